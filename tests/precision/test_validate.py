"""The mixed model is loaded as a user loads it, in a child process (issues #34, #36).

An FP16 GRU's mixed model crashes ONNX Runtime's default-optimised session (a SIGSEGV in
NchwcTransformer), which the old check, a session with optimisations off in trtbuild's own
process, called loadable. Now the crash is a warning naming ONNX Runtime's version and
the node, the model stays valid ONNX, and a model validated once is not loaded again.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtbuild import cache_codec
from trtbuild.cache import Cache
from trtbuild.precision import neighbourhoods
from trtbuild.precision.validate import InvalidMixedModel, start_mixed_check, validate_mixed

HIDDEN, WIDTH = 8, 4


def _gru(fp16: bool) -> onnx.ModelProto:
    """x (batch-major) → Transpose → GRU → Squeeze → Transpose → MatMul head; the mixed
    form (FP16 GRU, FP32 head) is what `convert` writes for a policy pinning the head."""
    rng = np.random.default_rng(0)
    kind = np.float16 if fp16 else np.float32
    inits = [
        numpy_helper.from_array(rng.standard_normal((1, 3 * HIDDEN, WIDTH)).astype(kind), "W"),
        numpy_helper.from_array(rng.standard_normal((1, 3 * HIDDEN, HIDDEN)).astype(kind), "R"),
        numpy_helper.from_array(rng.standard_normal((HIDDEN, 4)).astype(np.float32), "P"),
        numpy_helper.from_array(np.array([1], np.int64), "axis"),
    ]
    x = "xh" if fp16 else "x"
    nodes = [
        helper.make_node("Transpose", [x], ["xt"], perm=[1, 0, 2], name="to_time_major"),
        helper.make_node("GRU", ["xt", "W", "R"], ["Y", ""], hidden_size=HIDDEN, name="gru"),
        helper.make_node("Squeeze", ["Y", "axis"], ["Ys"], name="squeeze"),
        helper.make_node("Transpose", ["Ys"], ["Yt"], perm=[1, 0, 2], name="to_batch_major"),
        helper.make_node("MatMul", ["Yf" if fp16 else "Yt", "P"], ["y"], name="head"),
    ]
    if fp16:
        nodes.insert(0, helper.make_node("Cast", ["x"], ["xh"], to=TensorProto.FLOAT16))
        nodes.insert(-1, helper.make_node("Cast", ["Yt"], ["Yf"], to=TensorProto.FLOAT))
        nodes[0].name, nodes[-2].name = "x/cast", "Yt/cast"
    graph = helper.make_graph(
        nodes,
        "gru",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "steps", WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "steps", 4])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _crashes_in_default_session(path) -> bool:
    code = f"import onnxruntime as o; o.InferenceSession({str(path)!r}, providers=['CPUExecutionProvider'])"
    return subprocess.run([sys.executable, "-c", code], capture_output=True).returncode < 0


def test_an_onnx_runtime_crash_is_a_warning_naming_its_version_and_the_node(tmp_path):
    mixed = _gru(fp16=True)
    onnx.save(mixed, tmp_path / "mixed.onnx")
    if not _crashes_in_default_session(tmp_path / "mixed.onnx"):
        pytest.skip(f"ONNX Runtime {ort.__version__} on this CPU does not crash on it")
    warnings = validate_mixed(mixed)  # in this process, it would have been a SIGSEGV
    (said,) = warnings
    assert f"ONNX Runtime {ort.__version__} crashes (SIGSEGV)" in said
    assert "NchwcTransformer" in said and "at node 'head' (MatMul)" in said
    assert 'disabled_optimizers=["NchwcTransformer"]' in said
    onnx.checker.check_model(mixed, full_check=True)  # the file stays valid ONNX
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ort.InferenceSession(mixed.SerializeToString(), options, providers=["CPUExecutionProvider"])


def test_a_model_that_does_not_load_is_invalid_and_nothing_is_recorded(tmp_path):
    """An FP16 weight where the graph declares FP32: an InvalidMixedModel (exit 70)."""
    model = _gru(fp16=False)
    weight = numpy_helper.to_array(model.graph.initializer[0]).astype(np.float16)
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(weight, "W"))
    cache = Cache(codec=cache_codec, root=tmp_path / "cache")
    with pytest.raises(InvalidMixedModel, match="the mixed model"):
        validate_mixed(model, cache)
    assert cache.entries() == []  # nothing recorded: the broken model is checked again


def test_a_model_validated_once_is_not_loaded_again(tmp_path):
    cache = Cache(codec=cache_codec, root=tmp_path / "cache")
    mixed = _gru(fp16=True)
    first = validate_mixed(mixed, cache)
    again = start_mixed_check(mixed, cache)
    assert again.proc is None  # no child, no session: the record of the first check
    assert again.result() == first
    other = _gru(fp16=False)
    check = start_mixed_check(other, cache)
    assert check.proc is not None  # another model is checked
    assert check.result() == []


def test_convert_of_a_gru_policy_warns_and_writes_the_model(tmp_path):
    """The real command: the FP16 GRU's crash is a warning (exit 0), said again when warm."""
    onnx.save(_gru(fp16=False), tmp_path / "gru.onnx")
    policy = tmp_path / "gru.yaml"
    policy.write_text(
        textwrap.dedent(
            """\
            version: 1
            model: gru.onnx
            inputs: {x: {shape: [1, 6, 4]}}
            precision:
              default: fp16
              rules:
                - {id: head, match: {name: "^head$"}, precision: fp32}
            build: {backend: none}
            """
        )
    )
    env_cache = tmp_path / "cache"
    said = []
    for _ in range(2):  # cold, then warm: the validation is remembered, its warning too
        out = tmp_path / "mixed.onnx"
        done = subprocess.run(
            [sys.executable, "-m", "trtbuild", "convert", "--policy", str(policy), "-o", str(out)],
            capture_output=True,
            text=True,
            env={**__import__("os").environ, "TRTBUILD_CACHE_DIR": str(env_cache)},
        )
        assert done.returncode == 0, done.stderr
        said.append(done.stdout + done.stderr)
        onnx.checker.check_model(onnx.load(out), full_check=True)
    if not _crashes_in_default_session(tmp_path / "mixed.onnx"):
        pytest.skip(f"ONNX Runtime {ort.__version__} on this CPU does not crash on it")
    assert all(f"ONNX Runtime {ort.__version__} crashes (SIGSEGV)" in s for s in said), said


def test_the_load_check_imports_onnxruntime_not_a_file_in_the_working_folder(tmp_path, monkeypatch):
    """`python -c` puts its working folder first on sys.path: the child runs in the model's
    own (trtbuild's temporary) folder, so a planted `onnxruntime.py` decides nothing."""
    from trtbuild.precision import ort_child

    (tmp_path / "onnxruntime.py").write_text("raise SystemExit(3)\n")  # would fail any load
    monkeypatch.chdir(tmp_path)
    m = helper.make_model(
        helper.make_graph(
            [helper.make_node("Relu", ["x"], ["y"])],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    (tmp_path / "private").mkdir()
    path = tmp_path / "private" / "m.onnx"
    onnx.save(m, str(path))
    assert ort_child.outcome(ort_child.give(ort_child.start(), path, "default")).ok  # a file
    pipe = path.read_bytes()
    assert ort_child.outcome(ort_child.give(ort_child.start(), pipe, "default")).ok  # a pipe


# -- one load per neighbourhood, remembered (#46) ---------------------------------------

BLOCKS = 10


def _pinned(block: int) -> onnx.ModelProto:
    """An FP16 chain of BLOCKS × (MatMul → Add → Relu), each with its own weights, and
    block `block` pinned FP32 between Casts: what `convert` writes for a rule pinning it."""
    rng = np.random.default_rng(block)
    nodes = [helper.make_node("Cast", ["x"], ["x16"], to=TensorProto.FLOAT16, name="x/cast")]
    inits, x = [], "x16"
    for k in range(BLOCKS):
        kind = np.float32 if k == block else np.float16
        if k == block:
            nodes.append(helper.make_node("Cast", [x], [f"in{k}"], to=TensorProto.FLOAT))
            x = f"in{k}"
        inits.append(numpy_helper.from_array(rng.standard_normal((4, 4)).astype(kind), f"w{k}"))
        inits.append(numpy_helper.from_array(rng.standard_normal(4).astype(kind), f"b{k}"))
        nodes.append(helper.make_node("MatMul", [x, f"w{k}"], [f"m{k}"]))
        nodes.append(helper.make_node("Add", [f"m{k}", f"b{k}"], [f"a{k}"]))
        nodes.append(helper.make_node("Relu", [f"a{k}"], [f"r{k}"]))
        x = f"r{k}"
        if k == block:
            nodes.append(helper.make_node("Cast", [x], [f"out{k}"], to=TensorProto.FLOAT16))
            x = f"out{k}"
    nodes.append(helper.make_node("Cast", [x], ["y"], to=TensorProto.FLOAT, name="y/cast"))
    for k, n in enumerate(nodes):
        n.name = n.name or f"{n.op_type.lower()}_{k}"
    graph = helper.make_graph(
        nodes,
        "pinned",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def test_a_model_pinning_another_identical_layer_starts_no_child(tmp_path):
    """The rule-edit loop: the neighbourhoods of block 5 pinned were all seen with block 4
    pinned, so ONNX Runtime loads nothing; `whole` loads the whole model, as before."""
    cache = Cache(codec=cache_codec, root=tmp_path / "cache")
    assert validate_mixed(_pinned(4), cache) == []
    check = start_mixed_check(_pinned(5), cache)
    assert check.proc is None  # no child: every neighbourhood is known
    assert check.result() == []
    whole = start_mixed_check(_pinned(6), cache, scope="whole")
    assert whole.proc is not None and whole.result() == []


def test_where_every_neighbourhood_is_known_the_graph_is_still_checked(tmp_path):
    """A remembered key stands for its node's inference (the full check passed with it),
    not for the graph around it: nodes out of order are still InvalidMixedModel, said
    by the check that ran, and nothing is recorded."""
    cache = Cache(codec=cache_codec, root=tmp_path / "cache")
    assert validate_mixed(_pinned(4), cache, origin="pinned") == []
    shuffled = _pinned(5)
    nodes = list(shuffled.graph.node)
    nodes[2], nodes[3] = nodes[3], nodes[2]  # an Add before the MatMul it reads
    del shuffled.graph.node[:]
    shuffled.graph.node.extend(nodes)
    with pytest.raises(InvalidMixedModel, match="every neighbourhood remembered"):
        validate_mixed(shuffled, cache, origin="pinned")
    assert validate_mixed(_pinned(5), cache, origin="pinned") == []


def _resized(model: onnx.ModelProto, weight: str, dims: tuple[int, ...]) -> onnx.ModelProto:
    """`model` with `weight` of other dims: keys hold ranks, so its keys stay the same."""
    (w,) = [t for t in model.graph.initializer if t.name == weight]
    kind = numpy_helper.to_array(w).dtype
    w.CopyFrom(numpy_helper.from_array(np.ones(dims, kind), weight))
    return model


def test_a_new_neighbourhood_or_another_origin_gets_the_full_check(tmp_path):
    """What only the full check's inference sees: a value declared in a type its node
    does not make (its key is new: the declared type is in it), and dims that do not fit
    (keys hold ranks: every key is known, but the model comes from another origin, whose
    dims no full check has seen)."""
    cache = Cache(codec=cache_codec, root=tmp_path / "cache")
    assert validate_mixed(_pinned(4), cache, origin="pinned") == []
    wrong = _pinned(5)
    (relu,) = [v for v in wrong.graph.value_info if v.name == "r7"]
    relu.type.tensor_type.elem_type = TensorProto.DOUBLE
    with pytest.raises(InvalidMixedModel, match="full check"):
        validate_mixed(wrong, cache, origin="pinned")
    misfit = _resized(_pinned(5), "w2", (4, 5))  # MatMul [1,5] where the Add takes [4]
    for origin in ("another", ""):
        with pytest.raises(InvalidMixedModel, match="full check"):
            validate_mixed(misfit, cache, origin=origin)


def test_only_the_neighbourhoods_not_seen_are_loaded_even_without_a_cache():
    """`--no-cache`: nothing remembered, but one neighbourhood of each kind is loaded, not
    the ten blocks (the cold convert gains too)."""
    mixed = _pinned(4)
    check = start_mixed_check(mixed, None)
    loaded = onnx.load_model_from_string(check.source)
    assert check.proc is not None and 0 < len(loaded.graph.node) < len(mixed.graph.node)
    assert check.result() == []


MEMORY_IN_A_CHILD = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from tests.precision.test_validate import _pinned
from trtbuild import cache_codec
from trtbuild.cache import Cache
from trtbuild.precision.validate import validate_mixed
print(validate_mixed(_pinned(4), Cache(codec=cache_codec, root=Path(sys.argv[2]))))
"""


def test_the_memory_of_neighbourhoods_outlives_the_process(tmp_path):
    from tests.conftest import ROOT
    from trtbuild.precision import neighbourhoods

    root = tmp_path / "cache"
    done = subprocess.run(
        [sys.executable, "-c", MEMORY_IN_A_CHILD, str(ROOT), str(root)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr[-2000:]
    cache = Cache(codec=cache_codec, root=root)
    assert set(neighbourhoods.read_memory(cache, _pinned(4)).values()) == {""}  # all loaded clean
    assert start_mixed_check(_pinned(5), cache).proc is None


TRANSFORMER_POLICY = """\
version: 1
model: t.onnx
passes: {{opset: 17, fuse_layernorm: false}}
precision:
  default: fp16
  rules:
    - {{id: layernorm, match: {{pattern: layernorm}}, precision: fp32}}
    - {{id: edited, match: {{name: '^/layers\\.{layer}/fc2/'}}, precision: fp32}}
build: {{backend: none}}
"""


def _transformer_mixed(tmp_path, layer: int) -> onnx.ModelProto:
    """The generated transformer's mixed model, its LayerNorms pinned FP32 (which ONNX
    Runtime's LayerNormFusion refuses) and one layer's MLP: the rule a user edits."""
    import make_models  # tests/conftest.py puts scripts/ on the path

    from trtbuild.front import run_front
    from trtbuild.policy import load_policy

    if not (tmp_path / "t.onnx").exists():
        onnx.save(make_models.transformer_tiny(layers=8, dim=8, outlier=0.0), tmp_path / "t.onnx")
    path = tmp_path / f"p{layer}.yaml"
    path.write_text(TRANSFORMER_POLICY.format(layer=layer))
    return run_front(load_policy(path), reference="none").converted.model


def test_layernorm_fusion_refusal_is_a_warning_remembered_for_the_next_edit(tmp_path):
    cache = Cache(codec=cache_codec, root=tmp_path / "cache")
    (said,) = validate_mixed(_transformer_mixed(tmp_path, 3), cache)
    assert f"ONNX Runtime {ort.__version__} refuses the mixed model" in said
    assert "LayerNormFusion" in said and "graph optimisations off" in said
    check = start_mixed_check(_transformer_mixed(tmp_path, 4), cache)
    assert check.proc is None  # the edit made no neighbourhood ONNX Runtime has not seen
    assert check.result() == [said]  # the refusal still said, once
    whole = validate_mixed(_transformer_mixed(tmp_path, 5), None, scope="whole")
    assert [w.split(" in node ")[0] for w in whole] == [said.split(" in node ")[0]]


def test_every_child_the_check_starts_is_given_a_load(tmp_path, monkeypatch):
    """The transformer's LayerNorms refused in each of the three rounds: the spares
    started as children are taken serve the "off" load and the next rounds, and the last
    round's child starts none (it would import ONNX Runtime only to be killed)."""
    from trtbuild.precision import ort_child

    started, given = [], []
    start, give = ort_child.start, ort_child.give
    monkeypatch.setattr(
        ort_child, "start", lambda nice=0: started.append(start(nice)) or started[-1]
    )
    monkeypatch.setattr(
        ort_child, "give", lambda proc, *a, **k: given.append(proc.pid) or give(proc, *a, **k)
    )
    (said,) = validate_mixed(_transformer_mixed(tmp_path, 3), None)
    assert "LayerNormFusion" in said
    defaults = len(given) - 1  # every round's load, and the first round's "off" load
    assert defaults == neighbourhoods.ROUNDS
    assert sorted(p.pid for p in started) == sorted(given)


def test_a_neighbourhood_that_does_not_load_is_no_verdict_the_whole_model_decides(
    tmp_path, monkeypatch
):
    """A cut that ONNX Runtime refuses even with optimisations off may be the cut's fault,
    not the model's: the whole model is loaded then, and it decides (no exit 70)."""
    from trtbuild.graph import structure
    from trtbuild.precision import neighbourhoods

    cut = structure.neighbourhood_model

    def badly_cut(model, types, chosen):  # as a wrong cut would: an op ORT cannot load
        sub = cut(model, types, chosen)
        sub.graph.node[0].op_type = "NoSuchOp"
        return sub

    monkeypatch.setattr(structure, "neighbourhood_model", badly_cut)
    cache = Cache(codec=cache_codec, root=tmp_path / "cache")
    check = start_mixed_check(_pinned(4), cache)
    assert b"NoSuchOp" in check.source  # the neighbourhoods were loaded first
    assert check.result() == []  # the whole model loads
    assert neighbourhoods.read_memory(cache, _pinned(4)) == {}  # the cut's failure taught nothing


def test_a_weight_whose_bytes_do_not_fit_its_type_is_invalid_whatever_is_loaded(tmp_path):
    """A converter bug: block 7's weight declared FLOAT16 but holding FP32's bytes. The
    neighbourhoods loaded (block 4's) hold block 7's alike weights, not its bytes; ONNX
    Runtime's whole load would refuse it, so the parent checks every tensor's length."""
    cache = Cache(codec=cache_codec, root=tmp_path / "cache")
    assert validate_mixed(_pinned(4), cache) == []
    broken = _pinned(4)
    (w7,) = [t for t in broken.graph.initializer if t.name == "w7"]
    w7.raw_data = np.ones((4, 4), np.float32).tobytes()
    onnx.checker.check_model(broken, full_check=True)  # the checker does not see it
    for scope in ("neighbourhoods", "whole"):
        with pytest.raises(InvalidMixedModel, match=r"'w7' \(FLOAT16, dims \[4, 4\]\) holds 64"):
            validate_mixed(broken, cache, scope=scope)
    short = helper.make_tensor("k", TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])
    del short.float_data[1:]  # 3 declared, 1 stored
    body = helper.make_graph(
        [helper.make_node("Constant", [], ["k"], value=short)],
        "then",
        [],
        [helper.make_tensor_value_info("k", TensorProto.FLOAT, [3])],
    )
    If = helper.make_node("If", ["c"], ["y"], then_branch=body, else_branch=body, name="if")
    graph = helper.make_graph(
        [If],
        "g",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
    )
    inner = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(
        InvalidMixedModel, match=r"'k' in if's then_branch .* 1 values in float_data"
    ):
        validate_mixed(inner, None)


def _layernorm(opset: int = 17, eps_input: bool = False, upstream_fp16: bool = True):
    """A decomposed LayerNorm pinned FP32 behind an FP16 Relu (Cast → Relu → Cast → the
    nine nodes): ONNX Runtime's LayerNormFusion (opset 17) binds FP16 and FP32 and refuses
    it. `upstream_fp16=False`: the Relu FP32 too, nothing for the fusion to absorb (it
    loads). `eps_input`: the epsilon a graph input too (overridable, not a constant)."""
    F = TensorProto.FLOAT
    nodes = [
        helper.make_node("Cast", ["x"], ["xh"], to=TensorProto.FLOAT16, name="c0"),
        helper.make_node("Relu", ["xh"], ["r"], name="relu"),
        helper.make_node("Cast", ["r"], ["r32"], to=F, name="c1"),
        helper.make_node("ReduceMean", ["r32"], ["m"], axes=[-1], name="rm1"),
        helper.make_node("Sub", ["r32", "m"], ["d"], name="sub"),
        helper.make_node("Pow", ["d", "two"], ["d2"], name="pow"),
        helper.make_node("ReduceMean", ["d2"], ["v"], axes=[-1], name="rm2"),
        helper.make_node("Add", ["v", "eps"], ["ve"], name="addeps"),
        helper.make_node("Sqrt", ["ve"], ["s"], name="sqrt"),
        helper.make_node("Div", ["d", "s"], ["n"], name="div"),
        helper.make_node("Mul", ["n", "g"], ["ng"], name="mul"),
        helper.make_node("Add", ["ng", "b"], ["y"], name="addb"),
    ]
    if not upstream_fp16:
        nodes = nodes[3:]
        nodes.insert(0, helper.make_node("Relu", ["x"], ["r32"], name="relu"))
    inits = [
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.array(1e-5, np.float32), "eps"),
        numpy_helper.from_array(np.ones(8, np.float32), "g"),
        numpy_helper.from_array(np.zeros(8, np.float32), "b"),
    ]
    inputs = [helper.make_tensor_value_info("x", F, [2, 8])]
    if eps_input:
        inputs.append(helper.make_tensor_value_info("eps", F, []))
    graph = helper.make_graph(
        nodes, "ln", inputs, [helper.make_tensor_value_info("y", F, [2, 8])], inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def test_keys_learned_at_one_opset_say_nothing_of_another(tmp_path):
    """LayerNormFusion runs from opset 17: the same keys loaded clean at opset 13 must not
    hide its refusal at 17 (the memory is the opsets' and IR version's)."""
    cache = Cache(codec=cache_codec, root=tmp_path / "cache")
    assert validate_mixed(_layernorm(13), cache) == []
    check = start_mixed_check(_layernorm(17), cache)
    assert check.proc is not None  # another opset: nothing known
    (said,) = check.result()
    assert "LayerNormFusion" in said or "LayerNormalization" in said


def _with_function(crashing: bool) -> onnx.ModelProto:
    """Relu → a call of a model-local function; `crashing`: its body is the FP16
    `Cast` → `Transpose` → `Cast` → `MatMul` that crashes NchwcTransformer, else the
    harmless `Transpose` first. The calls (the keys' view) are alike."""
    F, H = TensorProto.FLOAT, TensorProto.FLOAT16
    weight = numpy_helper.from_array(np.ones([8, 4], np.float32))
    first = [
        helper.make_node("Cast", ["i"], ["h"], to=H),
        helper.make_node("Transpose", ["h"], ["t"], perm=[1, 0, 2]),
    ]
    if not crashing:
        first = [
            helper.make_node("Transpose", ["i"], ["h"], perm=[1, 0, 2]),
            helper.make_node("Cast", ["h"], ["t"], to=H),
        ]
    body = [
        helper.make_node("Constant", [], ["P"], value=weight),
        *first,
        helper.make_node("Cast", ["t"], ["tf"], to=F),
        helper.make_node("MatMul", ["tf", "P"], ["o"]),
    ]
    f = helper.make_function("local", "F", ["i"], ["o"], body, [helper.make_opsetid("", 17)])
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("F", ["r"], ["y"], domain="local", name="f"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", F, [2, 3, 8])],
        [helper.make_tensor_value_info("y", F, [3, 2, 4])],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]
    model = helper.make_model(graph, opset_imports=opsets, functions=[f])
    model.ir_version = 8
    return model


def test_a_model_with_local_functions_is_loaded_whole(tmp_path):
    """The keys see a call by its name, not the body ONNX Runtime inlines: a body that
    crashes its optimiser behind a call alike to a clean one is loaded, whole."""
    cache = Cache(codec=cache_codec, root=tmp_path / "cache")
    assert validate_mixed(_with_function(crashing=False), cache) == []
    crashing = _with_function(crashing=True)
    onnx.save(crashing, tmp_path / "crashing.onnx")
    check = start_mixed_check(crashing, cache)
    assert check.proc is not None and check.plan is None  # the whole model
    warnings = check.result()
    if not _crashes_in_default_session(tmp_path / "crashing.onnx"):
        pytest.skip(f"ONNX Runtime {ort.__version__} on this CPU does not crash on it")
    (said,) = warnings
    assert "crashes (SIGSEGV)" in said


def _if_reading(transposed: str, other: str) -> onnx.ModelProto:
    """x → Cast FP16 → `a`, x → Relu → `b`; an If whose then-branch transposes the outer
    value `transposed` then casts it FP32 into a MatMul (the NchwcTransformer crash where
    it is `a`, FP16), and casts `other` into another MatMul. Swapping them swaps only
    which outer value each read takes."""
    F = TensorProto.FLOAT
    shape = ["d0", "d1", 4]

    def weight():
        return numpy_helper.from_array(np.ones([8, 4], np.float32), "P")

    then = [
        helper.make_node("Transpose", [transposed], ["tt"], perm=[1, 0, 2]),
        helper.make_node("Cast", ["tt"], ["tc"], to=F),
        helper.make_node("MatMul", ["tc", "P"], ["t1"]),
        helper.make_node("Cast", [other], ["oc"], to=F),
        helper.make_node("MatMul", ["oc", "P"], ["t2"]),
        helper.make_node("Add", ["t1", "t2"], ["to"]),
    ]
    out = helper.make_tensor_value_info("to", F, shape)
    otherwise = [
        helper.make_node("Cast", ["b"], ["ec"], to=F),
        helper.make_node("MatMul", ["ec", "P"], ["to"]),
    ]
    nodes = [
        helper.make_node("Cast", ["x"], ["a"], to=TensorProto.FLOAT16, name="c16"),
        helper.make_node("Relu", ["x"], ["b"], name="relu"),
        helper.make_node(
            "If",
            ["cond"],
            ["y"],
            name="if",
            then_branch=helper.make_graph(then, "then", [], [out], [weight()]),
            else_branch=helper.make_graph(otherwise, "else", [], [out], [weight()]),
        ),
    ]
    inputs = [
        helper.make_tensor_value_info("x", F, [3, 3, 8]),
        helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
    ]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", F, shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_a_body_reading_other_outer_values_is_another_neighbourhood(tmp_path):
    """A body's reads from around it are keyed by first use and type, not by a sorted list
    of names: transposing the FP16 outer value instead of the FP32 one (a crash) is not
    alike to the clean If loaded before."""
    cache = Cache(codec=cache_codec, root=tmp_path / "cache")
    assert validate_mixed(_if_reading("b", "a"), cache) == []
    crashing = _if_reading("a", "b")
    onnx.save(crashing, tmp_path / "crashing.onnx")
    check = start_mixed_check(crashing, cache)
    assert check.proc is not None  # not known: loaded
    warnings = check.result()
    if not _crashes_in_default_session(tmp_path / "crashing.onnx"):
        pytest.skip(f"ONNX Runtime {ort.__version__} on this CPU does not crash on it")
    (said,) = warnings
    assert "crashes (SIGSEGV)" in said and "'if' (If)" in said


def test_a_refusal_is_remembered_for_the_named_node_not_for_models_sharing_its_surroundings(
    tmp_path,
):
    """LayerNormFusion refuses the LayerNorm pinned behind an FP16 Relu (named in its
    message); the same LayerNorm behind an FP32 Relu loads, whole. Keys near the named
    node that the second model shares must not carry the first one's refusal into it."""
    cache = Cache(codec=cache_codec, root=tmp_path / "cache")
    (said,) = validate_mixed(_layernorm(17), cache)
    assert "LayerNorm" in said
    fixed = _layernorm(17, upstream_fp16=False)
    assert validate_mixed(fixed, None, scope="whole") == []
    assert validate_mixed(fixed, cache) == []  # no warning naming the other model's node
    check = start_mixed_check(_layernorm(17), cache)  # the first again, another edit
    assert check.proc is None and check.result() == [said]  # still known, still said


def test_an_initializer_fed_as_an_input_too_is_no_constant(tmp_path):
    """The LayerNorm's epsilon a graph input too (overridable): ONNX Runtime does not fuse
    on it and loads the whole model; its neighbourhoods must keep it an input, and its
    keys tell it from the constant epsilon LayerNormFusion refuses."""
    overridable = _layernorm(17, eps_input=True)
    assert validate_mixed(overridable, None, scope="whole") == []
    assert validate_mixed(overridable, None) == []
    cache = Cache(codec=cache_codec, root=tmp_path / "cache")
    assert len(validate_mixed(_layernorm(17), cache)) == 1  # the constant one: refused
    check = start_mixed_check(overridable, cache)
    assert check.proc is not None  # not alike
    assert check.result() == []
    assert "eps" in [i.name for i in onnx.load_model_from_string(check.source).graph.input]


# -- children started ahead, all reaped (#46, the cold convert) --------------------------


def _children() -> set[int]:
    """This process's child processes, running or zombie (not yet waited for)."""
    found: set[int] = set()
    for task in Path("/proc/self/task").glob("*"):
        with contextlib.suppress(OSError):
            found |= {int(k) for k in (task / "children").read_text().split()}
    return found


needs_proc = pytest.mark.skipif(
    not Path("/proc/self/task").exists(), reason="reads /proc/self/task/*/children"
)


@needs_proc
def test_every_child_of_a_check_is_reaped_when_its_result_is_in():
    """The LayerNorm refused: round 1, the "off" load and round 2 each a spare's child,
    the next spares started as they were taken; none outlives `result()`."""
    before = _children()
    check = start_mixed_check(_layernorm(17), None)
    assert check.proc is not None and check.spares.children
    (said,) = check.result()
    assert "LayerNorm" in said
    assert _children() - before == set()


@needs_proc
def test_every_child_is_reaped_on_cancel_and_on_an_invalid_model():
    before = _children()
    check = start_mixed_check(_pinned(4), None)
    assert _children() - before  # loading, and a spare
    check.cancel()
    assert _children() - before == set()
    model = _gru(fp16=False)  # an FP16 weight where the graph declares FP32
    weight = numpy_helper.to_array(model.graph.initializer[0]).astype(np.float16)
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(weight, "W"))
    with pytest.raises(InvalidMixedModel):
        validate_mixed(model, None)
    assert _children() - before == set()


@needs_proc
def test_every_child_is_reaped_on_a_keyboard_interrupt():
    """Ctrl-C while `result()` waits for a load (stopped: it would never answer)."""
    before = _children()
    check = start_mixed_check(_pinned(4), None, timeout=600)
    os.kill(check.proc.pid, signal.SIGSTOP)
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
    with pytest.raises(KeyboardInterrupt):
        check.result()
    assert _children() - before == set()


@needs_proc
def test_an_edit_whose_neighbourhoods_are_all_known_leaves_no_child(tmp_path):
    """The spare started before the plan is killed as soon as the plan loads nothing."""
    cache = Cache(codec=cache_codec, root=tmp_path / "cache")
    assert validate_mixed(_pinned(4), cache) == []
    before = _children()
    check = start_mixed_check(_pinned(5), cache)
    assert check.proc is None and check.spares.closed
    assert _children() - before == set()  # killed and waited for at once
    assert check.result() == []


def test_the_timeout_counts_a_load_not_the_time_its_spare_waited():
    """Spares idle longer than the timeout before their loads (the "off" load and round
    2 after a refusal) still have the whole timeout for their sessions."""
    check = start_mixed_check(_layernorm(17), None, timeout=5)
    time.sleep(6)  # as a build's engine does, before the check is joined
    (said,) = check.result()
    assert "LayerNorm" in said


def test_a_child_that_cannot_import_onnxruntime_is_check_failed(tmp_path, monkeypatch):
    """A broken ONNX Runtime where trtbuild imports from (here one that raises ImportError
    as a missing library does): exit 2 saying what to install, whichever spare answers."""
    from trtbuild.precision.validate import CheckFailed

    broken = tmp_path / "site" / "onnxruntime"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('libonnxruntime.so: not found')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    for scope in ("neighbourhoods", "whole"):
        with pytest.raises(CheckFailed, match="could not import ONNX Runtime") as caught:
            validate_mixed(_pinned(4), None, scope=scope)
        assert "libonnxruntime.so" in str(caught.value) and caught.value.exit_code == 2


@needs_proc
def test_children_started_ahead_are_the_checks_own_and_reaped_however_it_ends(tmp_path):
    """A caller's spares (`open_spares`, filled as its graph is prepared): the first load
    is one of them, and every one is reaped at the result, on a record and without a check."""
    from trtbuild.precision.validate import AHEAD, open_spares

    before = _children()
    cache = Cache(codec=cache_codec, root=tmp_path / "cache")
    spares = open_spares()
    spares.fill(AHEAD)
    ahead = {p.pid for p in spares.idle}
    assert ahead <= _children()  # seen: so their absence after the check means reaped
    check = start_mixed_check(_layernorm(17), cache, spares=spares)
    assert check.proc.pid in ahead and check.spares is spares
    (said,) = check.result()
    assert spares.closed and _children() - before == set()
    for timeout, warned in ((None, [said]), (0, [])):  # the record of that pass; no load
        spares = open_spares()
        spares.fill(AHEAD)
        assert validate_mixed(_layernorm(17), cache, timeout, spares=spares) == warned
        assert spares.closed and _children() - before == set()
    spares = open_spares()
    spares.fill(AHEAD)
    with pytest.raises(ValueError, match="scope"):  # a check that cannot start
        start_mixed_check(_layernorm(17), cache, scope="all", spares=spares)
    assert spares.closed and _children() - before == set()


def test_a_validated_models_record_key_is_the_same_bytes_as_before():
    """Users' caches hold records under this key: hashing the bytes apart from the judge's
    name (no copy of a large model) must give the key written before."""
    import hashlib

    from trtbuild.precision import ort_child, validate

    data = bytes(range(256)) * 3
    joined = b"trtbuild-validated\0" + ort_child.judge().encode() + b"\0" + data
    assert validate._digest(data) == hashlib.sha256(joined).hexdigest()


@pytest.mark.parametrize("command", ["convert", "build", "check"])
def test_a_shape_the_model_declares_wrong_is_the_models_fault_not_trtbuilds(
    tmp_path, command, monkeypatch
):
    """An output shape an exporter wrote that shape inference contradicts passes the light check
    the model is read with, then failed the mixed model's full check as trtbuild's fault
    (exit 70; found by mutating a model's bytes): exit 2 naming the model, from `check` too
    (which said nothing of it), cached or not. A mixed model failing where the model passes
    stays trtbuild's (`InvalidMixedModel`, exit 70)."""
    from trtbuild.cli import main

    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu")]
    nodes.append(helper.make_node("Mul", ["r", "r"], ["y"], name="sq"))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])],  # inferred: [1, 4]
    )
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), tmp_path / "m.onnx"
    )
    policy = tmp_path / "p.yaml"
    policy.write_text("version: 1\nmodel: m.onnx\nbuild: {backend: none}\naccuracy: {samples: 1}\n")
    out = {"convert": ["-o", str(tmp_path / "c.onnx")], "build": ["--out", str(tmp_path / "o")]}
    assert main([command, "--policy", str(policy), "--no-cache", *out.get(command, [])]) == 2
    assert not (tmp_path / "o").exists() and not (tmp_path / "c.onnx").exists()
    monkeypatch.setenv("TRTBUILD_CACHE_DIR", str(tmp_path / "cache"))
    assert [main([command, "--policy", str(policy), *out.get(command, [])]) for _ in "12"] == [2, 2]


def test_a_mixed_model_failing_where_its_model_passes_is_still_trtbuilds_fault(tmp_path):
    from trtbuild.precision.validate import blamed_on_model

    model = _gru(fp16=False)
    onnx.save(model, tmp_path / "m.onnx")
    with (
        pytest.raises(InvalidMixedModel, match="wrote it wrong"),
        blamed_on_model(tmp_path / "m.onnx"),
    ):
        raise InvalidMixedModel("the mixed model's tensor: trtbuild wrote it wrong")


def test_onnx_runtimes_own_casts_typed_wrong_are_its_fault_not_the_models():
    """An FP16 MelWeightMatrix (the schema types `output_datatype` FLOAT16; ONNX Runtime has
    an FP32 kernel only) fails to load with a type error of the cast ONNX Runtime inserts
    itself: the valid mixed model was said invalid (exit 70, ONNX's melweightmatrix test)."""
    ins = [("bins", TensorProto.INT32), ("dft", TensorProto.INT32), ("rate", TensorProto.INT32)]
    ins += [("low", TensorProto.FLOAT16), ("high", TensorProto.FLOAT16)]
    graph = helper.make_graph(
        [
            helper.make_node(
                "MelWeightMatrix",
                [n for n, _ in ins],
                ["w"],
                name="mel",
                output_datatype=TensorProto.FLOAT16,
            )
        ],
        "g",
        [helper.make_tensor_value_info(n, t, []) for n, t in ins],
        [helper.make_tensor_value_info("w", TensorProto.FLOAT16, [9, 8])],
    )
    mixed = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    mixed.ir_version = 8
    onnx.checker.check_model(mixed, full_check=True)
    validate_mixed(mixed)  # no InvalidMixedModel: ONNX Runtime lacks the kernel
