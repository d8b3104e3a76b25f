"""The periodic walk (`graph.periodic`) as the `periodic_arguments` pattern names it: what
computes a sine's argument, and what each node of it is judged by."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from tests.helpers import I64, F, fourier_features, fourier_weights, model, node
from trtbuild.graph.view import GraphView


def test_periodic_arguments_walk_up_to_a_matrix_product_and_stop_there():
    """Fourier features, `sin(2π · (h @ B))` over a hidden state `h = relu(x) + y`: the
    product and its scaling compute the argument; what made `h` is the model's (an op
    other than arithmetic made it), not the argument's scale, and is left to the other
    rules."""
    from trtbuild.graph.analysis import Analysis
    from trtbuild.graph.patterns import find

    inits = {"b": np.ones((8, 4), np.float32), "tau": np.array(6.28, np.float32)}
    m = model(
        [
            node("Relu", ["x"], "r", "act"),
            node("Add", ["r", "y"], "h", "hidden"),
            node("MatMul", ["h", "b"], "p", "project"),
            node("Mul", ["p", "tau"], "a", "scale"),
            node("Sin", ["a"], "s", "sin"),
            node("Cos", ["a"], "c", "cos"),
            node("Concat", ["s", "c"], "out", "concat", axis=-1),
        ],
        [("x", F, [2, 8]), ("y", F, [2, 8])],
        [("out", F, [2, 8])],
        inits,
    )
    view = GraphView(m)
    found = {view.nodes[i].name for i in find("periodic_arguments", Analysis(view))}
    assert found == {"project", "scale", "sin", "cos"}


def _fourier_nodes() -> list:
    """SAM's prompt encoder (`fourier_features`), the size read from the image's shape, the
    features added to the image."""
    return [
        node("Shape", ["img"], "dims", "dims"),
        node("Gather", ["dims", "last"], "side", "side", axis=0),
        node("Cast", ["side"], "sidef", "side_float", to=onnx.TensorProto.FLOAT),
        *fourier_features("sidef"),
        node("Add", ["emb", "img"], "out", "mix"),
    ]


def _fourier_inits() -> dict:
    b = np.random.default_rng(0).normal(size=(2, 4)).astype(np.float32)
    return {**fourier_weights(b), "last": np.array(-1, np.int64)}


def test_periodic_arguments_follow_a_product_to_coordinates_computed_from_the_inputs():
    """Past a matrix product, values computed from the graph's inputs, weights and shapes
    alone are the argument's own (their rounding reaches it scaled by the product): the
    coordinates' normalisation is found, the size made a float too; the image the size is
    read from is the model's."""
    io = ([("pts", F, [1, 8, 2]), ("img", F, [1, 8, 8])], [("out", F, [1, 8, 8])])
    found = _periodic(_fourier_nodes(), *io, _fourier_inits())
    assert found == {
        *("shift", "side_float", "normalise", "twice", "centre"),
        *("project", "scale", "sin", "cos"),
    }


def _periodic(nodes, inputs, outputs, inits) -> set[str]:
    from trtbuild.graph.analysis import Analysis
    from trtbuild.graph.patterns import find

    view = GraphView(model(nodes, inputs, outputs, inits))
    return {view.nodes[i].name for i in find("periodic_arguments", Analysis(view))}


def test_periodic_arguments_leave_out_a_value_used_elsewhere_too():
    """A Snake activation, `h + sin(a · h)²`, after a hidden state `h = x + y` that the
    residual reads too: `a · h` is the argument's; `h` is the model's, and so is what
    feeds it, whatever op made it (a `ReduceMean` ends the walk)."""
    nodes = [
        node("ReduceMean", ["x"], "m", "mean", axes=[-1]),
        node("Add", ["m", "y"], "h", "hidden"),
        node("Mul", ["h", "a"], "ah", "scale"),
        node("Sin", ["ah"], "s", "sin"),
        node("Mul", ["s", "s"], "s2", "square"),
        node("Add", ["h", "s2"], "out", "residual"),
    ]
    io = ([("x", F, [2, 8]), ("y", F, [2, 1])], [("out", F, [2, 1])])
    assert _periodic(nodes, *io, {"a": np.array(30.0, np.float32)}) == {"scale", "sin"}


def test_periodic_arguments_of_a_rotary_embedding_by_matmul():
    """`inv_freq @ positions` (the rotary embedding's outer product, as transformers writes
    it): the product, what follows it, and the positions made floats before it (computed
    from the graph's input alone: FP16 rounds a position past 2048)."""
    from tests.helpers import I64

    nodes = [
        node("Cast", ["pos"], "posf", "to_float", to=onnx.TensorProto.FLOAT),
        node("Reshape", ["posf", "row"], "prow", "as_row"),
        node("MatMul", ["inv", "prow"], "freqs", "outer"),
        node("Transpose", ["freqs"], "ft", "transpose", perm=[1, 0]),
        node("Concat", ["ft", "ft"], "emb", "concat", axis=-1),
        node("Cos", ["emb"], "c", "cos"),
        node("Sin", ["emb"], "s", "sin"),
        node("Mul", ["c", "s"], "out", "mix"),
    ]
    inits = {"inv": np.ones((4, 1), np.float32), "row": np.array([1, -1], np.int64)}
    io = ([("pos", I64, [16])], [("out", F, [16, 8])])
    found = _periodic(nodes, *io, inits)
    assert found == {"to_float", "as_row", "outer", "transpose", "concat", "cos", "sin"}


def test_periodic_arguments_ignore_a_shape_reader_and_leave_out_a_graph_output():
    """`Shape(arg)` reads no value (a dynamic-axes export's), so `arg`'s producer still
    computes only the argument; a value the user is handed (a graph output) is theirs."""
    nodes = [
        node("Mul", ["t", "f"], "arg", "mul"),
        node("Shape", ["arg"], "dims", "shape"),
        node("Sin", ["arg"], "out", "sin"),
        node("Mul", ["u", "f"], "arg2", "mul2"),
        node("Cos", ["arg2"], "out2", "cos"),
    ]
    inputs = [("t", F, [4]), ("u", F, [4])]
    outputs = [("out", F, [4]), ("dims", onnx.TensorProto.INT64, [1]), ("out2", F, [4]),
               ("arg2", F, [4])]  # fmt: skip
    found = _periodic(nodes, inputs, outputs, {"f": np.ones(4, np.float32)})
    assert found == {"mul", "sin", "cos"}


def test_periodic_arguments_follow_a_coordinate_written_in_place():
    """torch's `coords[..., 0] = coords[..., 0] / w` exports a `ScatterND` writing the
    divided column back, and reads a column's `Shape` for the write's size: the write
    places values (no use of a shape is a use), so the coordinates stay the argument's."""
    idx = np.array([[[[0, i, 0]] for i in range(8)]], np.int64)  # (0, i, 0) for each point
    nodes = [
        node("Add", ["pts", "half"], "shifted", "shift"),
        node("Gather", ["shifted", "zero"], "x0", "column", axis=2),
        node("Gather", ["shifted", "one_i"], "x1", "peek", axis=2),
        node("Shape", ["x1"], "dims", "size_of_peek"),
        node("Div", ["x0", "side"], "xd", "normalise"),
        node("Reshape", ["xd", "dims3"], "upd", "as_updates"),
        node("ScatterND", ["shifted", "idx", "upd"], "written", "write"),
        node("MatMul", ["written", "b"], "p", "project"),
        node("Sin", ["p"], "s", "sin"),
        node("Add", ["s", "img"], "out", "mix"),
    ]
    inits = {**_fourier_inits(), "idx": idx, "side": np.array(128.0, np.float32)}
    inits |= {"zero": np.array(0, np.int64), "one_i": np.array(1, np.int64)}
    inits["dims3"] = np.array([1, 8, 1], np.int64)
    io = ([("pts", F, [1, 8, 2]), ("img", F, [1, 8, 4])], [("out", F, [1, 8, 4])])
    found = _periodic(nodes, *io, inits)
    assert found == {"shift", "column", "normalise", "as_updates", "write", "project", "sin"}


def test_periodic_anchors_are_every_band_a_value_feeds():
    """nerf-style bands, `sin(x · π)` and `sin(x · 512π)` of one shifted coordinate: the
    shift is judged by both arguments, whichever band the export wrote first (it was
    judged by the first band's alone, the lowest)."""
    from trtbuild.graph.analysis import Analysis
    from trtbuild.graph.patterns import anchors

    for high_first in (False, True):
        bands = [("low", "pi"), ("high", "pi512")][:: -1 if high_first else 1]
        nodes = [node("Add", ["x", "half"], "sx", "shift")]
        for name, k in bands:
            nodes += [node("Mul", ["sx", k], f"a_{name}", f"band_{name}")]
            nodes += [node("Sin", [f"a_{name}"], f"s_{name}", f"sin_{name}")]
        nodes += [node("Add", ["s_low", "s_high"], "y", "mix")]
        inits = {"half": np.float32(0.5), "pi": np.float32(np.pi)}
        inits["pi512"] = np.float32(512 * np.pi)
        view = GraphView(model(nodes, [("x", F, [4])], [("y", F, [4])], inits))
        anchored = anchors("periodic_arguments", Analysis(view))
        shift = next(i for i, n in enumerate(view.nodes) if n.name == "shift")
        assert set(anchored[shift]) == {"a_low", "a_high"}


def test_periodic_arguments_do_not_take_a_control_node_for_the_inputs():
    """An `If` on a flag returns `h · 2` or `h · 3` of a hidden state its bodies read from
    the outer graph: its only explicit input holds no float, yet its output is the model's,
    and the walk past the product stops there."""

    def branch(name: str, k: float) -> onnx.GraphProto:
        return onnx.helper.make_graph(
            [node("Mul", ["h", f"k_{name}"], f"o_{name}", f"times_{name}")],
            name,
            [],
            [onnx.helper.make_tensor_value_info(f"o_{name}", F, [2, 8])],
            [numpy_helper.from_array(np.float32(k), f"k_{name}")],
        )

    nodes = [
        node("Relu", ["x"], "h", "act"),
        node(
            "If", ["c"], "chosen", "choose", then_branch=branch("a", 2), else_branch=branch("b", 3)
        ),
        node("Add", ["chosen", "one"], "after", "after_if"),
        node("MatMul", ["after", "b"], "p", "project"),
        node("Sin", ["p"], "y", "sin"),
    ]
    inits = {"one": np.float32(1), "b": np.ones((8, 4), np.float32)}
    io = ([("x", F, [2, 8]), ("c", onnx.TensorProto.BOOL, [])], [("y", F, [2, 4])])
    assert _periodic(nodes, *io, inits) == {"project", "sin"}


def _positions_nodes(source: list) -> list:
    """Positions made floats and projected by a matrix product to a rotary's `cos`."""
    return [
        *source,
        node("Cast", ["pos"], "posf", "to_float", to=onnx.TensorProto.FLOAT),
        node("Unsqueeze", ["posf", "ax1"], "pcol", "as_column"),
        node("MatMul", ["pcol", "inv"], "freqs", "outer"),
        node("Cos", ["freqs"], "y", "cos"),
    ]


POSITIONS_INITS = {"ax1": np.array([1], np.int64), "inv": np.ones((1, 4), np.float32)}


def test_periodic_arguments_follow_positions_from_a_shape_and_from_an_integer_mask():
    """Positions `Range(0, Shape(h)[1])` of a hidden state the model computed (the shape is
    the input's, whatever made `h`), and `CumSum(mask) - 1` of a mask `ids != pad` (logic
    on integers, whatever its ops): both are computed from the inputs alone, and their `Cast` before the product is the argument's."""
    shape_source = [
        node("Relu", ["x"], "h", "act"),
        node("Shape", ["h"], "dims", "dims"),
        node("Gather", ["dims", "i1"], "n", "length", axis=0),
        node("Range", ["i0", "n", "i1"], "pos", "positions"),
    ]
    inits = {**POSITIONS_INITS, "i0": np.array(0, np.int64), "i1": np.array(1, np.int64)}
    io = ([("x", F, [2, 16])], [("y", F, [16, 4])])
    found = _periodic(_positions_nodes(shape_source), *io, inits)
    assert found == {"to_float", "as_column", "outer", "cos"}
    mask_source = [
        node("Equal", ["ids", "i1"], "pad", "is_pad"),
        node("Not", ["pad"], "real", "is_real"),
        node("Cast", ["real"], "mask", "as_int", to=onnx.TensorProto.INT64),
        node("CumSum", ["mask", "i0"], "count", "count"),
        node("Sub", ["count", "i1"], "pos", "minus_one"),
    ]
    io = ([("ids", I64, [16])], [("y", F, [16, 4])])
    found = _periodic(_positions_nodes(mask_source), *io, inits)
    assert found == {"to_float", "as_column", "outer", "cos"}
    float_source = [  # `torch.arange(n, dtype=float)`: a float `Range`
        *shape_source[:3],
        node("Cast", ["n"], "nf", "length_float", to=onnx.TensorProto.FLOAT),
        node("Range", ["f0", "nf", "f1"], "pos", "positions"),
    ]
    inits |= {"f0": np.float32(0), "f1": np.float32(1)}
    io = ([("x", F, [2, 16])], [("y", F, [16, 4])])
    found = _periodic(_positions_nodes(float_source), *io, inits)
    assert found == {"to_float", "as_column", "outer", "cos"}


def test_periodic_arguments_through_einsum_cumsum_and_resize():
    """wav2vec2-conformer's rotary `einsum("i,j->ij", positions, inv_freq)`, and a sine
    generator's phase `Resize(CumSum(f0 / sr) · 2π)` (StyleTTS2's SineGen): each carries the
    argument and is found."""
    rotary = [
        node("Cast", ["pos"], "posf", "to_float", to=onnx.TensorProto.FLOAT),
        node("Einsum", ["posf", "inv"], "freqs", "outer", equation="i,j->ij"),
        node("Cos", ["freqs"], "y", "cos"),
    ]
    inits = {"inv": np.ones(4, np.float32)}
    found = _periodic(rotary, [("pos", I64, [16])], [("y", F, [16, 4])], inits)
    assert found == {"to_float", "outer", "cos"}
    sine = [
        node("Div", ["f0", "sr"], "rad", "per_sample"),
        node("CumSum", ["rad", "axis"], "turns", "accumulate"),
        node("Mul", ["turns", "tau"], "phase", "radians"),
        node("Resize", ["phase", "", "scales"], "up", "upsample", mode="linear"),
        node("Sin", ["up"], "y", "sin"),
    ]
    inits = {"sr": np.float32(24000), "axis": np.array(2, np.int64), "tau": np.float32(6.28)}
    inits["scales"] = np.array([1, 1, 4], np.float32)
    found = _periodic(sine, [("f0", F, [1, 1, 32])], [("y", F, [1, 1, 128])], inits)
    assert found == {"per_sample", "accumulate", "radians", "upsample", "sin"}
