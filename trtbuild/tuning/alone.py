"""Each suspect's error alone: the ranking where one emulated run's error map ranks nothing.

Why: where the error accumulates layer after layer (a matting CNN whose sharp
final sigmoid amplifies every feature's rounding alike), no tensor's error jumps
but the last, and the error map scores every suspect the same: the growing then
pins nearly every group before a candidate passes, and the shrink unpins them
again one chunk after another (modnet: 66 of 69 groups grown, 68 evaluations).
Storing one group alone in the low precision, every other in FP32, measures what
that group adds to the failing outputs' error; the groups that add most are what
a passing candidate needs first (modnet: 24 evaluations, and more of it in FP16).

Why one session: a candidate per group (converted, emulated, a session each) cost
28 s on modnet's 69 groups. Here each group's stores sit behind a boolean input
of its own, so one session runs every suspect in turn at the cheapest point
(modnet's 67 in under 2 s). It only orders the suspects, and every verdict still
comes from the judge: where these stores differ from the emulation's (a body's
nodes and an op of unknown schema are not stored; `strict`'s stored sums are
not either; each rounding is charged to one group, `_Gated`), only the order can
change, never what passes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

from trtbuild.front import Front
from trtbuild.graph.optypes import PRECISION_DTYPE
from trtbuild.graph.view import GraphView
from trtbuild.policy.specs import Tolerance
from trtbuild.tuning.groups import Group

# The boolean input that rounds group k's tensors (a name no exporter writes).
GATE = "__trtbuild_alone_{}"
# The most suspects a ranking runs alone, one run each at the cheapest point: a run costs
# less than one evaluation (which converts, emulates and judges at every point), and a
# model whose error map ranks nothing may have thousands of suspects.
MOST_ALONE = 256


class _Gated:
    """The gated graph, node by node: with its gate on, a member's node stores in the low
    precision what pinning it to FP32 takes out of the current candidate (`stores`): its
    outputs, its weights, the graph inputs it reads, and the values it reads from a node
    that runs in FP32 there (the Cast before a low reader is the reader's).

    Why not a value a node in the low precision makes: the search starts from every group
    in the low precision and pins a few, so the maker stores that value there whether or
    not its reader is pinned. Each rounding is charged once: an activation to the group
    that makes it where that group is low, else to each low group that reads it; a
    weight or a graph input to each group that reads it. (On modnet, charging every read
    to the reader too took 27 evaluations instead of 24 and kept 83% of the FLOPs in
    FP16 instead of 93%, one run each, the answer pinning one more convolution.)
    """

    def __init__(self, front: Front, to: int, gate_of: dict[int, str], low_made: frozenset[str]):
        self.view, self.to, self.gate_of, self.low_made = front.view, to, gate_of, low_made
        self.nodes: list[onnx.NodeProto] = []

    def stored(self, src: str, dst: str, gate: str) -> None:
        """`dst`: `src` stored in the low precision where `gate` is on, else `src` itself.
        An `If`, not a `Where` of both: a run computes only the branch taken, so a gate
        off costs a copy, not a rounding (twice as fast a run on open_nsfw with 256 gates),
        and `If` is in every opset."""
        half, back, kept = f"{dst}__store", f"{dst}__load", f"{dst}__kept"
        out = [helper.make_tensor_value_info(back, TensorProto.FLOAT, None)]
        then = helper.make_graph(
            [
                helper.make_node("Cast", [src], [half], name=half, to=self.to),
                helper.make_node("Cast", [half], [back], name=back, to=TensorProto.FLOAT),
            ],
            f"{dst}__then",
            [],
            out,
        )
        keep = [helper.make_tensor_value_info(kept, TensorProto.FLOAT, None)]
        other = helper.make_graph(
            [helper.make_node("Identity", [src], [kept], name=kept)], f"{dst}__else", [], keep
        )
        self.nodes.append(
            helper.make_node(
                "If", [gate], [dst], name=f"{dst}__gate", then_branch=then, else_branch=other
            )
        )

    def add(self, i: int) -> None:
        gate, view = self.gate_of.get(i), self.view
        if gate is None:
            self.nodes.append(view.nodes[i])
            return
        node = onnx.NodeProto()
        node.CopyFrom(view.nodes[i])
        ins, outs = stores(view, i, self.to)
        copies: dict[str, str] = {}  # a value read twice is rounded once
        for k in ins:
            name = node.input[k]
            if name in self.low_made:
                continue  # stored by its maker, pinned or not (the class says why)
            if name not in copies:
                copies[name] = f"{name}__alone{i}"
                self.stored(name, copies[name], gate)
            node.input[k] = copies[name]
        for k in outs:
            node.output[k] = f"{node.output[k]}__alone_raw"
        self.nodes.append(node)
        for k in outs:
            self.stored(node.output[k], view.nodes[i].output[k], gate)


def stores(view: GraphView, i: int, to: int) -> tuple[list[int], list[int]]:
    """The input and output slots of node `i` that a candidate with it in the low precision
    `to` stores there: its FP32 values whose type variable allows `to` (not a Resize's
    scales, which stay FP32: rounded, they could change a shape), a Cast's output only;
    none of an op whose schema is unknown, which the conversion leaves as it is."""
    node, types = view.nodes[i], view.types(i)
    if not types.known:
        return [], []
    fp32 = lambda t: bool(t) and view.dtype.get(t) == TensorProto.FLOAT  # noqa: E731
    cast = node.op_type == "Cast"
    ins = [
        k
        for k, t in enumerate(node.input)
        if not cast and fp32(t) and types.is_var(types.input_var(k))
        and types.allows(types.input_var(k), to)
    ]  # fmt: skip
    outs = [
        k
        for k, t in enumerate(node.output)
        if fp32(t) and (cast or types.allows(types.output_var(k), to))
    ]
    return ins, outs


def gated_model(
    front: Front,
    groups_: list[Group],
    members: Sequence[int],
    low: str,
    low_made: frozenset[str] = frozenset(),
) -> onnx.ModelProto:
    """The prepared FP32 graph with each member group's values stored in `low` when its gate
    input (`GATE`) is true, kept as they are when false (an `If` each). A body's
    nodes are not gated (their group is not measured). `low_made`: the values the current
    candidate's makers store in `low` already (`_Gated`); none by default, every read
    stored by its reader."""
    view = front.view
    gate_of = {i: GATE.format(k) for k in members for i in groups_[k].nodes if not view.scope[i]}
    gated = _Gated(front, PRECISION_DTYPE[low], gate_of, low_made)
    for i in view.top:
        gated.add(i)
    model = onnx.ModelProto()
    model.CopyFrom(front.prepared.model)
    del model.graph.node[:]
    model.graph.node.extend(gated.nodes)
    for gate in sorted(set(gate_of.values())):
        model.graph.input.append(helper.make_tensor_value_info(gate, TensorProto.BOOL, []))
    return model


def errors_alone(
    front: Front,
    groups_: list[Group],
    members: Sequence[int],
    low: str,
    point: int,
    low_made: frozenset[str] = frozenset(),
) -> dict[int, dict[str, float]]:
    """Each member group's error on every FP32 output, that group alone in `low`: one run per
    group at `point` (an index into `front.shapes`), on its first feed, against the graph's
    own FP32 outputs (those of the quantized graph where the policy names a
    `reference_model`: what the gates-off run computes). The error is the statistic of the
    output's tolerance (`output_error`). A group with no node outside a body is left out
    (nothing of it is gated). `low_made` goes to `gated_model`."""
    from trtbuild.accuracy.sessions import (
        REFERENCE,
        lean_session,
        run_session,
        session_model,
    )

    model = gated_model(front, groups_, members, low, low_made)
    run = front.shapes[point]
    own = run.reference.graph_results
    reference = (run.reference.run_results if own is None else own)[REFERENCE][0]
    outputs = [n for n in front.view.outputs if front.view.dtype.get(n) == TensorProto.FLOAT]
    session = lean_session(session_model(model))
    del model
    gates = {i.name for i in session.get_inputs() if i.name.startswith(GATE.format(""))}
    off = {g: np.array(False) for g in gates}
    tolerance = front.policy.accuracy.tolerance
    measured = [k for k in members if GATE.format(k) in gates]
    found: dict[int, dict[str, float]] = {}
    for n, k in enumerate(measured):
        feed = {**run.feeds[0], **off, GATE.format(k): np.array(True)}
        values = run_session(session, outputs, feed, shrink=n == len(measured) - 1)
        found[k] = {
            name: output_error(value, np.asarray(reference[name]), tolerance(name))
            for name, value in zip(outputs, values)
        }
    return found


def output_error(out: np.ndarray, ref: np.ndarray, tol: Tolerance) -> float:
    """The error statistic `tol` judges an output by, against `ref` (larger is worse): a
    proxy that orders candidates as the check would, not the check itself. The absolute
    error's max, mean, median or quantile (Polygraphy fails such a check only where the
    relative one fails too); elementwise, the largest error over what atol or rtol
    allows there; for a PSNR, SNR or cosine threshold alone, the mean square error (PSNR
    and SNR fall as it grows; cosine similarity mostly does). Non-finite: inf."""
    if out.shape != ref.shape:  # a count the data decides is not FP32's: the worst there is
        return float("inf")
    err = np.abs(out.astype(np.float64) - ref.astype(np.float64))
    if err.size == 0:
        return 0.0
    if not np.isfinite(err).all():
        return float("inf")
    if not tol.simple:
        return float(np.mean(err**2))
    stat = tol.check_error_stat
    if stat == "elemwise":
        allowed = np.maximum(tol.atol, tol.rtol * np.abs(ref.astype(np.float64)))
        return float(np.max(err / np.maximum(allowed, 1e-30)))
    if stat == "quantile":
        q = tol.error_quantile
        return float(np.quantile(err, 0.5 if q is None else q))
    return float({"max": np.max, "mean": np.mean, "median": np.median}[stat](err))


def rank_alone(
    order: list[int], errors: dict[int, dict[str, float]], outputs: Sequence[str]
) -> list[int]:
    """`order` by what each group adds alone to the failing `outputs`, most first: each
    output's error scaled by its largest among the groups (so each output counts alike),
    summed. A group not measured (`errors_alone` left it out) is not ranked below those
    that were: it comes first. Ties keep `order`'s order."""
    measured = [errors[k] for k in order if k in errors]
    peak = {o: max((e.get(o, 0.0) for e in measured), default=0.0) for o in outputs}
    score = {
        k: sum(_share(errors[k].get(o, 0.0), peak[o]) for o in outputs)
        if k in errors
        else float("inf")
        for k in order
    }
    position = {k: n for n, k in enumerate(order)}
    return sorted(order, key=lambda k: (-score[k], position[k]))


def _share(value: float, peak: float) -> float:
    """`value` over `peak`, in [0, 1]: an inf peak counts only the infs."""
    if peak == 0.0:
        return 0.0
    if np.isinf(peak):
        return 1.0 if np.isinf(value) else 0.0
    return value / peak
