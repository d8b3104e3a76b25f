"""The validated policy as one immutable value, and the ways to get one.

Frozen, as its parts are (`specs` says why). The parts live in `specs`; reading a file
or a mapping in `load` (which knows no `Policy`, so the arrows point one way); writing
one back in `dump`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtbuild.policy.specs import AccuracySpec, BuildSpec, InputSpec, Passes, Precision

__all__ = ["Policy", "load_policy", "parse_policy"]


@dataclass(frozen=True)
class Policy:
    """A policy, validated; paths are absolute."""

    path: Path
    model: Path
    inputs: tuple[InputSpec, ...] = ()
    passes: Passes = field(default_factory=Passes)
    precision: Precision = field(default_factory=Precision)
    build: BuildSpec = field(default_factory=BuildSpec)
    accuracy: AccuracySpec = field(default_factory=AccuracySpec)

    @property
    def stem(self) -> str:
        return self.path.stem

    @classmethod
    def from_dict(
        cls, mapping: Mapping[str, Any], base_dir: str | Path = ".", name: str = "policy"
    ) -> Policy:
        """A policy from the mapping a policy file holds, validated as a file is.

        Args:
            mapping: the document (`version`, `model`, ...), as `yaml.safe_load` gives it.
            base_dir: what relative paths (the model, data files) are relative to.
            name: the policy's name (its stem: `build/<name>/` by default).

        Raises:
            UsageError: the same messages as for a file, naming the field and the fix.
        """
        from trtbuild.policy.load import mapping_fields

        return cls(**mapping_fields(mapping, (Path(base_dir) / f"{name}.yaml").resolve()))

    def to_dict(self) -> dict[str, Any]:
        """The mapping `from_dict` reads back as an equal policy (every value, absolute paths)."""
        from trtbuild.policy.dump import policy_dict

        return policy_dict(self)

    def to_yaml(self) -> str:
        """`to_dict` as YAML: a policy file that means the same wherever it is saved."""
        from trtbuild.policy.dump import policy_yaml

        return policy_yaml(self)


def load_policy(name: str | Path) -> Policy:
    """Load and validate a policy file; the model path is relative to the policy file.

    `--policy nafnet.yaml` that is not a path is looked up in `./policies/`.

    Raises:
        UsageError: one message naming the file, the line, the field and the fix.
    """
    from trtbuild.policy.load import load_fields

    return Policy(**load_fields(name))


def parse_policy(text: str, path: Path, shown: str | None = None) -> Policy:
    """A policy from a file's text, as if read from `path` (messages say `shown`)."""
    from trtbuild.policy.load import parse_fields

    return Policy(**parse_fields(text, path, shown))
