"""Inline a model's local functions, each call's nodes named under the call.

Why: precision rules, the FP32 reference's per-tensor walk, the emulation and the report
all work on nodes, and a call of a local function (a module exported with
`torch.onnx.export(..., export_modules_as_functions=...)`, an onnxscript model) is one
opaque node to them: the reference's segment models carry no functions, so ONNX Runtime
refused them ("is not a registered function/op"). TensorRT's parser inlines calls too.

Names: onnx's inliner keeps a body node's name (with a `__N` suffix per call), and one
function's body is shared by all its calls, so each call is first given its own copy of
the function whose nodes are named `{call}/{node or op}`: a rule `name: ^encoder/block1/`
selects what the call `encoder/block1` computed, as it selects an exported scope.
"""

from __future__ import annotations

import onnx
import onnx.inliner

from trtbuild.graph import subgraphs
from trtbuild.passes.basic import PassRecord, copied

FunctionId = tuple[str, str, str]  # domain, name, overload


def inline_functions(model: onnx.ModelProto) -> tuple[onnx.ModelProto, PassRecord]:
    """`model` with every call of a local function replaced by the function's nodes
    (bodies and nested calls included), and the opsets only the functions used dropped."""
    record = PassRecord("inline_functions")
    if not model.functions:
        return model, record
    model = copied(model)  # passes never change their input
    functions = {_function_id(f): f for f in model.functions}
    own: list[onnx.FunctionProto] = []
    before = {n.name for n in subgraphs.all_nodes(model)}  # a user's node keeps its name
    taken = set(before)
    record.changed = _own_copies(list(model.graph.node), functions, own, taken)
    named = taken - before  # the names the copies' nodes were given
    del model.functions[:]
    model.functions.extend(own)
    inlined = onnx.inliner.inline_local_functions(model, convert_version=True)
    del inlined.functions[:]  # a function no node calls is gone with the calls
    _unsuffixed(inlined, named)
    _opsets_used(inlined, {d for d, _, _ in functions}, list(functions.values()))
    record.details = {"functions": [{"name": f.name} for f in functions.values()]}
    return inlined, record


def _function_id(f: onnx.FunctionProto) -> FunctionId:
    return f.domain, f.name, getattr(f, "overload", "")


def _call_of(node: onnx.NodeProto) -> FunctionId:
    return node.domain, node.op_type, getattr(node, "overload", "")


def _own_copies(
    nodes: list[onnx.NodeProto],
    functions: dict[FunctionId, onnx.FunctionProto],
    own: list[onnx.FunctionProto],
    taken: set[str],
) -> int:
    """Point each call among `nodes` (and in their bodies, and in the functions they call)
    at a copy of its function of its own, appended to `own`, whose nodes are named under
    the call, each a name not in `taken` (then added to it). The calls found."""
    calls = 0
    for node in nodes:
        for _, body in subgraphs.bodies(node):
            calls += _own_copies(list(body.node), functions, own, taken)
        found = functions.get(_call_of(node))
        if found is None:
            continue
        copy = onnx.FunctionProto()
        copy.CopyFrom(found)
        copy.name = f"{found.name}__call{len(own)}"  # one per call: its nodes' own names
        for inner in copy.node:
            inner.name = _free(f"{node.name}/{inner.name or inner.op_type}", taken)
        own.append(copy)
        node.op_type = copy.name
        calls += 1 + _own_copies(list(copy.node), functions, own, taken)
    return calls


def _free(name: str, taken: set[str]) -> str:
    """`name`, or `name_1`, `name_2`, ... where it is taken; the one returned is taken."""
    found, k = name, 0
    while found in taken:
        k += 1
        found = f"{name}_{k}"
    taken.add(found)
    return found


def _unsuffixed(model: onnx.ModelProto, named: set[str]) -> None:
    """Each node the inliner named `{name}__N` after a name `_own_copies` gave back its name
    (each such name is given once: one copy per call)."""
    for node in subgraphs.all_nodes(model):
        base, cut, digits = node.name.rpartition("__")
        if cut and digits.isdigit() and base in named:
            node.name = base


def _opsets_used(
    model: onnx.ModelProto, domains: set[str], functions: list[onnx.FunctionProto]
) -> None:
    """The model's opset imports for the domains its nodes use now: the functions' own
    (`domains`) left out where no node uses them, and a domain only a function imported
    (its body's `com.microsoft` ops) imported as the function did (the inliner leaves it
    out)."""
    used = {n.domain or "" for n in subgraphs.all_nodes(model)}
    kept = [o for o in model.opset_import if o.domain not in domains or o.domain in used]
    have = {o.domain for o in kept} | ({"ai.onnx"} if "" in {o.domain for o in kept} else set())
    for f in functions:
        for o in f.opset_import:
            if o.domain in used and o.domain not in have and o.domain not in domains:
                kept.append(onnx.helper.make_opsetid(o.domain, o.version))
                have.add(o.domain)
    del model.opset_import[:]
    model.opset_import.extend(kept)
