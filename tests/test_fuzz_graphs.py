"""scripts/fuzz_graphs.py: its graphs are valid and its policies load, so what it finds is
trtbuild's, not the generator's."""

from __future__ import annotations

import random

import fuzz_graphs  # scripts/ is on the path (conftest)
import onnx
import pytest

from trtbuild.policy import load_policy


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("kind", sorted(fuzz_graphs.KINDS))
def test_every_kind_makes_a_tensor_any_later_node_may_read(kind, dynamic):
    """Each kind's tensor has the input's shape (a later node reads any earlier tensor)."""
    g = fuzz_graphs.Graph(random.Random(0), dynamic)
    g.pool.append(fuzz_graphs.KINDS[kind](g, "x", "x"))
    model = g.model()
    onnx.checker.check_model(model, full_check=True)
    (out,) = onnx.shape_inference.infer_shapes(model, strict_mode=True).graph.output
    dims = [d.dim_param or d.dim_value for d in out.type.tensor_type.shape.dim]
    assert dims == (fuzz_graphs.DYNAMIC_SHAPE if dynamic else fuzz_graphs.SHAPE)


@pytest.mark.parametrize("seed", range(4))
def test_random_policies_load(tmp_path, seed):
    rng = random.Random(seed)
    model = fuzz_graphs.random_graph(rng, dynamic=seed % 2 == 1)
    onnx.save(model, tmp_path / "m.onnx")
    (tmp_path / "p.yaml").write_text(fuzz_graphs.random_policy(model, rng, False, seed % 2 == 1))
    policy = load_policy(tmp_path / "p.yaml")
    assert policy.build.backend == "none"
