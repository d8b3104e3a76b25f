"""Each suspect's error alone: the ranking where one emulated run's error map ranks nothing.

Why: where the error accumulates layer after layer (a matting CNN whose sharp
final sigmoid amplifies every feature's rounding alike), no tensor's error jumps
but the last, and the error map scores every suspect the same: the growing then
pins nearly every group before a candidate passes, and the shrink unpins them
again one chunk after another (modnet: 66 of 69 groups grown, 68 evaluations).
Rounding one group alone, every other in FP32, measures what that group adds to
the failing outputs' error; the groups that add most are what a passing
candidate needs first (modnet: 24 evaluations, and more of it in FP16).

Why one session: a candidate per group (converted, emulated, a session each) cost
28 s on modnet's 69 groups. Here each group's storage rounding sits behind a
boolean input of its own, so one session runs every group in turn at the
cheapest point (69 runs in about 2 s). It only orders the suspects, and every
verdict still comes from the judge: where this rounding differs from the
emulation (a body's nodes stay FP32, `strict`'s stored sums are not rounded),
only the order can change, never what passes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

from trtbuild.front import Front
from trtbuild.graph.optypes import PRECISION_DTYPE
from trtbuild.policy.specs import Tolerance
from trtbuild.tuning.groups import Group

# The boolean input that rounds group k's tensors (a name no exporter writes).
GATE = "__trtbuild_alone_{}"


def gated_model(
    front: Front, groups_: list[Group], members: Sequence[int], low: str
) -> onnx.ModelProto:
    """The prepared FP32 graph with each member group's FP32 outputs and weights stored in
    `low` when its gate input (`GATE`) is true, kept as they are when false."""
    view, to = front.view, PRECISION_DTYPE[low]
    gate_of = {i: GATE.format(k) for k in members for i in groups_[k].nodes if not view.scope[i]}
    nodes: list[onnx.NodeProto] = []

    def stored(src: str, dst: str, gate: str) -> None:
        half, back = f"{dst}__store", f"{dst}__load"
        nodes.append(helper.make_node("Cast", [src], [half], name=half, to=to))
        nodes.append(helper.make_node("Cast", [half], [back], name=back, to=TensorProto.FLOAT))
        nodes.append(helper.make_node("Where", [gate, back, src], [dst], name=f"{dst}__gate"))

    for i in view.top:
        gate = gate_of.get(i)
        if gate is None:
            nodes.append(view.nodes[i])
            continue
        node = onnx.NodeProto()
        node.CopyFrom(view.nodes[i])
        for j, name in enumerate(node.input):
            if name in view.initializers and view.dtype.get(name) == TensorProto.FLOAT:
                node.input[j] = f"{name}__alone{i}"
                stored(name, node.input[j], gate)
        rounded = []
        for j, name in enumerate(node.output):
            if name and view.dtype.get(name) == TensorProto.FLOAT:
                node.output[j] = f"{name}__alone_raw"
                rounded.append(name)
        nodes.append(node)
        for name in rounded:
            stored(f"{name}__alone_raw", name, gate)
    model = onnx.ModelProto()
    model.CopyFrom(front.prepared.model)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    for gate in sorted(set(gate_of.values())):
        model.graph.input.append(helper.make_tensor_value_info(gate, TensorProto.BOOL, []))
    return model


def errors_alone(
    front: Front, groups_: list[Group], members: Sequence[int], low: str, point: int
) -> dict[int, dict[str, float]]:
    """Each member group's error on every float output, that group alone in `low`: one run
    per group at `point` (an index into `front.shapes`), on its first feed, against the
    FP32 reference. The error is the output's tolerance's own statistic (`output_error`)."""
    from trtbuild.accuracy.sessions import REFERENCE, plain_session, run_session

    run = front.shapes[point]
    reference = run.reference.run_results[REFERENCE][0]
    outputs = [n for n in front.view.outputs if front.view.dtype.get(n) == TensorProto.FLOAT]
    session = plain_session(gated_model(front, groups_, members, low).SerializeToString())
    gates = {i.name for i in session.get_inputs() if i.name.startswith(GATE.format(""))}
    off = {g: np.array(False) for g in gates}
    tolerance = front.policy.accuracy.tolerance
    found: dict[int, dict[str, float]] = {}
    for k in members:
        gate = GATE.format(k)
        if gate not in gates:  # every node of it in a body: nothing of it rounded here
            found[k] = dict.fromkeys(outputs, 0.0)
            continue
        feed = {**run.feeds[0], **off, gate: np.array(True)}
        values = run_session(session, outputs, feed, shrink=False)
        found[k] = {
            name: output_error(value, np.asarray(reference[name]), tolerance(name))
            for name, value in zip(outputs, values)
        }
    return found


def output_error(out: np.ndarray, ref: np.ndarray, tol: Tolerance) -> float:
    """The statistic `tol` judges an output by, of its error against `ref` (larger is worse):
    the error's max, mean, median or quantile; elementwise, the largest error over what
    atol and rtol allow there; for a PSNR, SNR or cosine threshold alone, the mean square
    error (each is monotonic in it for a given reference). Non-finite: inf."""
    err = np.abs(out.astype(np.float64) - ref.astype(np.float64))
    if err.size == 0:
        return 0.0
    if not np.isfinite(err).all():
        return float("inf")
    if not tol.simple:
        return float(np.mean(err**2))
    stat = tol.check_error_stat
    if stat == "elemwise":
        return float(np.max(err / (tol.atol + tol.rtol * np.abs(ref) + 1e-30)))
    if stat == "quantile":
        return float(np.quantile(err, tol.error_quantile or 0.5))
    return float({"max": np.max, "mean": np.mean, "median": np.median}[stat](err))


def rank_alone(
    order: list[int], errors: dict[int, dict[str, float]], outputs: Sequence[str]
) -> list[int]:
    """`order` by what each group adds alone to the failing `outputs`, most first: each
    output's error scaled by its largest among the groups (so each output counts alike),
    summed; ties keep `order`'s order."""
    peak = {o: max((errors[k].get(o, 0.0) for k in order), default=0.0) for o in outputs}
    score = {k: sum(_share(errors[k].get(o, 0.0), peak[o]) for o in outputs) for k in order}
    position = {k: n for n, k in enumerate(order)}
    return sorted(order, key=lambda k: (-score[k], position[k]))


def _share(value: float, peak: float) -> float:
    """`value` over `peak`, in [0, 1]: an inf peak counts only the infs."""
    if peak == 0.0:
        return 0.0
    if np.isinf(peak):
        return 1.0 if np.isinf(value) else 0.0
    return value / peak
