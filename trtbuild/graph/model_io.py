"""Model I/O: loading and saving with user-grade errors and atomic writes, the opset,
shape inference."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import onnx

from trtbuild.errors import UsageError
from trtbuild.fsutil import atomic_path

_TWO_GIB = 2**31 - 1
log = logging.getLogger(__name__)


def check_model_file(path: str | os.PathLike[str], *, what: str = "model") -> None:
    """Exit 2 unless `path` is a regular file (a symlink to one is): before anything reads it.

    Why: a FIFO blocks the first read for ever and /dev/zero reads until memory runs
    out; the cache's digest would read either before onnx could refuse it.
    """
    path = Path(path)
    try:
        mode = path.stat().st_mode  # other OSErrors (a symlink loop) are the surroundings'
    except FileNotFoundError:
        mode = None
    if mode is None:
        raise UsageError(
            f"{what} file not found",
            where=str(path),
            hint="fix the 'model' path, which is relative to the policy's folder (to base_dir for "
            "Policy.from_dict), or create the model there",
        )
    if not stat.S_ISREG(mode):
        kind = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
        raise UsageError(
            f"{kind}, not an ONNX file",
            where=str(path),
            hint=f"name a regular .onnx file as the {what}",
        )


# what a path is that is no regular file, by its stat type
_KINDS = {
    stat.S_IFDIR: "is a folder",
    stat.S_IFIFO: "is a FIFO (named pipe)",
    stat.S_IFCHR: "is a character device",
    stat.S_IFBLK: "is a block device",
    stat.S_IFSOCK: "is a socket",
}


def load_model(path: str | os.PathLike[str], *, what: str = "model") -> onnx.ModelProto:
    """Load an ONNX model (external data included) or fail with one clear message."""
    path = Path(path)
    check_model_file(path, what=what)
    try:
        model = onnx.load(str(path))
    except Exception as exc:  # protobuf raises DecodeError, onnx raises ValueError/OSError
        raise UsageError(
            f"not a readable ONNX model ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'truncated or corrupt'})",
            where=str(path),
            hint="re-export or re-download the model",
        ) from None
    if not model.graph.node:
        raise UsageError(
            "the model has no nodes", where=str(path), hint="is this a truncated or empty file?"
        )
    try:
        onnx.checker.check_model(model, full_check=False)
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0]
        raise UsageError(
            f"invalid ONNX model: {first}",
            where=str(path),
            hint="fix the exporter output; onnx.checker must accept the model",
        ) from None
    return model


def save_model(model: onnx.ModelProto, path: str | os.PathLike[str]) -> None:
    """Write atomically; models past protobuf's 2 GiB limit get one external data file."""
    path = Path(path)
    with atomic_path(path) as tmp:
        if model.ByteSize() < _TWO_GIB:
            tmp.write_bytes(model.SerializeToString())
        else:
            data_name = f"{path.name}.data"
            onnx.save_model(
                model,
                str(tmp),
                save_as_external_data=True,
                all_tensors_to_one_file=True,
                location=data_name,
            )


def opset_of(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    return 1


def infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Shape inference that never fails the pipeline; custom ops simply stay unknown."""
    try:
        return onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception as exc:  # inference errors on exotic models are not user errors
        log.warning("shape inference failed (%s); continuing without it", exc)
        out = onnx.ModelProto()
        out.CopyFrom(model)  # callers change what this returns; never the caller's model
        return out


def strip_value_info(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model without inferred shapes (a copy when there are any: the input stays)."""
    if not model.graph.value_info:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.value_info[:]
    return out
