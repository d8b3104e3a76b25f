"""Reference input data: seeded distributions or an .npz file, checked against the model."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from trtbuild.errors import UsageError
from trtbuild.policy.model import InputSpec, Policy

Feed = dict[str, np.ndarray]


def model_inputs(model: onnx.ModelProto) -> list[tuple[str, int, list[int | str | None]]]:
    inits = {t.name for t in model.graph.initializer}
    out = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dims = [
            d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim
        ]
        out.append((vi.name, tt.elem_type, dims))
    return out


def check_inputs(policy: Policy, model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    """Resolve the feed shape of every model input, or say which policy field to fix."""
    inputs = model_inputs(model)
    names = [n for n, _, _ in inputs]
    specs = {s.name: s for s in policy.inputs}
    for name in specs:
        if name not in names:
            raise UsageError(
                f"inputs.{name}: the model has no input '{name}'",
                where=str(policy.path),
                hint="its inputs are " + ", ".join(names),
            )
    shapes = {}
    for name, _, dims in inputs:
        spec = specs.get(name)
        shape = spec.feed_shape if spec else None
        if shape is None:
            if any(not isinstance(d, int) or d <= 0 for d in dims):
                raise UsageError(
                    f"inputs.{name}: the model's input '{name}' has dynamic shape "
                    f"{[d if d else '?' for d in dims]}",
                    where=str(policy.path),
                    hint=f"add 'inputs: {{{name}: {{shape: [...]}}}}' or a min/opt/max profile",
                )
            shape = tuple(dims)
        else:
            _check_fits(policy, name, shape, dims, spec)
        shapes[name] = tuple(shape)
    return shapes


def _check_fits(policy: Policy, name: str, shape, dims, spec: InputSpec) -> None:
    if len(shape) != len(dims):
        raise UsageError(
            f"inputs.{name}.shape: rank {len(shape)} does not fit the model's rank-{len(dims)} input",
            where=str(policy.path),
            hint=f"the model expects {[d if d else '?' for d in dims]}",
        )
    for given, fixed in zip(shape, dims):
        if isinstance(fixed, int) and fixed > 0 and given != fixed:
            raise UsageError(
                f"inputs.{name}.shape: {list(shape)} does not fit the model's {[d if d else '?' for d in dims]}",
                where=str(policy.path),
                hint="only dynamic dimensions may differ",
            )


def make_feeds(policy: Policy, model: onnx.ModelProto) -> list[Feed]:
    """`accuracy.samples` feeds, deterministic for `accuracy.seed`."""
    shapes = check_inputs(policy, model)
    specs = {s.name: s for s in policy.inputs}
    rng = np.random.default_rng(policy.accuracy.seed)
    dtypes = {n: helper.tensor_dtype_to_np_dtype(t) for n, t, _ in model_inputs(model)}
    files = {
        n: _load_npz(policy, s, shapes[n]) for n, s in specs.items() if s.data.file is not None
    }
    n_samples = policy.accuracy.samples
    if files:
        n_samples = min(n_samples, *(len(v) for v in files.values()))
    feeds = []
    for i in range(n_samples):
        feed = {}
        for name, shape in shapes.items():
            if name in files:
                feed[name] = files[name][i].astype(dtypes[name], copy=False)
                continue
            spec = specs.get(name, InputSpec(name)).data
            dtype = dtypes[name]
            if np.issubdtype(dtype, np.floating):
                if spec.distribution == "normal":
                    arr = rng.normal(spec.mean, spec.std, size=shape)
                else:
                    arr = rng.uniform(spec.low, spec.high, size=shape)
            elif dtype == np.bool_:
                arr = rng.integers(0, 2, size=shape)
            else:
                arr = rng.integers(
                    int(spec.low), max(int(spec.high), int(spec.low) + 1), size=shape
                )
            feed[name] = np.asarray(arr).astype(dtype)
        feeds.append(feed)
    return feeds


def _load_npz(policy: Policy, spec: InputSpec, shape: tuple[int, ...]) -> np.ndarray:
    field = f"inputs.{spec.name}.data.file"
    try:
        with np.load(spec.data.file) as data:
            if spec.name not in data:
                raise UsageError(
                    f"{field}: {spec.data.file.name} has no array '{spec.name}'",
                    where=str(policy.path),
                    hint="keys found: " + ", ".join(data.files),
                )
            arr = data[spec.name]
    except UsageError:
        raise
    except Exception as exc:
        raise UsageError(
            f"{field}: cannot read {spec.data.file}: {exc}", where=str(policy.path)
        ) from None
    if arr.shape == shape:
        return arr[None]
    if arr.shape[1:] == shape:
        return arr
    raise UsageError(
        f"{field}: array '{spec.name}' has shape {list(arr.shape)}; expected {list(shape)} "
        f"or [N, {', '.join(map(str, shape))}]",
        where=str(policy.path),
    )
