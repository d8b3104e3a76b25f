"""Graph passes that make the ONNX graph look the way TensorRT will see it.

Each pass takes a model and returns `(model, PassRecord)`. Why records: users
write policies against node names, so every change a pass makes must be
visible in `build.json` and the report, and node names must survive.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from trtbuild import words
from trtbuild.errors import UsageError
from trtbuild.graph import subgraphs
from trtbuild.graph.domains import DEFAULT_DOMAINS
from trtbuild.graph.model_io import IR_UNLISTED_WEIGHTS, fed_inputs, no_input
from trtbuild.graph.optypes import SHAPE_READERS  # folded from shapes alone, whatever the values
from trtbuild.graph.subgraphs import free_name
from trtbuild.shared import Shared
from trtbuild.sizes import fmt_bytes


@dataclass
class PassRecord:
    name: str
    changed: int = 0
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"pass": self.name, "changed": self.changed, **self.details}

    def summary(self) -> list[str]:
        """One line for the pass, then one per item it left alone and why."""
        scalars = {k: v for k, v in self.details.items() if not isinstance(v, list)}
        head = f"{self.name}: {self.changed} change(s)"
        head += "".join(f", {k} {v}" for k, v in scalars.items())
        lists = {k: v for k, v in self.details.items() if isinstance(v, list)}
        for key, items in lists.items():
            names = [i["name"] for i in items if isinstance(i, dict) and "name" in i]
            if names and not any("why" in i for i in items):
                shown = ", ".join(names[:4]) + (f", ... ({len(names)})" if len(names) > 4 else "")
                head += f"; {key.replace('_', ' ')}: {shown}"
        lines = [head]
        for items in lists.values():
            lines += [
                f"  {i['name']}: {i['why']}" for i in items if isinstance(i, dict) and "why" in i
            ]
        return lines


def copied(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy for a pass to change: the caller's model stays as it was."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def lift_constants(model: onnx.ModelProto) -> tuple[onnx.ModelProto, PassRecord]:
    """Turn `Constant` nodes into initializers, as TensorRT sees weights.

    Why: precision rules and range analysis reason about weights, and exporters
    (Paddle, older PyTorch) write them as `Constant` nodes. A constant inside a
    control-flow body becomes an initializer of the main graph, which the body
    reads from outside (names are unique by then): the conversion types weights
    there, once, whichever body reads them.
    """
    record = PassRecord("lift_constants")
    inner = [g for scope, g in subgraphs.walk(model.graph) if scope and g.initializer]
    if not inner and not any(n.op_type == "Constant" for n in subgraphs.all_nodes(model)):
        return model, record
    model = copied(model)  # passes never change their input
    held = {t.name: t for t in model.graph.initializer}
    for scope, graph in subgraphs.walk(model.graph):
        if scope and graph.initializer:  # a body's own weights move out with its constants
            record.changed += _move_out(model.graph, graph, held)
        keep = []
        for node in graph.node:
            value = (
                _constant_value(node)
                if node.op_type == "Constant" and node.domain in DEFAULT_DOMAINS
                else None
            )
            if value is None:
                keep.append(node)
                continue
            model.graph.initializer.append(numpy_helper.from_array(value, node.output[0]))
            record.changed += 1
        if len(keep) != len(graph.node):
            del graph.node[:]
            graph.node.extend(keep)
    return model, record


def _move_out(main: onnx.GraphProto, body: onnx.GraphProto, held: dict) -> int:
    """Move a body's weights into the main graph (`held`: its weights by name); returns
    how many.

    Why: onnx-graphsurgeon's fold writes a value it folded in the main graph that a body
    also reads into both graphs, under one name (Mask R-CNN's `/transform/Constant_2`,
    read by its mask head's `Loop`): moved as it is, the main graph held that name twice,
    which onnx.checker refuses. The main graph's copy of the same value stands for both; a
    body's weight of another value under a taken name is renamed in that body first.
    """
    renamed: dict[str, str] = {}
    for tensor in body.initializer:
        known = held.get(tensor.name)
        if known is not None and _same_weight(known, tensor):
            continue
        if known is not None:  # a name no value of the model has, the weights moved so far
            taken = set(held).union(*(subgraphs.defined_in(g) for _, g in subgraphs.walk(main)))
            renamed[tensor.name] = free_name(tensor.name, taken)
            tensor.name = renamed[tensor.name]
        main.initializer.append(tensor)
        held[tensor.name] = main.initializer[-1]
    moved = len(body.initializer)
    del body.initializer[:]
    if renamed:
        rename_values(body, renamed)
    return moved


def _same_weight(a: onnx.TensorProto, b: onnx.TensorProto) -> bool:
    """Whether two weights hold the same type, dims and values, bit for bit."""
    if a.data_type != b.data_type or list(a.dims) != list(b.dims):
        return False
    x, y = numpy_helper.to_array(a), numpy_helper.to_array(b)
    if x.dtype == object:  # strings: their bytes are not the array's
        return bool(np.array_equal(x, y))
    return x.tobytes() == y.tobytes()


def body_outputs_made_inside(model: onnx.ModelProto) -> tuple[onnx.ModelProto, PassRecord]:
    """An `Identity` for each body output its body does not make (a weight or a value of
    the graphs around it), or names a second time, which then makes it; the last of the
    passes.

    Why: ONNX Runtime refuses a body that hands out a value of the graphs around it ("an
    outer scope value being returned directly"), and lifting constants and folding make
    such bodies: torchvision's SSD exports an `If` whose branch is one `Constant`, a weight
    of the main graph once lifted. A body output is its control node's by position, so
    the output gets a new name, not the value.
    """
    record = PassRecord("body_outputs")
    bodies = [g for scope, g in subgraphs.walk(model.graph) if scope]
    if not any(_handed_in(body) for body in bodies):
        return model, record
    model = copied(model)  # passes never change their input
    graphs = list(subgraphs.walk(model.graph))
    taken = {n.name for _, g in graphs for n in g.node}  # node and value names: one each
    taken.update(t for _, g in graphs for t in subgraphs.defined_in(g))
    for scope, body in graphs[1:]:  # each output slot its own Identity (`[k, k]`: two)
        for out in _handed_in(body):
            inside = free_name(f"{scope}/{out.name}", taken)
            taken.add(inside)
            body.node.append(helper.make_node("Identity", [out.name], [inside], name=inside))
            out.name = inside
            record.changed += 1
    return model, record


def weight_outputs_made(model: onnx.ModelProto) -> tuple[onnx.ModelProto, PassRecord]:
    """An `Identity` makes each graph output that is a weight (a constant output, or one
    folding made constant), which is renamed for it; with `body_outputs_made_inside`, the
    last of the passes.

    Why: every run the judge makes hands out what nodes make, and a weight no node makes
    was missing from the outputs compared (exit 70). Outputs keep their names: they are
    the model's interface (a detector's constant strides, an `im_info`).
    """
    record = PassRecord("weight_outputs")
    graph = model.graph
    weights = {t.name for t in graph.initializer} - {i.name for i in graph.input}
    made = {o for n in graph.node for o in n.output}
    handed = [o.name for o in graph.output if o.name in weights and o.name not in made]
    if not handed:
        return model, record
    model = copied(model)  # passes never change their input
    graph = model.graph
    taken: set[str] = set()  # node and value names: one each
    for _, g in subgraphs.walk(graph):
        taken.update(n.name for n in g.node)
        taken.update(subgraphs.defined_in(g))
    for name in dict.fromkeys(handed):
        weight = free_name(f"{name}__weight", taken)
        taken.add(weight)
        rename_values(graph, {name: weight})
        for out in graph.output:
            out.name = name if out.name == weight else out.name
        graph.node.append(
            helper.make_node("Identity", [weight], [name], name=free_name(name, taken))
        )
        record.changed += 1
    return model, record


def _handed_in(body: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    """The outputs of `body` that it does not make, and each output after the first that
    names the same value (ONNX Runtime 1.32 hands one of the two slots out as zeros)."""
    made = {o for n in body.node for o in n.output} | {i.name for i in body.input}
    found, seen = [], set()
    for out in body.output:
        if out.name not in made or out.name in seen:
            found.append(out)
        seen.add(out.name)
    return found


def dense_weights(
    model: onnx.ModelProto, budget: int | None = None
) -> tuple[onnx.ModelProto, PassRecord]:
    """Sparse weights (a graph's `sparse_initializer`, a `Constant`'s `sparse_value`, in
    bodies and local functions too) made dense, as TensorRT's parser makes them; first of all the passes.

    Why: onnx's version converter refuses them ("Sparse tensors not supported"), shape
    inference does not type them, onnx-graphsurgeon's fold drops them, and a sparse
    weight listed as a graph input too would stay an FP32 input of an FP16 weight.
    `budget` bounds, in bytes, what one dense tensor may take (None: the machine's
    default budget).

    Raises:
        UsageError: a weight that would take more than `budget` dense.
    """
    record = PassRecord("dense_weights")
    if not any(_sparse_in(graph, nodes) for graph, nodes in _holders(model)):
        return model, record
    model = copied(model)  # passes never change their input
    limit = budget if budget is not None else _default_budget()
    for graph, nodes in _holders(model):
        for sparse in graph.sparse_initializer if graph is not None else ():
            name = sparse.values.name
            graph.initializer.append(
                numpy_helper.from_array(dense_array(sparse, name, limit), name)
            )
            record.changed += 1
        if graph is not None:
            del graph.sparse_initializer[:]
        for node in nodes:
            if node.op_type != "Constant" or node.domain not in DEFAULT_DOMAINS:
                continue
            for attr in node.attribute:
                if attr.name == "sparse_value":
                    value = dense_array(attr.sparse_tensor, node.output[0], limit)
                    attr.CopyFrom(helper.make_attribute("value", numpy_helper.from_array(value)))
                    record.changed += 1
    return model, record


def _holders(model: onnx.ModelProto) -> Iterator[tuple[onnx.GraphProto | None, Any]]:
    """(graph, its nodes) for the main graph and every body, then (None, a local function's
    nodes) and its nodes' bodies: everywhere a weight may be written."""
    for _, graph in subgraphs.walk(model.graph):
        yield graph, graph.node
    for function in model.functions:
        yield None, function.node
        for node in function.node:
            for _, body in subgraphs.bodies(node):
                for _, graph in subgraphs.walk(body):
                    yield graph, graph.node


def _sparse_in(graph: onnx.GraphProto | None, nodes: Any) -> bool:
    """Whether `graph` (None: a function) or its own `nodes` (not their bodies) hold a
    sparse weight."""
    return (graph is not None and bool(graph.sparse_initializer)) or any(
        node.op_type == "Constant" and any(a.name == "sparse_value" for a in node.attribute)
        for node in nodes
    )


def _default_budget() -> int:
    """The machine's default memory budget, read where a pass is given none (lazily: the
    policy's module is not needed by a pass that has a budget)."""
    from trtbuild.policy.specs import default_memory_budget

    return default_memory_budget()


def dense_array(sparse: onnx.SparseTensorProto, name: str, limit: int) -> np.ndarray:
    """The dense value of `sparse`, as ONNX defines it: zeros (empty strings) but at
    `indices`, which are [NNZ] positions in the flattened tensor or [NNZ, rank]
    coordinates; refused where it would take more than `limit` bytes, since the dims of
    a sparse tensor of a few bytes may describe any size.

    Raises:
        UsageError: dense, it would take more than `limit` bytes.
    """
    values = numpy_helper.to_array(sparse.values).reshape(-1)
    dims = tuple(int(d) for d in sparse.dims)
    size = int(np.prod(dims, dtype=np.int64)) * values.dtype.itemsize
    if size > limit:
        raise UsageError(
            f"the sparse weight {name!r} is {fmt_bytes(size)} dense ({list(dims)}, "
            f"{values.dtype}), more than the {fmt_bytes(limit)} one tensor may take: "
            "TensorRT's parser makes it dense too",
            where="the model",
            hint="give the model with that weight stored dense, or raise "
            "accuracy.memory_budget if the machine has the memory",
        )
    empty = "" if values.dtype == object else 0  # a string tensor's zero is ""
    dense = np.full(dims, empty, dtype=values.dtype)
    indices = numpy_helper.to_array(sparse.indices).astype(np.int64) if values.size else None
    if indices is not None and indices.ndim == 1:
        dense.reshape(-1)[indices] = values
    elif indices is not None:
        dense[tuple(indices.T)] = values
    return dense


def _constant_value(node: onnx.NodeProto) -> np.ndarray | None:
    for attr in node.attribute:
        if attr.name == "value":
            return numpy_helper.to_array(attr.t)
        if attr.name == "value_float":
            return np.array(attr.f, dtype=np.float32)
        if attr.name == "value_floats":
            return np.array(list(attr.floats), dtype=np.float32)
        if attr.name == "value_int":
            return np.array(attr.i, dtype=np.int64)
        if attr.name == "value_ints":
            return np.array(list(attr.ints), dtype=np.int64)
    return None  # value_string(s) constants stay nodes (`dense_weights` made sparse ones dense)


def foldable(model: onnx.ModelProto) -> bool:
    """Whether onnx-graphsurgeon could change anything: a node fed by constants only,
    a shape op, or a node nothing consumes. One linear scan; importing, folding and
    exporting a 10k-node graph costs seconds even where nothing folds."""
    graph = model.graph
    const = {t.name for t in graph.initializer} | {""}
    used = {o.name for o in graph.output}
    reads = [subgraphs.node_reads(n) for n in graph.node]  # a body's reads are walked once
    for r in reads:
        used.update(r)
    for n, r in zip(graph.node, reads):
        if n.op_type in SHAPE_READERS or all(i in const for i in r):
            return True
        if not any(o in used for o in n.output):
            return True
    return False


def fold_constants(
    model: onnx.ModelProto, verbose: bool = False, budget: int | None = None
) -> tuple[onnx.ModelProto, PassRecord]:
    """Fold constant subgraphs and drop dead nodes with onnx-graphsurgeon, within `budget`.

    A node whose output would exceed `budget` bytes (default: the machine's
    `default_memory_budget()`) is not computed (`fold_budget.oversized`, read
    from shapes before the fold runs) and is listed under `unfolded`: a model
    must not make `prepare` allocate what it describes in a few bytes.
    Its log and that of the ONNX Runtime session it folds with (`foldable nodes
    that produce large outputs`, `UnsqueezeElimination cannot remove node`) are
    shown with `--verbose` only: the terminal shows trtbuild's lines. An `If`
    whose condition folds stays for `control.inline_constant_ifs`: onnx-graphsurgeon's
    own flattening leaves the readers of its outputs dangling.
    """
    if not foldable(model):
        return model, PassRecord("fold_constants", details={"skipped": "nothing to fold"})
    import onnx_graphsurgeon as gs

    from trtbuild.passes.fold_budget import oversized
    from trtbuild.policy.specs import default_memory_budget

    unfolded = oversized(model, budget if budget is not None else default_memory_budget())
    excluded = {u["name"] for u in unfolded}
    with quiet_dependencies(verbose):  # its import warns of every FP8 weight, unasked
        graph = gs.import_onnx(
            _shape_ranges_sliced(_io_declared_once(_shapes_for_shape_ops(model)))
        )
        graph.fold_constants(
            error_ok=True, flatten_subgraphs=False, should_exclude_node=lambda n: n.name in excluded
        ).cleanup(remove_unused_graph_inputs=False).toposort()
        folded = gs.export_onnx(graph, do_type_check=False)
    # gs writes its own producer/ir version; keep the model's metadata and opsets.
    folded.ir_version = model.ir_version
    del folded.opset_import[:]
    folded.opset_import.extend(model.opset_import)
    folded.producer_name = model.producer_name
    folded.producer_version = model.producer_version
    _keep_body_weights(model, folded)
    # the model's nodes gone (a ranged Shape's Slice, `_shape_ranges_sliced`, is none of them)
    removed = len({n.name for n in model.graph.node} - {n.name for n in folded.graph.node})
    record = PassRecord("fold_constants", changed=removed, details={"nodes_removed": removed})
    if unfolded:
        record.details["unfolded"] = unfolded
    return folded, record


def _shapes_for_shape_ops(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` shape-inferred where a main-graph `Shape` or `Size` reads a tensor whose
    shape the model does not declare; `model` itself otherwise (no inference's cost).

    Why: onnx-graphsurgeon folds a `Shape` from its input's declared shape only. A
    quantizer inserts Q/DQ pairs after the export declared every shape (ModelOpt's INT8
    ViT: the key's DQ output, read by the `Shape` of `1/sqrt(head_dim)`), so the 12 Shapes
    the float export folds stayed, and `check` counted their 48 scalar nodes as FP32 pins
    of `guard:shape-arithmetic`.
    """
    g = model.graph
    known = {v.name for v in (*g.value_info, *g.input, *g.output)}
    known.update(t.name for t in g.initializer)
    if all(n.op_type not in SHAPE_READERS or not n.input or n.input[0] in known for n in g.node):
        return model
    from trtbuild.graph.model_io import infer_shapes

    return infer_shapes(model)


def _shape_ranges_sliced(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with each `Shape` that keeps a range of the dims (opset 15's `start`, `end`)
    made a whole `Shape` and a `Slice` of that range (a copy, where there is one).

    Why: onnx-graphsurgeon folds a `Shape` (and a `Gather` or `Slice` of one) from its
    input's whole shape, and ignores `start` and `end`: `Shape(q, start=-2, end=-1)` of a
    `[2, 4, 24]` query folded to `[2, 4, 24]`, not `[4]`, so every Reshape built from it
    computed another model (ONNX's expanded Attention, RMSNorm, GroupNormalization). The
    `Slice` it folds right; where the dims are dynamic the two nodes compute what the one did.
    """
    if not any(n.op_type == "Shape" and n.attribute for n in subgraphs.all_nodes(model)):
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    taken = {t for n in subgraphs.all_nodes(copy) for t in (*n.input, *n.output, n.name)}
    taken.update(t.name for _, g in subgraphs.walk(copy.graph) for t in g.initializer)
    for _, graph in subgraphs.walk(copy.graph):
        nodes: list[onnx.NodeProto] = []
        for node in graph.node:
            nodes.append(node)
            if node.op_type == "Shape" and node.attribute:
                nodes.append(_ranged(node, graph, taken))
        del graph.node[:]
        graph.node.extend(nodes)
    return copy


def _ranged(node: onnx.NodeProto, graph: onnx.GraphProto, taken: set[str]) -> onnx.NodeProto:
    """Make `node` (a ranged `Shape`) whole; return the `Slice` of its range, which takes its
    output over, its bounds weights of `graph`."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    bounds = (attrs.get("start", 0), attrs.get("end", np.iinfo(np.int64).max), 0)
    names = [subgraphs.new_name(f"{node.name}/{k}", taken) for k in ("starts", "ends", "axes")]
    graph.initializer.extend(
        numpy_helper.from_array(np.array([b], np.int64), n) for b, n in zip(bounds, names)
    )
    out = node.output[0]
    whole = subgraphs.new_name(f"{out}/whole", taken)
    del node.attribute[:]
    node.output[0] = whole
    name = subgraphs.new_name(f"{node.name}/range", taken)
    return helper.make_node("Slice", [whole, *names], [out], name=name)


def _io_declared_once(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` without the value_info entries that declare a graph input or output again
    (a copy, where there are any).

    Why: onnx-graphsurgeon takes such a second declaration over the graph's own, so a
    bare FLOAT there (a dynamically quantized OCR model's `[1, seqlen]` output) came out
    of the fold without its shape, which onnx.checker refuses on a graph output.
    """
    graph = model.graph
    io = {v.name for v in (*graph.input, *graph.output)}
    if not any(v.name in io for v in graph.value_info):
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    kept = [v for v in copy.graph.value_info if v.name not in io]
    del copy.graph.value_info[:]
    copy.graph.value_info.extend(kept)
    return copy


def _keep_body_weights(source: onnx.ModelProto, folded: onnx.ModelProto) -> None:
    """Put back the weights only a control-flow body reads, which onnx-graphsurgeon drops.

    Why: its cleanup counts the main graph's readers of a weight, not a body's
    (which reads it from outside by name), and exports the model without it.
    """
    defined = subgraphs.defined_in(folded.graph)
    read = {t for n in folded.graph.node for t in subgraphs.node_reads(n)}
    lost = read - defined
    folded.graph.initializer.extend(t for t in source.graph.initializer if t.name in lost)


def override_input_shapes(
    model: onnx.ModelProto, shapes: tuple[tuple[str, tuple[int | str, ...]], ...]
) -> tuple[onnx.ModelProto, PassRecord]:
    """Polygraphy's `surgeon sanitize --override-input-shapes`: new declared input shapes.

    Why: exporters write a placeholder shape (a face detector traced at
    [10, 3, 32, 32]) that its runtime makes dynamic when it loads the model. A
    dim given as a name becomes dynamic. The outputs' and intermediates' shapes
    inferred from the old ones are cleared; `prepare` infers them again.
    """
    record = PassRecord("override_input_shapes")
    if not shapes:
        return model, record
    inputs_named(model, [name for name, _ in shapes], "passes.override_input_shapes")
    model = copied(model)
    given = dict(shapes)
    for vi in model.graph.input:
        if vi.name in given:
            _set_dims(vi, given[vi.name])
            record.changed += 1
    for vi in model.graph.output:
        vi.type.tensor_type.ClearField("shape")
    del model.graph.value_info[:]
    record.details["inputs"] = {n: list(d) for n, d in shapes}
    return model, record


def inputs_named(model: onnx.ModelProto, names: list[str], field: str) -> None:
    """Exit 2, naming the policy's field, for a name that is not one of the model's inputs:
    as the error's `field`, so the caller that holds the policy names its file and line
    (`errors.fields_located`), where the name is written (`freeze_inputs` named no file)."""
    inputs = [i.name for i in fed_inputs(model)]
    for name in names:
        if name not in inputs:
            said = no_input(words.field(*field.split("."), name), name, inputs)
            at = (*field.split("."), name)
            raise UsageError(said.message.split(": ", 1)[1], hint=said.hint, field=at)


def _set_dims(vi: onnx.ValueInfoProto, dims: tuple[int | str, ...]) -> None:
    shape = vi.type.tensor_type.shape
    del shape.dim[:]
    for d in dims:
        dim = shape.dim.add()
        if isinstance(d, str):
            dim.dim_param = d
        else:
            dim.dim_value = d


def drop_initializer_inputs(model: onnx.ModelProto) -> tuple[onnx.ModelProto, PassRecord]:
    """Weights listed as graph inputs too (exports before IR version 4) become weights only,
    and a model of IR version 3 becomes version 4.

    Why: the mixed model stores a weight in FP16 while its graph input would
    still be declared FP32, which neither `onnx.checker` nor ONNX Runtime
    accepts; a weight is not an input anyone feeds. IR 3 requires every weight to be
    an input, and the passes add weights (a lifted `Constant`, a fold): the mixed model
    of an IR 3 export with no weight listed failed `onnx.checker` (exit 70).
    """
    record = PassRecord("drop_initializer_inputs")
    kept = fed_inputs(model)
    listed = len(model.graph.input) - len(kept)
    if not listed and model.ir_version >= IR_UNLISTED_WEIGHTS:
        return model, record
    model = copied(model)  # `extend` copies the kept inputs into the copy
    del model.graph.input[:]
    model.graph.input.extend(kept)
    if model.ir_version < IR_UNLISTED_WEIGHTS:
        record.details["ir_version"] = f"{model.ir_version} -> {IR_UNLISTED_WEIGHTS}"
        model.ir_version = IR_UNLISTED_WEIGHTS
    record.changed = listed
    return model, record


def _dependencies_quiet() -> Callable[[], object]:
    from onnx_graphsurgeon.logger import G_LOGGER

    from trtbuild.ortload import onnxruntime

    ort = onnxruntime()
    old = G_LOGGER.severity
    G_LOGGER.severity = G_LOGGER.ERROR
    ort.set_default_logger_severity(4)  # fatal only: folding failures are skipped, not errors

    def undo() -> None:
        G_LOGGER.severity = old
        ort.set_default_logger_severity(2)  # ONNX Runtime's default; it has no getter

    return undo


# set by the first thread to fold, given back by the last (`shared`): two builds at once
# left onnx-graphsurgeon's log at errors when each restored what it found
_QUIET = Shared(_dependencies_quiet)


@contextlib.contextmanager
def quiet_dependencies(verbose: bool) -> Iterator[None]:
    """onnx-graphsurgeon's log at errors and ONNX Runtime's default logger at fatal only
    (a fold that fails is skipped, not an error), given back after.

    ONNX Runtime's default logger belongs to the process: it is set for the
    fold and restored to its default (warnings) after, not left changed.
    """
    if verbose:
        yield
        return
    with _QUIET.held():
        yield


def name_unnamed_nodes(model: onnx.ModelProto) -> tuple[onnx.ModelProto, PassRecord]:
    """Give every node a unique name: rules, reports and TensorRT layers are keyed by it.

    A node inside a control-flow body gets its qualified name,
    `{control node}/{attribute}/{node}` (`If_0/then_branch/Conv_3`), and a value
    a body defines under a name used elsewhere in the model (two loops' `i`)
    is renamed with the body's scope: the policy sees all nodes in one list.
    """
    record = PassRecord("name_nodes")
    names = [n.name for n in model.graph.node]
    nested = any(subgraphs.has_body(n) for n in model.graph.node)
    if all(names) and len(set(names)) == len(names) and not nested:
        return model, record
    model = copied(model)  # passes never change their input
    seen: set[str] = set()
    record.changed += _name_graph(model.graph, "", seen)
    if nested:
        record.changed += _unique_values(model.graph, "", set())
    return model, record


def _name_graph(graph: onnx.GraphProto, scope: str, seen: set[str]) -> int:
    changed = 0
    prefix = f"{scope}/" if scope else ""
    for i, node in enumerate(graph.node):
        wanted = node.name if node.name.startswith(prefix) else prefix + node.name
        name = wanted
        if not node.name or wanted in seen:  # `{name or op}__{index}`, the next free index
            base = wanted or f"{prefix}{node.op_type}"
            name, k = f"{base}__{i}", i
            while name in seen:
                k += 1
                name = f"{base}__{k}"
        if name != node.name:
            node.name = name
            changed += 1
        seen.add(name)
        for attr, body in subgraphs.bodies(node):
            changed += _name_graph(body, f"{node.name}/{attr}", seen)
    return changed


def _unique_values(graph: onnx.GraphProto, scope: str, taken: set[str]) -> int:
    """Rename values a body defines under a name already defined elsewhere in the model."""
    changed = 0
    if scope:
        clash = {t for t in subgraphs.defined_in(graph) if t in taken}
        if clash:
            rename_values(graph, {t: f"{scope}/{t}" for t in clash})
            changed += len(clash)
    taken |= subgraphs.defined_in(graph)
    for node in graph.node:
        for attr, body in subgraphs.bodies(node):
            changed += _unique_values(body, f"{node.name}/{attr}", taken)
    return changed


def rename_values(graph: onnx.GraphProto, names: dict[str, str]) -> None:
    """Rename values in a graph and every body inside it, declarations, weights and reads
    (no body may redefine them: names are unique once `name_unnamed_nodes` ran)."""
    for vi in (*graph.input, *graph.output, *graph.value_info):
        vi.name = names.get(vi.name, vi.name)
    for t in graph.initializer:
        t.name = names.get(t.name, t.name)
    for node in graph.node:
        for k, t in enumerate(node.input):
            node.input[k] = names.get(t, t)
        for k, t in enumerate(node.output):
            node.output[k] = names.get(t, t)
        for _, body in subgraphs.bodies(node):
            rename_values(body, names)


def drop_unused_initializers(model: onnx.ModelProto) -> int:
    """Drop, in place, the main graph's weights no node reads (a body's outer reads count),
    none a graph output: what a pass left behind. Returns how many."""
    used = {t for n in model.graph.node for t in subgraphs.node_reads(n)}
    used |= {o.name for o in (*model.graph.output, *model.graph.input)}
    weights = model.graph.initializer
    unused = [i for i, t in enumerate(weights) if t.name not in used]
    for i in reversed(unused):  # in place: the kept weights are not copied
        del weights[i]
    return len(unused)
