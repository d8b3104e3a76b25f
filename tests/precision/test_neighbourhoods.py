"""The memory of neighbourhoods ONNX Runtime loaded, and how a failure is given to keys (#46).

The loads themselves run in tests/precision/test_validate.py (real ONNX Runtime children);
here: what is remembered, under which key, and what is said again.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trtbuild import cache_codec
from trtbuild.cache import Cache
from trtbuild.precision import neighbourhoods, ort_child
from trtbuild.precision.neighbourhoods import Plan, plan

from .test_validate import _pinned

REFUSED = (
    "ONNX Runtime 1.32.0 refuses the mixed model under its default graph optimisations: "
    "Type Error: Type parameter (T) of Optype (LayerNormalization) bound to different types "
    "(tensor(float16) and tensor(float) in node ({}/LayerNormFusion/)."
)


VERSION = ort_child.version()


@pytest.mark.parametrize(
    "other",
    [
        ("installed", lambda: ("onnxruntime", "0.0.0")),  # an upgrade
        ("installed", lambda: ("onnxruntime-gpu", VERSION)),  # another build of it
        ("cpu_features", lambda: "another CPU"),  # a cache shared with another machine
    ],
)
def test_another_onnx_runtime_or_cpu_reads_another_memory(monkeypatch, other):
    from trtbuild.precision import validate

    model = _pinned(4)
    before = neighbourhoods.memory_digest(model), validate._digest(model.SerializeToString())
    monkeypatch.setattr(ort_child, *other)
    after = neighbourhoods.memory_digest(model), validate._digest(model.SerializeToString())
    assert after[0] != before[0] and after[1] != before[1]  # the memory and the record


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="Linux's /proc/cpuinfo")
def test_the_cpu_features_are_read():
    """The flags' line, sorted (not the machine's name, the fallback elsewhere)."""
    lines = Path("/proc/cpuinfo").read_text(errors="replace").splitlines()
    flags = next(x for x in lines if x.startswith(("flags", "Features")) and ":" in x)
    assert ort_child.cpu_features() == " ".join(sorted(flags.split(":", 1)[1].split()))


def test_the_memory_keeps_the_most_recently_learned_keys(tmp_path, monkeypatch):
    cache = Cache(codec=cache_codec, root=tmp_path / "cache")
    monkeypatch.setattr(neighbourhoods, "MEMORY_KEYS", 3)
    m = _pinned(4)
    neighbourhoods.remember(cache, {"a": "", "b": "w", "c": ""}, m)
    neighbourhoods.remember(cache, {"d": "", "a": ""}, m)  # a learned again: recent
    assert neighbourhoods.read_memory(cache, m) == {"c": "", "d": "", "a": ""}
    assert neighbourhoods.read_memory(Cache(enabled=False), m) == {}


def test_a_refusal_goes_to_the_neighbourhoods_of_the_node_it_names():
    """ONNX Runtime stops at its first failure: the keys whose neighbourhoods hold the named
    node get the warning, the others stay pending (loaded again), none is called clean."""
    mixed = _pinned(4)
    p = plan(mixed, {})
    at = next(v for v, n in enumerate(mixed.graph.node) if n.op_type == "MatMul")
    said = REFUSED.format(mixed.graph.node[at].name)
    pending = dict(p.pending)
    assert p.learn(said, said)
    named = p.shape.keys[at]
    assert p.learned[named] == said  # the named node's key: the warning, its only one
    assert all(w.startswith("\0near ") for k, w in p.learned.items() if k != named)
    assert p.pending and set(p.pending) | set(p.learned) == set(pending)
    stopped = {k for k, w in p.learned.items() if k != named}
    assert stopped and set(plan(mixed, p.learned).known) == set(p.learned)
    # stopped by a key this model does not hold: they stand not, they are loaded again
    elsewhere = dict.fromkeys(stopped, "\0near " + "0" * 32)
    assert not plan(mixed, elsewhere).known
    far = [v for v in range(len(p.shape.keys)) if v not in p.shape.ball([at], 6)]
    assert all(p.shape.keys[v] not in p.learned for v in far[-3:])  # the graph's far end


def test_a_failure_named_nowhere_is_given_to_no_key():
    """No key can be charged with it: nothing learned, the whole model's load decides."""
    p = plan(_pinned(4), {})
    keys = set(p.pending)
    assert not p.learn("ONNX Runtime crashes (SIGSEGV)", "")
    assert not p.learned and set(p.pending) == keys


def test_the_same_failure_at_alike_nodes_is_said_once():
    mixed = _pinned(4)
    p = plan(mixed, {})
    keys = list(p.pending)
    memory = {keys[0]: REFUSED.format("/a/Mul"), keys[1]: REFUSED.format("/b/Mul")}
    memory[keys[2]] = "ONNX Runtime 1.32.0 crashes (SIGSEGV) at node 'x' (MatMul)"
    again: Plan = plan(mixed, memory)
    assert again.warnings() == [memory[keys[0]], memory[keys[2]]]


def test_a_message_names_a_node_as_onnx_runtime_quotes_it():
    """One pass over the message finds the names it quotes (not one search per node): a
    fused `(NAME/LayerNormFusion/)`, a crash's `'NAME'`, never a name inside another."""
    mixed = _pinned(4)
    p = plan(mixed, {})
    names = [n.name for n in mixed.graph.node]

    def named(said: str) -> list[str]:
        return [names[v] for v in neighbourhoods._named(mixed, p.shape, range(len(names)), said)]

    assert named(REFUSED.format("x/cast")) == ["x/cast"]
    assert named("crashes (SIGSEGV), at node 'relu_3' (Relu); the model") == ["relu_3"]
    assert named("in node (relu_3x).") == [] and named("in node (x/cas).") == []


def test_a_key_stopped_in_two_models_stands_beside_either_stopper(tmp_path):
    """A key near a refused node of one model and near another refused node in a second:
    the memory keeps both, so neither model loads it again."""
    cache = Cache(codec=cache_codec, root=tmp_path / "cache")
    m = _pinned(4)
    neighbourhoods.remember(cache, {"k": "\0near n1", "n1": "w"}, m)
    neighbourhoods.remember(cache, {"k": "\0near n2", "n2": "w"}, m)
    assert neighbourhoods.read_memory(cache, m)["k"] == "\0near n1 n2"
