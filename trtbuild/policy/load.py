"""Read a policy file: YAML → schema check → semantic checks → the `Policy`'s fields.

Why the YAML is composed twice (nodes for line numbers, then values): every
message must name the file, the line and the field, and PyYAML only keeps marks
on nodes.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from trtbuild import words
from trtbuild.errors import UsageError
from trtbuild.policy.keys import given, keyed, written
from trtbuild.policy.schema import SCHEMA, SchemaViolation, _validator, validate
from trtbuild.policy.source import PolicySource, line_of, spelled, unsaved
from trtbuild.policy.source import shown as shown_path
from trtbuild.policy.specs import (
    PATH_KEYS,
    AccuracySpec,
    BuildSpec,
    DataSpec,
    ImageSpec,
    InputSpec,
    Match,
    Passes,
    PointSpec,
    Precision,
    Rule,
    Tolerance,
    simple_applies,
)

POLICY_DIR = Path("policies")


def resolve_policy_path(name: str | Path) -> Path:
    """`--policy nafnet.yaml` (or just `nafnet`) finds `./policies/nafnet.yaml` when no
    such file exists here: the example policies are run by name from the project root."""
    path = Path(name)
    # `.`, `..`, `/` and `dir/` have no name to add `.yaml` to (`with_name` raised: exit 70)
    named = path.name not in ("", ".", "..") and not str(name).endswith(("/", os.sep))
    names = [path] if path.suffix or not named else [path, path.with_name(path.name + ".yaml")]
    candidates = [p for n in names for p in ([n] if n.is_absolute() else [n, POLICY_DIR / n])]
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    there = next((c for c in candidates if c.exists() and not c.is_dir()), None)
    if there is not None:
        check_regular(there)
    if path.is_dir():
        raise UsageError(
            "a folder, not a policy file",
            where=str(name),
            hint="name one policy file (`trtbuild nightly --policies DIR` runs every policy "
            "of a folder)",
        )
    raise UsageError(
        "policy file not found",
        where=str(name),
        hint=f"looked at {', '.join(map(str, candidates))}; name an existing policy file",
    )


def check_regular(path: Path) -> None:
    """Exit 2 unless `path` is a regular file (a symlink to one is), without opening it.

    Why: a FIFO named `x.yaml` blocks its first read for ever (and a nightly's whole night
    with it); a device reads until memory runs out.
    """
    import stat

    from trtbuild.errors import undecoded

    if not stat.S_ISREG(path.stat().st_mode):  # its OSErrors are the surroundings' (exit 2)
        raise UsageError(
            "the policy is not a regular file (a FIFO, device, socket or folder)",
            where=undecoded(str(path)),
            hint="name the policy's .yaml file; one from a pipe, save to a file first",
        )


class PolicyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, reading `1e-3` as the number YAML 1.2 and users mean.

    PyYAML follows YAML 1.1, where a float needs a dot, so `atol: 1e-3` would be a string.
    An integer too long for Python's `int()` (4300 digits) is malformed YAML at its line,
    not the bare ValueError PyYAML lets through.
    """

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        try:
            return super().construct_yaml_int(node)
        except ValueError:
            digits = sum(c.isdigit() for c in node.value)
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"an integer of {digits} digits is past any field's range",
                node.start_mark,
            ) from None


PolicyLoader.add_constructor("tag:yaml.org,2002:int", PolicyLoader.construct_yaml_int)


class PolicyDumper(yaml.SafeDumper):
    """PyYAML's safe dumper, quoting a string `PolicyLoader` would read as a number.

    Why: the dumper follows YAML 1.1 too, so an input, output or rule named `1e3` was
    written bare and read back as the float 1000.0 (`keys must be strings`): `to_yaml`,
    `save` and tune's pins wrote a policy that did not load.
    """


for _reader in (PolicyLoader, PolicyDumper):  # one resolver: what is written is what is read
    _reader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
        list("-+0123456789"),
    )


def read_yaml(text: str) -> Any:
    """A policy's values, as `load_policy` reads them (for tools that rewrite a policy)."""
    return yaml.load(text, Loader=PolicyLoader)


MAX_POLICY_BYTES = 1 << 20
MAX_YAML_NODES = 100_000  # aliases can make a small file expand without bound
MAX_YAML_DEPTH = 32


class _Duplicate(Exception):
    def __init__(self, path: tuple, line: int, first: int):
        super().__init__(path)
        self.path, self.line, self.first = path, line, first


class _TooLarge(Exception):
    pass


def _line_map(
    node: yaml.Node, path: tuple = (), out: dict | None = None, count: list | None = None
) -> dict:
    """Map every field path to the line of its key (or of its list item).

    Raises `_Duplicate` for a key given twice in one mapping (PyYAML keeps the
    last silently, so a pasted second `precision:` block would drop every pin),
    and `_TooLarge` when aliases or nesting make the document unbounded.
    """
    out = {} if out is None else out
    count = [0] if count is None else count
    out.setdefault(path, node.start_mark.line + 1)
    count[0] += 1
    if count[0] > MAX_YAML_NODES or len(path) > MAX_YAML_DEPTH:
        raise _TooLarge(path)
    if isinstance(node, yaml.MappingNode):
        seen: dict = {}
        for key, value in node.value:
            line = key.start_mark.line + 1
            if isinstance(key, yaml.ScalarNode) and key.value in seen:
                raise _Duplicate((*path, key.value), line, seen[key.value])
            seen[key.value] = line
            out[(*path, key.value)] = line
            _line_map(value, (*path, key.value), out, count)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _line_map(item, (*path, i), out, count)
    return out


def format_path(path: tuple) -> str:
    return words.field(*(p if isinstance(p, int) else str(p) for p in path)) or "(top level)"


class _Located:
    """Turns a field path into `file:line: field: message` errors."""

    def __init__(self, file: Path, lines: dict):
        self.file = file
        self.lines = lines

    def error(self, path: tuple, message: str, hint: str | None = None) -> UsageError:
        line = line_of(self.lines, path) or self.lines.get(())  # a missing key: the document's
        where = f"{self.file}:{line}" if line else str(self.file)
        return UsageError(f"{format_path(path)}: {message}", where=where, hint=hint)


def load_fields(name: str | Path) -> tuple[dict[str, Any], PolicySource]:
    """A policy file's fields, validated, and its source (`model.load_policy` makes the
    `Policy`)."""
    path = resolve_policy_path(name)
    shown = shown_path(path)
    try:
        if path.stat().st_size > MAX_POLICY_BYTES:
            raise UsageError(
                f"the policy is larger than {MAX_POLICY_BYTES >> 20} MiB",
                where=shown,
                hint="a policy names rules, not data; put reference data in an .npz file",
            )
        data = path.read_bytes()
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"cannot read policy: it is not UTF-8 text ({exc.reason} at byte {exc.start})",
            where=shown,
            hint="save the policy as UTF-8 (an editor's 'UTF-16' or 'Unicode' is not)",
        ) from None
    except OSError as exc:
        raise UsageError(f"cannot read policy: {exc}", where=shown) from None
    fields, source = parse_fields(text, path, shown)
    return fields, replace(source, sha256=hashlib.sha256(data).hexdigest())


def parse_fields(
    text: str, path: Path, shown: str | None = None
) -> tuple[dict[str, Any], PolicySource]:
    """A policy text's fields, validated (every message names the file, line and field),
    and its source: the text, its sha256, the paths it wrote absolute, its rules' notes."""
    shown = shown or str(path)
    try:
        _check_nesting(text, shown)
        node = yaml.compose(text, Loader=PolicyLoader)
        data = read_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{shown}:{mark.line + 1}" if mark else shown
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        context, opened = getattr(exc, "context", None), getattr(exc, "context_mark", None)
        if context and opened and (mark is None or opened.line != mark.line):
            problem += f" ({context} on line {opened.line + 1})"  # e.g. the unclosed bracket
        raise UsageError(
            f"malformed YAML: {problem}", where=where, hint="fix the YAML syntax"
        ) from None
    lines = _checked_lines(node, shown)
    fields = _fields(data, path.parent, _Located(Path(shown), lines))
    source = PolicySource(
        base_dir=path.parent,
        path=path,
        text=text,
        sha256=hashlib.sha256(text.encode("utf-8")).hexdigest(),
        absolute=_absolute(data, path.parent),
        spellings=_spellings(data, path.parent),
        notes=_notes(text, lines, fields["precision"]),
        lines=tuple(lines.items()),
    )
    return fields, source


def _check_nesting(text: str, shown: str) -> None:
    """Exit 2 where the YAML nests deeper than `MAX_YAML_DEPTH`, found from the parser's
    events before anything is composed.

    Why here: PyYAML's composer (and every walk of the result) recurses once per level,
    so 500 brackets are a RecursionError; the parser itself keeps a list, not a stack.
    """
    depth = 0
    for event in yaml.parse(text, Loader=PolicyLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                raise UsageError(
                    f"the policy nests deeper than {MAX_YAML_DEPTH} levels",
                    where=f"{shown}:{event.start_mark.line + 1}",
                    hint="a policy is a few levels deep: close the brackets or indent less",
                )
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def mapping_fields(
    data: Any, base_dir: Path, name: str = "policy"
) -> tuple[dict[str, Any], PolicySource]:
    """A mapping's fields, validated as a file's text is (messages name the policy `name`
    as every later error of it does, `unsaved`), and its source. The mapping is read as a
    file's values would be: `Path`s, tuples and numpy scalars as the strings, lists and
    numbers they stand for, and the strings YAML 1.1 leaves unread (`1e-2`) as numbers
    where the schema wants one."""
    _check_depth(data, unsaved(name))
    loc = _Located(Path(unsaved(name)), {})
    _model_in_memory(data, loc)
    plain = _numbers_where_wanted(_plain(data))
    fields = _fields(plain, base_dir, loc)
    source = PolicySource(base_dir, absolute=_absolute(plain, base_dir))
    return fields, replace(source, spellings=_spellings(plain, base_dir))


def _model_in_memory(data: Any, loc: _Located) -> None:
    """Exit 2, saying the fix, for a model given as itself (a `ModelProto`, its bytes), not
    its path: an export script holds one, and the schema's `must be a string, got
    ModelProto ModelProto(ir_version=...` named no way out. The model is a file the
    build, the cache and build.json's hash read; saving it is the caller's choice."""
    model = data.get("model") if isinstance(data, Mapping) else None
    if isinstance(model, bytes | bytearray | memoryview) or hasattr(model, "SerializeToString"):
        raise loc.error(
            ("model",),
            f"must be the path of an .onnx file (str or Path), not {type(model).__name__}",
            'a model in memory: save it first (onnx.save(model, "model.onnx")) and give that '
            "path, relative to base_dir",
        )


def merged_rules(
    precision: Precision, rules: Iterable[Any], drop: tuple[str, ...]
) -> tuple[Rule, ...]:
    """`precision`'s rules, each of `rules` replacing the one of its id or added after them,
    less the ids in `drop`; each given rule checked as a file's would be."""
    given_rules = [_plain(r) for r in rules]
    doc = _numbers_where_wanted({"version": 1, "model": "-", "precision": {"rules": given_rules}})
    loc = _Located(Path("<rules>"), {})
    try:
        validate(doc)
    except SchemaViolation as exc:
        raise loc.error(exc.path, exc.message, _fix_hint(exc)) from None
    new = _precision(doc["precision"], loc).rules
    by_id = {r.id: r for r in new}
    unknown = [i for i in drop if i not in {r.id for r in precision.rules}]
    if unknown:
        raise UsageError(
            f"no rule with id {unknown[0]!r} to drop",
            where="<rules>",
            hint=f"the policy's rules are {[r.id for r in precision.rules]}",
        )
    kept = [by_id.pop(r.id, r) for r in precision.rules if r.id not in drop]
    return (*kept, *(r for r in new if r.id in by_id))


def _plain(value: Any) -> Any:
    """What Python code passes, as the values a YAML file gives: str for a path, list for a
    tuple (or a numpy array), int, float or bool for a numpy scalar, a rule's mapping for a
    `Rule` (as `with_rules` takes one: `from_dict` refused it in `precision.rules`); a new
    object."""
    if isinstance(value, Rule):
        return {**written(value), "match": written(value.match)}
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (str, bool, int, float)) or value is None:
        return value
    if type(value).__module__ == "numpy":
        return _plain(value.tolist())  # a scalar's Python value, an array's nested lists
    return value  # the schema names what it is not


_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)(?:[eE][-+]?[0-9]+)?$")


def _numbers_where_wanted(doc: Any) -> Any:
    """`doc` with each string the schema refuses where a number goes, and that reads as one
    (`1e-2`: YAML 1.1's `yaml.safe_load` leaves it a string), made that number."""
    if not isinstance(doc, dict):
        return doc
    for _ in range(100):  # each round fixes every string the validator names
        fixes = [e for err in _validator(SCHEMA).iter_errors(doc) for e in _wanted_numbers(err)]
        if not fixes:
            break
        for path, number in fixes:
            *parents, last = path
            holder = doc
            for part in parents:
                holder = holder[part]
            holder[last] = number
    return doc


def _wanted_numbers(error: Any) -> list[tuple[tuple, float | int]]:
    """(path, number) for each string `error` (or its alternatives) refused for a number."""
    found = []
    for e in [error, *(error.context or ())]:
        if e is not error:
            found += _wanted_numbers(e)
            continue
        types = e.validator_value if e.validator == "type" else ()
        types = [types] if isinstance(types, str) else list(types)
        text = e.instance
        if {"number", "integer"} & set(types) and isinstance(text, str) and _FLOAT.match(text):
            number = float(text.replace("_", ""))
            if "integer" in types and "number" not in types and number.is_integer():
                number = int(number)
            found.append((tuple(e.absolute_path), number))
    return found


def _absolute(doc: Any, base: Path) -> frozenset[str]:
    """Every string of `doc` that is an absolute path, resolved as the loader resolves paths
    (`to_yaml` writes these absolute again, the others relative)."""
    found: set[str] = set()
    stack = [doc]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack += item.values()
        elif isinstance(item, list):
            stack += item
        elif isinstance(item, str) and os.path.isabs(item):
            found.add(str((base / item).resolve()))
    return frozenset(found)


def _spellings(doc: Any, base: Path) -> tuple[tuple[str, str], ...]:
    """(resolved, as written made absolute) for each relative path of `doc` (a value of a
    `PATH_KEYS` key) written through a symlink (`source.spelled`)."""
    found = []
    stack = [doc]
    while stack:
        item = stack.pop()
        pairs = (
            item.items()
            if isinstance(item, dict)
            else enumerate(item)
            if isinstance(item, list)
            else ()
        )
        for k, value in pairs:
            if not isinstance(value, str):
                stack.append(value)
            elif k in PATH_KEYS and value and not os.path.isabs(value) and "://" not in value:
                resolved = (base / value).resolve()
                written = spelled(base, value, resolved)
                if written != resolved:
                    found.append((str(resolved), str(written)))
    return tuple(sorted(set(found)))


def _notes(text: str, lines: dict, precision: Precision) -> tuple[tuple[str, str], ...]:
    """(rule id, comment) for each rule with a comment on the line above it: `tune`'s reason
    for a pin, kept when the policy is written again."""
    rows = text.splitlines()
    found = []
    for i, rule in enumerate(precision.rules):
        line = lines.get(("precision", "rules", i))
        above = rows[line - 2].strip() if line and line >= 2 else ""
        if above.startswith("#"):
            found.append((rule.id, above.lstrip("#").strip()))
    return tuple(found)


def _check_depth(data: Any, shown: str) -> None:
    """Exit 2 where a mapping nests deeper than `MAX_YAML_DEPTH` (walked without recursion)."""
    todo = [(data, 1)]
    while todo:
        value, depth = todo.pop()
        if not isinstance(value, dict | list | tuple):
            continue
        if depth > MAX_YAML_DEPTH:
            raise UsageError(
                f"the policy nests deeper than {MAX_YAML_DEPTH} levels",
                where=shown,
                hint="a policy is a few levels deep",
            )
        items = value.values() if isinstance(value, dict) else value
        todo.extend((v, depth + 1) for v in items)


def _fields(data: Any, base: Path, loc: _Located) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise loc.error((), "a policy must be a mapping with at least 'version' and 'model'")
    try:
        data = validate(data)
    except SchemaViolation as exc:
        raise loc.error(exc.path, exc.message, _fix_hint(exc)) from None
    return _build(data, base, loc)


def _checked_lines(node: yaml.Node | None, shown: str) -> dict:
    """The line map, or one message for a duplicate key or an unbounded document."""
    if node is None:
        return {}
    try:
        return _line_map(node)
    except _Duplicate as dup:
        raise UsageError(
            f"{format_path(dup.path)}: duplicate key '{dup.path[-1]}' (first given on line "
            f"{dup.first}); YAML would silently keep only the last one",
            where=f"{shown}:{dup.line}",
            hint="merge the two blocks into one, or delete one of them",
        ) from None
    except _TooLarge:
        raise UsageError(
            f"the policy expands to more than {MAX_YAML_NODES} YAML nodes or nests deeper than "
            f"{MAX_YAML_DEPTH} levels",
            where=shown,
            hint="remove recursive anchors/aliases; a policy is a few dozen lines",
        ) from None


def _fix_hint(exc: SchemaViolation) -> str | None:
    if exc.path == ("version",):
        return "this trtbuild reads policy version 1"
    if exc.message.startswith("missing required key 'model'"):
        return "add 'model: path/to/model.onnx' (relative to the policy file)"
    if exc.path and exc.path[-1] in ("workspace", "memory_budget"):
        return "write e.g. 4GiB, 512MiB or a number of bytes"
    if exc.path[-1:] == ("id",) and "guard:" in exc.message:
        return "ids starting with 'guard:' are reserved for the built-in guards; rename the rule"
    if exc.path[-1:] == ("skip",) and len(exc.path) == 4:
        return 'say why the point is not judged: skip: "the reason" (a list there is dims)'
    if "finite" in exc.message:
        return "write a number such as 1e-3; .nan and .inf mean nothing here"
    if _dims(exc.path) and exc.message.endswith("got 0"):
        return (
            "a dim of 0 (an empty tensor: a decoder's first step with an empty cache) is not "
            "judged: ONNX Runtime, which runs the FP32 reference and the emulation, dies on "
            "some ops fed one; start at 1, and run a decoder's first step on the model "
            "exported without its cache inputs"
        )
    return None


def _dims(path: tuple) -> bool:
    """Whether `path` is one dim of a shape (`inputs.x.min[2]`, `accuracy.shapes.a.x[1]`)."""
    return (
        len(path) >= 2 and isinstance(path[-1], int) and path[0] in ("inputs", "accuracy", "passes")
    )


# the keys only images read (mean and std are a distribution's too)
IMAGE_KEYS = tuple(n for *_, n in keyed(ImageSpec) if n not in {n for *_, n in keyed(DataSpec)})


# What each kind of data leaves unread: (keys, what reads them, the fix)
_UNREAD = {
    "uniform": (
        ("mean", "std"),
        "distribution: normal (and images)",
        "add distribution: normal, or give the uniform range as low and high",
    ),
    "normal": (
        ("low", "high"),
        "a uniform distribution (normal draws from mean and std, unbounded)",
        "remove low and high, or use distribution: uniform",
    ),
    "file": (("low", "high", "mean", "std"), "a distribution (a file's values are its own)", ""),
    "images": (("low", "high"), "a distribution (images take scale, mean and std)", ""),
}


def _all_read(raw: dict, at: tuple, loc: _Located) -> None:
    """Exit 2 for a key the data's kind does not read, given another value than its default
    (a written-out policy, `Policy.to_dict`, holds every key at its default).

    Why: it was dropped without a word: `{mean: 3, std: 2}` without `distribution:
    normal` drew uniform [0, 1), and `{distribution: normal, low: 0, high: 5}` drew
    outside [0, 5), each judged on data other than the policy said.
    """
    kind = next((k for k in ("file", "images") if k in raw), raw.get("distribution", "uniform"))
    keys, reader, fix = _UNREAD.get(kind, ((), "", ""))
    for key in keys:
        if key in raw and raw[key] != getattr(DataSpec, key):
            raise loc.error((*at, key), f"'{key}' is read only by {reader}", fix or f"remove {key}")


def _data_spec(raw: dict, name: str, base: Path, loc: _Located) -> DataSpec:
    at = ("inputs", name, "data")
    sources = [k for k in ("file", "distribution", "images") if k in raw]
    if len(sources) > 1:
        raise loc.error(at, f"give one of 'file', 'distribution' or 'images', not {sources}")
    if "derive" in raw and "file" not in raw:
        raise loc.error(
            (*at, "derive"),
            "'derive' applies to 'file' only",
            "images are fit to every point (fit: resize or crop); distributions are made at "
            "every point",
        )
    if "images" not in raw:
        for key in IMAGE_KEYS:
            if key in raw:
                raise loc.error((*at, key), f"'{key}' applies to 'images' only")
        for key in ("mean", "std"):
            if isinstance(raw.get(key), list):
                raise loc.error((*at, key), f"a distribution's {key} is one number")
    _all_read(raw, at, loc)
    if raw.get("low", DataSpec.low) > raw.get("high", DataSpec.high):
        raise loc.error((*at, "low"), "low must not exceed high")
    if "std" in raw and any(
        v <= 0 for v in (raw["std"] if isinstance(raw["std"], list) else [raw["std"]])
    ):
        raise loc.error((*at, "std"), "std must be positive")
    images = None
    if "images" in raw:
        images = ImageSpec(**given(raw, ImageSpec, base))
        if not images.folder.is_dir():
            raise loc.error(
                (*at, "images"),
                f"image folder not found: {images.folder}",
                "the path is relative to the policy file",
            )
        if images.resize is not None and images.fit == "resize":
            h, w = images.resize
            raise loc.error(
                (*at, "resize"),
                f"[{h}, {w}] with fit: resize (the default) would bring each larger point to "
                f"its size from a {h}x{w} image: judged on detail that image threw away",
                "remove 'resize': each point is resized straight from the original image; or add "
                f"'fit: crop' to crop every point from the image at {h}x{w} (its pixel scale)",
            )
    per_channel = ("mean", "std") if images else ()  # the images' own, not a distribution's
    range_given = "low" in raw or "high" in raw
    data_spec = DataSpec(
        **given(raw, DataSpec, base, skip=per_channel), images=images, range_given=range_given
    )
    if data_spec.file is not None and not data_spec.file.is_file():
        raise loc.error(
            (*at, "file"),
            f"data file not found: {data_spec.file}",
            "the path is relative to the policy file",
        )
    return data_spec


def _build(data: dict, base: Path, loc: _Located) -> dict[str, Any]:
    """The validated document as the `Policy`'s fields, section by section, with the checks a
    schema cannot express (profiles in order, unique rule ids, regexes that compile)."""
    return dict(
        model=_model(data, base, loc),
        inputs=tuple(
            _input(name, spec or {}, base, loc) for name, spec in _section(data, "inputs")
        ),
        passes=Passes(**given(data.get("passes") or {}, Passes, base)),
        precision=_precision(data.get("precision") or {}, loc),
        build=BuildSpec(**given(data.get("build") or {}, BuildSpec, base)),
        accuracy=_accuracy(data.get("accuracy") or {}, base, loc),
    )


def _section(data: dict, key: str) -> list[tuple[str, Any]]:
    return list((data.get(key) or {}).items())


def _model(data: dict, base: Path, loc: _Located) -> Path:
    model = (base / data["model"]).resolve()
    if model.is_dir():
        raise loc.error(
            ("model",),
            f"{model} is a folder, not an ONNX file",
            "name the .onnx file itself (relative to the policy file)",
        )
    if model.exists() and not model.is_file():  # a FIFO would block the first read for ever
        raise loc.error(
            ("model",),
            f"{model} is not a regular file (a FIFO, device or socket), not an ONNX file",
            "name the .onnx file itself (relative to the policy file)",
        )
    return model


def _input(name: str, spec: dict, base: Path, loc: _Located) -> InputSpec:
    has_profile = any(k in spec for k in ("min", "opt", "max"))
    if has_profile and not all(k in spec for k in ("min", "opt", "max")):
        raise loc.error(("inputs", name), "an optimization profile needs min, opt and max")
    if has_profile and "shape" in spec:
        raise loc.error(("inputs", name), "give either 'shape' or min/opt/max, not both")
    if has_profile:
        _check_profile(name, spec, loc)
    return InputSpec(
        name=name,
        **given(spec, InputSpec, base),
        data=_data_spec(spec.get("data") or {}, name, base, loc),
    )


def _check_profile(name: str, spec: dict, loc: _Located) -> None:
    """Refuse a profile whose min, opt and max disagree, naming the dim and its values.

    A profile of several dynamic axes (batch, height, width) is easy to get wrong in one
    of them; "min <= opt <= max" alone left the user to find which.
    """
    lengths = {k: len(spec[k]) for k in ("min", "opt", "max")}
    if len(set(lengths.values())) != 1:
        said = ", ".join(f"{k} has {n}" for k, n in lengths.items())
        raise loc.error(
            ("inputs", name),
            f"profile needs equal ranks: {said} dim(s)",
            "give min, opt and max one value per dim of the input",
        )
    for dim, (a, b, c) in enumerate(zip(spec["min"], spec["opt"], spec["max"])):
        if not a <= b <= c:
            raise loc.error(
                ("inputs", name),
                f"profile needs min <= opt <= max in every dim; dim {dim} is"
                f" min {a}, opt {b}, max {c}",
                f"order dim {dim}'s values so that min <= opt <= max",
            )


def _precision(prec: dict, loc: _Located) -> Precision:
    rules, seen = [], {}
    for i, raw_rule in enumerate(prec.get("rules") or []):
        rid = raw_rule["id"]
        if rid in seen:
            raise loc.error(
                ("precision", "rules", i, "id"),
                f"duplicate rule id '{rid}' (first used by rule {seen[rid]})",
                "give every rule its own id",
            )
        seen[rid] = i
        rules.append(_rule(i, raw_rule, loc))
    return Precision(**given(prec, Precision, Path()), rules=tuple(rules))


def _rule(i: int, raw_rule: dict, loc: _Located) -> Rule:
    m = raw_rule["match"]
    if m.get("name") is not None:
        try:
            re.compile(m["name"])
        except re.error as exc:
            raise loc.error(
                ("precision", "rules", i, "match", "name"),
                f"invalid regular expression {m['name']!r}: {exc}",
                "quote the pattern and escape special characters such as '(' or '['",
            ) from None
    if "last" in m and m.get("pattern") != "final_reductions":
        raise loc.error(
            ("precision", "rules", i, "match", "last"),
            "'last' only applies to pattern: final_reductions",
        )
    return Rule(
        **given(raw_rule, Rule, Path()),
        match=Match(**given(m, Match, Path())),
    )


def _tolerance(raw: dict, where: tuple, loc: _Located) -> Tolerance:
    """One output's tolerance from the keys given for it (the default's, then its own).

    Polygraphy's simple atol/rtol check applies when one of its keys is given, or
    when nothing else is: `{psnr_threshold: 30}` alone judges by PSNR alone.
    """
    tol = Tolerance(**given(raw, Tolerance, Path()), simple=simple_applies(raw))
    if tol.check_error_stat == "quantile" and tol.error_quantile is None:
        raise loc.error(
            (*where, "error_quantile"),
            "check_error_stat: quantile needs error_quantile",
            hint="add error_quantile: 0.99 (the 99th percentile of the errors), for example",
        )
    if tol.error_quantile is not None and tol.check_error_stat != "quantile":
        raise loc.error(
            (*where, "error_quantile"),
            "error_quantile is read only with check_error_stat: quantile",
            hint="add check_error_stat: quantile, or remove error_quantile",
        )
    if tol.compare != "indices" and (tol.index_tolerance is not None or tol.top_k is not None):
        raise loc.error(
            (*where, "compare"),
            "index_tolerance and top_k are read only with compare: indices",
            hint="add compare: indices (the output's top_k largest values compared as indices)",
        )
    if tol.top_k_axis is not None and tol.top_k is None:
        raise loc.error(
            (*where, "top_k_axis"),
            "top_k_axis is read only with top_k",
            hint="add top_k: 1 (the class each position chooses), or remove top_k_axis",
        )
    return tol


def _accuracy(a: dict, policy_dir: Path, loc: _Located) -> AccuracySpec:
    tol = a.get("tolerances") or {}
    base = dict(tol.get("default") or {})
    where = ("accuracy", "tolerances")
    default_tol = _tolerance(base, (*where, "default"), loc)
    outputs = tuple(
        (name, _tolerance({**base, **(t or {})}, (*where, "outputs", name), loc))
        for name, t in (tol.get("outputs") or {}).items()
    )
    spec = AccuracySpec(
        **given(a, AccuracySpec, policy_dir),
        default_tolerance=default_tol,
        output_tolerances=outputs,
        shapes=tuple(
            _point(name, raw or {}, policy_dir, loc)
            for name, raw in (a.get("shapes") or {}).items()
        ),
    )
    original = spec.reference_model
    if original is not None and not original.is_file():
        what = "is not a regular file" if original.exists() else "not found"
        raise loc.error(
            ("accuracy", "reference_model"),
            f"reference model {what}: {original}",
            "name the unquantized .onnx file the quantized model was made from (the path is "
            "relative to the policy file)",
        )
    return spec


def _point(name: str, raw: dict, base: Path, loc: _Located) -> PointSpec:
    """One `accuracy.shapes` entry: input dims (lists), `data` and `skip` told apart by type."""
    at = ("accuracy", "shapes", name)
    data = raw.get("data") if isinstance(raw.get("data"), dict) else None
    skip = raw.get("skip") if isinstance(raw.get("skip"), str) else None
    dims = tuple((i, tuple(d)) for i, d in raw.items() if isinstance(d, list))
    if skip is not None and data is not None:
        raise loc.error((*at, "skip"), "a skipped point is not judged; its data would not be read")
    if not dims and data is None and skip is None:
        raise loc.error(at, "a point needs input dims, data: {file: ...} or skip: REASON")
    file = None
    if data is not None:
        file = (base / data["file"]).resolve()
        if not file.is_file():
            raise loc.error(
                (*at, "data", "file"),
                f"data file not found: {file}",
                "the path is relative to the policy file",
            )
    return PointSpec(name=name, dims=dims, file=file, skip=skip)
