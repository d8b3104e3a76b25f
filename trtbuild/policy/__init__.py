"""Policy language: schema, loading, JSON Schema export, and writing a policy back."""

from trtbuild.policy.load import resolve_policy_path
from trtbuild.policy.model import Policy, load_policy, parse_policy
from trtbuild.policy.schema import SCHEMA
from trtbuild.policy.source import PolicySource
from trtbuild.policy.specs import Rule

__all__ = [
    "SCHEMA",
    "Policy",
    "PolicySource",
    "Rule",
    "load_policy",
    "parse_policy",
    "resolve_policy_path",
]
