"""Judging what the front half made: the policy and its baselines at every shape, the
warnings and the ops at risk. `build`, `report` and `check` read the same functions."""

from __future__ import annotations

from typing import Any

from trtbuild import __version__
from trtbuild.accuracy import risk
from trtbuild.accuracy.breakdown import split_error
from trtbuild.accuracy.judge import Candidate, judge_all
from trtbuild.accuracy.report import Report, ShapeVerdict
from trtbuild.accuracy.sessions import EMULATED, trt_runner
from trtbuild.front import Front, baselines
from trtbuild.graph.optypes import computes
from trtbuild.numerics import LOW_MAX
from trtbuild.precision.convert import Converted


def report_warnings(front: Front) -> list[str]:
    """Every warning `check` prints and the report lists: the rules', the conversion's, the
    FP16 boundaries' and what control flow leaves unmeasured."""
    return (
        front.warnings
        + boundary_warnings(front)
        + body_warnings(front)
        + unmeasured_quantization(front)
    )


def unmeasured_quantization(front: Front) -> list[str]:
    """A quantized model judged without `accuracy.reference_model`: the reference is the
    quantized graph itself, so only the FP16 part of the error is measured."""
    if front.policy.accuracy.reference_model is not None:
        return []
    qdq = len(front.analysis.qdq().nodes)
    if not qdq:
        return []
    return [
        f"the model is quantized ({qdq} QuantizeLinear/DequantizeLinear nodes) and is judged "
        "against its own FP32 run: the quantization's own error is not measured, only the FP16 "
        "part; set accuracy.reference_model to the model before quantization to judge what "
        "ships against what was trained"
    ]


def body_warnings(front: Front) -> list[str]:
    """What is not measured inside control-flow bodies (ONNX Runtime hands out no body tensor)."""
    view = front.view
    inside = [
        i
        for i, n in enumerate(view.nodes)
        if view.scope[i] and view.float_outputs(i) and computes(n.op_type)
    ]
    if not inside:
        return []  # data movement only (shape checks): nothing computes there
    controls = list(dict.fromkeys(view.nodes[view.parent[i]].name for i in inside))
    shown = ", ".join(controls[:3]) + (f", +{len(controls) - 3} more" if len(controls) > 3 else "")
    text = (
        f"{len(inside)} compute node(s) run inside the control flow of {shown}: each of their tensors "
        "is measured by its peak only (an overflow there is found and named; the divergence is "
        "measured at the control node's outputs)"
    )
    blind = risk.unmeasured(view, front.converted.model)
    if blind:
        text += (
            f"; the internal sums of {len(blind)} low-precision op(s) there are not measured "
            f"({', '.join(blind[:3])}): pin them to be safe on any kernel"
        )
    return [text]


def boundary_warnings(front: Front) -> list[str]:
    """Casts to FP16 or BF16 whose source values leave that range on the reference data."""
    if front.measures is None:
        return []
    found = []
    for cast in front.converted.casts:
        if cast.to in LOW_MAX:
            peak = front.measures.ranges.get(cast.tensor, 0.0)  # sentinels are not data
            if peak > LOW_MAX[cast.to]:
                found.append(
                    f"boundary {cast.tensor} is cast to {cast.to.upper()} but reaches {peak:.4g} on "
                    f"the reference data ({cast.to.upper()} max {LOW_MAX[cast.to]:.6g}): pin its "
                    "consumers too"
                )
    return found


def at_risk(front: Front) -> list[dict[str, Any]]:
    """The policy's low-precision ops whose internal quantities leave their range (`check`)."""
    return risk.at_risk(front.measures.internals, front.converted.model) if front.measures else []


def evaluate_all(
    front: Front,
    *,
    engines: dict[str, bytes],
    backend: str,
    verbose: bool = False,
    base_models: dict[str, Converted] | None = None,
) -> Report:
    """Judge the policy and the all-FP16 baseline (and, with `fp32_check`, all-FP32).

    `engines` maps variant ("policy", "fp16", "fp32") to a plan; where a GPU runs
    it, its outputs are judged, otherwise the emulation's. The divergence and
    the at-risk list always come from the emulation. `base_models` are the
    baselines where the caller converted them already (`build` compiles them too).
    """
    policy, reference = front.policy, front.reference
    if reference is None:
        raise ValueError('evaluate_all needs the reference tensors; run_front(reference="tensors")')

    models = base_models if base_models is not None else baselines(front)
    variants = [("policy", front.converted, EMULATED), ("fp16", models["fp16"], EMULATED)]
    if policy.accuracy.fp32_check:
        variants.append(("fp32", models["fp32"], "onnxrt-fp32-graph"))
    candidates = _candidates(variants, engines, backend)
    per_shape, firsts = [], []
    for run in front.shapes:  # every point of the input space, the primary first
        if run.reference is None:
            raise ValueError("evaluate_all needs every shape's reference tensors")
        model, spec = front.prepared.model, policy.accuracy
        verdicts = judge_all(run.reference, model, candidates, run.feeds, spec, verbose=verbose)
        point = run.point
        split = split_error(run.reference, verdicts[0], spec, verbose)  # reference_model only
        per_shape.append(
            ShapeVerdict(point.name, point.shapes, verdicts[0], verdicts[1], dict(run.data), split)
        )
        firsts = firsts or verdicts
    main, base = firsts[0], firsts[1]  # the baseline's at_risk: what FP16 would risk
    fp32 = firsts[2] if len(firsts) > 2 else None
    return Report(
        policy=policy.where,
        model=str(policy.model),
        samples=len(front.feeds),
        emulation=policy.accuracy.emulation,
        divergence_threshold=policy.accuracy.divergence_threshold,
        precision=front.assignment.summary(),
        main=main,
        fp16=base,
        fp32=fp32,
        shapes=per_shape,
        skipped=list(front.skipped),
        warnings=report_warnings(front),
        backend=backend,
        version=__version__,
    )


def _candidates(
    variants: list[tuple[str, Converted, str]], engines: dict[str, bytes], backend: str
) -> list[Candidate]:
    """Each variant (and its engine, if built). The judge emulates a candidate when it first
    runs it and keeps that for every shape (`Candidate.reused`); a policy with no pin is its
    FP16 baseline, judged, and so emulated, once for both."""
    return [
        Candidate(mixed.model, label, trt_runner(engines[v], backend) if v in engines else None)
        for v, mixed, label in variants
    ]
