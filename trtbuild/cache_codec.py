"""The cache's codecs: each kind of cached value as data (JSON, ONNX bytes, .npy), never code.

Why: a pickle runs whatever its bytes say when it is loaded, so a cache of pickles
is a way to run code as whoever reads it: another user who can write the folder,
or a CI cache restored from storage. A value encoded here decodes by building
only what its kind's codec names (a dataclass from exactly its fields, a list,
a dict, an ONNX `ModelProto`, a numpy array read with `allow_pickle=False`), so a
planted entry can at worst hold wrong data, never act.

The payload of an entry is one line of JSON, `{"kind", "blobs", "value"}`, then
the blobs it refers to, back to back (`blobs` lists their sizes). In `value`,
plain JSON stands for itself where it is exact: `str`, `int`, `float` (its repr
round-trips, NaN and infinities included), `bool`, `None`, lists and dicts whose
keys are strings that do not start with `$`. Everything else is a one-key object
tagged `$tuple`, `$set`, `$frozenset`, `$dict` (key-value pairs), `$array` (a
`.npy` blob), `$scalar` (a 0-d `.npy` blob: a numpy scalar keeps its dtype) or
`$onnx` (a serialized `ModelProto`). The types are checked exactly, not by
`isinstance`: a `numpy.float32` is not written as a `float`, an `OrderedDict` or a
subclass not as its base, because a hit must return exactly what a miss computes.
A value holding anything else raises `Uncacheable`: the cache refuses it and
never falls back to pickle.

A decoded value must also have its kind's shape: every field of a dataclass is
checked against its annotation (`conforms`: a `list[str]` holds strings, a model
field a `ModelProto`), and the reference's outputs are arrays by name. An entry of
the right hash but the wrong content (planted, or another version's) is `Corrupt`:
dropped and recomputed, never handed to a stage that would fail on it. The JSON
line is bounded (`HEAD_MAX_BYTES`): a string of hundreds of megabytes in it is
refused before it is parsed.
"""

from __future__ import annotations

import functools
import io
import json
import types
import typing
from collections.abc import Callable
from dataclasses import fields, is_dataclass
from typing import Any

import numpy as np

from trtbuild.cache import Corrupt, Uncacheable

Blobs = list[bytes]
Encoder = Callable[[Any, Blobs], Any]
Decoder = Callable[[Any, list[memoryview]], Any]


__all__ = ["Corrupt", "Uncacheable", "decode", "encode"]

# The JSON line of an entry holds structure and names only (arrays and models are blobs):
# the measures of a 100k-node model take a few tens of MB.
HEAD_MAX_BYTES = 64 << 20


def encode(kind: str, value: Any) -> list[bytes]:
    """The payload of `value` as parts to write one after the other (no copy of the blobs).

    Raises:
        Uncacheable: `kind` has no codec or `value` holds what the codec cannot express.
    """
    if kind not in CODECS:
        raise Uncacheable(f"no codec for kind {kind!r}")
    blobs: Blobs = []
    try:
        tree = CODECS[kind][0](value, blobs)
        head = {"kind": kind, "blobs": [len(b) for b in blobs], "value": tree}
        line = json.dumps(head, separators=(",", ":"), ensure_ascii=True, allow_nan=True)
        if len(line) >= HEAD_MAX_BYTES:
            raise Uncacheable(f"more than {HEAD_MAX_BYTES >> 20} MiB of structure")
    except Uncacheable:
        raise
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        # np.save refusing an object array, a model over protobuf's 2 GB, a cycle
        raise Uncacheable(str(exc)) from exc
    return [line.encode("ascii") + b"\n", *blobs]


def decode(kind: str, data: bytes, start: int = 0) -> Any:
    """The value of the payload that starts at `data[start]`, built only from data.

    Raises:
        Corrupt: the payload is not a value of `kind` (another version, a planted entry).
    """
    end = data.find(b"\n", start, start + HEAD_MAX_BYTES)
    try:
        head = json.loads(data[start:end]) if end >= 0 else None
        if type(head) is not dict or head.get("kind") != kind or kind not in CODECS:
            raise Corrupt(f"not a {kind} entry")
        sizes, view, blobs = head["blobs"], memoryview(data)[end + 1 :], []
        if any(type(n) is not int or n < 0 for n in sizes) or sum(sizes) != len(view):
            raise Corrupt("the blobs do not add up to the payload")
        for n in sizes:
            blobs.append(view[:n])
            view = view[n:]
        return CODECS[kind][1](head["value"], blobs)
    except Corrupt:
        raise
    except Exception as exc:  # json, protobuf and numpy each raise their own on bad bytes
        raise Corrupt(f"{type(exc).__name__}: {exc}") from exc


# -- values: exact JSON, or a tagged one-key object -------------------------------------


def tree(value: Any, blobs: Blobs) -> Any:
    """`value` as JSON data, its arrays and models appended to `blobs`.

    Raises:
        Uncacheable: a type this module does not name (the message says which).
    """
    t = type(value)
    if value is None or t in (str, int, float, bool):
        return value
    if t is list:
        return [tree(v, blobs) for v in value]
    if t is dict:
        if all(type(k) is str and not k.startswith("$") for k in value):
            return {k: tree(v, blobs) for k, v in value.items()}
        return {"$dict": [[tree(k, blobs), tree(v, blobs)] for k, v in value.items()]}
    if t in (tuple, set, frozenset):
        return {f"${t.__name__}": [tree(v, blobs) for v in value]}
    if t is np.ndarray:
        return {"$array": _add(blobs, _npy(value))}
    if isinstance(value, np.generic) and t.__module__ == "numpy":
        return {"$scalar": _add(blobs, _npy(np.asarray(value)))}
    if _is_model(value):
        return {"$onnx": _add(blobs, value.SerializeToString())}
    raise Uncacheable(f"a {t.__module__}.{t.__qualname__} the cache cannot store as data")


def untree(data: Any, blobs: list[memoryview]) -> Any:
    """The value `tree` wrote: plain JSON as itself, tagged objects by their tag."""
    if type(data) is list:
        return [untree(v, blobs) for v in data]
    if type(data) is not dict:
        return data
    if len(data) == 1 and next(iter(data)).startswith("$"):
        ((tag, arg),) = data.items()
        if tag not in _TAGS:
            raise Corrupt(f"unknown tag {tag}")
        return _TAGS[tag](arg, blobs)
    return {k: untree(v, blobs) for k, v in data.items()}


def _add(blobs: Blobs, data: bytes) -> int:
    """The index `data` gets among the blobs (what a tagged object refers to)."""
    blobs.append(data)
    return len(blobs) - 1


def _blob(index: Any, blobs: list[memoryview]) -> memoryview:
    if type(index) is not int or not 0 <= index < len(blobs):
        raise Corrupt(f"no blob {index!r}")
    return blobs[index]


def _npy(array: np.ndarray) -> bytes:
    """`.npy` bytes; an object array raises ValueError (it would need pickle)."""
    out = io.BytesIO()
    np.lib.format.write_array(out, array, allow_pickle=False)
    return out.getvalue()


def _array(index: Any, blobs: list[memoryview]) -> np.ndarray:
    return np.lib.format.read_array(io.BytesIO(_blob(index, blobs)), allow_pickle=False)


def _scalar(index: Any, blobs: list[memoryview]) -> np.generic:
    array = _array(index, blobs)
    if array.ndim != 0:
        raise Corrupt("a scalar blob holds an array")
    return array[()]


def _model(index: Any, blobs: list[memoryview]) -> Any:
    import onnx

    model = onnx.ModelProto()
    model.ParseFromString(bytes(_blob(index, blobs)))
    return model


def _is_model(value: Any) -> bool:
    """An ONNX `ModelProto`, without importing onnx for values that cannot be one."""
    if type(value).__name__ != "ModelProto":
        return False
    import onnx

    return type(value) is onnx.ModelProto


def _items(data: Any, blobs: list[memoryview]) -> list:
    if type(data) is not list:
        raise Corrupt("a tagged collection without a list")
    return [untree(v, blobs) for v in data]


def _pairs(data: Any, blobs: list[memoryview]) -> dict:
    return {k: v for k, v in _items(data, blobs)}


_TAGS: dict[str, Decoder] = {
    "$tuple": lambda d, b: tuple(_items(d, b)),
    "$set": lambda d, b: set(_items(d, b)),
    "$frozenset": lambda d, b: frozenset(_items(d, b)),
    "$dict": _pairs,
    "$array": _array,
    "$scalar": _scalar,
    "$onnx": _model,
}


# -- dataclasses: each kind names its classes; fields are values as above ---------------


def exact(value: Any, cls: type) -> Any:
    """`value` itself if it is a `cls` (not a subclass, which would decode as `cls`)."""
    if type(value) is not cls:
        raise Uncacheable(f"a {type(value).__qualname__} where a {cls.__qualname__} is cached")
    return value


def encode_fields(obj: Any, blobs: Blobs, special: dict[str, Encoder] | None = None) -> dict:
    """Every field of dataclass `obj`, so a field added later is stored, never dropped."""
    special = special or {}
    return {f.name: special.get(f.name, tree)(getattr(obj, f.name), blobs) for f in fields(obj)}


def decode_fields(
    cls: type, data: Any, blobs: list[memoryview], special: dict[str, Decoder] | None = None
) -> Any:
    """A `cls` from exactly its fields (a payload with other fields is another version's)."""
    names = [f.name for f in fields(cls)]
    if type(data) is not dict or list(data) != names:
        raise Corrupt(f"not the fields of {cls.__qualname__}")
    special = special or {}
    value = cls(**{n: special.get(n, untree)(data[n], blobs) for n in names})
    for f in fields(cls):
        if not conforms(getattr(value, f.name), _hints(cls)[f.name]):
            raise Corrupt(f"{cls.__qualname__}.{f.name} does not hold a {_hints(cls)[f.name]}")
    return value


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def conforms(value: Any, hint: Any) -> bool:
    """Whether `value` has the shape of annotation `hint` (a dataclass's fields, its items).

    Numbers are numbers (an int or numpy scalar where a float is annotated: what a
    stage computes); containers are checked item by item; `Any` holds anything.
    """
    return _checker(hint)(value)


Check = Callable[[Any], bool]


@functools.cache
def _checker(hint: Any) -> Check:
    """The check of one annotation, made once: a `dict[str, float]` of 10k ranges is
    checked per item on every read, so nothing per item asks `typing` again."""
    if hint is Any:
        return lambda v: True
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        parts = tuple(_checker(a) for a in args)
        return lambda v: any(p(v) for p in parts)
    if hint is type(None):
        return lambda v: v is None
    if origin is None:
        return _plain(hint)
    if origin is dict:
        key, item = _checker(args[0]), _checker(args[1])
        return lambda v: isinstance(v, dict) and all(key(k) and item(x) for k, x in v.items())
    if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
        each = tuple(_checker(a) for a in args)
        return lambda v: (
            isinstance(v, tuple) and len(v) == len(each) and all(c(x) for c, x in zip(each, v))
        )
    item = _checker(args[0]) if args else None
    return lambda v: isinstance(v, origin) and (item is None or all(map(item, v)))


def _plain(hint: Any) -> Check:
    if hint is float:
        return _is_number
    if hint is int:
        return lambda v: type(v) is int or isinstance(v, (int, np.integer))
    if is_dataclass(hint):
        names = [(f.name, _hints(hint)[f.name]) for f in fields(hint)]  # type: ignore[arg-type]
        return lambda v: type(v) is hint and all(conforms(getattr(v, n), h) for n, h in names)
    return lambda v: isinstance(v, hint)


def _is_number(value: Any) -> bool:
    """A float where one is annotated: a float, an int or a numpy number, not a bool."""
    return type(value) is float or (
        isinstance(value, (int, float, np.integer, np.floating)) and type(value) is not bool
    )


def _record_list(cls: type) -> tuple[Encoder, Decoder]:
    """The codec of a list of dataclass `cls` records (pass records, casts)."""

    def enc(items: Any, blobs: Blobs) -> list:
        exact(items, list)
        return [encode_fields(exact(item, cls), blobs) for item in items]

    def dec(data: Any, blobs: list[memoryview]) -> list:
        if type(data) is not list:
            raise Corrupt(f"not a list of {cls.__qualname__}")
        return [decode_fields(cls, item, blobs) for item in data]

    return enc, dec


# -- the kinds ----------------------------------------------------------------------


def encode_prepared(value: Any, blobs: Blobs) -> dict:
    """The prepared graph: its model as ONNX bytes, its pass records as data."""
    from trtbuild.passes.basic import PassRecord
    from trtbuild.passes.prepare import Prepared

    return encode_fields(exact(value, Prepared), blobs, {"records": _record_list(PassRecord)[0]})


def decode_prepared(data: Any, blobs: list[memoryview]) -> Any:
    """A `Prepared` from `encode_prepared`'s data."""
    from trtbuild.passes.basic import PassRecord
    from trtbuild.passes.prepare import Prepared

    return decode_fields(Prepared, data, blobs, {"records": _record_list(PassRecord)[1]})


def encode_converted(value: Any, blobs: Blobs) -> dict:
    """The mixed model: ONNX bytes, its casts as records, its warnings as strings."""
    from trtbuild.precision.convert import CastRecord, Converted

    return encode_fields(exact(value, Converted), blobs, {"casts": _record_list(CastRecord)[0]})


def decode_converted(data: Any, blobs: list[memoryview]) -> Any:
    """A `Converted` from `encode_converted`'s data."""
    from trtbuild.precision.convert import CastRecord, Converted

    return decode_fields(Converted, data, blobs, {"casts": _record_list(CastRecord)[1]})


def encode_measures(value: Any, blobs: Blobs) -> dict:
    """The reference's measures: peaks, sizes, shapes as JSON, special tensors as .npy."""
    from trtbuild.accuracy.reference import ReferenceMeasures

    return encode_fields(exact(value, ReferenceMeasures), blobs)


def decode_measures(data: Any, blobs: list[memoryview]) -> Any:
    """A `ReferenceMeasures` from `encode_measures`'s data."""
    from trtbuild.accuracy.reference import ReferenceMeasures

    return decode_fields(ReferenceMeasures, data, blobs)


def encode_run_results(value: Any, blobs: Blobs) -> list:
    """The reference's outputs (Polygraphy `RunResults`): per runner, per feed, .npy arrays."""
    from polygraphy.comparator import RunResults
    from polygraphy.comparator.struct import IterationResult

    runs = []
    for item in exact(value, RunResults):
        runner, iterations = exact(item, tuple)
        for it in exact(iterations, list):
            exact(it, IterationResult)
            if set(vars(it)) != {"dct", "key_type", "value_type", "runtime", "runner_name"}:
                raise Uncacheable("an IterationResult with attributes of another Polygraphy")
        runs.append(
            [
                tree(runner, blobs),
                [
                    {
                        "runner_name": tree(it.runner_name, blobs),
                        "runtime": tree(it.runtime, blobs),
                        "outputs": [[tree(k, blobs), tree(a, blobs)] for k, a in it.items()],
                    }
                    for it in iterations
                ],
            ]
        )
    return runs


def decode_run_results(data: Any, blobs: list[memoryview]) -> Any:
    """Polygraphy `RunResults` from `encode_run_results`'s data, outputs in their order."""
    from polygraphy.comparator import RunResults
    from polygraphy.comparator.struct import IterationResult

    results = RunResults()
    for runner, iterations in data:
        if type(runner) is not str or type(iterations) is not list:
            raise Corrupt("not a runner's name and its iterations")
        results.append(
            (
                untree(runner, blobs),
                [
                    IterationResult(
                        {untree(k, blobs): untree(a, blobs) for k, a in it["outputs"]},
                        runtime=untree(it["runtime"], blobs),
                        runner_name=untree(it["runner_name"], blobs),
                    )
                    for it in iterations
                ],
            )
        )
    for _, iterations in results:
        for it in iterations:
            if not all(type(k) is str and type(a) is np.ndarray for k, a in it.items()):
                raise Corrupt("an output that is not an array by name")
    return results


def encode_memory(value: Any, blobs: Blobs) -> dict:
    """ONNX Runtime's memory of neighbourhoods: a key -> warning ("" clean) as JSON."""
    if not conforms(exact(value, dict), dict[str, str]):
        raise Uncacheable("a memory of neighbourhoods that is not strings by string")
    return tree(value, blobs)


def decode_memory(data: Any, blobs: list[memoryview]) -> Any:
    """The memory from `encode_memory`'s data: strings by string, or `Corrupt`."""
    value = untree(data, blobs)
    if type(value) is not dict or not conforms(value, dict[str, str]):
        raise Corrupt("not a memory of neighbourhoods (warnings by key)")
    return value


CODECS: dict[str, tuple[Encoder, Decoder]] = {
    "prepared": (encode_prepared, decode_prepared),
    "measures": (encode_measures, decode_measures),
    "reference": (encode_run_results, decode_run_results),
    "converted": (encode_converted, decode_converted),
    "neighbourhoods": (encode_memory, decode_memory),
}
