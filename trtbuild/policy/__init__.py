"""Policy language: schema, loading, JSON Schema export."""

from trtbuild.policy.load import load_policy, resolve_policy_path
from trtbuild.policy.model import Policy, Rule
from trtbuild.policy.schema import SCHEMA

__all__ = ["SCHEMA", "Policy", "Rule", "load_policy", "resolve_policy_path"]
