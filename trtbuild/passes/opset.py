"""The opset upgrade: onnx.version_converter's, run on what it would change.

Why not the converter on the whole model every time: it infers the whole model's shapes,
imports every node into its C++ graph and exports them back: about 0.2 s on 10k nodes,
the largest part of a cold `convert` beyond its peer's. And most upgrades of a modern
export change no node: every step of every op is one the converter's registry calls
compatible. So:

- an op whose schema, at every version between the two opsets, changed in nothing but
  allowing more types (`_types_widened_only`) needs nothing;
- each distinct node of the other ops goes through the converter alone, with its values'
  types (`_probe`): an adapter reads a node, its attributes and its inputs' types and
  ranks. Where the model does not declare them (a TorchScript export types only its
  inputs and outputs), they are inferred first, as the converter infers them before its
  adapters run;
- where the converter gives every one of those back as it was, the model gets what the
  converter would give it: the shapes its inference writes (later passes read them), and
  the new opset number (`raised`). What its round trip drops (metadata, doc strings,
  denotations, quantization annotations, training info) is kept, as in a model exported
  at that opset. `tests/passes/test_opset.py` holds the prepared graphs equal either way
  on the repository's models at opsets 17, 19, 21 and the newest;
- anything else (a node the converter rewrites, a model inference fails on, control
  flow, whose bodies' types the converter's inference writes, and model-local
  functions) goes through the converter whole, as before. Where the converter runs
  after an inference the shortcut made, that inference was spent for nothing (the
  converter infers again; its cost over a corpus of exports: docs/benchmarks.md).
"""

from __future__ import annotations

import functools
import itertools

import onnx

from trtbuild.errors import UsageError
from trtbuild.graph import subgraphs
from trtbuild.graph.domains import DEFAULT_DOMAINS
from trtbuild.graph.model_io import (
    converter_inferred,
    opset_of,
    with_weight_data,
    without_weight_data,
)
from trtbuild.passes.basic import PassRecord


def upgrade_opset(model: onnx.ModelProto, target: int | None) -> tuple[onnx.ModelProto, PassRecord]:
    """Raise the default-domain opset to at least `target`, as onnx.version_converter does
    (the module's docstring says when it is run on the whole model)."""
    current = opset_of(model)
    record = PassRecord("opset", details={"from": current, "to": current})
    if target is None or target <= current:
        return model, record
    if target > onnx.defs.onnx_opset_version():
        raise UsageError(
            f"opset {target} is newer than this onnx package supports ({onnx.defs.onnx_opset_version()})",
            field=("passes", "opset"),
            hint="lower passes.opset or upgrade onnx",
        )
    record.changed = 1
    record.details["to"] = target
    upgraded = raised(model, current, target)
    if upgraded is None:  # the converter's: the nodes it adds are named
        upgraded = _converted(model, current, target)
        _interface_kept(model, upgraded, current, target)
        added = _name_converter_nodes(model, upgraded)
        if added:
            record.details["added"] = added
    return upgraded, record


def _interface_kept(
    model: onnx.ModelProto, upgraded: onnx.ModelProto, current: int, target: int
) -> None:
    """Exit 2 where the converter changed what the model takes or gives: an input or output
    gone, renamed, or of another element type or dims than the model declares.

    Why: such an upgrade computes another function. Its Scan 8 to 9 adapter drops Scan-8's
    batch axis from the graph's inputs and outputs (ONNX's scan_sum node test: `x` of
    `[1, 3, 2]` became `[3, 2]`), so the prepared model refused the feeds the model takes,
    and every verdict would have been about another model.
    """
    for kind in ("input", "output"):
        before, after = getattr(model.graph, kind), getattr(upgraded.graph, kind)
        was = {v.name: v for v in before}
        now = {v.name: v for v in after}
        for name, vi in was.items():
            said = _declared_as(vi)
            got = _declared_as(now[name]) if name in now else None
            if got is None or not _same_declaration(said, got):
                shown = "gone" if got is None else f"{_shown(got)}, not {_shown(said)}"
                raise UsageError(
                    f"onnx.version_converter changes the model's {kind} '{name}' from opset "
                    f"{current} to {target} ({shown}): the upgraded model computes another "
                    "function",
                    field=("passes", "opset"),
                    hint=f"leave passes.opset at most {current}, or re-export the model at "
                    "the opset you need",
                )


def _declared_as(vi: onnx.ValueInfoProto) -> tuple[int, tuple | None]:
    """A value's element type and dims as declared (0 and None where it declares none)."""
    tt = vi.type.tensor_type
    dims = None
    if vi.type.HasField("tensor_type") and tt.HasField("shape"):
        dims = tuple(
            d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim
        )
    return tt.elem_type, dims


def _same_declaration(said: tuple, got: tuple) -> bool:
    """Whether `got` declares what `said` does (what `said` leaves out may be added)."""
    (t0, d0), (t1, d1) = said, got
    if t0 and t1 != t0:
        return False
    if d0 is None:
        return True
    return (
        d1 is not None and len(d1) == len(d0) and all(a is None or a == b for a, b in zip(d0, d1))
    )


def _shown(declared: tuple) -> str:
    elem, dims = declared
    name = onnx.TensorProto.DataType.Name(elem) if elem else "untyped"
    return f"{name} {list(dims)}" if dims is not None else name


def _converted(model: onnx.ModelProto, current: int, target: int) -> onnx.ModelProto:
    """The converter's output for the whole model, run without the large weights' data
    (`model_io.without_weight_data`: no upgrade adapter reads a weight's values, only the
    downgrades do) and given it back after; where a weight came back changed, the
    converter is run on the model as it is."""
    try:
        out = onnx.version_converter.convert_version(without_weight_data(model), target)
        if with_weight_data(out, model):
            return out
    except Exception:  # said by the converter on the model as it is, if it fails there too
        pass
    try:
        return onnx.version_converter.convert_version(model, target)
    except Exception as exc:
        raise UsageError(
            f"onnx.version_converter cannot take this model from opset {current} to {target}: "
            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
            field=("passes", "opset"),
            hint="choose a lower opset, or re-export the model at the opset you need",
        ) from None


def raised(model: onnx.ModelProto, current: int, target: int) -> onnx.ModelProto | None:
    """`model` at opset `target` as the converter makes it where it would rewrite no node:
    the shapes inferred first, as it infers them (later passes read them: onnx-graphsurgeon
    folds a `Shape` by them), then its default-domain opset raised; the rest kept, the
    metadata its round trip drops too. None where it might rewrite one, where inference
    fails on the model, or where the model imports the default domain twice or not at all
    (then the converter runs on the whole, or refuses it)."""
    graph = model.graph
    defaults = [imp for imp in model.opset_import if imp.domain in DEFAULT_DOMAINS]
    if len(defaults) != 1 or model.functions or any(subgraphs.has_body(n) for n in graph.node):
        return None  # (none or two: the converter's to refuse) functions' nodes are at their
        # own opsets; bodies' types are the converter's inference's
    nodes = _changing(model, current, target)
    wanted = {t for node in nodes for t in (*node.input, *node.output) if t}
    upgraded, types = None, _declared(model, wanted)
    if not _all_shaped(nodes, types):  # an export that declares no value inside its graph
        upgraded = _converter_typed(model)  # as the adapters see it (a rank not found too)
        if upgraded is None:
            return None
        types = _declared(upgraded, wanted)
    probe = _probe(nodes, types, len(graph.node), current, model.ir_version)
    if probe is None or not _kept(probe, target):
        return None
    upgraded = upgraded or _converter_typed(model)
    if upgraded is None:
        return None
    default = next(imp for imp in upgraded.opset_import if imp.domain in DEFAULT_DOMAINS)
    default.domain = default.domain  # the field set (even to ""): the converter writes it
    default.version = target
    return upgraded


def _kept(probe: onnx.ModelProto, target: int) -> bool:
    """Whether the converter gives `probe` back as it was: its nodes, weights and names of
    inputs and outputs (it writes an empty type into a value that had none)."""
    if not probe.graph.node:
        return True
    try:
        out = onnx.version_converter.convert_version(probe, target)
    except Exception:  # the converter on the whole model says why, as before
        return False
    before, after = probe.graph, out.graph
    return (
        list(after.node) == list(before.node)
        and list(after.initializer) == list(before.initializer)
        and [v.name for v in after.input] == [v.name for v in before.input]
        and [v.name for v in after.output] == [v.name for v in before.output]
    )


def _changing(model: onnx.ModelProto, current: int, target: int) -> list[onnx.NodeProto]:
    """The default domain's nodes whose op changed between the opsets in more than its
    types: what the converter's adapters may rewrite."""
    return [
        node
        for node in model.graph.node
        if node.domain in DEFAULT_DOMAINS and not _types_widened_only(node.op_type, current, target)
    ]


def _all_shaped(nodes: list[onnx.NodeProto], types: dict[str, onnx.TypeProto]) -> bool:
    """Whether every input of `nodes` is declared as fully as the converter's inference
    would type it (`_shaped`): then the model need not be inferred before the probe."""
    return all(_shaped(types.get(t)) for node in nodes for t in node.input if t)


def _converter_typed(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """The converter's own inference of `model` (`model_io.converter_inferred`); None
    where it fails (the converter on the whole model says why, as before)."""
    try:
        return converter_inferred(model)
    except Exception:
        return None


def _probe(
    nodes: list[onnx.NodeProto],
    types: dict[str, onnx.TypeProto],
    total: int,
    current: int,
    ir_version: int,
) -> onnx.ModelProto | None:
    """One model of each distinct node of `nodes` (their inputs and outputs named apart,
    typed as `types` says: as declared, `_all_shaped`, or as the converter infers); None
    where most of the model's `total` nodes are distinct (the converter's own pass over
    them is the quicker)."""
    graph = onnx.GraphProto(name="opset_probe")
    seen: set[bytes] = set()
    for node in nodes:
        alone, values = _alone(node, len(seen), types)
        key = _key(alone, values)
        if key in seen:
            continue
        if 2 * len(seen) >= total:
            return None
        seen.add(key)
        graph.node.append(alone)
        n_in = len([t for t in alone.input if t])
        graph.input.extend(values[:n_in])
        graph.output.extend(values[n_in:])
    return onnx.helper.make_model(
        graph,
        opset_imports=[onnx.helper.make_opsetid("", current)],
        ir_version=ir_version,
    )


def _alone(
    node: onnx.NodeProto, k: int, types: dict[str, onnx.TypeProto]
) -> tuple[onnx.NodeProto, list[onnx.ValueInfoProto]]:
    """`node` with its values named apart (`p{k}_i{j}`, `p{k}_o{j}`; an omitted optional
    input stays ""), and the value infos of its inputs, then its outputs, typed as `types`
    says (declared or inferred; untyped where neither gives a type)."""
    alone = onnx.NodeProto()
    alone.CopyFrom(node)
    for held in (alone, *alone.attribute):  # what the converter's round trip drops, kept
        held.ClearField("doc_string")  # by `raised`: no change of the node
    alone.ClearField("metadata_props")
    values = []
    for side, names in (("i", alone.input), ("o", alone.output)):
        for j, name in enumerate(names):
            if not name:
                continue
            names[j] = f"p{k}_{side}{j}"
            info = onnx.ValueInfoProto(name=names[j])
            if name in types:
                info.type.CopyFrom(types[name])
            values.append(info)
    return alone, values


def _key(alone: onnx.NodeProto, values: list[onnx.ValueInfoProto]) -> bytes:
    """What the converter reads of a node: the node (its name and values' names aside)
    and its values' types."""
    node = onnx.NodeProto()
    node.CopyFrom(alone)
    node.name = ""
    node.input[:] = ["x" if t else "" for t in node.input]
    node.output[:] = ["x" if t else "" for t in node.output]
    typed = [v.type.SerializeToString() for v in values]
    return node.SerializeToString() + b"".join(b"%d:%s" % (len(t), t) for t in typed)


def _declared(model: onnx.ModelProto, names: set[str]) -> dict[str, onnx.TypeProto]:
    """The declared type of each of `names` that has one (inputs, outputs, value infos,
    weights), as the converter's import reads them."""
    graph, types = model.graph, {}
    for info in (*graph.input, *graph.output, *graph.value_info):
        if info.name in names and info.HasField("type"):
            types[info.name] = info.type
    for tensor in graph.initializer:
        if tensor.name in names and tensor.name not in types:
            types[tensor.name] = onnx.helper.make_tensor_type_proto(
                tensor.data_type, list(tensor.dims)
            )
    return types


def _shaped(declared: onnx.TypeProto | None) -> bool:
    """Whether a declared type says what the converter's inference would: a tensor's element
    type and rank (any other type as declared)."""
    if declared is None:
        return False
    if declared.HasField("tensor_type"):
        tensor = declared.tensor_type
        return tensor.elem_type != 0 and tensor.HasField("shape")
    return declared.WhichOneof("value") is not None


@functools.cache
def _types_widened_only(op_type: str, current: int, target: int) -> bool:
    """Whether every version of the op from opset `current` to `target` differs from the
    one before it only in allowing more types: the same inputs, outputs and attributes
    (defaults included), each type constraint a superset, none deprecated. onnx's
    converter registers nothing but its compatible adapter for such a step (the test
    reads its registry); the op's nodes need nothing but the opset's number."""
    try:
        versions = {
            onnx.defs.get_schema(op_type, v, "").since_version for v in range(current, target + 1)
        }
    except onnx.defs.SchemaError:  # not an op of one of them: the converter says what to do
        return False
    schemas = [onnx.defs.get_schema(op_type, v, "") for v in sorted(versions)]
    return all(_widened(old, new) for old, new in itertools.pairwise(schemas))


def _widened(old: onnx.defs.OpSchema, new: onnx.defs.OpSchema) -> bool:
    if new.deprecated or _contract(old) != _contract(new):
        return False
    before = {c.type_param_str: set(c.allowed_type_strs) for c in old.type_constraints}
    after = {c.type_param_str: set(c.allowed_type_strs) for c in new.type_constraints}
    return before.keys() == after.keys() and all(before[k] <= after[k] for k in before)


def _contract(schema: onnx.defs.OpSchema) -> tuple:
    """A schema's inputs, outputs, arities and attributes (their defaults included)."""

    def params(ps: list) -> tuple:
        return tuple((p.name, p.type_str, p.option, p.is_homogeneous) for p in ps)

    attrs = {
        name: (a.type, a.required, a.default_value.SerializeToString())
        for name, a in schema.attributes.items()
    }
    arity = (schema.min_input, schema.max_input, schema.min_output, schema.max_output)
    return params(schema.inputs), params(schema.outputs), arity, sorted(attrs.items())


def _name_converter_nodes(
    source: onnx.ModelProto, converted: onnx.ModelProto
) -> list[dict[str, str]]:
    """Name the nodes onnx.version_converter adds after the original node they stand in for.

    Why: the converter rewrites some ops as several (Softmax below opset 13
    becomes Flatten, Softmax, Reshape) and leaves the new nodes unnamed; a name
    like `p2o.Softmax.3/Reshape` keeps every node traceable to the original.
    """
    nodes = list(converted.graph.node)
    if all(n.name for n in nodes):  # most conversions rewrite no node
        return []
    made_by = {out: n.name for n in source.graph.node for out in n.output if n.name}
    consumers: dict[str, list[int]] = {}
    for i, n in enumerate(nodes):
        for t in n.input:
            consumers.setdefault(t, []).append(i)
    taken = {n.name for n in nodes if n.name}
    anchor: dict[int, str] = {}
    for i in range(len(nodes) - 1, -1, -1):  # consumers first, so anchors propagate upstream
        n = nodes[i]
        if n.name:
            anchor[i] = n.name.split("/opset")[0]
            continue
        base = next((made_by[o] for o in n.output if o in made_by), None)
        if base is None:
            users = [c for o in n.output for c in consumers.get(o, []) if c in anchor]
            base = anchor[users[0]] if users else n.op_type
        anchor[i] = base
    added = []
    for i, n in enumerate(nodes):
        if n.name:
            continue
        name, k = f"{anchor[i]}/opset/{n.op_type}", 1
        while name in taken:
            k += 1
            name = f"{anchor[i]}/opset/{n.op_type}_{k}"
        n.name = name
        taken.add(name)
        added.append({"name": name, "from": anchor[i]})
    return added
