"""Structural keys of nodes, and the neighbourhood of a few nodes as a model of its own.

Why: whether ONNX Runtime loads a model is decided node by node and by each node's
surroundings: a kernel exists for an (op, domain, opset, input and output types,
attributes); a graph optimiser matches and rewrites a pattern of a few connected
nodes (`LayerNormFusion` about ten, `NchwcTransformer`'s crash on an FP16
`Transpose` → `Cast` → `MatMul` three). A 10k-node transformer has a few hundred
distinct such neighbourhoods, repeated layer after layer, so a check that loads one
of each (`neighbourhood_model`) and remembers the keys it loaded (`Structure.keys`)
sees what loading the whole model sees, in a fraction of its time.

A node's key identifies its `RADIUS`-hop neighbourhood: its own signature (op,
domain, attributes, each input's and output's element type and rank, which inputs are
constants and the values of small ones; bodies by their structure, with the values they
read from around them numbered by first use and linked so), refined `RADIUS` times by Weisfeiler-Lehman
over the undirected data-flow graph, each edge labelled by its direction and its
(output slot, input slot). Weights' bytes are not in it (two layers with different
weights are alike to ONNX Runtime's loader), nor are names.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import math
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import onnx
from onnx import helper, numpy_helper

from trtbuild.graph import subgraphs
from trtbuild.graph.domains import DEFAULT_DOMAINS
from trtbuild.graph.model_io import infer_shapes
from trtbuild.graph.optypes import FLOAT_TYPES, INTEGER_TYPES

# Hops a key sees, and a checked neighbourhood holds, around its node. 3: every node of
# the largest pattern known to fail is within 3 hops of one of its nodes (a decomposed
# LayerNorm's `Sub` reaches its nine nodes within 3 hops: LayerNormFusion's refusal;
# NchwcTransformer's crash needs `Transpose` → `Cast` → `MatMul`, 1 hop around the
# `Cast`), so a ball around one node of the pattern holds all of it. A larger radius
# tells more nodes apart (fewer are alike) and loads larger neighbourhoods.
RADIUS = 3
VERSION = 2  # of what a key holds: a memory of keys made otherwise is another memory
SMALL_INTS = 64  # integer constants up to this many elements are keyed by value (shapes, axes)
DIGEST_BYTES = 16  # blake2b-128: a key is 32 hex digits

# bytes per element of the types whose `raw_data` numpy reads as it is (`_tensor_key`):
# whole-byte types (not the packed 4-bit ones), on a little-endian machine (else numpy
# swaps each value's bytes)
_RAW_BYTES: dict[int, int] = (
    {
        k: helper.tensor_dtype_to_np_dtype(k).itemsize
        for k in (*INTEGER_TYPES, *FLOAT_TYPES, onnx.TensorProto.DOUBLE)
    }
    if sys.byteorder == "little"
    else {}
)


_SPECIAL = frozenset(  # attributes `_attribute` keys otherwise than by their bytes
    {
        onnx.AttributeProto.GRAPH,
        onnx.AttributeProto.GRAPHS,
        onnx.AttributeProto.TENSOR,
        onnx.AttributeProto.TENSORS,
        onnx.AttributeProto.SPARSE_TENSOR,
        onnx.AttributeProto.SPARSE_TENSORS,
    }
)


class Unbuildable(ValueError):
    """A neighbourhood that cannot be a model of its own (a value of unknown type)."""


@dataclass(frozen=True)
class Structure:
    """The keys of a graph's nodes (in `graph.node` order) and who is next to whom."""

    keys: tuple[str, ...]
    # who is next to whom, flat (`_Links`): node v's neighbours, the nodes sharing a value
    # with it either way, are near[starts[v]:starts[v + 1]] (one twice where two are shared)
    near: list[int]
    starts: list[int]

    def ball(self, centres: Iterable[int], radius: int = RADIUS) -> set[int]:
        """The nodes at most `radius` hops from any of `centres`."""
        near, starts = self.near, self.starts
        seen = set(centres)
        edge = seen
        for _ in range(radius):
            edge = {u for v in edge for u in near[starts[v] : starts[v + 1]]} - seen
            seen |= edge
        return seen


@dataclass(frozen=True)
class _Links:
    """Who is next to whom and by which edge, flat: node v's pairs (neighbour, tag) are
    (near[k], tagged[k]) for k in range(starts[v], starts[v + 1]); `tags` each tag's
    bytes by its number. Flat lists, not a list of pairs per node: the rounds read them
    faster, and the garbage collector walks 3 lists, not 10k lists and 40k tuples (a
    full collection during the keys cost an edit's convert 25 ms)."""

    near: list[int]
    tagged: list[int]
    starts: list[int]
    tags: list[bytes]

    def pairs(self, v: int) -> Iterable[tuple[int, int]]:
        a, b = self.starts[v], self.starts[v + 1]
        return zip(self.near[a:b], self.tagged[a:b], strict=True)


def structure(model: onnx.ModelProto, types: dict[str, onnx.TypeProto]) -> Structure:
    """The keys of `model`'s top-level nodes; `types` (`value_types`) gives each value's
    element type and rank.

    How, fast (keys are made at each convert of a new mixed model): each distinct
    signature gets a number, and the `RADIUS` Weisfeiler-Lehman rounds run on numbers (a
    node's and its edge-tagged neighbours' as a sorted tuple of ints, numbered again;
    exact, no hash). Numbers are this graph's own (in the order of `graph.node`), so only
    each round's few distinct classes are hashed, from their first node (`_digests`), as
    a round over digests hashes them. Two nodes that share a number have the same
    signature and alike neighbours round after round, so they share that digest too: a
    key is, byte for byte, the digest the rounds over digests made (VERSION 2's), of bytes
    in no order a hash seed or a dict decides; nodes the digests told apart still differ.
    """
    wiring = _Wiring(model.graph, types)
    links = wiring.links()
    labels, firsts = [wiring.labels], []  # each round's numbers, and each number's first node
    for _ in range(RADIUS):
        numbered, first = _refined(labels[-1], links)
        labels.append(numbered)
        firsts.append(first)
    digests = _digests([repr(s).encode() for s in wiring.signatures], labels, firsts, links)
    return Structure(tuple([digests[c] for c in labels[-1]]), links.near, links.starts)


class _Wiring:
    """Each top-level node's signature (op, domain, attributes, each input's and output's
    element type and rank, constants, graph outputs), numbered in order of first use, and
    the values it reads; each protobuf field read once."""

    def __init__(self, graph: onnx.GraphProto, types: dict[str, onnx.TypeProto]) -> None:
        typed, consts = _initializers(graph)
        types = _TypeKeys(typed, types)
        outputs = {o.name for o in graph.output}

        def say(t: str) -> bytes:  # what a body's key holds of a value it reads from here
            return types[t] + b"=" + (consts.get(t) or b"")

        numbers: dict[tuple, int] = {}
        self.signatures: list[tuple] = []  # each distinct one, by its number
        self.labels: list[int] = []  # each node's number
        self.reads: list[str] = []  # each node's inputs by slot, one after the other
        self.ends: list[int] = [0]  # where each node's inputs end in `reads`
        self.outer: dict[int, list[str]] = {}  # a body's outer reads, by first use
        self.made: dict[str, tuple[int, int]] = {}  # value -> (its node, output slot)
        labels, reads, ends, made, const = self.labels, self.reads, self.ends, self.made, consts.get
        for v, node in enumerate(graph.node):
            ins, outs = node.input[:], node.output[:]  # a slice: half a list()'s time
            attributes = node.attribute
            keyed = self._attributes(v, attributes, say) if attributes else ()
            # lists made into tuples, not generators: a tenth of the time on ~10k nodes
            sign = (
                node.domain,
                node.op_type,
                keyed,
                tuple([(types[t], const(t)) if t else None for t in ins]),
                tuple([(types[t], t in outputs) if t else None for t in outs]),
            )
            label = numbers.get(sign)
            if label is None:
                label = numbers[sign] = len(self.signatures)
                self.signatures.append(sign)
            labels.append(label)
            reads += ins  # one list, not one per node: fewer objects for the collector
            ends.append(len(reads))
            if len(outs) == 1:  # most nodes: no enumerate
                if outs[0]:
                    made[outs[0]] = (v, 0)
            else:
                for i, o in enumerate(outs):
                    if o:
                        made[o] = (v, i)

    def _attributes(
        self, v: int, attributes: Sequence[onnx.AttributeProto], say: Callable[[str], bytes]
    ) -> tuple[bytes, ...]:
        """Node v's attributes by name; its bodies' outer reads go to `outer`."""
        outer = _Outer(say)
        ordered = list(attributes) if len(attributes) == 1 else sorted(attributes, key=_name)
        keyed = tuple([_attribute(a, outer) for a in ordered])
        if outer.order:
            self.outer[v] = list(outer.order)
        return keyed

    def links(self) -> _Links:
        """Each node's (neighbour, tag) pairs, and the tags' bytes by number: v gets `<i,j`
        where the neighbour's output slot i feeds its input slot j, the neighbour `>i,j`
        (an outer-scope read: slot -1, -2, … by first use)."""
        numbers: dict[tuple[int, int], int] = {}
        links: list[list[int]] = [[] for _ in self.labels]  # per node: neighbour, tag, …
        made, outer = self.made, self.outer
        for v, (a, b) in enumerate(itertools.pairwise(self.ends)):
            ins = self.reads[a:b]
            reads: Iterable[tuple[int, str]] = enumerate(ins)
            if v in outer:  # a body's outer reads by first use: slot -1, -2, … (not by name)
                reads = [*reads, *((-1 - k, t) for k, t in enumerate(outer[v]))]
            for j, t in reads:
                if t in made:
                    u, i = made[t]
                    tag = numbers.get((i, j))
                    if tag is None:
                        tag = numbers[i, j] = 2 * len(numbers)
                    links[v] += (u, tag)
                    links[u] += (v, tag + 1)
        tags = [b""] * (2 * len(numbers))
        for (i, j), tag in numbers.items():
            tags[tag], tags[tag + 1] = b"<%d,%d" % (i, j), b">%d,%d" % (i, j)
        flat = list(itertools.chain.from_iterable(links))
        starts = list(itertools.accumulate([len(near) // 2 for near in links], initial=0))
        return _Links(flat[0::2], flat[1::2], starts, tags)


def _name(a: onnx.AttributeProto) -> str:
    return a.name


class _Outer:
    """The values a node's bodies read from around them, numbered by first use (`order`):
    each read keyed as `o<k>:` and what `say` (the scope around) says of the value, so
    swapping which outer value a body reads where changes its key."""

    def __init__(self, say: Callable[[str], bytes]) -> None:
        self.say = say
        self.order: dict[str, bytes] = {}  # name -> its label, in order of first use

    def __call__(self, name: str) -> bytes:
        label = self.order.get(name)
        if label is None:
            label = self.order[name] = b"o%d:" % len(self.order) + self.say(name)
        return label


def _refined(labels: list[int], links: _Links) -> tuple[list[int], list[int]]:
    """One Weisfeiler-Lehman round on numbers: each node's neighbours (each `label * tags
    + tag`: one int per pair, sorted: a multiset) then its own number, as a tuple,
    numbered again in order of first use; and the first node of each new number."""
    numbers: dict[tuple[int, ...], int] = {}
    out: list[int] = []
    firsts: list[int] = []
    scaled = [label * len(links.tags) for label in labels]
    pairs = [scaled[u] + t for u, t in zip(links.near, links.tagged, strict=True)]
    for v, a, b in zip(range(len(labels)), links.starts, links.starts[1:]):
        around = pairs[a:b]
        around.sort()  # in place, the own number last: 2/3 of sorted((own, *near))'s time
        around.append(labels[v])
        key = tuple(around)
        label = numbers.get(key)
        if label is None:
            label = numbers[key] = len(firsts)
            firsts.append(v)
        out.append(label)
    return out, firsts


def _digests(
    signatures: list[bytes], labels: list[list[int]], firsts: list[list[int]], links: _Links
) -> list[str]:
    """Each final number's key: its signature's digest, then per round the digest of its
    first node's digest before and its neighbours' (each its tag's bytes and digest, as
    a sorted multiset), so a key depends on bytes alone, not on the numbers' order."""
    tags = links.tags
    digests = [_hash(s) for s in signatures]
    for before, first in zip(labels, firsts):  # a round's numbers before it, its new ones
        digests = [
            _hash(
                digests[before[v]],
                *sorted([tags[t] + digests[before[u]] for u, t in links.pairs(v)]),
            )
            for v in first
        ]
    return [d.hex() for d in digests]


def value_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Each top-level value's type (initializers aside): as the model declares it, and
    where it declares none (a value `convert` made), as shape inference finds it.

    Why not `model_io.infer_shapes` on the whole model each time: a mixed model declares
    all but a few values, and inferring those few from their producers' declared inputs
    takes a millisecond, not a tenth of a second. Only where that falls short (a
    producer's input undeclared too) is the whole model inferred.
    """
    g = model.graph
    found = {v.name: v.type for v in g.value_info}
    found.update({v.name: v.type for v in g.input})
    found.update({v.name: v.type for v in g.output})
    made: list[str] = []  # every node's outputs in one list (not one per node: the collector)
    ends = []  # where each node's outputs end in `made`
    for n in g.node:
        made += n.output[:]  # a slice: half the time of iterating the field
        ends.append(len(made))
    missing = set(made).difference(found)
    missing.discard("")  # an optional output left out
    if missing:  # an initializer is no value to type (its own type is read)
        missing.difference_update(t.name for t in g.initializer)
    if not missing:
        return found
    at = [k for k, t in enumerate(made) if t in missing]
    makers = [g.node[v] for v in dict.fromkeys(bisect.bisect_right(ends, k) for k in at)]
    local = _inferred(model, makers, found, missing)
    if local is None:
        typed = infer_shapes(model)
        return {
            v.name: v.type
            for v in (*typed.graph.value_info, *typed.graph.input, *typed.graph.output)
        }
    return {**found, **local}


def _inferred(
    model: onnx.ModelProto,
    makers: list[onnx.NodeProto],
    found: dict[str, onnx.TypeProto],
    missing: set[str],
) -> dict[str, onnx.TypeProto] | None:
    """The types of the `missing` values (`makers` make them, `model` does not declare
    them), inferred from the makers alone; None where an input of theirs has no declared
    type either."""
    reads = list(dict.fromkeys(t for n in makers for t in subgraphs.node_reads(n)))
    g = model.graph
    read = set(reads)
    weights = {t.name: t for t in g.initializer if t.name in read}
    if any(t not in found and t not in weights for t in reads):
        return None
    wanted = [o for n in makers for o in n.output if o in missing]
    mini = helper.make_graph(
        makers,
        "untyped",
        [helper.make_value_info(t, found[t]) for t in reads if t not in weights],
        [helper.make_value_info(t, onnx.TypeProto()) for t in wanted],
        [weights[t] for t in reads if t in weights],
    )
    sub = helper.make_model(mini, opset_imports=list(model.opset_import))
    sub.ir_version = model.ir_version
    sub.functions.extend(model.functions)
    typed = infer_shapes(sub)
    got = {v.name: v.type for v in typed.graph.output if v.type.WhichOneof("value")}
    return got if all(t in got for t in wanted) else None


def _hash(*parts: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=DIGEST_BYTES)
    for part in parts:
        h.update(part)
    return h.digest()


def _initializers(graph: onnx.GraphProto) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """Each initializer's type key (its own type and rank), and the values that are
    constants (initializers, `Constant` outputs) -> what keys them: the values of small
    integer ones (shapes and axes drive ONNX Runtime's rewrites) and of float scalars (a
    fusion matches GELU's 0.5 or LayerNorm's exponent 2). An initializer that is a graph
    input too is no constant: a user may feed another value, so ONNX Runtime neither
    folds it nor fuses on it. One pass over the initializers."""
    inputs = {i.name for i in graph.input}
    typed, found = {}, {}
    for t in graph.initializer:
        name, kind, dims = t.name, t.data_type, t.dims[:]
        typed[name] = b"%d/%d" % (kind, len(dims))
        if name not in inputs:
            found[name] = _tensor_key(t, kind, dims)
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in DEFAULT_DOMAINS and node.output:
            found[node.output[0]] = b"C" + b"".join(_attribute(a) for a in node.attribute)
    return typed, found


def _tensor_key(t: onnx.TensorProto, kind: int = 0, dims: list[int] | None = None) -> bytes:
    """A constant's type, and its values where small (`_initializers`), never its
    weights' bytes: layers alike but for their weights are alike to the loader. A small
    tensor's `raw_data` is its values' bytes as numpy's `tobytes` gives them (little
    endian, a type of whole bytes, the size its dims say): read as they are, without
    `numpy_helper.to_array` (a tenth of the keys' time on a 10k-node model). `kind` and
    `dims`: the tensor's `data_type` and `dims` where the caller read them already."""
    if dims is None:
        kind, dims = t.data_type, t.dims[:]
    size = math.prod(dims)
    small = size <= SMALL_INTS if kind in INTEGER_TYPES else size == 1
    if not small or t.data_location == onnx.TensorProto.EXTERNAL:
        return b"W%d" % kind
    raw = t.raw_data
    if raw and len(raw) == size * _RAW_BYTES.get(kind, -1) and not t.HasField("segment"):
        return b"T%d:%r=" % (kind, dims) + raw
    try:
        return b"T%d:%r=" % (kind, dims) + numpy_helper.to_array(t).tobytes()
    except Exception:  # a tensor numpy cannot hold (a new type): its type keys it
        return b"W%d" % kind


def _attribute(a: onnx.AttributeProto, outer: _Outer | None = None) -> bytes:
    """An attribute by value; tensors by `_tensor_key`, bodies by their structure
    (`outer`: what the scope around says of the values they read from it)."""
    kind = onnx.AttributeProto
    if a.type not in _SPECIAL:  # a number, a string, a type: most attributes
        if not a.doc_string:
            return a.SerializeToString(deterministic=True)
        plain = onnx.AttributeProto()
        plain.CopyFrom(a)
        plain.ClearField("doc_string")  # words for people, not for the loader
        return plain.SerializeToString(deterministic=True)
    if a.type in (kind.GRAPH, kind.GRAPHS):
        outer = outer or _Outer(lambda t: b"?")
        if a.type == kind.GRAPH:
            return f"{a.name}:g".encode() + _body(a.g, outer)
        return f"{a.name}:G".encode() + b"".join(_body(g, outer) for g in a.graphs)
    if a.type == kind.TENSOR:
        return f"{a.name}:t".encode() + _tensor_key(a.t)
    if a.type == kind.TENSORS:
        return f"{a.name}:T".encode() + b"".join(_tensor_key(t) for t in a.tensors)
    return f"{a.name}:s{a.type}".encode()  # a sparse tensor (or tensors)


def _body(graph: onnx.GraphProto, outer: _Outer) -> bytes:
    """A body's structure: its inputs' and outputs' types, its nodes' ops, attributes and
    wiring (by position, not name), its constants by `_tensor_key`, the values it reads
    from around it by first use with their type and constant key (`outer`); no weights'
    bytes. A body inside reads this one's values by position, or its outer reads."""
    where: dict[str, bytes] = {}
    parts = [b"B"]
    for k, v in enumerate(graph.input):
        where[v.name] = b"i%d" % k
        parts.append(_type_key(v.type))
    for k, t in enumerate(graph.initializer):
        where[t.name] = b"w%d" % k
        parts.append(_tensor_key(t))

    def ref(t: str) -> bytes:
        return where[t] if t in where else outer(t)

    for v, node in enumerate(graph.node):
        wiring = b",".join(ref(t) if t else b"-" for t in node.input)
        parts.append(b"|%s:%s(%s)" % (node.domain.encode(), node.op_type.encode(), wiring))
        inner = _Outer(ref)
        parts.extend(_attribute(a, inner) for a in sorted(node.attribute, key=lambda a: a.name))
        for i, o in enumerate(node.output):
            where[o] = b"n%d.%d" % (v, i)
    parts.extend(ref(o.name) + _type_key(o.type) for o in graph.output)
    return _hash(*parts)


class _TypeKeys(dict):
    """Value name -> `_type_key` of its type (`structure` asks of every input and output
    of every node), each distinct type computed once (a model has a few dozen: alike by
    their bytes); an initializer's from its own type and dims (`typed`), whatever
    `types` says."""

    def __init__(self, typed: dict[str, bytes], types: dict[str, onnx.TypeProto]) -> None:
        super().__init__()
        memo: dict[bytes, bytes] = {}
        for name, t in types.items():
            data = t.SerializeToString()
            key = memo.get(data)
            if key is None:
                key = memo[data] = _type_key(t)
            self[name] = key
        self.update(typed)

    def __missing__(self, name: str) -> bytes:
        return b"?"  # no type known


def _type_key(t: onnx.TypeProto | None) -> bytes:
    """Element type and rank of a tensor type (`?` where unknown); other types by kind."""
    if t is None:
        return b"?"
    kind = t.WhichOneof("value")
    if kind != "tensor_type":
        return f"[{kind}]".encode() if kind else b"?"
    tt = t.tensor_type
    rank = len(tt.shape.dim) if tt.HasField("shape") else "?"
    return f"{tt.elem_type}/{rank}".encode()


def neighbourhood_model(
    model: onnx.ModelProto, types: dict[str, onnx.TypeProto], chosen: Iterable[int]
) -> onnx.ModelProto:
    """The `chosen` top-level nodes (in the graph's order) as a model of their own.

    Values they read but do not make are graph inputs of their inferred type and shape,
    except constants: initializers are copied and `Constant` producers taken in, so
    what ONNX Runtime folds or matches on a constant stays a constant; an initializer
    the graph has as an input too stays an input as well (not folded, as in the model). The outputs are
    the values made inside that nothing inside reads, and the graph's own outputs, so no
    fusion inside is blocked that the graph allows. Control flow comes whole, with the
    outer values its bodies read.

    Raises:
        Unbuildable: a value crossing the border has no known element type.
    """
    graph = model.graph
    picked = {v: graph.node[v] for v in set(chosen)}
    made = {o for n in picked.values() for o in n.output if o}
    wanted = {t for n in picked.values() for t in subgraphs.node_reads(n)} - made
    consts = {
        n.output[0]: k for k, n in enumerate(graph.node) if n.op_type == "Constant" and n.output
    }
    for t in wanted & consts.keys():
        picked[consts[t]] = graph.node[consts[t]]
        made.add(t)
    nodes = [picked[v] for v in sorted(picked)]
    reads = [t for n in nodes for t in subgraphs.node_reads(n)]
    read, shown = set(reads), {o.name for o in graph.output}
    weights = {t.name: t for t in graph.initializer if t.name in read}  # not a dict of all
    fed = {i.name for i in graph.input} & weights.keys()  # overridable: no constants
    outer = [t for t in dict.fromkeys(reads) if t not in made and (t not in weights or t in fed)]
    ends = [o for n in nodes for o in n.output if o and (o not in read or o in shown)]
    sub = helper.make_graph(
        nodes,
        f"{graph.name}-neighbourhood",
        [_value(t, types) for t in outer],
        [_value(t, types) for t in ends],
        [weights[t] for t in dict.fromkeys(reads) if t in weights],
    )
    out = helper.make_model(sub, opset_imports=list(model.opset_import))
    out.ir_version = model.ir_version
    out.functions.extend(model.functions)
    return out


def _value(name: str, types: dict[str, onnx.TypeProto]) -> onnx.ValueInfoProto:
    t = types.get(name)
    if t is None or t.WhichOneof("value") is None:
        raise Unbuildable(f"no type is known for {name!r}")
    if t.WhichOneof("value") == "tensor_type" and not t.tensor_type.elem_type:
        raise Unbuildable(f"no element type is known for {name!r}")
    return helper.make_value_info(name, t)
