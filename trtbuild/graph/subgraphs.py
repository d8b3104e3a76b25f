"""Control flow: the bodies of `If`, `Loop` and `Scan` nodes, and what they read.

Why one module: the view, the passes, the conversion, the emulation and the
streaming runs all ask the same questions of a node with a body ("which graphs
does it hold", "which outer values does it read"); a body reads values of the
enclosing graphs by name, without listing them as inputs, so a question asked
of `node.input` alone misses them.

Qualified names: a node inside a body is named `{control node}/{attribute}/{node}`,
for example `If_0/then_branch/Conv_3` (`passes.basic.name_unnamed_nodes`
writes them), so rules, reports and pins name it like any other node.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import onnx

from trtbuild.graph.domains import DEFAULT_DOMAINS

CONTROL_FLOW = frozenset({"If", "Loop", "Scan"})
_GRAPH = onnx.AttributeProto.GRAPH


def bodies(node: onnx.NodeProto) -> list[tuple[str, onnx.GraphProto]]:
    """(attribute name, graph) of every body a node holds, in attribute order; none where
    the op's schema declares no graph (onnx.checker, which every model passes on its
    load, refuses one there)."""
    if not may_hold_bodies(node.domain, node.op_type):
        return []
    return [(a.name, a.g) for a in node.attribute if a.type == _GRAPH]


def has_body(node: onnx.NodeProto) -> bool:
    """Whether `bodies(node)` holds any (without building the list)."""
    return may_hold_bodies(node.domain, node.op_type) and any(
        a.type == _GRAPH for a in node.attribute
    )


@functools.cache
def may_hold_bodies(domain: str, op_type: str) -> bool:
    """Whether a node of this op may hold a graph: any op of another domain (a custom
    op's attributes are its own), and the default domain's ops whose schema has a graph
    attribute (If, Loop, Scan, SequenceMap).

    Why: every pass asks each node, and most of a graph's 10k nodes are MatMuls and Adds
    whose attributes need not be read; onnx.checker refuses an attribute a schema does
    not declare, so the schema's answer is the node's.
    """
    if domain not in DEFAULT_DOMAINS:
        return True
    try:
        schema = onnx.defs.get_schema(op_type)  # the newest: control flow kept its bodies
    except onnx.defs.SchemaError:
        return True
    graphs = (onnx.defs.OpSchema.AttrType.GRAPH, onnx.defs.OpSchema.AttrType.GRAPHS)
    return any(a.type in graphs for a in schema.attributes.values())


def defined_in(graph: onnx.GraphProto) -> set[str]:
    """Names a graph defines itself: its inputs, initializers and node outputs."""
    names = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    names.update(o for n in graph.node for o in n.output if o)
    return names


def outer_reads(graph: onnx.GraphProto) -> set[str]:
    """Names a body (and the bodies inside it) reads from the graphs around it."""
    own = defined_in(graph)
    reads = {t for n in graph.node for t in n.input if t}
    reads.update(o.name for o in graph.output)
    for n in graph.node:
        for _, body in bodies(n):
            reads |= outer_reads(body)
    return reads - own


def node_reads(node: onnx.NodeProto) -> list[str]:
    """Every value a node needs to run: its inputs and, for control flow, what its bodies read."""
    reads = [t for t in node.input if t]
    for _, body in bodies(node):
        reads.extend(sorted(outer_reads(body) - set(reads)))
    return reads


def walk(graph: onnx.GraphProto, scope: str = "") -> Iterator[tuple[str, onnx.GraphProto]]:
    """(scope, graph) for `graph` and every body inside it, outermost first.

    The scope of a body is `{control node}/{attribute}`, the prefix of its nodes'
    qualified names; the main graph's scope is "".
    """
    yield scope, graph
    for n in graph.node:
        for attr, body in bodies(n):
            yield from walk(body, f"{n.name}/{attr}")


def all_nodes(model: onnx.ModelProto) -> Iterator[onnx.NodeProto]:
    """Every node of the model, bodies included."""
    for _, graph in walk(model.graph):
        yield from graph.node


def free_name(name: str, taken: set[str]) -> str:
    """`name`, or `name__1`, `name__2`, ...: the first that `taken` does not hold."""
    found, k = name, 0
    while found in taken:
        k += 1
        found = f"{name}__{k}"
    return found


def new_name(base: str, taken: set[str]) -> str:
    """`free_name`, then taken: a name made for a model, never made twice."""
    name = free_name(base, taken)
    taken.add(name)
    return name


def held_tensors(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    """Every weight and `Constant`'s value by name, bodies included (before `prepare` lifts
    the Constants): the tensors themselves, so a change to one is the model's."""
    found: dict[str, onnx.TensorProto] = {}
    for _, graph in walk(model.graph):
        found.update((t.name, t) for t in graph.initializer)
        for n in graph.node:
            value = next((a.t for a in n.attribute if a.name == "value"), None)
            if n.op_type == "Constant" and value is not None and n.output:
                found[n.output[0]] = value
    return found


def carried(node: onnx.NodeProto) -> tuple[int, int, int, int]:
    """A Loop's or Scan's carried values: (how many, first node input, first body input,
    first body output); a node's outputs start with them. Loop: M and cond come first."""
    if node.op_type == "Loop":
        return len(node.input) - 2, 2, 2, 1
    n_scan = next(a.i for a in node.attribute if a.name == "num_scan_inputs")
    if batched_scan(node):  # Scan-8: `sequence_lens` first, then the carried values
        return len(node.input) - 1 - n_scan, 1, 0, 0
    return len(node.input) - n_scan, 0, 0, 0


def batched_scan(node: onnx.NodeProto) -> bool:
    """Whether `node` is an opset-8 Scan: its first input `sequence_lens` (which its body
    does not take), and a batch axis on every carried value and scanned input."""
    held = dict(bodies(node)) if node.op_type == "Scan" else {}
    return "body" in held and len(node.input) == len(held["body"].input) + 1


def typing_problem(node: onnx.NodeProto) -> str | None:
    """Why a control node's bodies cannot be typed consistently, or None.

    The conversion keeps every body's inputs and outputs in their declared
    types; that holds only where an If's branches declare one type per output
    and a Loop's or Scan's body hands each carried value back in the type it
    takes it in.
    """
    held = dict(bodies(node))
    if node.op_type == "If" and len(held) == 2:
        pairs = zip(held["then_branch"].output, held["else_branch"].output)
        what = (
            "its then_branch output {k} ({a}) is {ta} but its else_branch output {k} ({b}) is {tb}"
        )
    elif node.op_type in ("Loop", "Scan") and "body" in held:
        n, _, first_in, first_out = carried(node)
        body = held["body"]
        pairs = zip(body.input[first_in : first_in + n], body.output[first_out : first_out + n])
        what = "its body takes carried value {k} ({a}) as {ta} but hands it back ({b}) as {tb}"
    else:
        return None
    for k, (a, b) in enumerate(pairs):
        ta, tb = _elem(a), _elem(b)
        if ta and tb and ta != tb:
            return what.format(k=k, a=a.name, b=b.name, ta=_type_name(ta), tb=_type_name(tb))
    return None


def _elem(vi: onnx.ValueInfoProto) -> int:
    return vi.type.tensor_type.elem_type if vi.type.HasField("tensor_type") else 0


def _type_name(elem: int) -> str:
    return onnx.helper.tensor_dtype_to_np_dtype(elem).name
