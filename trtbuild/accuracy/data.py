"""Reference input data at each point: seeded distributions, .npz files or image folders.

Why provenance travels with the feeds: a verdict is only as good as its data, so
every point says whether it was judged on the user's data, on data derived from
it (a sequence tiled to the point's length), on synthetic data with its
statistics, or on random values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from trtbuild.accuracy import derive, images
from trtbuild.accuracy.images import load_images
from trtbuild.accuracy.points import InputData, ShapePoint, check_inputs, model_inputs
from trtbuild.accuracy.sessions import quiet_polygraphy
from trtbuild.errors import UsageError
from trtbuild.policy.model import Policy
from trtbuild.policy.specs import DataSpec, InputSpec
from trtbuild.sizes import fmt_bytes

Feed = dict[str, np.ndarray]


def check_memory(policy: Policy, shapes: dict[str, tuple[int, ...]], dtypes: dict) -> None:
    """Refuse `accuracy.samples` whose feeds (and their outputs) cannot fit, before making any.

    Every feed is held for the whole run beside its outputs (reference and
    candidate), so the estimate is three times the inputs' bytes per sample, a
    lower bound, against the same `accuracy.memory_budget` the judge streams by.
    """
    per_sample = sum(math.prod(s) * np.dtype(dtypes[n]).itemsize for n, s in shapes.items())
    need, budget = 3 * per_sample * policy.accuracy.samples, policy.accuracy.budget().bytes
    if need > budget:
        fits = max(1, budget // max(3 * per_sample, 1))
        raise UsageError(
            f"accuracy.samples: {policy.accuracy.samples} samples of these inputs need about "
            f"{fmt_bytes(need)} ({fmt_bytes(per_sample)} of inputs per sample, held three "
            f"times); accuracy.memory_budget is {fmt_bytes(budget)}",
            where=policy.where,
            hint=f"lower accuracy.samples to at most {fits}, or raise accuracy.memory_budget",
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
    policy: Policy, model: onnx.ModelProto, point: ShapePoint | None = None
) -> PointFeeds:
    """`accuracy.samples` feeds at `point` (default: the primary one), deterministic for
    `accuracy.seed`, with where each input's data comes from.

    The point's own file first, then images fit to the point, then the input's file
    (derived where its arrays have another shape), then a distribution: uniform
    from Polygraphy's `DataLoader` (seeded per sample, as `polygraphy run
    --val-range` makes it), `normal`, which it does not make, from numpy.
    """
    shapes = point.shapes if point is not None else check_inputs(policy, model)
    inputs = {n: (t, d) for n, t, d in model_inputs(model)}
    dtypes = {n: helper.tensor_dtype_to_np_dtype(t) for n, (t, _) in inputs.items()}
    check_memory(policy, shapes, dtypes)
    model_dims = {n: d for n, (_, d) in inputs.items()}
    given, sources = _given(policy, shapes, dtypes, model_dims, point)
    n_samples = min([policy.accuracy.samples, *(len(v) for v in given.values())])
    specs = {s.name: s for s in policy.inputs}
    data = {n: specs.get(n, InputSpec(n)).data for n in shapes if n not in given}
    normal = {n for n, d in data.items() if d.distribution == "normal" and _is_float(dtypes[n])}
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
            if name in given:
                feed[name] = given[name][i].astype(dtypes[name], copy=False)
            elif name in normal:
                arr = rng.normal(data[name].mean, data[name].std, size=shapes[name])
                feed[name] = arr.astype(dtypes[name])
            else:
                feed[name] = np.asarray(uniform[i][name], dtype=dtypes[name])
        feeds.append(feed)
    sources.update({n: _random_source(d, dtypes[n], n in normal) for n, d in data.items()})
    return PointFeeds(feeds, {n: sources[n] for n in shapes})


def _given(
    policy: Policy,
    shapes: dict[str, tuple[int, ...]],
    dtypes: dict,
    model_dims: dict,
    point: ShapePoint | None,
) -> tuple[dict[str, np.ndarray], dict[str, InputData]]:
    """The inputs whose data comes from the user's files or images, as [samples, *shape]."""
    own = _point_file(policy, point, shapes, dtypes) if point and point.file else {}
    specs = {s.name: s for s in policy.inputs}
    given, sources = {}, {}
    for name, shape in shapes.items():
        spec = specs.get(name)
        if name in own:
            given[name] = own[name]
            sources[name] = InputData("file", f"{point.file.name} (this point's own)")
        elif spec is not None and spec.data.images is not None:
            given[name] = load_images(policy, spec, shape)
            sources[name] = InputData("images", images.describe(spec, shape))
        elif spec is not None and spec.data.file is not None:
            arr = _load_npz(policy, spec, dtypes[name])
            given[name], sources[name] = derive.fit(
                policy, spec, arr, shape, model_dims[name], point
            )
    return given, sources


def _random_source(data: DataSpec, dtype, normal: bool) -> InputData:
    if normal:
        return InputData("random", f"normal (mean {data.mean:g}, std {data.std:g})")
    if dtype == np.bool_:
        return InputData("random", "uniform booleans")
    kind = "" if _is_float(dtype) else " integers"
    return InputData("random", f"uniform{kind} [{data.low:g}, {data.high:g})")


def _point_file(
    policy: Policy, point: ShapePoint, shapes: dict[str, tuple[int, ...]], dtypes: dict
) -> dict[str, np.ndarray]:
    """A point's own .npz: its arrays, keyed by input name, at exactly this point's shapes."""
    field = f"accuracy.shapes.{point.name.split('=')[-1]}.data.file"
    arrays = read_npz(policy, point.file, field)
    unknown = [k for k in arrays if k not in shapes]
    if unknown:
        raise UsageError(
            f"{field}: {point.file.name} holds array(s) {unknown} that name no model input",
            where=policy.where,
            hint="the model's inputs are " + ", ".join(shapes),
        )
    out = {}
    for name, arr in arrays.items():
        arr = _checked_values(policy, field, name, arr, np.dtype(dtypes[name]))
        shape = shapes[name]
        if arr.shape != shape and arr.shape[1:] != shape:
            raise UsageError(
                f"{field}: array '{name}' has shape {list(arr.shape)}; {point.label} needs "
                f"{list(shape)} or [N, {', '.join(map(str, shape))}]",
                where=policy.where,
                hint="a point's own file holds that point's shapes",
            )
        out[name] = arr[None] if arr.shape == shape else arr
    return out


def _is_float(dtype) -> bool:
    return bool(np.issubdtype(dtype, np.floating))


def _uniform(inputs: dict, seed: int, n_samples: int) -> list[Feed]:
    """Polygraphy's `DataLoader` samples for the uniform inputs (none: empty feeds).

    The policy's integer range is half-open, `[low, high)` (token ids below the
    vocabulary size); Polygraphy's `val_range` is inclusive, so it gets `high - 1`.
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
        return [dict(loader[i]) for i in range(n_samples)]


def read_npz(policy: Policy, path: Path, field: str) -> dict[str, np.ndarray]:
    """Every array of an .npz, read without pickles (an object array is refused)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except Exception as exc:
        raise UsageError(f"{field}: cannot read {path}: {exc}", where=policy.where) from None


def _load_npz(policy: Policy, spec: InputSpec, dtype) -> np.ndarray:
    """The input's array from its .npz (only that one is read), in the input's dtype."""
    field = f"inputs.{spec.name}.data.file"
    try:
        with np.load(spec.data.file, allow_pickle=False) as data:
            if spec.name not in data.files:
                raise UsageError(
                    f"{field}: {spec.data.file.name} has no array '{spec.name}'",
                    where=policy.where,
                    hint="keys found: " + ", ".join(data.files),
                )
            arr = data[spec.name]
    except UsageError:
        raise
    except Exception as exc:
        raise UsageError(
            f"{field}: cannot read {spec.data.file}: {exc}", where=policy.where
        ) from None
    return _checked_values(policy, field, spec.name, arr, np.dtype(dtype))


def _checked_values(policy: Policy, field: str, name: str, arr: np.ndarray, want) -> np.ndarray:
    """The array in the input's dtype, or one message: a wrong kind of number, or NaN/inf.

    Converting within a kind (float64 to float32, int32 to int64) is what a
    deployment's preprocessing does; floats for an integer input or integers
    for a float one mean the file holds something else than the model expects.
    """
    kind = {"f": "floating-point", "i": "integer", "u": "integer", "b": "boolean"}
    if arr.dtype.kind not in kind or kind[arr.dtype.kind] != kind.get(want.kind):
        raise UsageError(
            f"{field}: array '{name}' holds {arr.dtype} values; the model's input "
            f"'{name}' takes {want} ({kind.get(want.kind, want.kind)})",
            where=policy.where,
            hint=f"save the array as {want} (e.g. arr.astype(np.{want}))",
        )
    if arr.dtype.kind == "f":
        bad = np.argwhere(~np.isfinite(arr))
        if bad.size:
            index = tuple(int(i) for i in bad[0])
            raise UsageError(
                f"{field}: array '{name}' holds {len(bad)} NaN or infinite value(s), the "
                f"first at index {list(index)} ({arr[index]})",
                where=policy.where,
                hint="reference inputs must be finite; clean or regenerate the file",
            )
    return arr.astype(want, copy=False)
