"""What the ONNX op schemas say about a node's types.

Why the schemas: which inputs follow a node's compute precision (type variable
`T`) and which are fixed (`Resize`'s scales are always float32, shapes are
int64) is written in the operator schema. Reading it generalises to every op
instead of a hand-kept list.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto

from trtbuild.graph.domains import DEFAULT_DOMAINS
from trtbuild.graph.subgraphs import CONTROL_FLOW

# The quantization ops (the graph's Q/DQ pairs, `graph.qdq`): written here, below the
# view, since what counts as compute (`computes`) leaves them out too.
QUANTIZE = "QuantizeLinear"
DEQUANTIZE = "DequantizeLinear"
QDQ_OPS = frozenset({QUANTIZE, DEQUANTIZE})
# ONNX Runtime's own operator domains (its contrib ops, the fusions of its transformer
# optimizer and offline graph optimizations): ONNX Runtime runs them; TensorRT's parser
# runs those that share an ONNX op's name (it imports by name) and looks for a plugin of
# the others' names, finding none.
ORT_DOMAINS = frozenset(
    {"com.microsoft", "com.microsoft.nchwc", "com.microsoft.experimental"}
    | {"com.ms.internal.nhwc", "com.microsoft.dml"}
)
FLOAT_TYPES = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16})
# Element types ONNX Runtime's Python API takes and hands out no array of ("No corresponding
# Numpy type"; numpy has none): no such value crosses a cut of the judge's run
# (`accuracy.stream`), and a graph input or output of one is exit 2 (`front`). FP8 is handed
# out as uint8, read back as FP8.
UNHANDED_TYPES = frozenset(
    getattr(TensorProto, name)
    for name in ("BFLOAT16", "INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2")
    if hasattr(TensorProto, name)
)
# whole numbers, booleans among them: what indices, shapes and masks are stored in
INTEGER_TYPES = frozenset(
    {
        TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64,
        TensorProto.UINT8, TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64,
        TensorProto.BOOL,
    }
)  # fmt: skip
PRECISION_DTYPE = {
    "fp16": TensorProto.FLOAT16,
    "bf16": TensorProto.BFLOAT16,
    "fp32": TensorProto.FLOAT,
}
DTYPE_STR = {
    TensorProto.FLOAT: "tensor(float)",
    TensorProto.FLOAT16: "tensor(float16)",
    TensorProto.BFLOAT16: "tensor(bfloat16)",
}
DTYPE_NAME = {TensorProto.FLOAT: "fp32", TensorProto.FLOAT16: "fp16", TensorProto.BFLOAT16: "bf16"}
LOW_DTYPES = {t: name for t, name in DTYPE_NAME.items() if t != TensorProto.FLOAT}  # 16-bit


def as_float_type(array: np.ndarray, dtype: int) -> np.ndarray:
    """`array` in the ONNX float type `dtype` (FLOAT16; BFLOAT16, through ml_dtypes; else
    FLOAT), rounded to nearest even as a Cast rounds it. Past the type's range a value is
    inf, silently: the callers that can meet one say so (`convert`'s weight warning)."""
    with np.errstate(over="ignore"):
        if dtype == TensorProto.FLOAT16:
            return array.astype(np.float16)
        if dtype == TensorProto.BFLOAT16:
            import ml_dtypes

            return array.astype(ml_dtypes.bfloat16)
        return array.astype(np.float32)


# Ops that read a value's shape alone, never its values
SHAPE_READERS = frozenset({"Shape", "Size"})

# Ops that only move or select data: no arithmetic, so they follow their input's
# precision instead of the default (a pinned result reshaped on its way to a
# graph output must not be truncated to FP16 by the reshape).
DATA_MOVEMENT = frozenset(
    {
        "Reshape",
        "Transpose",
        "Flatten",
        "Squeeze",
        "Unsqueeze",
        "Slice",
        "Gather",
        "GatherElements",
        "GatherND",
        "Split",
        "Expand",
        "Tile",
        "Identity",
        "Concat",
        "DepthToSpace",
        "SpaceToDepth",
        "Pad",
    }
)


# Ops that decide among values (an arg-extremum, a top-k), and the output holding the indices
# they chose: FP16 flips a decision between two values closer than its step (a codebook's
# nearest code, a class), and what reads the indices (a Gather) then diverges by whole
# values. The walk compares those indices with FP32's (`accuracy.judge`).
# Decisions whose count the data decides too: the axis along which each chosen index tuple
# lies (a NonZero's columns, a NonMaxSuppression's rows). FP16 may choose more or fewer.
SELECTIONS = {"NonZero": 1, "NonMaxSuppression": 0}
DECISIONS = {"ArgMax": 0, "ArgMin": 0, "TopK": 1, **dict.fromkeys(SELECTIONS, 0)}
# Ops whose output is a sequence or an optional, never a tensor.
NOT_TENSOR_OPS = frozenset(
    {"SequenceEmpty", "SequenceConstruct", "SequenceInsert", "SequenceErase", "SequenceMap"}
    | {"SplitToSequence", "Optional"}
)
# Ops that read a sequence or an optional, and those that make one: a sequence's element
# type is declared once (SequenceEmpty's `dtype`, its first element's), so every tensor
# put in or taken out of it keeps that type.
SEQUENCE_OPS = NOT_TENSOR_OPS | {
    "SequenceAt",
    "SequenceLength",
    "ConcatFromSequence",
    "OptionalGetElement",
    "OptionalHasElement",
}


# Ops that draw random numbers: their values differ from run to run, and TensorRT's
# generator is not ONNX Runtime's, so no reference judges what they reach.
RANDOM_OPS = frozenset(
    {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike"}
    | {"Bernoulli", "Multinomial"}
)
RANDOM_FIX = (
    "export the model with its noise fixed or as an input (StyleGAN2's and GFPGAN's "
    "randomize_noise=False; torch.randn_like in forward() becomes a RandomNormalLike node), "
    "or fold the generator's values into a weight"
)
# Ops TensorRT-RTX (1.7.1) refuses in a low precision where the ONNX schema types them in it
# (at opset 22 for BF16, 27/28 for FP16's Range and Celu): the build fails (exit 3). Each one
# builds in FP32; following the opset hint to such a schema led to that failure.
TENSORRT_REFUSES = {
    "bf16": frozenset({"HardSwish", "Mish", "LpNormalization", "LpPool", "GRU", "Range", "Celu"}),
    "fp16": frozenset({"Range", "Celu"}),
}
# The attribute that names a node's output type, where one does: `convert` writes in it the
# type the node computes in. (The random ops name theirs too, but are refused before any
# conversion: `RANDOM_OPS`; a DQ's opset-23 `output_dtype` is left out by `convert`.)
TYPE_ATTRIBUTES = {
    "Cast": "to",
    "EyeLike": "dtype",
    **dict.fromkeys(
        ("HannWindow", "HammingWindow", "BlackmanWindow", "MelWeightMatrix"), "output_datatype"
    ),
}
# Ops whose output is FLOAT where the attribute that types it is absent (the windows'
# `output_datatype`, a ConstantOfShape's `value`: float32 zeros): made another float type,
# `convert` writes the attribute.
FLOAT_WHEN_ABSENT = {
    "ConstantOfShape": "value",
    **{op: a for op, a in TYPE_ATTRIBUTES.items() if a == "output_datatype"},
}


def random(node: onnx.NodeProto) -> bool:
    """Whether this node draws random numbers (an ONNX op of `RANDOM_OPS`)."""
    return node.domain in DEFAULT_DOMAINS and node.op_type in RANDOM_OPS


def _unparsed(node: onnx.NodeProto, domains: frozenset[str]) -> bool:
    """Whether node is of one of `domains` and its name is no ONNX op's. TensorRT's parser
    imports an op by its name whatever its domain (a com.microsoft `Gelu` is ONNX's Gelu to
    it), and looks for a plugin of any other name, finding none."""
    return node.domain in domains and not onnx.defs.has(node.op_type)


def runtime_only(node: onnx.NodeProto) -> bool:
    """Whether ONNX Runtime runs this node and TensorRT's parser does not: an op of one of
    ONNX Runtime's own domains (`ORT_DOMAINS`): `BiasGelu`, `SkipLayerNormalization`."""
    return _unparsed(node, ORT_DOMAINS)


def classic_ml(node: onnx.NodeProto) -> bool:
    """Whether this is an ONNX-ML op (`ai.onnx.ml`: scikit-learn's and the other classic
    ML converters' trees, scalers, encoders), which ONNX Runtime runs and TensorRT's parser
    does not."""
    return _unparsed(node, ML_DOMAINS)


ML_DOMAINS = frozenset({"ai.onnx.ml"})
CLASSIC_ML_FIX = (
    "build an engine of the neural network alone (the part before or after these ops) and "
    "run the ai.onnx.ml part in ONNX Runtime"
)
RUNTIME_ONLY_FIX = (
    "give the model as exported, before onnxruntime.transformers.optimizer or ONNX Runtime's "
    "offline graph optimizations (SessionOptions.optimized_model_filepath) fused its ops"
)


def computes(op_type: str) -> bool:
    """Does a node of this op count as compute in FP16 shares?

    Why one predicate: the report's share, `check`'s counts and the tune
    benchmark's node share must count the same nodes. Data movement follows its
    input and a Cast only converts, so neither computes in a precision; control flow
    computes in its bodies, whose nodes count one by one. A QuantizeLinear or
    DequantizeLinear only converts too: TensorRT fuses it into the op it feeds,
    which counts as quantized (INT8/FP8) compute. A sequence op only puts tensors in a
    sequence or takes them out (SequenceMap computes in its body).
    """
    return (
        op_type not in DATA_MOVEMENT
        and op_type != "Cast"
        and op_type not in QDQ_OPS
        and op_type not in CONTROL_FLOW
        and op_type not in SEQUENCE_OPS
    )


@dataclass(frozen=True)
class OpTypes:
    """Type variables of a node's formal inputs/outputs and what each allows."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    allowed: dict[str, frozenset[str]]
    known: bool = True

    def input_var(self, index: int) -> str | None:
        if not self.inputs:
            return None
        return self.inputs[min(index, len(self.inputs) - 1)]  # variadic last formal repeats

    def output_var(self, index: int) -> str | None:
        if not self.outputs:
            return None
        return self.outputs[min(index, len(self.outputs) - 1)]

    def allows(self, var: str | None, dtype: int) -> bool:
        if var is None:
            return True
        return DTYPE_STR.get(dtype, "") in self.allowed.get(var, frozenset({var}))

    def is_var(self, var: str | None) -> bool:
        return var is not None and var in self.allowed and not var.startswith("tensor(")


UNKNOWN = OpTypes((), (), {}, known=False)


@functools.lru_cache(maxsize=4096)
def op_types(op_type: str, domain: str, opset: int) -> OpTypes:
    try:
        schema = onnx.defs.get_schema(op_type, max_inclusive_version=opset, domain=domain or "")
    except onnx.defs.SchemaError:
        return UNKNOWN
    allowed = {c.type_param_str: frozenset(c.allowed_type_strs) for c in schema.type_constraints}
    for formal in (*schema.inputs, *schema.outputs):
        if formal.type_str not in allowed:
            allowed[formal.type_str] = frozenset({formal.type_str})
    return OpTypes(
        tuple(f.type_str for f in schema.inputs),
        tuple(f.type_str for f in schema.outputs),
        allowed,
    )


@functools.lru_cache(maxsize=1024)
def opset_typing(op_type: str, opset: int, slot: int, dtype: int) -> int | None:
    """The first opset after `opset` (up to the newest this onnx knows) whose schema of
    `op_type` (default domain) types output `slot` in `dtype`, or None.

    Why: an op kept FP32 because its schema at the model's opset has no BF16 type (Conv
    and its kin until opset 22) left a BF16 CNN with every convolution FP32 and a cast
    around each, and nothing named the fix, `passes.opset`.
    """
    for version in range(opset + 1, onnx.defs.onnx_opset_version() + 1):
        types = op_types(op_type, "", version)
        var = types.output_var(slot)
        if types.known and (not types.is_var(var) or types.allows(var, dtype)):
            return version
    return None
