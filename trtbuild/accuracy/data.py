"""Reference input data at each point: seeded distributions, .npz files or image folders.

Why provenance travels with the feeds: a verdict is only as good as its data, so
every point says whether it was judged on the user's data, on data derived from
it (a sequence tiled to the point's length), on images blown up past their size,
on synthetic data with its statistics, or on random values. Why a plan before
any read: the files' headers and the images' sizes say how many samples a point
gets and what reading them costs, so nothing is inflated that the point does not
use, and data past `accuracy.memory_budget` is refused before it is read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from trtbuild import words
from trtbuild.accuracy import derive, files, npz
from trtbuild.accuracy.images import (
    Decoded,
    image_layout,
    image_paths,
    images_per_sample,
    point_images,
)
from trtbuild.accuracy.points import InputData, ShapePoint, check_inputs, model_inputs
from trtbuild.accuracy.sessions import quiet_polygraphy
from trtbuild.errors import UsageError
from trtbuild.numerics import holds, not_held
from trtbuild.policy.model import Policy
from trtbuild.policy.specs import DataSpec, InputSpec
from trtbuild.sizes import fmt_bytes

Feed = dict[str, np.ndarray]


def check_memory(
    policy: Policy,
    shapes: dict[str, tuple[int, ...]],
    dtypes: dict,
    loading: dict[str, int] | None = None,
    whole: dict[str, int] | None = None,
    count: int | None = None,
) -> None:
    """Refuse `accuracy.samples` whose feeds (and their outputs), with the data read to make
    them, cannot fit, before reading any.

    Every feed is held for the whole run beside its outputs (reference and
    candidate), so the estimate is three times the inputs' bytes per sample, a
    lower bound. Reading the data takes what the files' headers and the images'
    sizes say: `loading` for `count` samples (the samples inflated, the images
    decoded), `whole` for files read whole whatever the count (synthetic data takes
    every sample's statistics). All against the `accuracy.memory_budget` the judge
    streams by.
    """
    per_sample = sum(math.prod(s) * np.dtype(dtypes[n]).itemsize for n, s in shapes.items())
    loading, whole = loading or {}, whole or {}
    read, fixed = sum(loading.values()) + sum(whole.values()), sum(whole.values())
    need, budget = 3 * per_sample * policy.accuracy.samples + read, policy.accuracy.budget().bytes
    if need <= budget:
        return
    rate = 3 * per_sample + (read - fixed) // max(count or policy.accuracy.samples, 1)
    fits = (budget - fixed) // max(rate, 1)
    shown = dict(loading)
    for k, v in whole.items():
        shown[k] = shown.get(k, 0) + v
    parts = ", ".join(f"{k} {fmt_bytes(v)}" for k, v in shown.items() if v)
    reading = f"; reading the data {fmt_bytes(read)}: {parts}" if read else ""
    hint = f"lower accuracy.samples to at most {fits}, or raise accuracy.memory_budget"
    if fits < 1 and not whole:
        hint = "one sample does not fit: raise accuracy.memory_budget, or use smaller images"
    elif fits < 1:
        names = ", ".join(whole)
        hint = (
            f"{names} is read whole (derive: synthetic takes every sample's statistics): "
            "use derive: tile, keep fewer samples in the file, or raise accuracy.memory_budget"
        )
    raise UsageError(
        f"accuracy.samples: {policy.accuracy.samples} samples of these inputs need about "
        f"{fmt_bytes(need)} ({fmt_bytes(per_sample)} of inputs per sample, held three "
        f"times{reading}); accuracy.memory_budget is {fmt_bytes(budget)}",
        where=policy.where_of("accuracy", "samples"),
        hint=hint,
    )


@dataclass(frozen=True)
class PointFeeds:
    """The feeds of one point and, for every input, where its data comes from."""

    feeds: list[Feed]
    data: dict[str, InputData]


def make_feeds(
    policy: Policy, model: onnx.ModelProto, point: ShapePoint | None = None
) -> list[Feed]:
    """`accuracy.samples` feeds at `point` (default: the primary one); see `point_feeds`."""
    return point_feeds(policy, model, point).feeds


def point_feeds(
    policy: Policy,
    model: onnx.ModelProto,
    point: ShapePoint | None = None,
    decoded: Decoded | None = None,
    draw: bool = True,
) -> PointFeeds:
    """`accuracy.samples` feeds at `point` (default: the primary one), deterministic for
    `accuracy.seed`, with where each input's data comes from.

    `draw=False`: no feeds (`[]`), only where each input's data comes from, for a
    caller that runs nothing (`convert`): the user's files and images are
    still read and fit (their errors are the same), the random ones not drawn.

    `decoded` holds the images decoded for earlier points of the same run (one
    decode per image, every point fit from the original); without it they are
    decoded for this point alone.

    The point's own file first, then images fit to the point, then the input's file
    (derived where its arrays have another shape), then a distribution: uniform
    from Polygraphy's `DataLoader` (seeded per sample, as `polygraphy run
    --val-range` makes it), `normal`, which it does not make, from numpy. Files
    and images are known by their headers first: the sample count and the memory
    follow from those, then only what the point uses is read.
    """
    decoded = decoded if decoded is not None else Decoded()
    shapes, dtypes, model_dims, plan = _checked_plan(policy, model, point, decoded)
    given, sources = _given(policy, plan, shapes, dtypes, model_dims, point, decoded)
    n_samples, constant = plan.count, plan.constant
    specs = {s.name: s for s in policy.inputs}
    data = {n: specs.get(n, InputSpec(n)).data for n in shapes if n not in given}
    for n, d in data.items():
        _normal_of_floats(policy, n, d, np.dtype(dtypes[n]))
    normal = {n for n, d in data.items() if d.distribution == "normal"}
    sources.update({n: _random_source(d, dtypes[n], n in normal) for n, d in data.items()})
    for n in constant if n_samples > 1 else ():
        sources[n] = InputData(sources[n].kind, f"{sources[n].source}, the same in every sample")
    sources = {n: sources[n] for n in shapes}
    if not draw:
        return PointFeeds([], sources)
    for n, d in data.items():
        _range_held(policy, n, d, np.dtype(dtypes[n]), n in normal)
    feeds = _drawn(policy, shapes, dtypes, given, constant, data, normal, n_samples)
    for n in normal:
        _normal_held(policy, n, data[n], [f[n] for f in feeds])
    return PointFeeds(feeds, sources)


def check_points(
    policy: Policy, model: onnx.ModelProto, points: list[ShapePoint], decoded: Decoded
) -> None:
    """Every point's data checked from its headers against the memory budget, before any
    point's is read: a 9000² photo fit for a small first point was decoded, only for a
    larger point to be refused after it."""
    for point in points:
        _checked_plan(policy, model, point, decoded)


def _checked_plan(
    policy: Policy, model: onnx.ModelProto, point: ShapePoint | None, decoded: Decoded
) -> tuple[dict[str, tuple[int, ...]], dict, dict, _Plan]:
    """The point's shapes, input dtypes and dims, and its plan, checked against the memory
    budget from the headers alone."""
    shapes = point.shapes if point is not None else check_inputs(policy, model)
    inputs = {n: (t, d) for n, t, d in model_inputs(model)}
    dtypes = {n: helper.tensor_dtype_to_np_dtype(t) for n, (t, _) in inputs.items()}
    model_dims = {n: d for n, (_, d) in inputs.items()}
    plan = _plan(policy, shapes, dtypes, model_dims, point, decoded)
    check_memory(policy, shapes, dtypes, plan.loading, plan.whole, plan.count)
    return shapes, dtypes, model_dims, plan


def _drawn(
    policy: Policy,
    shapes: dict[str, tuple[int, ...]],
    dtypes: dict,
    given: dict[str, np.ndarray],
    constant: set[str],
    data: dict[str, DataSpec],
    normal: set[str],
    n_samples: int,
) -> list[Feed]:
    """The samples: the given arrays (a constant one repeated), the random inputs drawn."""
    uniform = _uniform(
        {n: (shapes[n], dtypes[n], data[n]) for n in data if n not in normal},
        policy.accuracy.seed,
        n_samples,
    )
    rng = np.random.default_rng(policy.accuracy.seed)
    feeds = []
    for i in range(n_samples):
        feed = {}
        for name in shapes:  # the model's input order
            if name in given:  # an ndarray even for a 0-d input (indexing gives a scalar)
                at = 0 if name in constant else i
                feed[name] = np.asarray(given[name][at], dtype=dtypes[name])
            elif name in normal:
                arr = rng.normal(data[name].mean, data[name].std, size=shapes[name])
                with np.errstate(over="ignore"):  # an inf is said by `_normal_held`
                    feed[name] = arr.astype(dtypes[name])
            else:
                feed[name] = np.asarray(uniform[i][name], dtype=dtypes[name])
        feeds.append(feed)
    return feeds


@dataclass(frozen=True)
class _Plan:
    """What a point reads, known before any of it is read: from the files' headers and the
    images' sizes."""

    files: dict[str, files.FileInput]
    images: dict[str, int]  # an image input's samples
    count: int  # the samples the point is judged on
    loading: dict[str, int]  # bytes each file and image folder takes to read for `count`
    whole: dict[str, int]  # bytes of the files read whole whatever the count (synthetic)

    @property
    def constant(self) -> set[str]:
        """Inputs whose file has no sample axis: the same array in every sample."""
        return {n for n, f in self.files.items() if f.constant}


def _plan(
    policy: Policy,
    shapes: dict[str, tuple[int, ...]],
    dtypes: dict,
    model_dims: dict,
    point: ShapePoint | None,
    decoded: Decoded,
) -> _Plan:
    """The point's files and images, checked from their headers, and how many samples it is
    judged on: `accuracy.samples`, at most as many as every file with a sample axis and
    every image folder holds. An array without a sample axis (a 0-d sample rate, one
    state) is the same in every sample and does not cut the others to one; where every
    file's arrays lack one (and no images), that is one sample, as given."""
    found = files.plan(policy, shapes, dtypes, model_dims, point)
    specs = {s.name: s for s in policy.inputs}
    images, loading = {}, {}
    for name, shape in shapes.items():
        spec = specs.get(name)
        if name in found or spec is None or spec.data.images is None:
            continue
        image_layout(policy, spec, shape, ("inputs", name, "data"), dtypes[name])
        per_sample = images_per_sample(shape)
        paths = image_paths(policy, spec, per_sample)
        images[name] = len(paths) // per_sample
        folder = f"{spec.data.images.folder.name}/"
        loading[folder] = loading.get(folder, 0) + decoded.nbytes(policy, spec, paths)
    counts = [f.member.shape[0] for f in found.values() if not f.constant]
    counts += images.values()
    count = min([policy.accuracy.samples, *(counts or ([1] if found else []))])
    whole: dict[str, int] = {}
    for f in found.values():
        into = whole if f.every else loading
        into[f.path.name] = into.get(f.path.name, 0) + f.nbytes(count)
    return _Plan(found, images, count, loading, whole)


def _given(
    policy: Policy,
    plan: _Plan,
    shapes: dict[str, tuple[int, ...]],
    dtypes: dict,
    model_dims: dict,
    point: ShapePoint | None,
    decoded: Decoded,
) -> tuple[dict[str, np.ndarray], dict[str, InputData]]:
    """The inputs whose data comes from the user's files or images, as [samples, *shape]
    (one sample where the file has no sample axis), read as the plan says."""
    specs = {s.name: s for s in policy.inputs}
    given, sources = {}, {}
    for name, shape in shapes.items():
        f = plan.files.get(name)
        if f is not None:
            arr = files.read(policy, f, plan.count, dtypes[name])
            if f.own:
                given[name] = arr[None] if f.constant else arr
                sources[name] = InputData("file", f"{f.path.name} (this point's own)")
            else:
                given[name], sources[name] = derive.fit(
                    policy, specs[name], arr, shape, model_dims[name], point
                )
                sources[name] = _split_said(sources[name], f.member)
        elif name in plan.images:
            given[name], sources[name] = point_images(
                policy, specs[name], shape, decoded, plan.count, dtypes[name]
            )
    return given, sources


def _split_said(source: InputData, member: npz.Member) -> InputData:
    """The source, saying where a file's first axis was read as batches (ModelOpt's layout)."""
    if member.stored is None:
        return source
    k, batch = member.shape[0], member.shape[1]
    said = f"{source.source} (its first axis, {member.stored[0]}, read as {k} batches of {batch})"
    return InputData(source.kind, said)


def _normal_of_floats(policy: Policy, name: str, data: DataSpec, dtype: np.dtype) -> None:
    """Exit 2 for `distribution: normal` on an integer or boolean input, naming the field.

    Why: it was dropped without a word for the default range, [0, 1): token ids given
    `{distribution: normal, mean: 5, std: 2}` were 0 everywhere, and the data line said
    "uniform integers [0, 1)".
    """
    if data.distribution == "normal" and not _is_float(dtype):
        raise UsageError(
            f"{words.field('inputs', name, 'data', 'distribution')}: normal draws floats, and "
            f"the model's input '{name}' takes {dtype}",
            where=policy.where_of("inputs", name, "data", "distribution"),
            hint="give it a range of integers instead ({low: 0, high: N}: uniform in "
            "[low, high)), or real samples in a file",
        )


def _range_held(policy: Policy, name: str, data: DataSpec, dtype: np.dtype, normal: bool) -> None:
    """Exit 2 where a uniform range passes what the input's type holds (a float one's
    largest value, an integer one's limits), naming `inputs.NAME.data`.

    Why: `high: 1e6` for an FP16 input drew inf, blamed on the model ("the FP32 reference
    holds inf: a broken checkpoint's weights?"), `high: 1e12` for an int32 input was a
    traceback (exit 70) from Polygraphy's `DataLoader`, and an integer input's `[0.5, 2.5)`
    was cut to `[0, 2)` without a word.
    """
    if normal or dtype == np.bool_:
        return
    ends = [data.low, data.high]  # the draws lie between: a float one may reach high
    if not _is_float(dtype):
        if not (float(data.low).is_integer() and float(data.high).is_integer()):
            raise UsageError(
                f"{words.field('inputs', name, 'data')}: the range [{data.low:g}, "
                f"{data.high:g}) of the integer input '{name}' ({dtype}) is not of whole "
                f"numbers: its draws would be cut to [{int(data.low)}, {int(data.high)})",
                where=policy.where_of("inputs", name, "data"),
                hint="give low and high as whole numbers (integers drawn from [low, high))",
            )
        ends = [int(data.low), int(data.high) - 1]  # integers drawn from [low, high)
    if not_held(np.array(ends, dtype=object if not _is_float(dtype) else float), dtype).any():
        raise UsageError(
            f"{words.field('inputs', name, 'data')}: the range [{data.low:g}, {data.high:g}) "
            f"passes what the model's input '{name}' ({dtype}) holds ({holds(dtype)})",
            where=policy.where_of("inputs", name, "data"),
            hint=f"give low and high within {holds(dtype)}: the values the deployment feeds",
        )


def _normal_held(policy: Policy, name: str, data: DataSpec, arrays: list[np.ndarray]) -> None:
    """Exit 2 where a normal distribution drew a value the input's float type cannot hold
    (inf): the policy's `mean`/`std`, not the model, made it."""
    if all(np.isfinite(a).all() for a in arrays):  # drawn in its type: an inf is past it
        return
    raise UsageError(
        f"{words.field('inputs', name, 'data')}: normal (mean {data.mean:g}, std "
        f"{data.std:g}) drew values past what the model's input '{name}' "
        f"({arrays[0].dtype}) holds ({holds(arrays[0].dtype)}): inf",
        where=policy.where_of("inputs", name, "data"),
        hint="give a mean and std whose draws stay within that range",
    )


def _random_source(data: DataSpec, dtype, normal: bool) -> InputData:
    if normal:
        return InputData("random", f"normal (mean {data.mean:g}, std {data.std:g})")
    if dtype == np.bool_:
        return InputData("random", "uniform booleans")
    kind = "" if _is_float(dtype) else " integers"
    return InputData("random", f"uniform{kind} [{data.low:g}, {data.high:g})")


def _is_float(dtype) -> bool:
    return bool(np.issubdtype(dtype, np.floating))


def _uniform(inputs: dict, seed: int, n_samples: int) -> list[Feed]:
    """Polygraphy's `DataLoader` samples for the uniform inputs (none: empty feeds).

    The policy's integer range is half-open, `[low, high)` (token ids below the
    vocabulary size); Polygraphy's `val_range` is inclusive, so it gets `high - 1`.

    A one-element integer input (shape `[1]`: a count, a sample rate, TopK's k) is drawn
    here, from the same range with the same seed: Polygraphy's `DataLoader` takes it for
    a TensorRT shape tensor and feeds it its own shape, `[1]`, whatever the range (its
    hack for older TensorRT), while the report said `uniform integers [0, 100)`.
    """
    if not inputs:
        return [{} for _ in range(n_samples)]
    from polygraphy.common import TensorMetadata
    from polygraphy.comparator import DataLoader

    meta, ranges = TensorMetadata(), {}
    for name, (shape, dtype, spec) in inputs.items():
        meta.add(name, dtype, shape)
        if _is_float(dtype):
            ranges[name] = (float(spec.low), float(spec.high))
        elif dtype == np.bool_:
            ranges[name] = (False, True)
        else:
            low = int(spec.low)
            ranges[name] = (low, max(int(spec.high) - 1, low))
    with quiet_polygraphy():  # it announces the metadata at info level
        loader = DataLoader(seed=seed, iterations=n_samples, input_metadata=meta, val_range=ranges)
        feeds = [dict(loader[i]) for i in range(n_samples)]
    for k, (name, (shape, dtype, _)) in enumerate(inputs.items()):
        if tuple(shape) == (1,) and np.issubdtype(dtype, np.integer):
            low, high = ranges[name]
            for i, feed in enumerate(feeds):
                rng = np.random.default_rng([seed, i, k])
                feed[name] = rng.integers(low, high, size=(1,), dtype=dtype, endpoint=True)
    return feeds
