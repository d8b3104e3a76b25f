"""The validated policy's parts as immutable values (`model.Policy` holds them).

Why frozen dataclasses with tuple fields: the pipeline passes a policy through
every stage, and `tune` derives new policies from old ones; nothing may change a
policy behind another stage's back (ModelOpt's mutable defaults are a lesson).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, is_dataclass
from pathlib import Path
from typing import Any

from trtbuild.graph.patterns import PATTERNS
from trtbuild.numerics import FP16_MAX, LOW_PHASE_MAX, LOW_WHOLE, PHASE_ERROR
from trtbuild.policy.keys import (
    BOOL,
    DIMS,
    NAME,
    NONNEG,
    NUMBER,
    NUMBERS,
    SIZE,
    enum,
    integer,
    key,
    keyed,
    section,
)
from trtbuild.sizes import parse_size

PRECISIONS = ("fp16", "bf16", "fp32")
BACKENDS = ("auto", "tensorrt", "tensorrt-rtx", "none")
# What ONNX Runtime's check of the mixed model loads (`precision.validate`): one of each
# neighbourhood not yet checked (the default), or the whole model each time
ORT_CHECKS = ("neighbourhoods", "whole")
ERROR_STATS = ("elemwise", "max", "mean", "median", "quantile")
MAX_SAMPLES = 10_000
OPSET_RANGE = (7, 99)  # passes.opset and `prepare --opset`: ONNX Runtime runs opset 7 on
# The fix for a model older than ONNX Runtime or TensorRT's parser reads (opset 6 exports).
OPSET_FIX = "upgrade the model in the graph passes: `passes: {opset: 17}` in the policy"
EMULATIONS = ("storage", "strict")
# When the judge walks the graph for the first divergence and the error curve.
WALKS = ("on_failure", "always")
# What a value an output masks does to the verdict: a tensor of the graph (or a boundary Cast
# the conversion adds) that turns non-finite where FP32 is finite, with every output in
# tolerance. One rule for build, report, tune and the nightly.
MASKED_OVERFLOWS = ("fail", "warn")
IMAGE_FITS = ("resize", "crop")  # how images are brought to each point's H x W
DERIVATIONS = ("tile", "synthetic", "none")  # a file's data at a point of another shape
# PIL's own limit (Image.MAX_IMAGE_PIXELS); beyond twice it PIL refuses to decode at all
DEFAULT_MAX_IMAGE_PIXELS = 89_478_485


def _floats(value: float | list) -> tuple[float, ...]:
    return tuple(float(v) for v in value) if isinstance(value, list) else (float(value),)


def _bytes(value: int | str) -> int:
    return value if isinstance(value, int) else parse_size(value)


def _pairs(value: dict) -> tuple[tuple[str, Any], ...]:
    """A mapping keyed by input name as ((name, value), ...), lists made tuples."""
    return tuple((n, tuple(v) if isinstance(v, list) else v) for n, v in value.items())


def _mapping(pairs: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    """`_pairs` undone: what a policy file holds."""
    return {n: list(v) if isinstance(v, tuple) else v for n, v in pairs}


_PER_CHANNEL = "normal: a number; images: one per channel"


@dataclass(frozen=True)
class ImageSpec:
    """A folder of images turned into input tensors the way a deployment preprocesses them."""

    folder: Path = field(
        metadata=key(NAME, "a folder, relative to the policy", yaml="images", path=True)
    )
    resize: tuple[int, int] | None = field(
        default=None,
        metadata=key(
            {"type": "array", "items": integer(1, 65536), "minItems": 2, "maxItems": 2},
            "with fit: crop, the pixel scale: each image is scaled once from the original to "
            "[H, W] and every point is centre-cropped from that (mirror-padded where a point is "
            "larger, and said so); with fit: resize exit 2, as each point is resized straight "
            "from the original",
            read=tuple,
        ),
    )
    fit: str = field(
        default="resize",
        metadata=key(
            enum(IMAGE_FITS),
            "how images meet each point's H, W, always from the original: resize (default) "
            "or crop (centre crop, mirrored padding where the image is smaller; keeps the "
            "pixel scale). A point larger than an image says so (upsampled or mirror-padded)",
        ),
    )
    # default: where the channel dimension is 1 or 3
    layout: str | None = field(default=None, metadata=key(enum(["NCHW", "NHWC"])))
    channels: str = field(default="RGB", metadata=key(enum(["RGB", "BGR", "GRAY"])))
    scale: float | None = field(
        default=None,
        metadata=key(
            NUMBER,
            "pixels are multiplied by this before mean/std (default 1/255; an integer input, "
            "a uint8 image, takes the pixels as they are)",
            read=float,
            show_default=False,
        ),
    )
    mean: tuple[float, ...] = field(
        default=(0.0,), metadata=key(NUMBERS, _PER_CHANNEL, read=_floats, show_default=False)
    )
    std: tuple[float, ...] = field(
        default=(1.0,), metadata=key(NUMBERS, _PER_CHANNEL, read=_floats, show_default=False)
    )


@dataclass(frozen=True)
class DataSpec:
    """How reference inputs are made: a seeded distribution, a file, or images."""

    distribution: str = field(default="uniform", metadata=key(enum(["uniform", "normal"])))
    low: float = field(default=0.0, metadata=key(NUMBER, read=float))
    high: float = field(default=1.0, metadata=key(NUMBER, read=float))
    # a distribution's; images take theirs per channel (ImageSpec declares the key alike)
    mean: float = field(
        default=0.0, metadata=key(NUMBERS, _PER_CHANNEL, read=float, show_default=False)
    )
    std: float = field(
        default=1.0, metadata=key(NUMBERS, _PER_CHANNEL, read=float, show_default=False)
    )
    file: Path | None = field(default=None, metadata=key(NAME, path=True))
    images: ImageSpec | None = None  # made from the ImageSpec keys of the same mapping
    # `low` or `high` written in the policy file: a range of one value is then the user's
    # choice (`evaluation.constant_inputs` says the default's). Where the range came from,
    # not what it is: no part of the policy's value (equality, its text)
    range_given: bool = field(default=False, compare=False)
    derive: str = field(
        default="tile",
        metadata=key(
            enum(DERIVATIONS),
            "a file's data at a point whose shape its arrays do not have: tile (default; "
            "crop or repeat along the axes that differ), synthetic (random values with the "
            "data's per-channel mean, std and range; integers and booleans uniform in its "
            "range) or none (exit 2: give the point data in "
            "accuracy.shapes or skip it)",
        ),
    )


@dataclass(frozen=True)
class InputSpec:
    name: str  # the key of `inputs:`
    shape: tuple[int, ...] | None = field(default=None, metadata=key(DIMS, read=tuple))
    min: tuple[int, ...] | None = field(default=None, metadata=key(DIMS, read=tuple))
    opt: tuple[int, ...] | None = field(default=None, metadata=key(DIMS, read=tuple))
    max: tuple[int, ...] | None = field(default=None, metadata=key(DIMS, read=tuple))
    data: DataSpec = field(
        default_factory=DataSpec,
        metadata=key(
            section(DataSpec, ImageSpec),
            "How reference inputs are made: a seeded distribution, an .npz file keyed by "
            "input name (or an .npy, this input's one array), or a folder of images (resized, "
            "scaled, normalised per channel).",
            built=True,
        ),
    )

    @property
    def feed_shape(self) -> tuple[int, ...] | None:
        """The shape reference data is made with: `shape`, else the profile's `opt`."""
        return self.shape if self.shape is not None else self.opt


# A dim given by name (dynamic) in `passes.override_input_shapes`, as ONNX's dim_param
DIM_NAME = "[A-Za-z_][A-Za-z0-9_]{0,63}"


@dataclass(frozen=True)
class Passes:
    opset: int | None = field(default=None, metadata=key(integer(*OPSET_RANGE)))
    fuse_layernorm: bool = field(default=True, metadata=key(BOOL))
    fold_constants: bool = field(default=True, metadata=key(BOOL))
    fold_batchnorm: bool = field(default=True, metadata=key(BOOL))
    # Polygraphy's --override-input-shapes: ((input, dims), ...), a dim a number or a name
    override_input_shapes: tuple[tuple[str, tuple[int | str, ...]], ...] = field(
        default=(),
        metadata=key(
            {
                "type": "object",
                "maxProperties": 1000,
                "additionalProperties": {
                    "type": "array",
                    "maxItems": 16,
                    "items": {
                        "oneOf": [
                            integer(1, 2**31 - 1),
                            {"type": "string", "pattern": f"^{DIM_NAME}$"},
                        ]
                    },
                },
            },
            "new declared input shapes, as Polygraphy's surgeon sanitize "
            "--override-input-shapes: {INPUT: [dims]}, a dim a number or a name (dynamic)",
            read=_pairs,
            write=_mapping,
        ),
    )
    # inputs made constants: ((input, value), ...), a value a number, a bool or a flat list
    freeze_inputs: tuple[tuple[str, Any], ...] = field(
        default=(),
        metadata=key(
            {
                "type": "object",
                "maxProperties": 1000,
                "additionalProperties": {
                    "oneOf": [NUMBER, BOOL, {"type": "array", "maxItems": 4096, "items": NUMBER}]
                },
            },
            "inputs that become constants of the given value, as an engine built for one of "
            "them serves it (Silero VAD's sample rate): {INPUT: value}; control flow that "
            "branches on it folds away",
            read=_pairs,
            write=_mapping,
        ),
    )


@dataclass(frozen=True)
class Match:
    """What a rule matches; every key given must hold."""

    name: str | None = field(default=None, metadata=key(NAME, "regex, re.search on node names"))
    op: tuple[str, ...] = field(
        default=(),
        metadata=key(
            {"oneOf": [NAME, {"type": "array", "items": NAME, "minItems": 1, "maxItems": 1000}]},
            read=lambda op: (op,) if isinstance(op, str) else tuple(op),
            # no op: any op (the key left out); what is no tuple left for the schema to name
            write=lambda op: (list(op) if isinstance(op, tuple | list) else op) or None,
            show_default=False,
        ),
    )
    pattern: str | None = field(
        default=None,
        metadata=key(
            enum(PATTERNS), "; ".join(f"{k}: {p.description}" for k, p in PATTERNS.items())
        ),
    )
    last: int | None = field(default=None, metadata=key(integer(1, 1_000_000)))
    max_abs_above: float | None = field(default=None, metadata=key(NONNEG))
    initializer_abs_above: float | None = field(default=None, metadata=key(NONNEG))
    reduction_depth_above: int | None = field(default=None, metadata=key(integer(1, 2**62)))

    def __post_init__(self) -> None:
        if isinstance(self.op, str):  # one op, as a file may give it: not its letters
            object.__setattr__(self, "op", (self.op,))
        elif isinstance(self.op, list):  # a caller's list: a copy, not theirs to change
            object.__setattr__(self, "op", tuple(self.op))


@dataclass(frozen=True)
class Rule:
    id: str = field(metadata=key({**NAME, "pattern": "^(?!guard:)"}))
    match: Match = field(
        metadata=key(
            section(Match, minProperties=1),
            "All keys must hold for a node to match.",
            built=True,
        )
    )
    precision: str = field(metadata=key(enum(PRECISIONS)))
    why: str | None = field(default=None, metadata=key({"type": "string", "maxLength": 4096}))
    dequantize: bool = field(
        default=False,
        metadata=key(
            BOOL,
            "Take the matched ops of a quantized model out of INT8/FP8 altogether: each "
            "reads the float tensor in front of its Q and its weight dequantized, in the "
            "rule's precision. Without it, a pin keeps the INT8 math (FP32 scales, FP32 output).",
        ),
    )


def _weight_range(low: str) -> Rule:
    return Rule(
        id="guard:weight-range",
        match=Match(initializer_abs_above=FP16_MAX),
        precision="fp32",
        why="consumes a weight that is finite in FP32 and beyond the FP16 range",
    )


def _periodic_range(low: str) -> Rule | None:
    if low not in LOW_PHASE_MAX:  # an FP32 policy: nothing to guard, no reference to run
        return None
    bound = LOW_PHASE_MAX[low]
    return Rule(
        id="guard:periodic-range",
        match=Match(pattern="periodic_arguments", max_abs_above=bound),
        precision="fp32",
        why=f"computes a periodic op's argument past {bound:g}, which {low.upper()} rounds by "
        f"more than {PHASE_ERROR:g} rad",
    )


def _shape_arithmetic(low: str) -> Rule | None:
    if low not in LOW_WHOLE:  # an FP32 policy: nothing made low
        return None
    return Rule(
        id="guard:shape-arithmetic",
        match=Match(pattern="shape_arithmetic"),
        precision="fp32",
        why=f"computes a shape (TensorRT's shape tensors): {low.upper()} holds integers exactly "
        f"only up to {LOW_WHOLE[low]}, and TensorRT-RTX refuses it there",
    )


# Built-in safety rules, applied after the user's (a user rule naming a node wins), each made
# for the policy's default precision (None: nothing to guard there).
# Why weight-range: a weight beyond 65504 is inf in FP16 (Hugging Face's mask constant
# finfo(float32).min among them) and `0 x -inf` is NaN; ModelOpt AutoCast keeps such
# nodes in FP32 by default too. Why periodic-range: FP16 stores a timestep embedding's
# t * freq (t up to 1000) to a quarter of a radian and a rotary embedding's position *
# inv_freq worse still past 1024 positions: sin and cos of it are noise, which random
# weights may not show at the outputs; BF16 loses the phase from 4 on. Why shape-arithmetic:
# a resize's scale from the input's size made FP16 changed the output's shape, and
# TensorRT-RTX refuses FP16 in its shape computations (`patterns._shape_arithmetic`).
GUARDS: dict[str, Callable[[str], Rule | None]] = {
    "weight-range": _weight_range,
    "periodic-range": _periodic_range,
    "shape-arithmetic": _shape_arithmetic,
}


@dataclass(frozen=True)
class Precision:
    default: str = field(default="fp16", metadata=key(enum(PRECISIONS)))
    # read by no stage: the only choice there is (TensorRT 11 is strongly typed, the graph's
    # I/O types are its own), a field so that the schema, the loader and to_dict know the key
    io: str = field(
        default="keep", metadata=key(enum(["keep"]), "graph inputs/outputs keep their dtypes")
    )
    rules: tuple[Rule, ...] = field(
        default=(),
        metadata=key(
            {"type": "array", "maxItems": 10_000, "items": section(Rule)},
            built=True,
            show_default=False,
        ),
    )
    # names of the guards that apply
    guards: tuple[str, ...] = field(
        default=tuple(GUARDS),
        metadata=key(
            {
                "oneOf": [
                    BOOL,
                    {"type": "array", "items": enum(list(GUARDS)), "maxItems": len(GUARDS)},
                ]
            },
            "built-in safety rules applied after the user's: true (all, the default), false "
            "(none), or a list of guard names to keep",
            read=lambda g: tuple(GUARDS) if g is True else tuple(g or ()),
            show_default=False,
        ),
    )

    def all_rules(self) -> tuple[Rule, ...]:
        """The user's rules, then the enabled guards: the order assignment applies them."""
        guards = (GUARDS[name](self.default) for name in self.guards)
        return self.rules + tuple(g for g in guards if g is not None)


@dataclass(frozen=True)
class BuildSpec:
    backend: str = field(default="auto", metadata=key(enum(BACKENDS)))
    compute_capabilities: tuple[str, ...] = field(
        default=("8.9",),
        metadata=key(
            {
                "type": "array",
                "items": {"type": "string", "pattern": r"^\d+\.\d+$", "maxLength": 8},
                "minItems": 1,
                "maxItems": 16,
            },
            read=tuple,
        ),
    )
    workspace: int = field(default=4 << 30, metadata=key(SIZE, read=_bytes))
    timing_cache: Path | None = field(
        default=None, metadata=key({"type": ["string", "null"], "maxLength": 4096}, path=True)
    )
    variants: bool = field(
        default=True,
        metadata=key(
            BOOL, "also build all-FP16 and all-FP32 engines to show what the policy costs"
        ),
    )
    decomposable_attention: bool = field(
        default=True,
        metadata=key(
            BOOL,
            "let TensorRT split an ONNX Attention (opset 23 on) into several kernels where "
            "it has no fused kernel for its shapes and types (IAttention's decomposable; a "
            "fused kernel is still taken where there is one); false, as TensorRT's parser "
            "leaves it, fails such a build (TensorRT-RTX 1.7: every FP32 attention)",
        ),
    )
    ort_check_timeout: float | None = field(
        default=None,  # None: scaled to the mixed model's size (precision.ort_child)
        metadata=key(
            {"type": ["number", "null"], "minimum": 0, "maximum": 7 * 86400},
            "seconds ONNX Runtime's load of the mixed model (a session in a child process, "
            "waited for before anything is written) may take; past it the command ends "
            "with exit 2. Default: 60 s and 1 s more per 4 MiB of model; 0 skips this check "
            "(onnx.checker's still runs)",
            show_default=False,
        ),
    )
    ort_check: str = field(
        default=ORT_CHECKS[0],
        metadata=key(
            enum(ORT_CHECKS),
            "what ONNX Runtime's check of the mixed model loads: neighbourhoods (the "
            "default: one of each node's 3-hop neighbourhood not checked before, remembered "
            "in the cache, so a rule edit that makes none new starts no session) or whole "
            "(the whole model, every time)",
        ),
    )


SIMPLE_KEYS = ("atol", "rtol", "check_error_stat", "error_quantile")  # SimpleCompareFunc's
METRIC_KEYS = ("psnr_threshold", "cosine_similarity_threshold", "snr_threshold")


def simple_applies(given: Mapping[str, Any]) -> bool:
    """Whether an output whose tolerance keys are `given` (the default's, then its own) is
    judged by the simple atol/rtol check: where one of its keys is given, or no other
    check is (a metric threshold, `compare: indices`). `compare: values` is no other
    check: alone it judged nothing, and every output passed."""
    return any(k in given for k in SIMPLE_KEYS) or not _other_checks(given)


def _other_checks(given: Mapping[str, Any]) -> bool:
    """Whether `given` holds a check besides the simple one: a metric threshold, or
    `compare: indices` (`compare: values` is none)."""
    return any(given.get(k) is not None for k in METRIC_KEYS) or given.get("compare") == "indices"


@dataclass(frozen=True)
class Tolerance:
    """How one output is judged, by Polygraphy's names; every check it holds must pass.

    `simple` is Polygraphy's `SimpleCompareFunc` (atol, rtol, check_error_stat,
    error_quantile): judged when any of its keys is given, or when no other check
    is. The metric thresholds are its `PsnrCompareFunc`,
    `CosineSimilarityCompareFunc` and `SnrCompareFunc`; `compare: indices` is its
    `IndicesCompareFunc`, on the indices of the `top_k` largest values where given.
    """

    atol: float = field(default=1e-3, metadata=key(NONNEG))
    rtol: float = field(default=1e-3, metadata=key(NONNEG))
    check_error_stat: str = field(
        default="elemwise",
        metadata=key(
            enum(ERROR_STATS),
            "elemwise (default, as Polygraphy): every element within atol or within rtol x "
            "|ref| (the larger bound); max, mean, median or quantile (with error_quantile): "
            "that statistic of the errors within atol, or of the errors relative to |ref| "
            "within rtol",
        ),
    )
    error_quantile: float | None = field(
        default=None, metadata=key({"type": "number", "minimum": 0, "maximum": 1})
    )
    psnr_threshold: float | None = field(
        default=None, metadata=key(NUMBER, "minimum PSNR in dB (PsnrCompareFunc)")
    )
    cosine_similarity_threshold: float | None = field(
        default=None, metadata=key({"type": "number", "minimum": -1, "maximum": 1})
    )
    snr_threshold: float | None = field(
        default=None, metadata=key(NUMBER, "minimum SNR in dB (SnrCompareFunc)")
    )
    compare: str = field(
        default="values",
        metadata=key(
            enum(["values", "indices"]),
            "indices: the output holds indices (a TopK's), or with top_k the indices of its "
            "top_k largest values; IndicesCompareFunc",
        ),
    )
    index_tolerance: int | None = field(default=None, metadata=key(integer(0, 1_000_000)))
    top_k: int | None = field(default=None, metadata=key(integer(1, 1_000_000)))
    top_k_axis: int | None = field(
        default=None,
        metadata=key(
            integer(-8, 7),
            "the axis top_k ranks along (TopKPostprocessFunc's (k, axis)); default -1, the "
            "last: a segmentation's [B, C, H, W] logits rank their classes on 1",
        ),
    )
    simple: bool = True  # not a key: whether the simple check applies (the loader decides)

    def __post_init__(self) -> None:
        # never no check at all: `simple=False` with no other check judged nothing (a pass)
        if not _other_checks({k: getattr(self, k) for k in (*METRIC_KEYS, "compare")}):
            object.__setattr__(self, "simple", True)

    @property
    def ranked_axis(self) -> int:
        """The axis `top_k` ranks along: `top_k_axis`, or the last."""
        return -1 if self.top_k_axis is None else self.top_k_axis

    def checks(self) -> tuple[str, ...]:
        """The checks this output is judged by, in the order reports show them."""
        metric = (
            ("psnr", self.psnr_threshold),
            ("cosine", self.cosine_similarity_threshold),
            ("snr", self.snr_threshold),
        )
        found = ("simple",) if self.simple else ()
        found += tuple(k for k, v in metric if v is not None)
        return found + (("indices",) if self.compare == "indices" else ())


@dataclass(frozen=True)
class PointSpec:
    """One entry of `accuracy.shapes`: a named point, or data/skip for a profile's own point.

    Why data and skip per point: a file holds one shape, and the engine serves every
    shape of its profile; each point gets its own real data, data derived from the
    input's, or an explicit reason it is not judged, never a silent drop.
    """

    name: str
    dims: tuple[tuple[str, tuple[int, ...]], ...] = ()  # ((input, dims), ...)
    file: Path | None = None  # an .npz keyed by input name, arrays of this point's shapes
    skip: str | None = None  # why this point is not judged


_TOLERANCE = section(
    Tolerance,
    description="How one output is judged, by Polygraphy's compare functions and names; "
    "every key given must hold.",
)

# An output's keys override the default's, so its defaults are the default's, not the class's.
_OUTPUT_TOLERANCE = {
    **_TOLERANCE,
    "description": "How this output is judged: tolerances.default's keys, these overriding them.",
    "properties": {
        name: {k: v for k, v in node.items() if k != "default"}
        for name, node in _TOLERANCE["properties"].items()
    },
}

# A point of `accuracy.shapes`: input dims, plus `data` (a mapping) and `skip` (a reason).
# Told apart by the value's type, so an input named `data` or `skip` can still get dims;
# the loader makes each PointSpec.
_POINT_DATA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["file"],
    "properties": {
        "file": {**NAME, "description": ".npz keyed by input name, this point's shapes"}
    },
}
_POINTS = {
    "type": "object",
    "description": "points judged beside a profile's min, opt and max: {NAME: {INPUT: [dims]}} "
    "(inputs not named keep their opt shape); any point, min/opt/max included, may add "
    "data: {file: X.npz} (its own real data) or skip: REASON (not judged; the verdict says so)",
    "maxProperties": 64,
    "propertyNames": {"pattern": "^[A-Za-z0-9_.-]{1,64}$"},
    "additionalProperties": {
        "type": "object",
        "minProperties": 1,
        "properties": {
            "data": {"oneOf": [DIMS, _POINT_DATA]},
            "skip": {"oneOf": [DIMS, {"type": "string", "minLength": 1, "maxLength": 1000}]},
        },
        "additionalProperties": DIMS,
    },
}


DEFAULT_BUDGET_SHARE = 24  # the default memory budget: this share of the machine's memory ...
DEFAULT_BUDGET_RANGE = (256 << 20, 4 << 30)  # ... within these bounds


def physical_memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 16 << 30


def default_memory_budget() -> int:
    """`accuracy.memory_budget` when the policy gives none: 1/24 of physical memory, clamped.

    Why so small a share: the budget bounds the tensors a judge holds at once,
    beside what the process needs anyway; 1 GiB on a 24 GiB machine judges a
    1920x1920 detector whose largest step is 340 MiB, and whatever does not
    fit streams through it.
    """
    low, high = DEFAULT_BUDGET_RANGE
    return int(min(max(physical_memory() // DEFAULT_BUDGET_SHARE, low), high))


@dataclass(frozen=True)
class MemoryBudget:
    """Bytes of tensors a judgement may hold, and how far a default may grow.

    A policy's own `memory_budget` is kept as given (a step that does not fit is
    exit 2); the default grows to what the model's largest step needs, up to
    `ceiling` (half the machine's memory), so a 2048x2048 restoration model
    needs no setting where the machine can judge it.
    """

    bytes: int
    ceiling: int | None = None


@dataclass(frozen=True)
class AccuracySpec:
    samples: int = field(default=4, metadata=key(integer(1, MAX_SAMPLES)))
    seed: int = field(default=0, metadata=key(integer(0, 2**32 - 1)))
    divergence_threshold: float = field(
        default=0.05,
        metadata=key(
            {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
            "relative error (to the tensor's range) at which an intermediate tensor counts as "
            "diverged",
        ),
    )
    walk: str = field(
        default="on_failure",
        metadata=key(
            enum(WALKS),
            "when the judge walks the graph for the first divergence and the error curve "
            "(the FP32 reference runs again beside the candidate, every tensor compared): "
            "on_failure (default; a candidate that fails, or whose intermediate turns "
            "non-finite) or always (a passing candidate too)",
        ),
    )
    reference_model: Path | None = field(
        default=None,
        metadata=key(
            NAME,
            "the model before quantization, or the FP32 original of a model converted "
            "elsewhere (an .onnx file relative to the policy, with the same inputs and "
            "outputs): the tolerances then apply against it, and the report splits each "
            "output's error into the model's own (the quantization's) and the FP16 part",
            path=True,
        ),
    )
    masked_overflow: str = field(
        default="fail",
        metadata=key(
            enum(MASKED_OVERFLOWS),
            "a tensor of the graph or a boundary Cast that turns inf or NaN where FP32 is "
            "finite, while every output holds (a Clip or a Max after it hides the overflow): "
            "fail (default; the verdict fails, as in tune) or warn (the verdict passes and "
            "names it)",
        ),
    )
    fp32_check: bool = field(
        default=False,
        metadata=key(
            BOOL,
            "also judge the all-FP32 graph (engine on a GPU): what the backend itself changes, "
            "apart from FP16",
        ),
    )
    emulation: str = field(
        default="storage",
        metadata=key(
            enum(EMULATIONS),
            "what the CPU verdict assumes inside an FP16 kernel: storage (default; FP32 "
            "arithmetic, every stored tensor rounded) or strict (also the sums behind FP16 "
            "means and a fused normalization's intermediates in FP16)",
        ),
    )
    # `tolerances: {default: ..., outputs: {NAME: ...}}`; an output's keys override the default's
    default_tolerance: Tolerance = field(
        default_factory=Tolerance,
        metadata=key(
            {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "default": _TOLERANCE,
                    "outputs": {
                        "type": "object",
                        "additionalProperties": _OUTPUT_TOLERANCE,
                        "maxProperties": 10_000,
                    },
                },
            },
            yaml="tolerances",
            built=True,
        ),
    )
    output_tolerances: tuple[tuple[str, Tolerance], ...] = ()  # made from `tolerances` too
    memory_budget: int | None = field(
        default=None,  # None: the machine's share, default_memory_budget()
        metadata=key(
            SIZE,
            "bytes of tensors a judgement holds at once (e.g. 2GiB); runs larger than this "
            f"stream through it. Default: 1/{DEFAULT_BUDGET_SHARE} of this machine's memory, "
            "within 256 MiB to 4 GiB",
            read=_bytes,
        ),
    )
    # named input shapes judged beside the profile's min/opt/max, and per-point data or skip
    shapes: tuple[PointSpec, ...] = field(default=(), metadata=key(_POINTS, built=True))
    max_image_pixels: int = field(
        default=DEFAULT_MAX_IMAGE_PIXELS,
        metadata=key(
            integer(1, 2 * DEFAULT_MAX_IMAGE_PIXELS),
            "an image with more pixels is refused before it is decoded (default "
            f"{DEFAULT_MAX_IMAGE_PIXELS:,}, Pillow's; at most twice that, where Pillow itself "
            "refuses)",
        ),
    )

    def budget(self) -> MemoryBudget:
        if self.memory_budget is not None:
            return MemoryBudget(self.memory_budget)
        return MemoryBudget(default_memory_budget(), physical_memory() // 2)

    def tolerance(self, output: str) -> Tolerance:
        return dict(self.output_tolerances).get(output, self.default_tolerance)


# The keys whose value is a path relative to the policy: the model, a point's data file,
# and every field the table marks `path` (data files, image folders, the timing cache).
PATH_KEYS = frozenset(
    {"model", "file"}
    | {
        name
        for cls in list(globals().values())
        if is_dataclass(cls) and isinstance(cls, type)
        for _, k, name in keyed(cls)
        if k.path
    }
)
