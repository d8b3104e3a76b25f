"""What ONNX Runtime's check of a mixed model loads: one of each neighbourhood not yet seen.

Why: a user edits one rule and converts again, and the whole 10k-node model used to be
loaded by ONNX Runtime twice (the default load, refused by its LayerNormFusion on
pinned LayerNorms, then the load with optimisations off): 3.4 s of a 4.3 s convert.
Whether ONNX Runtime loads a model is decided per node and its surroundings (a kernel
per op and types, an optimiser per pattern of a few connected nodes), so a node whose
`RADIUS`-hop neighbourhood has the structure of one that loaded before
(`graph.structure`: the same key) tells nothing new. The check loads the union of the
neighbourhoods of one node per key not yet known (`Plan.model`) and remembers, per
key, what the load said: "" where it loaded, else the warning (`Memory`).

Type consistency across the whole graph is `onnx.checker`'s full check, on the whole
model wherever a key is new (`validate.needs_full_check`: a key is remembered only after a model
holding it passed that check).

Attribution, where the default load fails and the load with optimisations off passes:
ONNX Runtime stops at the first failure, so the load says nothing of the other
neighbourhoods. The warning is remembered for the keys of the nodes its message names
only (a refusal names its node, a crash's warning the node its bisection found). A key
whose neighbourhood holds a node alike to a named one (the same key) is remembered as
stopped by those keys (`_NEAR`): it stands only in a model that holds one of them (the
load of its neighbourhood stops there too, and that warning is said), and is loaded
again in any other. The other keys are loaded again without those (`ROUNDS` loads at
most; what is left stays unknown, for the next check), so a key is remembered clean
only where a default load of its neighbourhood loaded. Where the message names no node
(or a node remembered clean), nothing is learned: the whole model is loaded and its
load is the verdict.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import onnx

from trtbuild.graph import structure
from trtbuild.precision import ort_child

KIND = "neighbourhoods"  # the cache's kind of the memory entry
MEMORY_KEYS = 50_000  # keys kept (about 2 MB); the least recently learned leave first
ROUNDS = 3  # default loads per check, each without the keys a failure was given to
# How ONNX Runtime's messages quote a node: `node (NAME)`, a fused `(NAME/LayerNormFusion/)`,
# the crash warning's `node 'NAME'` (a name inside another, `a/Mul` in `a/Mul_1`, is not it)
_QUOTED = re.compile(r"""(?=[(\s'":]([^)\s'"]+))""")  # from each opening: a quoted name
_NAME_ENDS = "/:,."  # where a quoted name may end inside a longer word
_NODE = re.compile(r"(?i)(\bnode\s*[(':]\s*)[^)'\s]*")  # the node a warning names
_NEAR = "\0near "  # a memory's value: the load stopped at a node of these keys (no warning)


@dataclass
class Plan:
    """The keys of one mixed model's nodes and which of them are not yet known."""

    model: onnx.ModelProto
    types: dict[str, onnx.TypeProto]  # each value's (`structure.value_types`)
    shape: structure.Structure
    known: dict[str, str]  # key -> warning ("" clean), what the memory knew of this model
    pending: dict[str, int] = field(default_factory=dict)  # unknown key -> its node
    learned: dict[str, str] = field(default_factory=dict)  # key -> warning, this check's

    def neighbourhood(self) -> bytes:
        """The model of the pending keys' neighbourhoods, serialized.

        Raises:
            structure.Unbuildable: a value on its border has no known type.
        """
        nodes = self.shape.ball(self.pending.values())
        return structure.neighbourhood_model(self.model, self.types, nodes).SerializeToString()

    def learn(self, warning: str, said: str) -> bool:
        """A default load of `neighbourhood()` said `said` (its message, "" where it
        loaded); `warning` is what it means for the user ("" where it loaded). False
        where the failure cannot be given to keys (no node named, or one remembered
        clean): nothing is learned, the whole model's load must decide."""
        if not warning:
            self.learned.update(dict.fromkeys(self.pending, ""))
            self.pending = {}
            return True
        named = _named(self.model, self.shape, self.pending.values(), said + "\n" + warning)
        keys = self.shape.keys
        alike = {keys[v] for v in named}
        said_before = {**self.known, **self.learned}
        if not alike or any(
            k not in self.pending and not _warns(said_before.get(k)) for k in alike
        ):
            return False
        for key in alike & self.pending.keys():
            self.learned[key] = warning
            del self.pending[key]
        # the neighbourhoods holding a node alike to a named one: one search from all of them
        stopped = self.shape.ball(v for v, k in enumerate(keys) if k in alike)
        near = _NEAR + " ".join(sorted(alike))
        for key in [k for k, v in self.pending.items() if v in stopped]:
            self.learned[key] = near
            del self.pending[key]
        return True

    def warnings(self) -> list[str]:
        """The warnings of the model's keys in the order of the graph, one per kind: a
        failure that differs only in the node it names (the same LayerNormFusion refusal
        at each pinned LayerNorm) is said once, as the whole model's load says it once."""
        said = {**self.known, **self.learned}
        kinds = {w: _kind(w) for w in set(said.values()) if _warns(w)}  # a few distinct ones
        first: dict[str, str] = {}
        for key in self.shape.keys:
            if _warns(said.get(key)):
                first.setdefault(kinds[said[key]], said[key])
        return list(first.values())


def _warns(said: str | None) -> bool:
    """Whether a memory's value is a warning (not clean, not `_NEAR`, not unknown)."""
    return bool(said) and not said.startswith(_NEAR)  # type: ignore[union-attr]


def _stands(said: str, keys: set[str]) -> bool:
    """Whether a memory's value holds for a model of `keys`: a `_NEAR` value only where
    the model holds a key it was stopped by (its load stops there too)."""
    return not said.startswith(_NEAR) or not _stoppers(said).isdisjoint(keys)


def _stoppers(said: str) -> set[str]:
    """The keys a `_NEAR` value was stopped by (none for any other value)."""
    return set(said[len(_NEAR) :].split()) if said.startswith(_NEAR) else set()


def _kind(warning: str) -> str:
    """A warning without the node it names: ONNX Runtime's `node (NAME)`, the crash
    warning's `node 'NAME'`."""
    return _NODE.sub(r"\1", warning)


def plan(model: onnx.ModelProto, memory: dict[str, str]) -> Plan:
    """The keys of `model` and, of those `memory` does not hold, one node each."""
    types = structure.value_types(model)
    shape = structure.structure(model, types)
    present = set(shape.keys)
    known = {k: memory[k] for k in present if k in memory and _stands(memory[k], present)}
    pending: dict[str, int] = {}
    for v, key in enumerate(shape.keys):
        if key not in known:
            pending.setdefault(key, v)
    return Plan(model, types, shape, known, pending)


def _named(
    model: onnx.ModelProto, shape: structure.Structure, checked: Iterable[int], said: str
) -> list[int]:
    """The nodes of the checked neighbourhoods that ONNX Runtime's message names: as it
    quotes them, `node (NAME)` or a fused `(NAME/LayerNormFusion/)`, or the crash
    warning's `'NAME'`, so `a/Mul` is not found in `a/Mul_1`."""
    nodes = model.graph.node
    quoted = _quoted(said)
    return [v for v in sorted(shape.ball(checked)) if nodes[v].name in quoted]


def _quoted(said: str) -> set[str]:
    """Every name the message may quote: after one of `(`, a space, a quote or `:`, up to
    a `)`, a space or a quote, or to a `/`, `:`, `,` or `.` inside (a fused node's
    `NAME/LayerNormFusion/`). One pass over the message, not one search per node."""
    found = set()
    for token in _QUOTED.findall(said):
        found.add(token)
        found.update(token[:k] for k, ch in enumerate(token) if ch in _NAME_ENDS)
    found.discard("")
    return found


def memory_digest(model: onnx.ModelProto) -> str:
    """The memory's cache key: what judged its keys (`ort_child.judge`), how keys are made
    (`structure.RADIUS` and its code's version), and what the keys do not hold but ONNX Runtime reads: `model`'s opsets (a kernel or a fusion
    is registered per opset: a refusal at opset 17 is none at 13) and IR version. So a
    new ONNX Runtime checks every neighbourhood again, and so does another opset."""
    h = hashlib.sha256(b"trtbuild-neighbourhoods\0")
    h.update(ort_child.judge().encode() + b";")
    h.update(f"radius={structure.RADIUS};keys={structure.VERSION};".encode())
    opsets = sorted((o.domain or "ai.onnx", o.version) for o in model.opset_import)
    h.update(f"ir={model.ir_version};opsets={opsets};".encode())
    return h.hexdigest()


def read_memory(cache: object, model: onnx.ModelProto) -> dict[str, str]:
    """The keys already checked in models of `model`'s opsets and what their load said;
    empty without a cache."""
    if cache is None or not getattr(cache, "enabled", False):
        return {}
    found = cache.get(KIND, memory_digest(model))  # type: ignore[attr-defined]
    return dict(found) if found is not None else {}


def remember(cache: object, learned: dict[str, str], model: onnx.ModelProto) -> None:
    """Add `learned` (of `model`'s keys) to the memory (read again just before: another
    process may have written meanwhile; the last write wins, the cache's write is atomic).
    The least recently learned keys leave beyond `MEMORY_KEYS`. A key stopped by some
    keys in one model and by others in another (`_NEAR`) stands beside any of them."""
    if not learned or cache is None or not getattr(cache, "enabled", False):
        return
    memory = read_memory(cache, model)
    for key, said in learned.items():
        before = memory.pop(key, None)  # learned again: the most recent
        if before and before.startswith(_NEAR) and said.startswith(_NEAR):
            said = _NEAR + " ".join(sorted(_stoppers(before) | _stoppers(said)))
        memory[key] = said
    for key in list(memory)[: max(0, len(memory) - MEMORY_KEYS)]:
        del memory[key]
    cache.put(KIND, memory_digest(model), memory)  # type: ignore[attr-defined]
