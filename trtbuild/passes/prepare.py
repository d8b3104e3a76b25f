"""The `prepare` stage: every graph pass, in order, with a record of each."""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from trtbuild.errors import UsageError
from trtbuild.graph import subgraphs
from trtbuild.graph.model_io import infer_shapes
from trtbuild.graph.qdq import SCALE_OPSET, WIDE_OPSET, WIDE_TYPES
from trtbuild.passes import basic as passes
from trtbuild.passes import control, fuse, opset
from trtbuild.passes.foreign_qdq import standard_qdq
from trtbuild.passes.inline import inline_functions
from trtbuild.passes.upcast import upcast_low_precision
from trtbuild.passes.weight_dq import dequantize_scalar_weights
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
    model = _upgraded(model, options, records, source)
    model, rec = passes.name_unnamed_nodes(model)  # what the converter added inside bodies
    if rec.changed:
        records.append(rec)
    model = _weights_in_fp32(model, records)
    model, rec = dequantize_scalar_weights(model)  # before folding: a weight, folded on
    if rec.changed:
        records.append(rec)
    if options.fold_constants:
        model, rec = passes.fold_constants(model, verbose, budget)
        records.append(rec)
        model = _fold_control_flow(model, records, verbose, budget)
        model = _fold_quantized_scalars(model, records, verbose, budget)
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
    model = infer_shapes(model, anew=True)
    _check_bodies(model, source)
    return Prepared(model, records)


def _fold_quantized_scalars(
    model: onnx.ModelProto, records: list, verbose: bool, budget: int | None
) -> onnx.ModelProto:
    """The quantized scalars folding made (a Q/DQ of a constant the fold computed), each
    dequantized and folded on, until none is left: arithmetic on constants that ONNX
    Runtime's `quantize_static` quantized step by step (a MobileViT's shape arithmetic:
    Ceil, Q/DQ, Mul, Q/DQ, Cast to int64), which the fold leaves at each Q/DQ."""
    for _ in range(len(model.graph.node)):  # each round removes a DQ: it ends
        model, rec = dequantize_scalar_weights(model)
        if not rec.changed:
            break
        records.append(rec)
        model, rec = passes.fold_constants(model, verbose, budget)
        records.append(rec)
    return model


def _upgraded(
    model: onnx.ModelProto, options: Passes, records: list, source: str
) -> onnx.ModelProto:
    """The opset upgrade (to what the policy asks, or a quantized graph needs), then ONNX
    Runtime's own Q/DQ made ONNX's, at the opset their types need."""
    target = _opset(model, options.opset)
    try:
        model, rec = opset.upgrade_opset(model, target)
    except UsageError as exc:
        if target == options.opset:
            raise
        raise UsageError(
            f"{exc.message} (a quantized model needs opset {target}: "
            f"{'FP16 scales' if target == SCALE_OPSET else 'INT4 or INT16 Q/DQ'})",
            where=source,
            hint=f"export or quantize the model at opset {target} (ModelOpt: --opset "
            f"{target}; torch.onnx.export(..., opset_version={target}))",
        ) from None
    if rec.changed and target != options.opset:
        rec.details["because"] = (
            "Q/DQ: FP16 scales on DequantizeLinear need opset 19"
            if target == SCALE_OPSET
            else "Q/DQ of INT4 or INT16 values are ONNX's from opset 21"
        )
    records.append(rec)
    model, rec = standard_qdq(model)  # at the opset its types need
    if rec.changed:
        records.append(rec)
    return model


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
    # an unknown input is the policy's field (its file and line: `front`'s fields_located)
    model, rec = passes.override_input_shapes(model, options.override_input_shapes)
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
    """The opset to upgrade to: at least 19 for a quantized (Q/DQ) graph, 21 where a Q/DQ
    holds INT4 or INT16 values.

    Why: in a strongly typed network a DQ's output type is its scale's type, and
    an FP16 op fed by a DQ needs an FP16 scale, which only opset 19 allows; below
    it every DQ would need a Cast in front of the op it feeds, and TensorRT fuses
    a DQ into the op only when it is directly in front of it. ONNX's Q/DQ take INT4 and
    INT16 from opset 21 (ONNX Runtime writes its own below it, made ONNX's after the
    upgrade). The opset record says the upgrade (`to` 19 or 21).
    """
    from trtbuild.graph.optypes import DEQUANTIZE, QDQ_OPS
    from trtbuild.graph.qdq import foreign_qdq

    ops = [(n, foreign_qdq(n) or n.op_type) for n in subgraphs.all_nodes(model)]
    qdq = [(n, op) for n, op in ops if op in QDQ_OPS]
    if not qdq:
        return asked
    held = [n.input[0] if op == DEQUANTIZE else "" for n, op in qdq]  # a Q's: its zero point's
    held += [n.input[2] for n, _ in qdq if len(n.input) > 2]
    typed = _declared_types(model)
    wide = any(typed.get(t) in WIDE_TYPES for t in held if t)
    return max(asked or 0, WIDE_OPSET if wide else SCALE_OPSET)


def _declared_types(model: onnx.ModelProto) -> dict[str, int]:
    """Each value's element type where the model declares it, bodies included: inputs,
    value_info, weights and `Constant`s (before they are lifted)."""
    typed: dict[str, int] = {}
    for _, graph in subgraphs.walk(model.graph):
        ends = (*graph.input, *graph.value_info, *graph.output)
        typed.update({vi.name: vi.type.tensor_type.elem_type for vi in ends})
    typed.update((name, t.data_type) for name, t in subgraphs.held_tensors(model).items())
    return typed


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
