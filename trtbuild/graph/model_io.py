"""Model I/O: loading and saving with user-grade errors and atomic writes, the opset,
shape inference."""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import io
import logging
import math
import operator
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import onnx

from trtbuild.errors import UsageError
from trtbuild.fsutil import READ_NOFOLLOW, atomic_path, file_kind
from trtbuild.graph import subgraphs
from trtbuild.graph.domains import DEFAULT_DOMAINS
from trtbuild.graph.subgraphs import all_nodes, bodies, may_hold_bodies

_TWO_GIB = 2**31 - 1
log = logging.getLogger(__name__)


def fed_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The graph inputs a run feeds: each one that is not a weight (IR 3 lists weights as
    graph inputs too, beside their initializers)."""
    weights = {t.name for t in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in weights]


def no_input(field: str, name: str, inputs: Iterable[str], where: str | None = None) -> UsageError:
    """Exit 2 for a policy field that names an input the model does not have, with the
    inputs it has."""
    names = list(inputs)
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
    return UsageError(
        f"{field}: the model has no input '{name}'",
        where=where,
        hint=(f"did you mean '{close[0]}'? " if close else "")
        + "name one of the model's inputs: "
        + ", ".join(names),
    )


def check_model_file(
    path: str | os.PathLike[str], *, what: str = "model", field: str | None = "model"
) -> None:
    """Exit 2 unless `path` is a regular file (a symlink to one is): before anything reads it.
    `field`: the policy's field that names it, or None for a path given on the command line.

    Why: a FIFO blocks the first read for ever and /dev/zero reads until memory runs
    out; the cache's digest would read either before onnx could refuse it.
    """
    path = Path(path)
    try:
        mode = path.stat().st_mode  # other OSErrors (a symlink loop) are the surroundings'
    except FileNotFoundError:
        mode = None
    if mode is None:
        fix = (
            f"fix the `{field}` path, which is relative to the policy's folder (to base_dir "
            "for Policy.from_dict), or create the model there"
            if field
            else "fix the path (relative to the current folder), or create the model there"
        )
        raise UsageError(f"{what} file not found", where=str(path), hint=fix)
    kind = file_kind(path)
    if kind:
        raise UsageError(
            f"{kind}, not an ONNX file",
            where=str(path),
            hint=f"name a regular .onnx file as the {what}",
        )


def load_model(
    path: str | os.PathLike[str], *, what: str = "model", raw: bytes | None = None
) -> onnx.ModelProto:
    """Load an ONNX model (external data included) or fail with one clear message.

    `raw`: the file's bytes, where the caller read them (`read_model`) and made the cache
    key of them: the model is parsed from the bytes the key says, not from a file that
    an export may have replaced since.
    """
    path = Path(path)
    check_model_file(path, what=what)
    try:
        fmt = onnx.serialization.registry.get_format_from_file_extension(path.suffix)
        fmt = fmt or "protobuf"  # as onnx.load tells it from the name
        if raw is None:
            model = onnx.load(str(path), load_external_data=False)  # any format onnx reads
        else:
            model = onnx.load_model(io.BytesIO(raw), fmt, False)
        external = _holds_external_data(model, raw)
        if external:
            places = _external_places(model, path)  # before any byte of it is read
            _check_size(path, len(raw) if raw is not None else path.stat().st_size, places)
            onnx.load_external_data_for_model(model, str(path.parent))
    except UsageError:
        raise
    except Exception as exc:  # protobuf raises DecodeError, onnx raises ValueError/OSError
        raise UsageError(
            f"not a readable ONNX model ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'truncated or corrupt'})",
            where=str(path),
            hint="re-export or re-download the model",
        ) from None
    _refuse_damaged(model, path)
    try:
        _check(model, None if external or fmt != "protobuf" else raw)
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0]
        raise UsageError(
            f"invalid ONNX model: {first}",
            where=str(path),
            hint="fix the exporter output; onnx.checker must accept the model",
        ) from None
    return model


def _refuse_damaged(model: onnx.ModelProto, path: Path) -> None:
    """What parses and onnx.checker passes but no run can use: no node, a name that is not
    text, an input or output of an element type ONNX does not have (found by mutating a
    model's bytes: an input's type 80 ended `check` as an internal error)."""
    if not model.graph.node:
        raise UsageError(
            "the model has no nodes", where=str(path), hint="is this a truncated or empty file?"
        )
    damaged = _not_text(model) or _untyped(model)
    if damaged:
        raise UsageError(
            f"not a readable ONNX model ({damaged})",
            where=str(path),
            hint="re-export or re-download the model: the file is damaged, or its exporter "
            "wrote it wrong",
        )


def _untyped(model: onnx.ModelProto) -> str:
    """An input the run feeds, or an output, of an element type ONNX does not have (an input
    of none: UNDEFINED, no data can be drawn for it), said; "" where there is none."""
    known = set(onnx.TensorProto.DataType.values())
    fed = fed_inputs(model)
    for kind, values in (("input", fed), ("output", model.graph.output)):
        for v in values:
            if not v.type.HasField("tensor_type"):
                continue
            elem = v.type.tensor_type.elem_type
            if elem not in known:
                return f"its {kind} '{v.name}' has element type {elem}, which is no ONNX type"
            if kind == "input" and elem == onnx.TensorProto.UNDEFINED:
                return f"its input '{v.name}' declares no element type (UNDEFINED)"
    return ""


def _not_text(model: onnx.ModelProto) -> str:
    """The first text of the model (a name of a node, op, value, attribute, graph or
    function; a doc string, the producer, metadata) that is not UTF-8, said; "" where every
    one is.

    Why: protobuf gives a proto2 string field holding bytes that are not UTF-8 (a damaged
    byte of the file) as `bytes`, onnx.checker passes it, and every later step takes names
    for `str` (found by mutating a model's bytes: `check` ended as an internal error, and
    `convert` where it copies a graph's name). `str.join` refuses bytes: one C-level pass
    per field, about 30 ms on 10k nodes, paid where the model is parsed (not where the
    prepared graph is cached).
    """
    texts = [model.producer_name, model.producer_version, model.domain, model.doc_string]
    texts += [x for m in model.metadata_props for x in (m.key, m.value)]
    found = next((x for x in texts if not isinstance(x, str)), None)
    todo: list[onnx.GraphProto | onnx.FunctionProto] = [model.graph, *model.functions]
    while todo and found is None:
        graph = todo.pop()
        found = _bytes_in(graph)
        if found is None:  # its op types are text: `bodies` may look them up
            todo += [body for n in graph.node if n.attribute for _, body in subgraphs.bodies(n)]
    return f"the text {found!r} is not UTF-8" if found is not None else ""


def _bytes_in(graph: onnx.GraphProto | onnx.FunctionProto) -> bytes | None:
    """The first text of one graph's (not its bodies') that protobuf gave as bytes, or None."""
    join, name = "".join, operator.attrgetter("name")
    nodes = list(graph.node)
    named = [*graph.value_info, *(a for n in nodes if n.attribute for a in n.attribute)]
    plain = [graph.name, graph.doc_string]
    if isinstance(graph, onnx.GraphProto):
        named += [*graph.input, *graph.output, *graph.initializer]
    else:  # a function's inputs and outputs are names
        plain += [graph.domain, *graph.input, *graph.output]
    try:
        join(map(join, map(operator.attrgetter("input"), nodes)))
        join(map(join, map(operator.attrgetter("output"), nodes)))
        for key in ("name", "op_type", "domain"):
            join(map(operator.attrgetter(key), nodes))
        join([*map(name, named), *plain])
        return None
    except TypeError:
        names = [x for n in nodes for x in (n.name, n.op_type, n.domain, *n.input, *n.output)]
        return next(x for x in [*names, *map(name, named), *plain] if not isinstance(x, str))


# The first IR version whose weights need not be graph inputs.
IR_UNLISTED_WEIGHTS = 4


def _check(model: onnx.ModelProto, raw: bytes | None = None) -> None:
    """onnx.checker's verdict, an IR 3 model's weights that are not graph inputs forgiven:
    IR 3 requires them to be, ONNX Runtime and TensorRT read them either way (ONNX
    Runtime's own `mul_1.onnx` does it), and `prepare` makes such a model IR 4 first
    (`drop_initializer_inputs`). Checked as IR 4 then, and given back as it was read.

    `raw`: the bytes `model` was parsed from, all of it (no external data): checked as
    they are, not serialized again (a third of the check's time on 10k nodes).
    """
    try:
        onnx.checker.check_model(model if raw is None else raw, full_check=False)
    except onnx.checker.ValidationError as exc:
        if (
            model.ir_version >= IR_UNLISTED_WEIGHTS
            or "in initializer but not in graph input" not in str(exc)
        ):
            raise
        read = model.ir_version
        model.ir_version = IR_UNLISTED_WEIGHTS
        try:
            onnx.checker.check_model(model, full_check=False)
        finally:
            model.ir_version = read


def _external_places(model: onnx.ModelProto, path: Path) -> list[tuple[str, int, str | None]]:
    """(file, offset, length as written) of each tensor's external data, or exit 2 where
    one names no file or a file not in the model's folder (an absolute path, `..`, a
    symlink out): ONNX's own rule, said before anything is read."""
    folder, places = os.path.realpath(path.parent), []
    for tensor in external_tensors(model):
        location, target, offset, length = _data_of(tensor, folder)
        if not location:
            raise UsageError(
                f"tensor {tensor.name!r} is marked as keeping its data in a file, and names "
                "none (its external_data has no `location`)",
                where=str(path),
                hint="save the model again with its data inside it, or with "
                "onnx.save_model(..., save_as_external_data=True)",
            )
        if target is None:
            raise UsageError(
                f"tensor {tensor.name!r} keeps its data in {location!r}, outside the model's "
                "folder; ONNX reads external data only from files beside the model",
                where=str(path),
                hint="move the data file into the model's folder and save the model again",
            )
        places.append((target, offset, length))
    return places


def _check_size(path: Path, own: int, places: list[tuple[str, int, str | None]]) -> None:
    """Exit 2 where the model with its external data would pass protobuf's 2 GiB, before
    any of it is read: every stage holds the model as one message (its cache entry,
    ONNX Runtime's sessions, the conversion), which no serialization past 2 GiB takes.
    Without this, the load read it all and failed on the first serialization (exit 70).
    `own`: the model file's bytes; `places`: its tensors' (`_external_places`)."""
    size = own
    for target, offset, length in places:
        with contextlib.suppress(OSError, ValueError):  # onnx's load says why
            size += int(length) if length else max(os.stat(target).st_size - offset, 0)
    if size > _TWO_GIB:
        raise UsageError(
            f"the model with its external data is {size / (1 << 30):.1f} GiB, past the 2 GiB "
            "an ONNX model holds in one protobuf message, as trtbuild holds it through every "
            "stage",
            where=str(path),
            hint="quantize its weights (ModelOpt's INT8 or FP8 Q/DQ keep one byte a weight), "
            "or take the model in parts (one block at a time)",
        )


def read_model(path: Path) -> bytes | None:
    """The model file's bytes, or None where they cannot be read (`load_model` says why).

    Why once: the cache key is made of these bytes and the model parsed from them, so a
    file replaced between the two (an export rewriting it, a checkout) cannot store one
    model's prepared graph under another's key.
    """
    try:
        check_model_file(path)
        return path.read_bytes()
    except (OSError, UsageError):
        return None


def model_digest(path: Path, raw: bytes | None = None) -> str:
    """sha256 of the model file (`raw`, where read already) and of the bytes each
    external-data tensor names.

    Only those bytes, streamed: a 2 KB tensor in a 3 GiB data file costs 2 KB, not the
    file. A data file outside the model's folder is never opened (ValueError; loading
    the model says why in its words).
    """
    raw = path.read_bytes() if raw is None else raw
    h = hashlib.sha256(raw)
    if not may_name_data_files(raw):
        return h.hexdigest()
    folder = os.path.realpath(path.parent)
    for tensor in external_tensors(onnx.load_model_from_string(raw)):
        location, target, offset, length = _data_of(tensor, folder)
        if target is None:
            raise ValueError(f"external data {location!r} is outside {folder}")
        h.update(f"{tensor.name}\0{location}\0{offset}\0{length}\0".encode())
        _hash_range(h, target, offset, int(length) if length else None)
    return h.hexdigest()


def key_digest(path: Path, raw: bytes | None = None) -> str | None:
    """`model_digest` for a cache key, or None where the file cannot be read or is not
    ONNX (any error: a key is an optimisation, and the load that follows says why, in
    its words, with the exit code of the fault)."""
    try:
        return model_digest(path, raw)
    except Exception:
        return None


def inside(folder: str, location: str) -> str | None:
    """The path of external-data `location` where it is a file name under `folder` (no
    absolute path, no `..`, no symlink out); None where it is not."""
    if not location or os.path.isabs(location) or ".." in Path(location).parts:
        return None
    target = os.path.realpath(os.path.join(folder, location))
    return target if os.path.commonpath([folder, target]) == folder else None


def _hash_range(h: Any, target: str, offset: int, length: int | None) -> None:
    """Feed `length` bytes of `target` from `offset` (to its end: None) to `h`, a MiB at a
    time; a missing file or one that is no regular file is hashed as such."""
    try:
        fd = os.open(target, READ_NOFOLLOW)
    except OSError:
        h.update(b"<missing>")
        return
    with open(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            h.update(b"<not a file>")
            return
        f.seek(offset)
        left = length
        while left is None or left > 0:
            block = f.read(1 << 20 if left is None else min(left, 1 << 20))
            if not block:
                break
            h.update(block)
            left = None if left is None else left - len(block)


def _data_of(tensor: onnx.TensorProto, folder: str) -> tuple[str, str | None, int, str | None]:
    """Where a tensor keeps its data: its `location`, that file's path where it is one under
    `folder` (`inside`; None where not), the offset, and the length as written (None or
    "": to the file's end); ValueError where the offset is no number."""
    info = {entry.key: entry.value for entry in tensor.external_data}
    location = info.get("location", "")
    return location, inside(folder, location), int(info.get("offset") or 0), info.get("length")


# Bytes of the model file per node below which searching them for "location" is quicker
# than walking the parsed model's tensors: about 0.55 ns a byte against 2 us a node (10k
# small nodes, 256 bytes each: 1.5 ms against 21; a ConvNeXt's 684 nodes in 108 MB: 58 ms
# against 1.2).
SEARCH_BELOW = 3600


def _holds_external_data(model: onnx.ModelProto, raw: bytes | None) -> bool:
    """Whether a tensor of `model` (parsed from `raw`, where at hand) keeps its data in a
    file: the bytes searched first where that is the quicker (`SEARCH_BELOW`), then one
    walk over every tensor where they may name one. Where none does (most models), onnx's
    loader, a second walk, has nothing to load."""
    searched = raw is not None and len(raw) < SEARCH_BELOW * len(model.graph.node)
    if searched and not may_name_data_files(raw):
        return False
    return next(external_tensors(model), None) is not None


def may_name_data_files(raw: bytes | None) -> bool:
    """Whether a model's bytes (None: not at hand) may hold a tensor whose data is in a
    file: every external-data entry names its file under the key `location` (a tensor
    marked external without one is refused: by onnx.checker where the bytes are searched,
    by `_external_places` where the tensors are walked), so bytes without that word
    hold none, found in a millisecond where a walk of 10k nodes takes 20."""
    return raw is None or b"location" in raw


def external_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every tensor of the model that keeps its data in a file: initializers, sparse
    ones, and tensor attributes, in every subgraph (walked without recursion)."""
    graphs = [model.graph]
    while graphs:
        graph = graphs.pop()
        tensors = [*graph.initializer, *(s.values for s in graph.sparse_initializer)]
        for node in graph.node:
            for attr in node.attribute:
                tensors += [attr.t, *attr.tensors] if attr.HasField("t") else list(attr.tensors)
                graphs += [attr.g] if attr.HasField("g") else []
                graphs += list(attr.graphs)
        yield from (t for t in tensors if t.data_location == onnx.TensorProto.EXTERNAL)


def save_model(
    model: onnx.ModelProto, path: str | os.PathLike[str], data: bytes | None = None
) -> None:
    """Write atomically; models past protobuf's 2 GiB limit get one external data file.
    `data`: `model` serialized, where the caller has it (it serialized: below 2 GiB).

    Why no `ByteSize()` first: protobuf's upb backend measures a message by serializing
    it (0.7 s for a 345 MB model, as long as the serialization itself), and past 2 GiB
    both raise the same `EncodeError`."""
    path = Path(path)
    with atomic_path(path) as tmp:
        if data is None:
            data = _serialized(model)
        if data is not None:
            tmp.write_bytes(data)
            return
        location = f"{path.name}.data"
        with atomic_path(path.with_name(location)) as data_tmp:  # renamed once both are written
            tmp.write_bytes(_with_data_file(model, data_tmp, location))


# Bytes of raw data from which `_with_data_file` moves a weight to the data file (onnx's
# `size_threshold` default).
DATA_FILE_FROM = 1024


def _with_data_file(model: onnx.ModelProto, file: Path, location: str) -> bytes:
    """`model`'s bytes with its main graph's weights of raw data (`DATA_FILE_FROM` bytes
    or more) in one external data file, written to `file`, which the bytes name
    `location` (the file's final name, beside the model).

    Why not onnx's `save_as_external_data`: it clears every weight's data in the model it
    is given, and `build` goes on judging the prepared graph it saved."""
    light = _without_weights(model)
    with open(file, "wb") as f:
        for t in model.graph.initializer:
            external = t.data_location == onnx.TensorProto.EXTERNAL
            data = t.raw_data if t.HasField("raw_data") and not external else b""
            if len(data) < DATA_FILE_FROM:
                light.graph.initializer.append(t)
                continue
            light.graph.initializer.append(_stored_in(t, location, f.tell(), len(data)))
            f.write(data)
    return light.SerializeToString()


def _stored_in(t: onnx.TensorProto, location: str, offset: int, length: int) -> onnx.TensorProto:
    """`t` without its data (its other fields kept), which ONNX's external data at
    `location` holds."""
    stand_in = onnx.TensorProto()
    _copy_fields(t, stand_in, skip={"raw_data", "data_location", "external_data"})
    stand_in.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        stand_in.external_data.add(key=key, value=value)
    return stand_in


def _serialized(model: onnx.ModelProto) -> bytes | None:
    """`model`'s bytes, or None where protobuf cannot serialize it (past 2 GiB)."""
    from google.protobuf.message import EncodeError

    try:
        return model.SerializeToString()
    except EncodeError:
        return None


def opset_of(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in DEFAULT_DOMAINS:
            return imp.version
    return 1


# Standard ops onnx's shape inference leaves untyped (and so every tensor after them), each
# with a standard op onnx infers alike: the same inputs, the output its first input's shape
# and type. GroupNormalization (18 and 21) is a function op with no inference of its own in
# onnx up to 1.23 (onnx/onnx#7157); torch.onnx's dynamo exporter writes it from opset 21.
INFERRED_AS = {"GroupNormalization": "InstanceNormalization"}


def infer_shapes(model: onnx.ModelProto, anew: bool = False) -> onnx.ModelProto:
    """Shape inference that never fails the pipeline; custom ops simply stay unknown.
    `anew`: the value infos `model` holds are left out first, as `strip_value_info`
    then this would (a large model's weights copied once, not twice).

    A model of large weights (`LIGHT_FROM`), or with an `INFERRED_AS` op, is inferred on a
    copy (`_for_inference`): its large weights without their data, its `INFERRED_AS` ops
    their stand-ins; the types found are given to a copy of `model`.
    Why the stand-ins: without them a GroupNorm network's tensors after the first
    GroupNorm had no type, were taken for non-float and left out of the conversion (its
    mixed model failed onnx.checker).
    """
    try:
        return _inferred(model, _holds_stand_ins(model.graph), anew, data_prop=True)
    except Exception as exc:  # inference errors on exotic models are not user errors
        log.warning("shape inference failed (%s); continuing without it", exc)
        out = onnx.ModelProto()
        out.CopyFrom(model)  # callers change what this returns; never the caller's model
        if anew:  # what it held is not given back as if inferred
            del out.graph.value_info[:]
        return out


def converter_inferred(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with the types and shapes onnx.version_converter infers before its adapters
    read them: onnx's inference with its defaults (no stand-ins, no data propagation), on
    `_for_inference`'s copy where the weights are large (a 108 MB ConvNeXt: 0.03 s, not
    0.37 s). Raises what onnx's inference raises."""
    return _inferred(model, False)


def _inferred(
    model: onnx.ModelProto, stand_ins: bool, anew: bool = False, **options: bool
) -> onnx.ModelProto:
    """onnx's inference of `model` (a copy; `anew`: without its value infos), on
    `_for_inference`'s copy where it has stand-ins or large weights; `options` onnx's
    (`strict_mode` is always off)."""
    inside = _reads_outer_shaping(model.graph)
    light = stand_ins or inside or _elements(model.graph) > LIGHT_FROM
    if not light:
        source = strip_value_info(model) if anew else model
        return onnx.shape_inference.infer_shapes(source, strict_mode=False, **options)
    found = onnx.shape_inference.infer_shapes(
        _for_inference(model, stand_ins, anew), strict_mode=False, **options
    )
    return _typed_as(model, found)  # its value infos are the ones inference gave back


# Weights' elements from which a model is inferred in `_for_inference`'s copy: below, its
# making and the types' transplant cost more than they save (0.13 s against 0.07 s on the
# 10k-node transformer's 2.6 MB of weights).
LIGHT_FROM = 16 << 20


def _elements(graph: onnx.GraphProto) -> int:
    """The elements of the main graph's weights (their dims: no data read)."""
    return sum(math.prod(t.dims) for t in graph.initializer)


# A weight with more elements than this shapes nothing (shape and index tensors, a Resize's
# scales, a Pad's values hold a few): `_for_inference`'s copy holds it without its data,
# unless it is of an integer type (`weight_only`).
SHAPING_MOST = 1024


def without_weight_data(model: onnx.ModelProto, value_infos: bool = True) -> onnx.ModelProto:
    """A copy of `model` with every field as it is (`value_infos=False`: but the main
    graph's value infos), its main graph's large weights (more than `SHAPING_MOST`
    elements) but their name, type and dims: for a tool that reads no weight's values
    (onnx's version converter, whose output `with_weight_data` completes; its inference).

    Why: the converter serializes the model, parses it in C++, imports every weight into
    its own graph and back, and Python parses the result: a 345 MB ViT took 2.9 s and
    peaked at 2.7 GB there, most of it the weights' copies. Integer tensors keep their
    data whatever their size (`weight_only`): inference reads shapes and sizes in them."""
    copy = _without_weights(model, value_infos)
    copy.graph.initializer.extend(
        _without_data(t) if weight_only(t) else t for t in model.graph.initializer
    )
    return copy


def with_weight_data(out: onnx.ModelProto, source: onnx.ModelProto) -> bool:
    """`out`, made from `without_weight_data(source)`, given back the weights' data it was
    made without, in place (each weight as `source` holds it: its doc string too, which
    the converter drops); False (and `out` not to be used) where one came back with
    another type or dims, or with data of its own (the tool read or changed it), or where
    `source` names two weights alike (onnx.checker refuses such a model)."""
    large = [t for t in source.graph.initializer if weight_only(t)]
    held = {t.name: t for t in large}
    if len(held) != len(large):
        return False
    for t in out.graph.initializer:
        original = held.get(t.name)
        if original is None:
            continue
        if (t.data_type, list(t.dims)) != (original.data_type, list(original.dims)):
            return False
        if t.ByteSize() != _without_data(t).ByteSize():
            return False  # data of its own
        t.CopyFrom(original)
    return True


def weight_only(t: onnx.TensorProto) -> bool:
    """Whether shape inference never reads `t`'s values: more than `SHAPING_MOST` elements,
    and not of the integer types shapes, sizes, axes and indices come in (a Split of 1030
    outputs reads 1030 sizes)."""
    return math.prod(t.dims) > SHAPING_MOST and t.data_type not in _SHAPING_TYPES


_SHAPING_TYPES = frozenset({onnx.TensorProto.INT64, onnx.TensorProto.INT32})


def _without_data(t: onnx.TensorProto) -> onnx.TensorProto:
    return onnx.TensorProto(name=t.name, data_type=t.data_type, dims=t.dims)


# The file name of ONNX's external data that a weight given apart to ONNX Runtime names
# (`data_apart`), followed by its index: no path, so nothing is read from a disk.
MEMORY_FILE = "trtbuild-weight-"


def data_apart(
    tensors: Iterable[onnx.TensorProto],
) -> tuple[list[onnx.TensorProto], list[tuple[str, bytes]]]:
    """`tensors` for an ONNX Runtime session: each large weight (`weight_only`, its data raw)
    as a stand-in whose data is ONNX's external data in a file of memory (`MEMORY_FILE`
    and an index, offset 0, its length), with each such file's name and bytes; the others
    as they are (integer tensors keep their data: ONNX Runtime reads shapes in them).

    Why: a session made from a model's bytes gets the weights serialized into them,
    parsed again and copied into its own tensors. The judge makes a session per
    segment and per candidate: on a 343 MB transformer each took 1.7 to 3 s and faulted
    in 2.2 GB, most of it the weights' copies. Given apart, ONNX Runtime copies each
    weight once, from these bytes, as it makes the session (see `sessions.SessionModel`).
    """
    kept: list[onnx.TensorProto] = []
    files: list[tuple[str, bytes]] = []
    for t in tensors:
        external = t.data_location == onnx.TensorProto.EXTERNAL
        if external or not (weight_only(t) and t.HasField("raw_data")):
            kept.append(t)
            continue
        data = t.raw_data
        name = f"{MEMORY_FILE}{len(files)}"
        kept.append(_stored_in(t, name, 0, len(data)))
        files.append((name, data))
    return kept, files


def model_data_apart(
    model: onnx.ModelProto, weights: Iterable[onnx.TensorProto] = (), apart: bool = True
) -> tuple[onnx.ModelProto, list[tuple[str, bytes]]]:
    """A copy of `model` with every field as it is, `weights` added to its main graph's
    weights, and (`apart`) the large ones given apart as `data_apart` gives them.

    Why `weights` beside `model`: a model put together for one session (`assembled`: a
    segment's, a lean run's) gets its weights here, not first in a graph of its own,
    which would copy them once more."""
    copy = _without_weights(model)
    tensors = [*model.graph.initializer, *weights]
    kept, files = data_apart(tensors) if apart else (tensors, [])
    copy.graph.initializer.extend(kept)
    return copy, files


def assembled(
    like: onnx.ModelProto,
    name: str,
    nodes: Iterable[onnx.NodeProto],
    inputs: Iterable[onnx.ValueInfoProto],
    outputs: Iterable[onnx.ValueInfoProto],
    initializers: Iterable[onnx.TensorProto] = (),
) -> onnx.ModelProto:
    """A model of these parts, at `like`'s IR version and opsets: what `helper.make_model(
    helper.make_graph(...))` makes, each part copied once.

    Why: `make_graph` copies the weights into a graph and `make_model` copies that graph
    again; the judge makes such models of a whole graph (the emulation, a lean run, a
    segment), and a 345 MB model's copies were most of its peak."""
    model = onnx.ModelProto(ir_version=like.ir_version)
    model.opset_import.extend(like.opset_import)
    graph = model.graph
    graph.name = name
    graph.node.extend(nodes)
    graph.input.extend(inputs)
    graph.output.extend(outputs)
    graph.initializer.extend(initializers)
    return model


def _without_weights(model: onnx.ModelProto, value_infos: bool = True) -> onnx.ModelProto:
    """A copy of `model` with every field but its main graph's weights (and, with
    `value_infos` False, its value infos): the weights are the caller's to put in."""
    copy = onnx.ModelProto()
    _copy_fields(model, copy, skip={"graph"})
    skip = {"initializer"} if value_infos else {"initializer", "value_info"}
    _copy_fields(model.graph, copy.graph, skip=skip)
    return copy


def _copy_fields(source: Any, target: Any, skip: set[str]) -> None:
    """Every set field of protobuf message `source` into `target`, but those in `skip`."""
    for field, value in source.ListFields():
        if field.name in skip:
            continue
        repeated = getattr(field, "is_repeated", None)
        if repeated is None:  # protobuf before 5.28
            repeated = field.label == field.LABEL_REPEATED
        if repeated:
            getattr(target, field.name).extend(value)
        elif field.message_type is not None:
            getattr(target, field.name).CopyFrom(value)
        else:
            setattr(target, field.name, value)


def _for_inference(model: onnx.ModelProto, stand_ins: bool, anew: bool = False) -> onnx.ModelProto:
    """A copy of `model` for inference only: its large weights without their data (their
    type and dims are what inference reads), with `stand_ins` its `INFERRED_AS` ops their
    stand-ins, with `anew` none of its value infos.

    Why without the weights: onnx's inference serializes the model it is given, parses
    it in C++ and back, and the weights were most of that: a model with a 400 MB weight
    peaked at 2.0 GB and took 3.2 s, at 0.83 GB and 1.1 s this way.
    """
    copy = without_weight_data(model, value_infos=not anew)
    _shaping_inside(copy)
    if stand_ins:
        for node in all_nodes(copy):
            if _stood_in(node.domain, node.op_type):
                node.op_type = INFERRED_AS[node.op_type]
                kept_attrs = [a for a in node.attribute if a.name == "epsilon"]
                del node.attribute[:]
                node.attribute.extend(kept_attrs)
    return copy


def _typed_as(model: onnx.ModelProto, inferred: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` (its nodes and weights as they are) with the types and shapes
    `inferred`, its `_for_inference` copy inferred, found: each graph's value_info and outputs,
    and a body's inputs, bodies included (inference adds types, never nodes, so the graphs
    pair in order).

    Why a body's inputs: ONNX lets them be declared untyped, and inference types them from
    the outer values, as it does on the model itself; left untyped here (the expanded
    LinearAttention's Scan, whose body reads outer axes), `convert` took its float state for
    no float, an FP16 `Add` read it in FP32 and the full check failed (exit 70).
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    pairs = zip(subgraphs.walk(out.graph), subgraphs.walk(inferred.graph), strict=True)
    for (scope, mine), (_, found) in pairs:
        del mine.value_info[:]
        mine.value_info.extend(v for v in found.value_info if not v.name.startswith(_INSIDE))
        ends = [(mine.output, found.output), (mine.input, found.input)] if scope else []
        for declared_all, typed_all in ends or [(mine.output, found.output)]:
            for declared, typed in zip(declared_all, typed_all, strict=True):
                declared.CopyFrom(typed)
    return out


def _holds_stand_ins(graph: onnx.GraphProto) -> bool:
    """Whether `graph` or a body in it has an `INFERRED_AS` op. Why not `all_nodes`: this
    runs before every inference, and a set of op types is a third of its time on 10k nodes."""
    kinds = {(n.domain, n.op_type) for n in graph.node}
    if any(_stood_in(*kind) for kind in kinds):
        return True
    holders = {kind for kind in kinds if may_hold_bodies(*kind)}
    return bool(holders) and any(
        _holds_stand_ins(body)
        for n in graph.node
        if (n.domain, n.op_type) in holders
        for _, body in bodies(n)
    )


def _stood_in(domain: str, op_type: str) -> bool:
    """Whether an op of this kind is inferred as its `INFERRED_AS` stand-in."""
    return op_type in INFERRED_AS and domain in DEFAULT_DOMAINS


def strip_value_info(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model without inferred shapes (a copy when there are any: the input stays)."""
    if not model.graph.value_info:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.value_info[:]
    return out


# The names of `_shaping_inside`'s Constants (inference's copy only; never in a model given back).
_INSIDE = "trtbuild/inside/"


def _reads_outer_shaping(graph: onnx.GraphProto) -> bool:
    """Whether a body reads a main-graph weight onnx's inference of it needs the values of
    (`_shaping_inside`). Why this cheap: it runs before every inference."""
    if not any(may_hold_bodies(*kind) for kind in {(n.domain, n.op_type) for n in graph.node}):
        return False
    shaping = {t.name for t in graph.initializer if _shapes_inside(t)}
    return bool(shaping) and any(
        shaping & subgraphs.outer_reads(body) for scope, body in subgraphs.walk(graph) if scope
    )


def _shapes_inside(t: onnx.TensorProto) -> bool:
    """An integer weight of a few elements: an axis, a size, a shape a body may read."""
    return t.data_type in _SHAPING_TYPES and math.prod(t.dims) <= SHAPING_MOST


def _shaping_inside(copy: onnx.ModelProto) -> None:
    """In inference's `copy`, each body's reads of small integer main-graph weights made
    reads of `Constant`s of its own, in place.

    Why: onnx's inference of a body sees no value of the graphs around it, and lifting a
    body's `Constant`s into main-graph weights (`lift_constants`, as TensorRT sees weights)
    took from it the axes and sizes it computed shapes from: ViTMatte's relative-position
    resize (`Unsqueeze` by lifted axes, `Concat`, `Resize` by those sizes) lost the length
    of its `sizes`, which onnx's full check refuses ("Number of elements of input 'sizes'
    (0)"): exit 70 from `check`, `convert` and `build` for a model onnx.checker passes.
    """
    weights = {t.name: t for t in copy.graph.initializer if _shapes_inside(t)}
    for k, (scope, body) in enumerate(subgraphs.walk(copy.graph)):
        if not scope:  # the main graph reads its weights as they are
            continue
        own = subgraphs.defined_in(body)
        made: dict[str, str] = {}
        for node in body.node:
            for i, name in enumerate(node.input):
                if name in weights and name not in own:
                    made.setdefault(name, f"{_INSIDE}{k}/{name}")
                    node.input[i] = made[name]
        consts = [
            onnx.helper.make_node("Constant", [], [inner], value=weights[outer])
            for outer, inner in made.items()
        ]
        if consts:  # before the nodes that read them: a body stays in topological order
            nodes = [*consts, *body.node]
            del body.node[:]
            body.node.extend(nodes)
