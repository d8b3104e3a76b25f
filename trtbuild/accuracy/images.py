"""A folder of images as input tensors at one point's H x W, preprocessed as deployments do.

Why per point: the engine serves every shape of its profile, and a restoration
model's statistics grow with the image; so the same images are brought to each
point's H, W (resized, or centre-cropped with mirrored padding to keep the pixel
scale), with the same normalisation, rather than judged at one size only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from trtbuild.errors import UsageError
from trtbuild.policy.model import Policy
from trtbuild.policy.specs import InputSpec

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff", ".ppm", ".pgm")


def image_paths(policy: Policy, spec: InputSpec, per_sample: int) -> list[Path]:
    """The folder's images, sorted by name: whole samples of `per_sample` each, at most
    `accuracy.samples` of them (no image is decoded that no sample uses)."""
    img, field = spec.data.images, f"inputs.{spec.name}.data.images"
    try:
        paths = sorted(
            p for p in img.folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()
        )
    except OSError as exc:
        raise UsageError(
            f"{field}: cannot list {img.folder}: {exc.strerror or exc}", where=policy.where
        ) from None
    if len(paths) < per_sample:
        raise UsageError(
            f"{field}: {img.folder} holds {len(paths)} image(s); one sample needs {per_sample}",
            where=policy.where,
            hint="add images (" + ", ".join(IMAGE_SUFFIXES[:4]) + ", ...)",
        )
    samples = min(len(paths) // per_sample, policy.accuracy.samples)
    return paths[: samples * per_sample]


def load_images(policy: Policy, spec: InputSpec, shape: tuple[int, ...]) -> np.ndarray:
    """The folder's images as [samples, *shape] (batches of consecutive images) at `shape`."""
    field = f"inputs.{spec.name}.data"
    layout, (_, h, w) = image_layout(policy, spec, shape, field)
    paths = image_paths(policy, spec, shape[0])
    arrays = [_image(policy, spec, path, (h, w), field, layout) for path in paths]
    stacked = np.stack(arrays).astype(np.float32)
    return stacked.reshape(len(arrays) // shape[0], *shape)


def describe(spec: InputSpec, shape: tuple[int, ...]) -> str:
    """How the images were brought to this point, said plainly for the terminal and reports."""
    img = spec.data.images
    _, h, w = _chw(shape, img.layout or guess_layout(shape) or "NCHW")
    how = "resized" if img.fit == "resize" else "centre-cropped/padded"
    first = f" after a resize to {img.resize[0]}x{img.resize[1]}" if img.resize else ""
    return f"images {img.folder.name}/ {how} to {h}x{w}{first}"


def image_layout(
    policy: Policy, spec: InputSpec, shape: tuple[int, ...], field: str
) -> tuple[str, tuple[int, int, int]]:
    """The layout and (channels, height, width) of an image input, or the field to fix."""
    img, where = spec.data.images, policy.where
    if len(shape) != 4:
        raise UsageError(
            f"{field}.images: input '{spec.name}' has rank {len(shape)}; images need a rank-4 input",
            where=where,
            hint="use 'file' (.npz) or a distribution for this input",
        )
    layout = img.layout or guess_layout(shape)
    if layout is None:
        raise UsageError(
            f"{field}.layout: cannot tell where the channels of {list(shape)} are",
            where=where,
            hint="add 'layout: NCHW' or 'layout: NHWC'",
        )
    c, h, w = _chw(shape, layout)
    want_c = 1 if img.channels == "GRAY" else 3
    if c != want_c:
        raise UsageError(
            f"{field}.channels: {img.channels} gives {want_c} channel(s); the input has {c} ({layout})",
            where=where,
            hint="set channels (RGB, BGR, GRAY) or layout to fit the model",
        )
    for key, values in (("mean", img.mean), ("std", img.std)):
        if len(values) not in (1, c):
            raise UsageError(
                f"{field}.{key}: {len(values)} values for {c} channel(s)",
                where=where,
                hint=f"give one number or {c}",
            )
    return layout, (c, h, w)


def _chw(shape: tuple[int, ...], layout: str) -> tuple[int, int, int]:
    return (shape[1], shape[2], shape[3]) if layout == "NCHW" else (shape[3], shape[1], shape[2])


def _image(
    policy: Policy, spec: InputSpec, path: Path, size: tuple[int, int], field: str, layout: str
) -> np.ndarray:
    """One image, fit to `size`, scaled and normalised, in the input's layout."""
    img = spec.data.images
    a = _pixels(policy, spec, path, size, field)
    if img.channels == "BGR":
        a = a[..., ::-1]
    a = (a * img.scale - np.asarray(img.mean, np.float32)) / np.asarray(img.std, np.float32)
    return a.transpose(2, 0, 1) if layout == "NCHW" else a


def _pixels(
    policy: Policy, spec: InputSpec, path: Path, size: tuple[int, int], field: str
) -> np.ndarray:
    """The image as float32 [H, W, C] at `size`: `resize` first where given, then `fit`."""
    from PIL import Image

    img, (h, w) = spec.data.images, size
    channels = 1 if img.channels == "GRAY" else 3
    try:
        with Image.open(path) as im:
            _check_pixels(policy, field, path, im.size)
            im = im.convert("L" if channels == 1 else "RGB")
            if img.resize is not None:
                im = im.resize((img.resize[1], img.resize[0]), Image.BILINEAR)
            if img.fit == "resize":
                im = im.resize((w, h), Image.BILINEAR)
            a = np.asarray(im, dtype=np.float32).reshape(im.height, im.width, channels)
    except Image.DecompressionBombError as exc:
        raise UsageError(
            f"{field}.images: {path.name} is refused by Pillow: {exc}",
            where=policy.where,
            hint="downscale the image; Pillow decodes no image past twice its limit",
        ) from None
    except (OSError, ValueError) as exc:
        raise UsageError(
            f"{field}.images: cannot read {path.name}: {exc}", where=policy.where
        ) from None
    return a if img.fit == "resize" else centre_fit(a, h, w)


def _check_pixels(policy: Policy, field: str, path: Path, size: tuple[int, int]) -> None:
    """An image larger than `accuracy.max_image_pixels` is refused before it is decoded."""
    limit, count = policy.accuracy.max_image_pixels, size[0] * size[1]
    if count > limit:
        raise UsageError(
            f"{field}.images: {path.name} has {count:,} pixels ({size[0]}x{size[1]}), more than "
            f"accuracy.max_image_pixels {limit:,}",
            where=policy.where,
            hint="downscale the image, or raise accuracy.max_image_pixels if you trust it",
        )


def centre_fit(a: np.ndarray, h: int, w: int) -> np.ndarray:
    """[H, W, C] centre-cropped to h x w, mirrored outward where it is smaller (no new edges)."""
    out = a
    for axis, want in ((0, h), (1, w)):
        have = out.shape[axis]
        if have > want:
            start = (have - want) // 2
            out = np.take(out, range(start, start + want), axis=axis)
        elif have < want:
            before = (want - have) // 2
            pad = [(0, 0)] * out.ndim
            pad[axis] = (before, want - have - before)
            out = np.pad(out, pad, mode="symmetric")
    return out


def guess_layout(shape: tuple[int, ...]) -> str | None:
    nchw, nhwc = shape[1] in (1, 3), shape[3] in (1, 3)
    if nchw != nhwc:
        return "NCHW" if nchw else "NHWC"
    return None
