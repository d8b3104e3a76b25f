"""Streaming runs: a graph cut into consecutive segments whose tensors fit a memory budget.

Why: measuring every tensor of a run (the reference's peaks, the emulated
candidate's divergence) needs every tensor marked as an ONNX Runtime output,
and a run with every tensor marked holds all of them at once: 2.8 GB per copy
for a 4.7 MB detector at 1280x1280. Cut into segments, a run holds one
segment's tensors and the values later segments read; each segment's tensors
are measured and compared as they come, then dropped.

A `Plan` is made once per graph and input shape: by budget for the FP32
reference (`plan_by_budget`, from the tensors' byte sizes), and for a
candidate aligned to the reference's cuts by node name (`plan_aligned`), so
that the reference and every candidate produce the same tensors in the same
segment and can be compared in lockstep. A `SegmentRunner` runs a plan, one
ONNX Runtime session per segment.
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from trtbuild.accuracy.sessions import (
    SessionModel,
    lean_session,
    plain_session,
    run_session,
    session_model,
)
from trtbuild.errors import UsageError
from trtbuild.graph import subgraphs
from trtbuild.graph.model_io import assembled, fed_inputs, infer_shapes
from trtbuild.graph.optypes import NOT_TENSOR_OPS, UNHANDED_TYPES
from trtbuild.policy.specs import MemoryBudget
from trtbuild.sizes import fmt_bytes

# A reference segment waits beside a candidate's, and at the end of a run its tensors
# exist twice (in ONNX Runtime's arena and as the copies it hands out): three segments'
# worth at once, so a segment's tensors may take a sixth of the budget. One node's
# tensors (a step) may take half: it is a segment of its own, held once by the
# reference and once by a candidate.
SEGMENT_SHARE = 6
STEP_SHARE = 2


@dataclass(frozen=True)
class Segment:
    """Consecutive nodes run by one session, and the values that cross its borders."""

    nodes: tuple[int, ...]  # indices into the graph's node list
    needs: tuple[str, ...]  # values read from the feed or an earlier segment
    marked: tuple[str, ...]  # tensors handed out to be measured (produced here)
    keep: tuple[str, ...]  # values produced here that a later segment reads


@dataclass(frozen=True)
class Plan:
    segments: tuple[Segment, ...]
    segment_of: dict[str, int]  # marked tensor -> the segment that produces it
    node_segment: dict[str, int]  # node name -> its segment (names a candidate keeps)
    budget: int = 0  # bytes the plan was cut for

    def __len__(self) -> int:
        return len(self.segments)


def plan_by_budget(
    model: onnx.ModelProto, marked: set[str], sizes: dict[str, int], budget: MemoryBudget
) -> Plan:
    """Cut `model` where a segment's tensors and the values crossing into it reach budget/4.

    `sizes` gives each tensor's bytes at the input shape. One node whose inputs
    and outputs alone pass half the budget cannot be cut: a default budget grows
    to fit it (up to its ceiling), a policy's own is refused with exit 2.
    """
    nodes = list(model.graph.node)
    initializers = {t.name for t in model.graph.initializer}
    asked, budget = budget, _fitted(nodes, sizes, budget, initializers)
    limit = max(budget // SEGMENT_SHARE, 1)
    last_use = _last_use(nodes)
    freed_at: dict[int, list[str]] = defaultdict(list)
    live = {vi.name: sizes.get(vi.name, 0) for vi in fed_inputs(model)}
    for t in live:
        freed_at[last_use.get(t, -1) + 1].append(t)
    unhanded = _unhanded_values(model)
    seg, held, assign, stretch = 0, sum(live.values()), [], (0, frozenset())
    holding: set[str] = set()  # the values that held this segment uncut
    for i, node in enumerate(nodes):
        for t in freed_at.pop(i, ()):
            live.pop(t, None)
        out = sum(sizes.get(o, 0) for o in node.output if o)
        alive = unhanded.intersection(live)
        if assign and held + out > limit and alive:  # no cut while it lives: how much it holds
            holding |= alive
            stretch = max(stretch, (held + out, frozenset(holding)), key=lambda h: h[0])
        elif assign and held + out > limit:
            seg, held, holding = seg + 1, sum(live.values()), set()
        assign.append(seg)
        held += out
        for o in node.output:
            if o and o in last_use:
                live[o] = sizes.get(o, 0)
                freed_at[last_use[o] + 1].append(o)
    budget = _held_fits(nodes, sizes, stretch, budget, asked)
    return cut(model, assign, marked, budget=budget)


def _held_fits(
    nodes: list[onnx.NodeProto],
    sizes: dict[str, int],
    stretch: tuple[int, frozenset[str]],
    budget: int,
    asked: MemoryBudget,
) -> int:
    """The budget the longest stretch an uncut value lives through needs, held like one step
    (a segment that cannot be split): `budget` where it fits, a default grown to it (up to
    its ceiling), or exit 2 naming the value that holds most and a budget that fits it.

    Why the hint asks three times that value's life: its segment may start up to a sixth
    of the budget before the value is made, and a step may take half.
    """
    held, alive = stretch
    need = held * STEP_SHARE
    if need <= budget:
        return budget
    if asked.ceiling is not None and need <= asked.ceiling:
        return need
    lives = {v: _life(nodes, sizes, v) for v in sorted(alive)}
    value = max(lives, key=lambda v: lives[v][0])
    life, made, last = lives[value]
    ceiling = " (half this machine's memory)" if asked.ceiling is not None else ""
    raise UsageError(
        f"accuracy.memory_budget: {value} (a sequence, or of a type ONNX Runtime hands Python no "
        f"array of) lives from {made} until {last}, and the judge's run cannot be cut while it "
        f"does: that stretch holds {fmt_bytes(held)}, and one may take half of "
        f"{fmt_bytes(asked.ceiling or asked.bytes)}{ceiling}",
        hint=f"raise accuracy.memory_budget to at least {fmt_bytes(max(need, 3 * life))}, or "
        "judge smaller inputs",
    )


def _life(nodes: list[onnx.NodeProto], sizes: dict[str, int], value: str) -> tuple[int, str, str]:
    """(bytes, maker, last reader) of `value`'s life: what the nodes from its maker to its last
    reader make and read from before it."""
    made = next((i for i, n in enumerate(nodes) if value in n.output), 0)
    last = max((i for i, n in enumerate(nodes) if value in _reads(n)), default=made)
    inside = nodes[made : last + 1]
    outs = {o for n in inside for o in n.output if o}
    ins = {t for n in inside for t in _reads(n) if t not in outs}
    total = sum(sizes.get(t, 0) for t in outs | ins)
    return total, nodes[made].name or nodes[made].op_type, nodes[last].name or nodes[last].op_type


def _unhanded_values(model: onnx.ModelProto) -> set[str]:
    """The main graph's values no border may carry: of an `UNHANDED_TYPES` type (declared so,
    or made by a QuantizeLinear whose zero point is: INT4 activations, with no value_info to
    say so), and sequences and optionals (handed out as lists, which no input is declared
    from)."""
    graph = model.graph
    found = {
        vi.name
        for vi in (*graph.input, *graph.value_info, *graph.output)
        if vi.type.tensor_type.elem_type in UNHANDED_TYPES
        or vi.type.WhichOneof("value") not in (None, "tensor_type")
    }
    zeros = {t.name for t in graph.initializer if t.data_type in UNHANDED_TYPES}
    for node in graph.node:
        if node.op_type in NOT_TENSOR_OPS:
            found.update(o for o in node.output if o)
        elif node.op_type == "QuantizeLinear" and len(node.input) > 2 and node.input[2] in zeros:
            found.add(node.output[0])
    return found


def _fitted(
    nodes: list[onnx.NodeProto], sizes: dict[str, int], budget: MemoryBudget, initializers: set
) -> int:
    """The budget in bytes that the largest step fits in, or exit 2 naming that step."""

    def tensors(node: onnx.NodeProto) -> list[str]:
        return [t for t in (*node.input, *node.output) if t and t not in initializers]

    if not nodes:
        return budget.bytes
    node = max(nodes, key=lambda n: sum(sizes.get(t, 0) for t in tensors(n)))
    step = sum(sizes.get(t, 0) for t in tensors(node))
    need = step * STEP_SHARE
    if need <= budget.bytes:
        return budget.bytes
    if budget.ceiling is not None and need <= budget.ceiling:
        return need
    largest = max(tensors(node), key=lambda t: sizes.get(t, 0))
    allowed = budget.bytes if budget.ceiling is None else budget.ceiling
    what = (
        "the budget of" if budget.ceiling is None else "the ceiling (half this machine's memory) of"
    )
    raise UsageError(
        f"accuracy.memory_budget: node {node.name or node.op_type} ({node.op_type}) holds "
        f"{fmt_bytes(step)} at once (its largest tensor {largest} is "
        f"{fmt_bytes(sizes.get(largest, 0))}); one step may take half {what} "
        f"{fmt_bytes(allowed)}",
        hint=f"raise accuracy.memory_budget to at least {fmt_bytes(need)}, or judge smaller inputs",
    )


def plan_aligned(model: onnx.ModelProto, marked: set[str], reference: Plan) -> Plan:
    """Cut a candidate where the reference is cut, matching nodes by the tensors they produce.

    A node the reference knows (by its name, which the conversion and the
    emulation keep, or by a marked tensor it produces) joins that segment; any
    other node (a Cast of the emulation or the conversion) joins the latest
    segment it reads from, so a rounded tensor is produced in the segment of the
    node that computed it. Never earlier than its inputs.
    """
    nodes = list(model.graph.node)
    producer_seg: dict[str, int] = {}
    assign = []
    for node in nodes:
        known = [reference.segment_of[o] for o in node.output if o in reference.segment_of]
        if node.name in reference.node_segment:
            known.append(reference.node_segment[node.name])
        after = max((producer_seg[t] for t in node.input if t in producer_seg), default=0)
        seg = max(min(known), after) if known else after
        assign.append(seg)
        for o in node.output:
            if o:
                producer_seg[o] = seg
    _with_readers(nodes, assign, _unhanded_values(model))
    return cut(model, assign, marked, n_segments=len(reference), budget=reference.budget)


def _with_readers(nodes: list[onnx.NodeProto], assign: list[int], values: set[str]) -> None:
    """The maker of a value no border may carry joins its readers' earliest segment, where
    every value it makes is read no earlier; the last maker first, so a chain of them moves.

    Why: a node the reference does not know (a Q the conversion clones under a new name)
    joins the segment of its input, and its reader (a DQ the reference knows) stays in
    its own: the cut between them carried an INT4 value.
    """
    readers: dict[str, list[int]] = defaultdict(list)
    for i, n in enumerate(nodes):
        for t in _reads(n):
            readers[t].append(i)
    made = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    for v in sorted((v for v in values if v in made), key=made.get, reverse=True):
        maker = made[v]
        target = min((assign[r] for r in readers[v]), default=assign[maker])
        earliest = min((assign[r] for o in nodes[maker].output for r in readers[o]), default=target)
        if assign[maker] < target <= earliest:
            assign[maker] = target


def cut(
    model: onnx.ModelProto,
    assign: list[int],
    marked: set[str],
    n_segments: int | None = None,
    budget: int = 0,
) -> Plan:
    """Segments from a segment index per node, none before its inputs' (empty segments
    allowed)."""
    nodes = list(model.graph.node)
    n = n_segments if n_segments is not None else (max(assign) + 1 if assign else 1)
    produced_in: dict[str, int] = {}
    members: list[list[int]] = [[] for _ in range(n)]
    for i, (node, seg) in enumerate(zip(nodes, assign)):
        members[seg].append(i)
        for o in node.output:
            if o:
                produced_in[o] = seg
    outputs = {o.name for o in model.graph.output}
    initializers = {t.name for t in model.graph.initializer}
    read_in: dict[str, set[int]] = defaultdict(set)
    for node, seg in zip(nodes, assign):
        for t in _reads(node):
            read_in[t].add(seg)
    segments = []
    for k in range(n):
        mine = [nodes[i] for i in members[k]]
        here = {o for node in mine for o in node.output if o}
        needs = sorted({t for node in mine for t in _reads(node) if t not in here} - initializers)
        made = [o for node in mine for o in node.output if o in marked or o in outputs]
        keep = [o for node in mine for o in node.output if o and any(s > k for s in read_in[o])]
        segments.append(Segment(tuple(members[k]), tuple(needs), tuple(made), tuple(keep)))
    segment_of = {t: produced_in[t] for t in marked if t in produced_in}
    named = {node.name: seg for node, seg in zip(nodes, assign) if node.name}
    return Plan(tuple(segments), segment_of, named, budget)


def _reads(node: onnx.NodeProto) -> list[str]:
    return subgraphs.node_reads(node)  # a control node's bodies read outer values by name


def _last_use(nodes: list[onnx.NodeProto]) -> dict[str, int]:
    last: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for t in _reads(node):
            last[t] = i
    return last


class SegmentRunner:
    """Runs a `Plan` on one feed after another, one ONNX Runtime session per segment.

    Sessions are made at the first run, from the dtypes the values crossing each
    border really have, and reused for every later feed. With `mark=False` a
    segment hands out only the graph outputs it produces: ONNX Runtime frees
    the rest as it goes (a feed whose intermediates nobody compares).
    """

    def __init__(self, model: onnx.ModelProto, plan: Plan, *, mark: bool = True):
        self.model, self.plan = model, plan
        self.sessions: list = [None] * len(plan)
        self.initializers = {t.name: t for t in model.graph.initializer}
        outputs = {o.name for o in model.graph.output}
        # each value's ONNX type where numpy's may not say it: the graph's inputs as declared,
        # and what a segment makes as its session says (ONNX Runtime hands FP8 out as uint8)
        self.declared = {vi.name: vi for vi in fed_inputs(model)}
        self.types = {n: vi.type.tensor_type.elem_type for n, vi in self.declared.items()}
        self.handed = [
            seg.marked if mark else tuple(t for t in seg.marked if t in outputs)
            for seg in plan.segments
        ]

    def run(
        self, feed: dict[str, np.ndarray], *, once: bool = False
    ) -> Iterator[dict[str, np.ndarray]]:
        """Yield, per segment, its marked tensors and the values it read. With `once`, each
        segment's session is let go once it ran (no later run needs it), not kept.

        Values a later segment reads are held until their last reader has run;
        everything else a segment yields is the caller's to drop. The shared arena is
        shrunk after each segment: kept for the whole pass, it held 0.13 GB more at
        PP-OCRv4 det 1280x1280 (fragments of every segment's sizes) for 7% of the
        accuracy stage's time (`bench_memory.py`, measured in #36).
        """
        live = {k: np.asarray(v) for k, v in feed.items()}
        last_reader = _last_reader(self.plan)
        for k, seg in enumerate(self.plan.segments):
            if not seg.nodes:
                yield {}
                continue
            inputs = {t: live[t] for t in seg.needs if t in live}
            sess = self.sessions[k] or self._session(k, inputs)
            self.sessions[k] = None if once else sess  # `once`: its weights let go
            names = [o.name for o in sess.get_outputs()]
            fed = {t: _as_type(v, self.types.get(t)) for t, v in inputs.items()}
            values = dict(zip(names, run_session(sess, names, fed)))
            del fed, sess  # `once`: no reference to the session held across the yield
            for t in seg.keep:
                live[t] = values[t]
            for t in [t for t in live if last_reader.get(t, -1) <= k]:
                del live[t]
            yield {**inputs, **{t: values[t] for t in self.handed[k]}}
            del inputs, values
            if k + 1 < len(self.plan):  # the next run's first segment reuses the last one's pages
                release_freed_memory()

    def _session(self, k: int, inputs: dict[str, np.ndarray]):
        seg = self.plan.segments[k]
        nodes = [self.model.graph.node[i] for i in seg.nodes]
        fixed = _resize_vectors(nodes)
        feeds = [self._declared(t, v, t in fixed) for t, v in inputs.items()]
        used = {t for node in nodes for t in _reads(node)}
        inits = [self.initializers[t] for t in sorted(used) if t in self.initializers]
        outs = [helper.ValueInfoProto(name=t) for t in dict.fromkeys((*self.handed[k], *seg.keep))]
        # the model's bytes and its weights apart, not the model too, while ONNX Runtime reads them
        part = assembled(self.model, f"segment{k}", nodes, feeds, outs)
        session = plain_session(session_model(part, inits))
        self.types.update({o.name: ORT_TYPES.get(o.type, 0) for o in session.get_outputs()})
        return session

    def _declared(self, name: str, value: np.ndarray, fixed: bool) -> onnx.ValueInfoProto:
        """A segment's input: a graph input as the model declares it, a value a segment
        before made with its type and rank, its dims left free (the next feed's may differ)
        but where `fixed` (a Resize's `sizes`: its length is the rank it resizes).

        Why: ONNX Runtime's shape inference refuses a `Resize` whose `sizes` is of a length
        it cannot read ("Number of elements of input 'sizes' (0) must be same as rank of
        input 'X' (4)"): a segment fed that value, or fed the input whose `Shape` makes it
        undeclared, was refused, and so was `check` of every dynamo export of a DINOv2 that
        resizes its position embeddings to the image ("the FP32 model cannot run").
        """
        if name in self.declared:
            return self.declared[name]
        elem = self.types.get(name) or helper.np_dtype_to_tensor_dtype(value.dtype)
        dims = list(np.shape(value)) if fixed and np.ndim(value) <= 1 else [None] * np.ndim(value)
        return helper.make_tensor_value_info(name, elem, dims)


def _resize_vectors(nodes: list[onnx.NodeProto]) -> set[str]:
    """A segment's Resize roi, scales and sizes, and the values the segment computes them
    from (a `Shape`'s input aside): declared at their length, which is the rank they resize,
    at every point (`SegmentRunner._declared` fixes only vectors).

    Why the values behind them: where the segment computes `sizes` itself (SeemoRe's
    `Concat` of a `Slice` of its feature map's `Shape` and the `Cast` of the sizes it
    resizes to) from a vector an earlier segment made, declared without its length, ONNX
    Runtime's shape inference read `sizes` as empty and refused the segment: `check` exit 2,
    "the FP32 model cannot run at max", for a model that runs, at `max` only because the
    default memory budget cut the graph there.
    """
    producer = {o: n for n in nodes for o in n.output if o}
    stack = [t for n in nodes if n.op_type in ("Resize", "Upsample") for t in n.input[1:] if t]
    found: set[str] = set()
    while stack:
        t = stack.pop()
        if t in found:
            continue
        found.add(t)
        node = producer.get(t)
        if node is not None and node.op_type != "Shape":
            stack.extend(i for i in node.input if i)
    return found


# ONNX Runtime's name of each tensor type ("tensor(float8e4m3fn)") -> its ONNX element type
ORT_TYPES = {f"tensor({name.lower()})": value for name, value in onnx.TensorProto.DataType.items()}


def _as_type(value: np.ndarray, elem_type: int | None):
    """`value` as ONNX Runtime takes it for an input of `elem_type`: the array itself where
    numpy's type is that type, else an OrtValue of its bytes as that type (an FP8 tensor
    handed out as uint8 by the segment that made it)."""
    if not elem_type or helper.np_dtype_to_tensor_dtype(value.dtype) == elem_type:
        return value
    import onnxruntime as ort

    return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(np.ascontiguousarray(value), elem_type)


@functools.lru_cache(maxsize=1)
def _malloc_trim() -> Callable[[int], int] | None:
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc: its allocator returns memory its own way
        return None


def release_freed_memory() -> None:
    """Give the pages of freed tensors back to the system (glibc's `malloc_trim`).

    Why: glibc raises its mmap threshold each time a large block is freed, so
    after a few segments tensors of up to 32 MB come from the heap, and a heap
    keeps its freed pages: measured on PP-OCRv4 det at 1280x1280, the reference
    pass peaked at 0.97 GB without and 0.45 GB with a trim after each segment.
    The price is time: the next segment faults its pages in again (a judgement
    there took 7.4 s with, 5.5 s without, at 0.8 and 1.5 GB). An action on
    freed memory, not a setting: nothing else in the process changes.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


class LeanRunner:
    """A whole graph in one session that hands out only what is asked, the way inference runs.

    Why not segments: nothing but the outputs (and, for `finite_sums`, a scalar
    per tensor) leaves the session, so ONNX Runtime frees each intermediate
    after its last reader and the run holds what plain inference holds; at
    640x640 that is three times faster than a cut run that hands every tensor out.

    `finite_sums` names tensors to check: each gets a `ReduceSum` right after
    the node that makes it, whose result is finite only when every value is
    (an inf or a NaN always reaches the sum; a sum of finite values may still
    overflow, so a non-finite sum is a suspect to confirm, never a verdict).
    """

    SUFFIX = "__trtbuild_sum"

    def __init__(self, model: onnx.ModelProto, outputs: list[str], finite_sums: set[str]):
        self.model, self.outputs = model, outputs
        self.sums = {t: t + self.SUFFIX for t in finite_sums}
        self.session = None

    def run(self, feed: dict[str, np.ndarray], *, shrink: bool = True) -> dict[str, np.ndarray]:
        """Sessions are made at the first run, as `SegmentRunner`'s: a judgement of one feed
        that walks the divergence never needs this one. Without `shrink`, the shared arena
        keeps this run's pages for the next (a caller with more feeds to run)."""
        if self.session is None:
            lean = _with_sums(self.model, self.outputs, self.sums)
            self.session = lean_session(lean)  # the bytes and weights apart, not the model
            del lean
        names = [o.name for o in self.session.get_outputs()]
        values = dict(zip(names, run_session(self.session, names, feed, shrink=shrink)))
        if shrink:
            release_freed_memory()
        return values

    def let_go(self) -> None:
        """Let the session go (the next run makes it again): its copy of the weights is not
        held while other sessions of them run."""
        self.session = None

    def suspects(self, values: dict[str, np.ndarray]) -> list[str]:
        """Checked tensors whose sum is not finite (one of their values may not be)."""
        with np.errstate(all="ignore"):
            return [t for t, s in self.sums.items() if not np.isfinite(values[s]).all()]


def _with_sums(model: onnx.ModelProto, outputs: list[str], sums: dict[str, str]) -> SessionModel:
    """`model` with only `outputs` and a scalar ReduceSum of each of `sums`, placed in order,
    for a session."""
    nodes = []
    for node in model.graph.node:
        nodes.append(node)
        for o in node.output:
            if o in sums:
                nodes.append(helper.make_node("ReduceSum", [o], [sums[o]], sums[o], keepdims=0))
    by_name = {o.name: o for o in model.graph.output}
    outs = [by_name.get(t) or helper.ValueInfoProto(name=t) for t in outputs]
    outs += [helper.ValueInfoProto(name=s) for s in sums.values()]
    graph = model.graph
    return session_model(assembled(model, graph.name, nodes, graph.input, outs), graph.initializer)


def _last_reader(plan: Plan) -> dict[str, int]:
    last: dict[str, int] = {}
    for k, seg in enumerate(plan.segments):
        for t in seg.needs:
            last[t] = k
    return last


def estimate_sizes(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> dict[str, int]:
    """Bytes of every tensor at the feed's shapes, by ONNX shape inference.

    Why an estimate: the cuts of the first run must be made before anything ran.
    A tensor whose shape inference cannot tell takes the size of its largest
    input (right for element-wise ops, the most common case); later runs use
    the sizes the first one measured.
    """
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    for vi in fixed.graph.input:
        if vi.name in feed:
            shape = np.asarray(feed[vi.name]).shape
            vi.type.tensor_type.ClearField("shape")
            vi.type.tensor_type.shape.dim.extend(
                onnx.TensorShapeProto.Dimension(dim_value=int(d)) for d in shape
            )
    fixed = infer_shapes(fixed)  # never fails (a graph onnx cannot infer: sizes fall back
    # below); a GroupNorm's outputs typed, a model of large weights inferred without them
    sizes = {k: int(np.asarray(v).nbytes) for k, v in feed.items()}
    for t in fixed.graph.initializer:
        sizes[t.name] = math.prod(t.dims) * _itemsize(t.data_type)
    for vi in (*fixed.graph.value_info, *fixed.graph.output):
        size = _known_size(vi)
        if size is not None:
            sizes[vi.name] = size
    weights = {t.name: list(t.dims) for t in fixed.graph.initializer}
    for node in fixed.graph.node:
        guess = _guess(node, sizes, weights)
        for o in node.output:
            if o and o not in sizes:
                sizes[o] = guess
    return sizes


def _guess(node: onnx.NodeProto, sizes: dict[str, int], weights: dict[str, list[int]]) -> int:
    """The size of an output shape inference cannot tell: its largest input's, but a
    `Concat`'s inputs together, and a convolution's input scaled by its channels and
    strides (a `ConvTranspose` of stride 3 makes nine times the pixels).

    Why: after a `Pad` of computed size nothing downstream is inferred, and Real-CUGAN's
    UpCunet3x grows 3 channels of 256² to 64 of 804² there: every tensor guessed at the
    image's size, the whole graph was one segment and `check` held every tensor at once
    (2.96 GB under a 256 MiB `accuracy.memory_budget`; 0.98 GB for a plain run).
    """
    ins = [sizes.get(t, 0) for t in node.input if t]
    if node.op_type == "Concat":
        return sum(ins)
    shape = weights.get(node.input[1]) if len(node.input) > 1 else None
    if node.op_type not in ("Conv", "ConvTranspose") or not ins or not shape or len(shape) < 3:
        return max(ins, default=0)
    group = next((a.i for a in node.attribute if a.name == "group"), 1) or 1
    strides = next((list(a.ints) for a in node.attribute if a.name == "strides"), [])
    step = math.prod(strides) if strides else 1
    if node.op_type == "Conv":  # W: [M, C / group, k...]
        return int(ins[0] * shape[0] / max(shape[1] * group, 1) / max(step, 1))
    return int(ins[0] * shape[1] * group / max(shape[0], 1) * step)  # W: [C, M / group, k...]


def _known_size(vi: onnx.ValueInfoProto) -> int | None:
    t = vi.type.tensor_type
    if not t.HasField("shape") or not t.elem_type:
        return None
    dims = [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim]
    if any(d < 0 for d in dims):
        return None
    return math.prod(dims) * _itemsize(t.elem_type)


def _itemsize(elem_type: int) -> int:
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).itemsize
    except Exception:  # string or an unknown type: counts as a byte an element
        return 1
