"""Judging what the front half made: the policy and its baselines at every shape, the
warnings and the ops at risk. `build`, `report` and `check` read the same functions."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

import numpy as np

from trtbuild import __version__, words
from trtbuild.accuracy import risk
from trtbuild.accuracy.breakdown import kept_runs, split_error
from trtbuild.accuracy.judge import Candidate, Verdict, judge_all
from trtbuild.accuracy.masked import RULE_KEY, masked_at, rule_said
from trtbuild.accuracy.reference import ReferenceMeasures
from trtbuild.accuracy.report import Report, ShapeVerdict
from trtbuild.accuracy.sessions import EMULATED, trt_runner
from trtbuild.front import Front, baselines, kept_quantization
from trtbuild.graph.optypes import computes
from trtbuild.graph.view import in_sequences
from trtbuild.numerics import LOW_EPS, LOW_INF_AT, LOW_MAX
from trtbuild.policy.specs import AccuracySpec
from trtbuild.precision.convert import Converted
from trtbuild.words import first_few

# "Nearly constant" (docs/outputs.md): at a point, an output whose standard deviation over
# the data there is at most one step of the policy's low precision at the output's scale
# there (its largest |value|, and at least 1.0: the scale of a probability, a [0, 1] image or
# a logit; one step at 1.0 is LOW_EPS), or whose relative spread (standard deviation over
# largest |value|) is at most FLAT_AGAINST_POINTS of the relative spread it has at another
# judged point.
FLAT_AGAINST_POINTS = 0.01


def report_warnings(front: Front, flat: list[dict[str, Any]] | None = None) -> list[str]:
    """Every warning `check` prints and the report lists: the rules', the conversion's, the
    FP16 boundaries' and stored tensors' overflows, what control flow leaves unmeasured, and
    data that does not exercise the model (`flat`: `flat_outputs(front)`, where the caller
    has it already)."""
    return (
        front.warnings
        + boundary_warnings(front)
        + overflow_warnings(front)
        + body_warnings(front)
        + unmeasured_quantization(front)
        + upcast_warnings(front)
        + fewer_samples(front)
        + constant_inputs(front)
        + flat_warnings(flat_outputs(front) if flat is None else flat, front)
    )


def constant_inputs(front: Front) -> list[str]:
    """The integer inputs given no range whose random data is one value everywhere, in
    every sample and at every point: the default range `[0, 1)` holds only 0. A range of
    one value the policy writes (`token_type_ids: {low: 0, high: 1}`) is the user's.

    Why said: an exported BERT's `attention_mask` and token ids given no data were 0
    everywhere, every row of every attention masked; FP16 turned the mask's -3.4e38 into
    -inf and the softmax into NaN, and `tune` pinned an attention block per evaluation
    for data no user feeds.
    """
    given = {s.name for s in front.policy.inputs if s.data.range_given}
    spans: dict[str, tuple[int, int]] = {}  # each input's least and largest value so far
    for run in front.shapes:
        for name, data in run.data.items():
            if data.kind != "random" or name in given:
                continue
            for a in (np.asarray(f[name]) for f in run.feeds if name in f):
                if a.dtype.kind in "iu" and a.size:  # min and max: no copy of the data
                    least, most = a.min().item(), a.max().item()
                    low, high = spans.get(name, (least, most))
                    spans[name] = (min(low, least), max(high, most))
    constant = {n: low for n, (low, high) in spans.items() if low == high}
    if not constant:
        return []
    said = ", ".join(f"{n} is {v}" for n, v in constant.items())
    return [
        f"the random data of an integer input is one value everywhere ({said}, in every "
        "sample: the default range [0, 1) holds only 0), so every sample feeds the model "
        "the same; give each its range under inputs.<name>.data ({low: 0, high: 2} for a "
        "mask, {low: 0, high: <vocabulary size>} for token ids), or real samples in a file"
    ]


def fewer_samples(front: Front) -> list[str]:
    """The points judged on fewer samples than `accuracy.samples` asks: the data given holds
    no more (a file's frames, an image folder's whole batches; the images left over from the
    last batch are not judged).

    Why said: `samples: 3` over three images at batch 2 judged one sample, and the terminal
    said nothing of the two not asked for nor of the image left out. The default count, where
    the policy does not write it, is said as such: "accuracy.samples is 4" read as a key the
    user had written (and `samples: 4` written is the user's own: `PolicySource.writes`).
    """
    asked = front.policy.accuracy.samples
    default = next(f.default for f in fields(AccuracySpec) if f.name == "samples")
    # said only where the policy's text does not write it: `samples: 4` is the user's own
    src = front.policy.current_source
    defaulted = asked == default and not (src and src.writes(("accuracy", "samples")))
    short = [r for r in front.shapes if r.feeds and len(r.feeds) < asked]
    if not short:
        return []
    where = "; ".join(f"{len(r.feeds)} at {r.point.label}" for r in short)
    given = dict.fromkeys(
        f"{words.field('inputs', n)}: {d.source}"
        for r in short
        for n, d in r.data.items()
        if d.kind != "random"
    )
    return [
        f"accuracy.samples is {asked}{' (the default)' if defaulted else ''}, but the "
        f"data given holds fewer samples ({where}): "
        f"{'; '.join(given)} (a sample takes whole batches)"
    ]


def upcast_warnings(front: Front) -> list[str]:
    """A model that computed in FP16/BF16 as exported, made FP32 by `prepare` (its `upcast`
    record): what is judged and built is no longer the export's own FP16 choice."""
    from onnx import TensorProto

    done = [r for r in front.prepared.records if r.name == "upcast" and r.changed]
    if not done:
        return []
    low = done[0].details.get("from", "fp16")
    kind = TensorProto.BFLOAT16 if low == "bf16" else TensorProto.FLOAT16
    graph = front.prepared.model.graph
    bound = any(vi.type.tensor_type.elem_type == kind for vi in (*graph.input, *graph.output))
    return [
        f"the model computes in {low} as exported: prepare made it compute in FP32 "
        f"({done[0].changed} weights, casts and types; the values are exact), so the policy, "
        f"not the export, decides what runs in {low}"
        + (f"; its {low} inputs and outputs stay {low}" if bound else "")
    ]


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


def flat_outputs(front: Front) -> list[dict[str, Any]]:
    """report.json's `flat_outputs`: each (point, output) whose FP32 reference is constant or
    nearly so on the policy's data there, with the figures that say so.

    Why: an output that does not move with the data (a text detector's map on noise, ~1e-7
    everywhere) passes any precision; the verdict at that point proves nothing.
    """
    runs = [r for r in front.shapes if r.measures is not None and r.measures.output_std]
    default = front.policy.precision.default
    step = LOW_EPS.get(default, LOW_EPS["fp16"])  # an FP32 default: its FP16 rules
    found = []
    for out in runs[0].measures.outputs if runs else []:
        figures = {
            r.point.name: (r.measures.output_std[out], _output_peak(r.measures, out))
            for r in runs
            if out in r.measures.output_std
        }
        spread = {k: std / peak if peak > 0 else 0.0 for k, (std, peak) in figures.items()}
        floating = front.view.is_float(out) or out not in front.view.dtype
        for r in (r for r in runs if r.point.name in figures):
            std, peak = figures[r.point.name]
            widest = max((v for k, v in spread.items() if k != r.point.name), default=0.0)
            limit = step * max(1.0, peak) if floating else 0.0
            if out in r.measures.output_empty:
                why = "empty"  # no element on any feed
            elif std <= limit:
                why = "dtype"
            elif spread[r.point.name] <= FLAT_AGAINST_POINTS * widest:
                why, limit = "points", FLAT_AGAINST_POINTS * widest * peak
            else:
                continue
            found.append(
                {"point": r.point.name, "label": r.point.label, "output": out, "std": std,
                 "peak": peak, "limit": limit, "why": why, "samples": len(r.feeds)}
            )  # fmt: skip
    return found


def _output_peak(measures: ReferenceMeasures, output: str) -> float:
    """A graph output's largest |value| on the reference: a float's data peak, an integer's."""
    return measures.ranges.get(output) or measures.output_peak.get(output, 0.0)


def flat_warnings(flat: list[dict[str, Any]], front: Front) -> list[str]:
    """One warning per output that is nearly constant somewhere: the points, the figures and
    the fix (real data under `inputs.<name>.data`)."""
    by_output: dict[str, list[dict[str, Any]]] = {}
    for f in flat:
        by_output.setdefault(f["output"], []).append(f)
    names = [n for r in front.shapes[:1] for n in r.point.shapes]
    if front.shapes and not names:  # a model without inputs: no data could change its outputs
        return []
    names = names or ["<input>"]
    fix = " or ".join(f"`{words.field('inputs', n, 'data')}`" for n in names)
    low = front.policy.precision.default.upper().replace("FP32", "FP16")
    out = []
    for output, rows in by_output.items():
        if all(f["why"] == "empty" for f in rows):
            out.append(
                f"data does not exercise the model: output {output} is empty on every sample "
                f"of the FP32 reference at {', '.join(f['label'] for f in rows)} (no element: "
                f"a detector's boxes where it found nothing), so it passes whatever the engine "
                f"computes; give data under {fix} on which it finds something (real images)"
            )
            continue
        said = "; ".join(_flat_figures(f, low) for f in rows)
        out.append(
            f"data does not exercise the model: output {output} is constant or nearly so on "
            f"the FP32 reference ({said}), so a verdict there proves little; give real data "
            f"under {fix} (images, or a .npz of real samples)"
        )
    return out


def _flat_figures(f: dict[str, Any], low: str) -> str:
    """One point of a flat output, as `flat_warnings` says it: its spread and the limit."""
    if f["why"] == "empty":
        return f"at {f['label']}: empty on all {f['samples']} sample(s)"
    if f["why"] == "dtype" and not f["limit"]:  # an integer or bool output: no step to allow
        return f"at {f['label']}: every value the same on all {f['samples']} sample(s)"
    limit = (
        f"one {low} step at its scale"
        if f["why"] == "dtype"
        else "1% of its relative spread at another point"
    )
    return f"at {f['label']}: std {f['std']:.3g} over {f['samples']} sample(s), at most {f['limit']:.3g} ({limit})"


def overflow_warnings(front: Front) -> list[str]:
    """Tensors the policy stores in FP16 (or BF16) whose FP32 values pass that range on the
    reference data: they turn inf, and `accuracy.masked_overflow` says what `build` and `tune`
    make of it where the outputs hide it (`check` says so before anything is built).

    Past the range means from `LOW_INF_AT` on (65520 in FP16), where storing rounds to inf:
    a value between 65504 and it rounds to 65504, and an attention score plus FP16's own
    `finfo.min` mask (-65510) was said to turn inf and fail the policy, which then passed.
    """
    if front.measures is None:
        return []
    view, ranges = front.view, front.measures.ranges
    rule = front.policy.accuracy.masked_overflow
    found = []
    for i, d in enumerate(front.assignment.decisions):
        if d.precision not in LOW_MAX or view.scope[i]:
            continue
        for t in view.float_outputs(i):
            peak = ranges.get(t, 0.0)  # sentinels are not data
            if peak >= LOW_INF_AT[d.precision]:  # below it a value rounds to the largest
                found.append((view.nodes[i].name, view.nodes[i].op_type, t, peak, d.precision))
    if not found:
        return []
    shown = first_few([f"{n} ({op}) reaches {p:.4g}" for n, op, _, p, _ in found])
    did = "fails the policy" if rule == "fail" else "is only warned"
    low = found[0][4].upper()
    return [
        f"{len(found)} tensor(s) stored in {low} pass its range on the reference data and turn "
        f"inf: {shown}; where the outputs hide it, the masked overflow {did} "
        f"{rule_said(rule)}; pin them (a `name` rule) or `trtbuild tune`"
    ]


def body_warnings(front: Front) -> list[str]:
    """What is not measured inside control-flow bodies (ONNX Runtime hands out no body tensor).
    Not a SequenceMap's body: its nodes run FP32 with the sequence (`graph.view.in_sequences`)."""
    view = front.view
    inside = [
        i
        for i, n in enumerate(view.nodes)
        if view.scope[i]
        and view.float_outputs(i)
        and computes(n.op_type)
        and not in_sequences(view, i)
    ]
    if not inside:
        return []  # data movement only (shape checks): nothing computes there
    controls = list(dict.fromkeys(view.nodes[view.parent[i]].name for i in inside))
    shown = first_few(controls)
    text = (
        f"{len(inside)} compute node(s) run inside the control flow of {shown}: each of their tensors "
        "is measured by its peak only (an overflow there is found and named; the divergence is "
        "measured at the control node's outputs)"
    )
    scans = [_batched_scan_of(view, i) for i in inside]
    unprobed = list(dict.fromkeys(view.nodes[k].name for k in scans if k is not None))
    if unprobed:
        text += (
            f"; inside the opset-8 Scan {first_few(unprobed)} not even that: it carries every "
            "value with a batch axis, beside which no peak is carried, so it is measured at its "
            "outputs only"
        )
    blind = risk.unmeasured(view, front.converted.model)
    if blind:
        text += (
            f"; the internal sums of {len(blind)} low-precision op(s) there are not measured "
            f"({first_few(blind)}): pin them to be safe on any kernel"
        )
    return [text]


def _batched_scan_of(view: Any, i: int) -> int | None:
    """The opset-8 Scan node i runs inside (at any depth), whose body hands out no peaks
    (`accuracy.probes`); None where there is none."""
    from trtbuild.graph.subgraphs import batched_scan

    k = view.parent[i]
    while k is not None:
        if batched_scan(view.nodes[k]):
            return k
        k = view.parent[k]
    return None


def boundary_warnings(front: Front) -> list[str]:
    """Casts to FP16 or BF16 whose source values leave that range on the reference data."""
    if front.measures is None:
        return []
    found = []
    for cast in front.converted.casts:
        if cast.to in LOW_MAX:
            peak = front.measures.ranges.get(cast.tensor, 0.0)  # sentinels are not data
            if peak >= LOW_INF_AT[cast.to]:  # below it a value rounds to the largest
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
    per_shape, firsts = _per_point(front, candidates, verbose)
    main, base = firsts[0], firsts[1]  # the baseline's at_risk: what FP16 would risk
    fp32 = firsts[2] if len(firsts) > 2 else None
    flat = flat_outputs(front)  # measured once: the warnings and report.json's list
    report = Report(
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
        warnings=report_warnings(front, flat),
        backend=backend,
        version=__version__,
        masked_overflow_rule=policy.accuracy.masked_overflow,
        flat_outputs=[{k: v for k, v in f.items() if k != "label"} for f in flat],
    )
    return replace(report, warnings=report.warnings + masked_warnings(report))


def _per_point(
    front: Front, candidates: list[Candidate], verbose: bool
) -> tuple[list[ShapeVerdict], list[Verdict]]:
    """Each point's verdicts on the candidates (the primary point first), and the primary
    point's verdicts. At the last point each candidate lets its lean session go after its
    last sample (`judge_all`'s `again`): the next one's is made only then."""
    per_shape: list[ShapeVerdict] = []
    firsts: list[Verdict] = []
    model, spec = front.prepared.model, front.policy.accuracy
    dequantized = len(front.assignment.dequantized)
    kept = _kept_session(front)
    for run in front.shapes:  # every point of the input space, the primary first
        if run.reference is None:
            raise ValueError("evaluate_all needs every shape's reference tensors")
        last = run is front.shapes[-1]
        verdicts = judge_all(
            run.reference, model, candidates, run.feeds, spec, verbose=verbose, again=not last
        )
        point = run.point
        # reference_model only; against the graph as the policy keeps it, where it differs
        runs = kept_runs(kept, run.reference, run.feeds) if kept is not None else None
        split = split_error(
            run.reference, verdicts[0], spec, verbose, front.quantized, dequantized, runs
        )
        per_shape.append(
            ShapeVerdict(point.name, point.shapes, verdicts[0], verdicts[1], dict(run.data), split)
        )
        firsts = firsts or verdicts
    return per_shape, firsts


def _kept_session(front: Front) -> Any:
    """A session of the graph as the policy keeps it (`front.kept_quantization`), where the
    policy has a reference model and `dequantize: true` rules that take ops out; else None."""
    from trtbuild.accuracy.sessions import lean_session, session_model

    if front.policy.accuracy.reference_model is None:
        return None
    kept = kept_quantization(front)
    return lean_session(session_model(kept.model)) if kept is not None else None


def masked_warnings(report: Report) -> list[str]:
    """Under `accuracy.masked_overflow: warn`, each masked overflow as a warning too (the
    verdict passes; the warning says what it passed over)."""
    if report.masked_overflow_rule != "warn":
        return []
    return [
        f"{masked_at(s.label, o)}, and {RULE_KEY}: warn lets the policy pass (pin the node, "
        "or set fail)"
        for s, o in report.masked_overflows
    ]


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
