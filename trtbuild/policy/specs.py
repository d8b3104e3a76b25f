"""The validated policy's parts as immutable values (`model.Policy` holds them).

Why frozen dataclasses with tuple fields: the pipeline passes a policy through
every stage, and `tune` derives new policies from old ones; nothing may change a
policy behind another stage's back (ModelOpt's mutable defaults are a lesson).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtbuild.numerics import FP16_MAX

EMULATIONS = ("storage", "strict")
IMAGE_FITS = ("resize", "crop")  # how images are brought to each point's H x W
DERIVATIONS = ("tile", "synthetic", "none")  # a file's data at a point of another shape
PROFILE_POINTS = ("shape", "min", "opt", "max")  # points the inputs' own shapes define
# PIL's own limit (Image.MAX_IMAGE_PIXELS); beyond twice it PIL refuses to decode at all
DEFAULT_MAX_IMAGE_PIXELS = 89_478_485


@dataclass(frozen=True)
class ImageSpec:
    """A folder of images turned into input tensors the way a deployment preprocesses them."""

    folder: Path
    resize: tuple[int, int] | None = None  # (H, W) every image takes first; then `fit`
    fit: str = "resize"  # IMAGE_FITS: to each point's H, W by resizing, or centre crop/pad
    layout: str | None = None  # NCHW or NHWC; default: where the channel dimension is 1 or 3
    channels: str = "RGB"
    scale: float = 1.0 / 255.0
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)


@dataclass(frozen=True)
class DataSpec:
    distribution: str = "uniform"
    low: float = 0.0
    high: float = 1.0
    mean: float = 0.0
    std: float = 1.0
    file: Path | None = None
    images: ImageSpec | None = None
    derive: str = "tile"  # DERIVATIONS: a file's data at a point its arrays do not fit


@dataclass(frozen=True)
class InputSpec:
    name: str
    shape: tuple[int, ...] | None = None
    min: tuple[int, ...] | None = None
    opt: tuple[int, ...] | None = None
    max: tuple[int, ...] | None = None
    data: DataSpec = field(default_factory=DataSpec)

    @property
    def feed_shape(self) -> tuple[int, ...] | None:
        """The shape reference data is made with: `shape`, else the profile's `opt`."""
        return self.shape if self.shape is not None else self.opt


@dataclass(frozen=True)
class Passes:
    opset: int | None = None
    fuse_layernorm: bool = True
    fold_constants: bool = True
    fold_batchnorm: bool = True
    # Polygraphy's --override-input-shapes: ((input, dims), ...), a dim a number or a name
    override_input_shapes: tuple[tuple[str, tuple[int | str, ...]], ...] = ()
    # inputs made constants: ((input, value), ...), a value a number, a bool or a flat list
    freeze_inputs: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class Match:
    name: str | None = None
    op: tuple[str, ...] = ()
    pattern: str | None = None
    last: int | None = None
    max_abs_above: float | None = None
    initializer_abs_above: float | None = None
    reduction_depth_above: int | None = None


@dataclass(frozen=True)
class Rule:
    id: str
    match: Match
    precision: str
    why: str | None = None


# Built-in safety rules, applied after the user's (a user rule naming a node wins).
# Why weight-range: a weight beyond 65504 is inf in FP16 (Hugging Face's mask constant
# finfo(float32).min among them) and `0 x -inf` is NaN; ModelOpt AutoCast keeps such
# nodes in FP32 by default too.
GUARDS: dict[str, Rule] = {
    "weight-range": Rule(
        id="guard:weight-range",
        match=Match(initializer_abs_above=FP16_MAX),
        precision="fp32",
        why="consumes a weight that is finite in FP32 and beyond the FP16 range",
    ),
}


@dataclass(frozen=True)
class Precision:
    default: str = "fp16"
    rules: tuple[Rule, ...] = ()
    guards: tuple[str, ...] = tuple(GUARDS)  # names of the guards that apply

    def all_rules(self) -> tuple[Rule, ...]:
        """The user's rules, then the enabled guards: the order assignment applies them."""
        return self.rules + tuple(GUARDS[name] for name in self.guards)


@dataclass(frozen=True)
class BuildSpec:
    backend: str = "auto"
    compute_capabilities: tuple[str, ...] = ("8.9",)
    workspace: int = 4 << 30
    timing_cache: Path | None = None
    variants: bool = True


@dataclass(frozen=True)
class Tolerance:
    """How one output is judged, by Polygraphy's names; every check it holds must pass.

    `simple` is Polygraphy's `SimpleCompareFunc` (atol, rtol, check_error_stat,
    error_quantile): judged when any of its keys is given, or when no other check
    is. The metric thresholds are its `PsnrCompareFunc`,
    `CosineSimilarityCompareFunc` and `SnrCompareFunc`; `compare: indices` is its
    `IndicesCompareFunc`, on the indices of the `top_k` largest values where given.
    """

    atol: float = 1e-3
    rtol: float = 1e-3
    check_error_stat: str = "elemwise"  # Polygraphy's default: every element within tolerance
    error_quantile: float | None = None  # with check_error_stat: quantile
    psnr_threshold: float | None = None  # dB
    cosine_similarity_threshold: float | None = None
    snr_threshold: float | None = None  # dB
    compare: str = "values"  # values | indices
    index_tolerance: int | None = None
    top_k: int | None = None
    simple: bool = True

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

    @property
    def is_profile_point(self) -> bool:
        return self.name in PROFILE_POINTS


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
    samples: int = 4
    seed: int = 0
    divergence_threshold: float = 0.05
    fp32_check: bool = False
    emulation: str = "storage"  # what the CPU verdict assumes inside a kernel (EMULATIONS)
    default_tolerance: Tolerance = field(default_factory=Tolerance)
    output_tolerances: tuple[tuple[str, Tolerance], ...] = ()
    memory_budget: int | None = None  # bytes of tensors a judge holds; None: the machine's share
    # named input shapes judged beside the profile's min/opt/max, and per-point data or skip
    shapes: tuple[PointSpec, ...] = ()
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS  # a larger image is exit 2, not decoded

    def budget(self) -> MemoryBudget:
        if self.memory_budget is not None:
            return MemoryBudget(self.memory_budget)
        return MemoryBudget(default_memory_budget(), physical_memory() // 2)

    def tolerance(self, output: str) -> Tolerance:
        return dict(self.output_tolerances).get(output, self.default_tolerance)
