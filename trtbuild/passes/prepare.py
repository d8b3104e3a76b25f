"""The `prepare` stage: every graph pass, in order, with a record of each."""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from trtbuild.errors import UsageError
from trtbuild.graph import subgraphs
from trtbuild.graph.model_io import infer_shapes, strip_value_info
from trtbuild.graph.qdq import SCALE_OPSET
from trtbuild.passes import basic as passes
from trtbuild.passes import control, fuse
from trtbuild.passes.inline import inline_functions
from trtbuild.passes.upcast import upcast_low_precision
from trtbuild.policy.specs import Passes


@dataclass
class Prepared:
    model: onnx.ModelProto
    records: list[passes.PassRecord]

    def records_json(self) -> list[dict]:
        return [r.to_json() for r in self.records]


def prepare(
    model: onnx.ModelProto,
    options: Passes,
    *,
    source: str = "model",
    verbose: bool = False,
    budget: int | None = None,
) -> Prepared:
    """Sanitize: names, constants, opset, folding, fusions, shapes; each step recorded.

    `budget` bounds, in bytes, each constant folding may compute (the policy's
    `accuracy.memory_budget`; None: the machine's default budget): a larger one
    stays a node of the graph and its record says so. A sparse weight larger than it
    dense is refused (`dense_weights`).
    """
    records: list[passes.PassRecord] = []
    model = _inputs_and_weights(model, options, records, source, budget)
    model = _named_and_inlined(model, records)
    target = _opset(model, options.opset)
    try:
        model, rec = passes.upgrade_opset(model, target)
    except UsageError as exc:
        if target == options.opset:
            raise
        raise UsageError(
            f"{exc.message} (a quantized model needs opset {SCALE_OPSET}: FP16 scales)",
            where=source,
            hint=f"export or quantize the model at opset {SCALE_OPSET} (ModelOpt: --opset "
            f"{SCALE_OPSET}; torch.onnx.export(..., opset_version={SCALE_OPSET}))",
        ) from None
    if rec.changed and target != options.opset:
        rec.details["because"] = "Q/DQ: FP16 scales on DequantizeLinear need opset 19"
    records.append(rec)
    model, rec = passes.name_unnamed_nodes(model)  # what the converter added inside bodies
    if rec.changed:
        records.append(rec)
    model = _weights_in_fp32(model, records)
    if options.fold_constants:
        model, rec = passes.fold_constants(model, verbose, budget)
        records.append(rec)
        model = _fold_control_flow(model, records, verbose, budget)
    if options.fuse_layernorm:
        model, rec = fuse.fuse_layernorm(model)
        records.append(rec)
    if options.fold_batchnorm:
        model, rec = fuse.fold_batchnorm(model)
        records.append(rec)
    for made_by_nodes in (passes.body_outputs_made_inside, passes.weight_outputs_made):
        model, rec = made_by_nodes(model)
        if rec.changed:
            records.append(rec)
    model = infer_shapes(strip_value_info(model))
    _check_bodies(model, source)
    return Prepared(model, records)


def _inputs_and_weights(
    model: onnx.ModelProto, options: Passes, records: list, source: str, budget: int | None
) -> onnx.ModelProto:
    """Sparse weights made dense, then the inputs as the policy says (shapes, frozen
    values), then the weights an IR 3 export lists as inputs made weights only: what the
    later steps read as the graph's inputs and weights."""
    try:
        model, rec = passes.dense_weights(model, budget)
    except UsageError as exc:  # a sparse weight too large dense: the model is where it is
        raise UsageError(exc.message, where=source, hint=exc.hint) from None
    if rec.changed:
        records.append(rec)
    try:
        model, rec = passes.override_input_shapes(model, options.override_input_shapes)
    except UsageError as exc:  # it names the policy's field; the model is where inputs are
        raise UsageError(exc.message, where=exc.where or source, hint=exc.hint) from None
    records.append(rec)
    model, rec = control.freeze_inputs(model, options.freeze_inputs)
    if rec.changed:
        records.append(rec)
    model, rec = passes.drop_initializer_inputs(model)
    records.append(rec)
    return model


def _weights_in_fp32(model: onnx.ModelProto, records: list) -> onnx.ModelProto:
    """Constants lifted into weights, then a model that computes in FP16/BF16 made to
    compute in FP32: before folding, so what is folded is computed in FP32."""
    model, rec = passes.lift_constants(model)
    records.append(rec)
    model, rec = upcast_low_precision(model)
    if rec.changed:
        records.append(rec)
    return model


def _named_and_inlined(model: onnx.ModelProto, records: list) -> onnx.ModelProto:
    """Every node named, then local functions inlined: a call is named first, so the
    nodes it inlines are named under it."""
    model, rec = passes.name_unnamed_nodes(model)
    records.append(rec)
    model, rec = inline_functions(model)
    if rec.changed:
        records.append(rec)
        model, _ = passes.name_unnamed_nodes(model)  # a name an inlined node took already
    return model


def _opset(model: onnx.ModelProto, asked: int | None) -> int | None:
    """The opset to upgrade to: at least 19 for a quantized (Q/DQ) graph.

    Why: in a strongly typed network a DQ's output type is its scale's type, and
    an FP16 op fed by a DQ needs an FP16 scale, which only opset 19 allows; below
    it every DQ would need a Cast in front of the op it feeds, and TensorRT fuses
    a DQ into the op only when it is directly in front of it. The opset record
    says the upgrade (`to` 19).
    """
    from trtbuild.graph.optypes import QDQ_OPS

    if not any(n.op_type in QDQ_OPS for n in model.graph.node):
        return asked
    return max(asked or 0, SCALE_OPSET)


def _fold_control_flow(
    model: onnx.ModelProto, records: list, verbose: bool, budget: int | None
) -> onnx.ModelProto:
    """Inline the Ifs whose condition folded, and fold what that exposes (a few rounds).

    Folding can leave weights inside bodies; they move to the main graph as
    `lift_constants` moves them, so the conversion types each weight once.
    """
    for _ in range(3):
        model, rec = control.inline_constant_ifs(model)
        if not rec.changed:
            break
        records.append(rec)
        model, rec = passes.fold_constants(model, verbose, budget)
        records.append(rec)
    model, rec = passes.lift_constants(model)
    if rec.changed:
        records.append(rec)
    return model


def _check_bodies(model: onnx.ModelProto, source: str) -> None:
    """Refuse, naming the node, control flow whose bodies cannot keep one type per value."""
    for node in subgraphs.all_nodes(model):
        why = subgraphs.typing_problem(node) if subgraphs.has_body(node) else None
        if why is not None:
            raise UsageError(
                f"node {node.name!r} ({node.op_type}) cannot be typed consistently: {why}",
                where=source,
                hint="re-export the model so that every branch and iteration declares one type "
                "per value (the exporter's own output would fail in ONNX Runtime too)",
            )
