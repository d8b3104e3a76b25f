"""Property tests: no policy text makes the loader crash.

Any YAML document either loads as a policy or fails with one UsageError that
names the file; nothing else escapes (no KeyError, TypeError, ...).
"""

from __future__ import annotations

from pathlib import Path

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from trtbuild.errors import UsageError
from trtbuild.policy import parse_policy
from trtbuild.policy.schema import SCHEMA

KEYS = sorted(
    {"version", "model", "inputs", "passes", "precision", "build", "accuracy", "rules", "match"}
    | set(SCHEMA["properties"])
    | {k for v in SCHEMA["properties"].values() for k in v.get("properties", {})}
    | {"pattern", "op", "name", "last", "id", "default", "shape", "data", "atol", "opp"}
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 70000),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["fp16", "fp32", "bf16", "layernorm", "auto", "4GiB", "1e-3", "(", "m.onnx"]),
    st.text(max_size=8),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.sampled_from(KEYS), inner, max_size=5),
    ),
    max_leaves=25,
)


@st.composite
def documents(draw) -> str:
    doc = draw(st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=7))
    if draw(st.booleans()):
        doc = {"version": 1, "model": "m.onnx", **doc}
    return yaml.safe_dump(doc, allow_unicode=True)


@settings(max_examples=300, deadline=None)
@given(text=st.one_of(documents(), st.text(max_size=60)))
def test_any_text_loads_or_fails_with_one_usage_error(text):
    path = Path("/tmp/trtbuild-prop/policy.yaml")
    try:
        policy = parse_policy(text, path)
    except UsageError as exc:
        assert "policy.yaml" in str(exc)
        assert "\n" not in exc.message
    else:
        assert policy.model.name and policy.accuracy.samples >= 1
        assert len({r.id for r in policy.precision.rules}) == len(policy.precision.rules)
