"""The values each shape input is fed at the points judged: its optimization profile.

Why from the data: TensorRT builds an engine for a shape input's values (a Resize's
`sizes`, TopK's `K`) as it does for the other inputs' dims, from a min, an opt and a max,
and refuses to build without them. trtbuild knows the values it feeds at every point it
judges, and its verdict holds for those; so the profile holds them. min and max are the
least and the largest value fed at any point, entry by entry: every value judged runs in
the engine. opt is one sample's values at opt, whole (those fed most often there, the
first sample's where none repeats): TensorRT checks the network's shapes at opt with every
input at its opt (a Reshape's volume against its input's), which a sample fed at opt
holds, and an entrywise mix of samples need not.

Refused (exit 2) where trtbuild cannot know them: the policy gives the input no data at a
point (the default range `[0, 1)` holds only 0: an engine for 0 alone), the values differ
between the points judged while opt is not judged (`accuracy.shapes.opt.skip`), or they
come in different lengths (a profile holds one length).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

import numpy as np

from trtbuild import words
from trtbuild.accuracy.points import InputData, ShapePoint
from trtbuild.errors import UsageError
from trtbuild.graph.shape_inputs import ShapeValues, is_candidate, unfixed_lengths
from trtbuild.graph.view import GraphView
from trtbuild.policy.model import Policy

# What a shape input is called where TensorRT named it and the graph did not say why
NAMED_BY_TENSORRT = "its parser takes it for one"


class Run(Protocol):
    """One point judged, as `front.ShapeRun` holds it (read only: it is frozen)."""

    @property
    def point(self) -> ShapePoint: ...

    @property
    def feeds(self) -> list[dict[str, np.ndarray]]: ...

    @property
    def data(self) -> Mapping[str, InputData]: ...


def check_given(
    policy: Policy, point: ShapePoint, data: Mapping[str, InputData], decides: Mapping[str, str]
) -> None:
    """Exit 2 for a shape input the policy gives no data at `point`, before the point's
    reference runs (its zeros would run as the model's sizes)."""
    for name, what in decides.items():
        if name in data and _unfed(policy, name, data[name]):
            raise _no_data(policy, name, what, [point.label]).error()


def check_known(policy: Policy, runs: Sequence[Run], decides: Mapping[str, str]) -> None:
    """Exit 2 for a shape input whose profile values trtbuild cannot know from the data
    judged: what `build` would refuse, said by `check` too."""
    for found in profile_values(policy, runs, decides, decides).values():
        if found.refused is not None:
            raise found.error()


def check_lengths(policy: Policy, view: GraphView) -> None:
    """Exit 2 for a shape input whose length the model leaves dynamic where TensorRT needs it
    fixed (`graph.unfixed_lengths`), before anything runs: TensorRT-RTX's parser refuses
    the node as if its op were unsupported (exit 3), or dies, whatever the profile holds.
    The fix measured to build: the length fixed in the model by `override_input_shapes`
    (a `shape:` under `inputs` sets the profile, not the model's declaration)."""
    for name, what in unfixed_lengths(view).items():
        spec = next((s for s in policy.inputs if s.name == name), None)
        given = [d for d in (spec.shape, spec.min, spec.opt, spec.max) if d] if spec else []
        lengths = sorted({d[0] for d in given if len(d) == 1})
        length = str(lengths[0]) if len(lengths) == 1 else "LENGTH"
        declared = [d.dim_param or "?" for d in view.shape[name].tensor_type.shape.dim]
        message = (
            f"{_field(name)}: the input is a shape tensor to TensorRT ({what}), and the model "
            f"leaves its length dynamic ({declared}): TensorRT-RTX takes that operand only of a "
            "fixed length (its parser refuses the node as if the op were unsupported), and a "
            f"`shape:` under {_field(name)} sets the profile, not the model"
        )
        hint = (
            f"fix its length in the model: `passes: {{override_input_shapes: "
            f"{{{json.dumps(name)}: [{length}]}}}}`"
        )
        if len(lengths) != 1:
            hint += ", LENGTH the number of values it is always fed"
        if len(lengths) > 1:
            hint += f", and give {_field(name)} that one length (shape: [LENGTH])"
        raise UsageError(message, where=policy.where_of("inputs", name), hint=hint)


def engine_values(
    policy: Policy, view: GraphView, runs: Sequence[Run], decides: Mapping[str, str]
) -> tuple[ShapeValues, ...]:
    """What an engine build is given: the values of every input that may be a shape tensor
    (int32 or int64, rank 0 or 1), or why they are not known. TensorRT says which ones are
    once it has parsed the network; the graph's finding (`decides`) may miss one."""
    names = [n for n in view.inputs if is_candidate(view, n)]
    return tuple(profile_values(policy, runs, names, decides).values())


def profile_values(
    policy: Policy, runs: Sequence[Run], names: Iterable[str], decides: Mapping[str, str]
) -> dict[str, ShapeValues]:
    """The profile's values of each input in `names` fed at `runs` (every point judged, the
    primary one first), or why they are not known; `decides` says what each input's values
    decide, where the graph says (`graph.shape_inputs`). An input fed nowhere is left out."""
    found = {}
    for name in names:
        values = _values(policy, runs, name, decides.get(name, NAMED_BY_TENSORRT))
        if values is not None:
            found[name] = values
    return found


def _values(policy: Policy, runs: Sequence[Run], name: str, what: str) -> ShapeValues | None:
    unfed = [r.point.label for r in runs if name in r.data and _unfed(policy, name, r.data[name])]
    if unfed:
        return _no_data(policy, name, what, unfed)
    fed = [(r, _flat(f[name])) for r in runs for f in r.feeds if name in f]
    if not fed:
        return None
    if len({len(v) for _, v in fed}) > 1:  # `zip` would cut each to the shortest
        return _lengths_differ(policy, name, what, fed)
    least = tuple(min(col) for col in zip(*(v for _, v in fed)))
    largest = tuple(max(col) for col in zip(*(v for _, v in fed)))
    at_opt = [v for r, v in fed if r is runs[0]] if _judges_opt(runs[0].point) else []
    if not at_opt and least != largest:
        return _opt_unknown(policy, name, what, fed)
    opt = Counter(at_opt).most_common(1)[0][0] if at_opt else least
    return ShapeValues(name, least, opt, largest, points=_by_point(fed))


def _by_point(fed: list[tuple[Run, tuple[int, ...]]]) -> tuple[tuple[str, tuple], ...]:
    """The values fed at each point, each once, in the order fed (what build.json records)."""
    seen: dict[str, dict[tuple[int, ...], None]] = {}
    for run, values in fed:
        seen.setdefault(run.point.name, {})[values] = None
    return tuple((name, tuple(values)) for name, values in seen.items())


def _flat(value: np.ndarray) -> tuple[int, ...]:
    return tuple(int(v) for v in np.asarray(value).reshape(-1).tolist())


def _judges_opt(point: ShapePoint) -> bool:
    """Whether `point` is the profile's opt (or a static policy's one shape), merged or not."""
    return point.name.split("=")[0] in ("opt", "shape")


def _unfed(policy: Policy, name: str, data: InputData) -> bool:
    """Whether the input's data at a point is trtbuild's default: random, no range given."""
    spec = next((s for s in policy.inputs if s.name == name), None)
    return data.kind == "random" and (spec is None or not spec.data.range_given)


def _field(name: str) -> str:
    return words.field("inputs", name)


def _no_data(policy: Policy, name: str, what: str, labels: list[str]) -> ShapeValues:
    field = _field(name)
    message = (
        f"{field}: the input is a shape tensor to TensorRT ({what}), so the engine's "
        "optimization profile holds the values it may be fed, and the policy gives it no "
        f"data at {words.first_few(labels)}: the default range [0, 1) holds only 0"
    )
    hint = (
        f"give the values the deployment feeds under {field}.data, a file ({{file: "
        "values.npz}) or a range ({low: 1, high: 65}, high excluded); or, where it takes one "
        f"value, freeze it: `passes: {{freeze_inputs: {{{json.dumps(name)}: VALUE}}}}`"
    )
    return ShapeValues(name, refused=(message, policy.where_of("inputs", name), hint))


def _lengths_differ(
    policy: Policy, name: str, what: str, fed: list[tuple[Run, tuple[int, ...]]]
) -> ShapeValues:
    lengths = sorted({len(v) for _, v in fed})
    message = (
        f"{_field(name)}: the input is a shape tensor to TensorRT ({what}), fed values of "
        f"{', '.join(map(str, lengths))} entries: an optimization profile holds one length"
    )
    hint = f"feed {name} values of one length at every point and sample"
    return ShapeValues(name, refused=(message, policy.where_of("inputs", name), hint))


def _opt_unknown(
    policy: Policy, name: str, what: str, fed: list[tuple[Run, tuple[int, ...]]]
) -> ShapeValues:
    seen = dict.fromkeys(f"{list(v)} at {r.point.name}" for r, v in fed)
    message = (
        f"{_field(name)}: the input is a shape tensor to TensorRT ({what}), and its values "
        f"differ between the points judged ({words.first_few(list(seen))}) while opt is not "
        "judged: the optimization profile's opt, the values TensorRT checks and tunes the "
        "engine at beside every other input at opt, is not known"
    )
    hint = "judge opt (remove accuracy.shapes.opt.skip), or feed the input one value at every point"
    return ShapeValues(name, refused=(message, policy.where_of("inputs", name), hint))
