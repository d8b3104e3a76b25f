"""The `prepare` stage: every graph pass, in order, with a record of each."""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from trtbuild.errors import UsageError
from trtbuild.graph.model_io import infer_shapes, strip_value_info
from trtbuild.passes import basic as passes
from trtbuild.passes import fuse
from trtbuild.policy.model import Passes

_CONTROL_FLOW = {"If", "Loop", "Scan"}


@dataclass
class Prepared:
    model: onnx.ModelProto
    records: list[passes.PassRecord]

    def records_json(self) -> list[dict]:
        return [r.to_json() for r in self.records]


def prepare(
    model: onnx.ModelProto, options: Passes, *, source: str = "model", verbose: bool = False
) -> Prepared:
    """Sanitize: names, constants, opset, folding, fusions, shapes; each step recorded."""
    _reject_unsupported(model, source)
    records = []
    try:
        model, rec = passes.override_input_shapes(model, options.override_input_shapes)
    except UsageError as exc:  # it names the policy's field; the model is where inputs are
        raise UsageError(exc.message, where=exc.where or source, hint=exc.hint) from None
    records.append(rec)
    model, rec = passes.drop_initializer_inputs(model)
    records.append(rec)
    model, rec = passes.name_unnamed_nodes(model)
    records.append(rec)
    model, rec = passes.upgrade_opset(model, options.opset)
    records.append(rec)
    model, rec = passes.lift_constants(model)
    records.append(rec)
    if options.fold_constants:
        model, rec = passes.fold_constants(model, verbose)
        records.append(rec)
    if options.fuse_layernorm:
        model, rec = fuse.fuse_layernorm(model)
        records.append(rec)
    if options.fold_batchnorm:
        model, rec = fuse.fold_batchnorm(model)
        records.append(rec)
    model = infer_shapes(strip_value_info(model))
    return Prepared(model, records)


def _reject_unsupported(model: onnx.ModelProto, source: str) -> None:
    for node in model.graph.node:
        if node.op_type in _CONTROL_FLOW and node.domain in ("", "ai.onnx"):
            raise UsageError(
                f"node {node.name or '(unnamed)'!r} is a {node.op_type} with a subgraph; "
                "control-flow subgraphs are not supported yet",
                where=source,
                hint="export the model without control flow (e.g. trace with fixed sizes)",
            )
