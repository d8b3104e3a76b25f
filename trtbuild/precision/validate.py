"""The mixed model is checked before any command says it wrote it.

Why: a mixed graph that `onnx.checker` refuses, or that ONNX Runtime will not
load (a weight stored in FP16 behind an input still declared FP32), is a
trtbuild bug however it arose; it must never be written as if it were done.

How, and why so:
- `onnx.checker` runs in this process: it cannot crash it. So does a
  check of every tensor's stored length against its declared type and dims
  (`_misstored`: the checker does not look, and a neighbourhood's load reads only its
  own weights, where the whole model's load refuses any such tensor).
- ONNX Runtime loads the model as a user would, with its default graph
  optimisations, in a child process (`ort_child`): its optimisers crash on some
  valid mixed graphs (a SIGSEGV in `NchwcTransformer` on an FP16 `Transpose` →
  `Cast` → `MatMul`, as around an FP16 GRU) or refuse them (`LayerNormFusion`
  binding FP16 and FP32), and a crash in trtbuild's own process would take the
  command down with it. When that load fails, a second child loads it with
  optimisations off: if that loads, the model is valid ONNX that TensorRT builds,
  and the failure is ONNX Runtime's (a warning naming its version and the op);
  if not, the model is invalid (`InvalidMixedModel`, exit 70).
- The child starts as soon as the mixed model exists (`start_mixed_check`) and
  is joined before anything is published (`MixedCheck.result`), so the load runs
  beside the rest of the command. Each load is a child of the check's own spares
  (`ort_child.Spares`): started ahead (by `convert` as it prepares a graph anew,
  `AHEAD` of them at a lower priority; else the first before the plan's keys are
  computed where nothing is remembered; each next one as one is taken), its
  `import onnxruntime` is done when its job comes,
  and `MixedCheck.cancel` kills and waits for every one, however the check ends. A
  load is waited for at most `timeout` seconds once joined, its session's creation
  and not a spare's idle wait (`build.ort_check_timeout`; by default scaled to the
  model's size, 0 skips the check): a stopped or swapping child ends in exit 2 saying what to set, and so
  does a child the kernel's OOM killer ended (`CheckFailed`), not a verdict on the
  model.
- A model validated once is not validated again: its digest (with the versions of
  ONNX Runtime and onnx) is recorded as a small `converted` entry of the cache
  after the check passed, holding the check's warnings. Why a record of its own
  and not the cached mixed model: `check` caches mixed models it never validates,
  and the record is written only by a check that passed, so a hit proves it.
- A model not validated before is, by default (`build.ort_check: neighbourhoods`),
  loaded in ONNX Runtime one neighbourhood per structural key not yet checked
  (`precision.neighbourhoods`, `graph.structure`): whether ONNX Runtime loads a model
  is decided per node and its few neighbours, and a rule edit that pins one more
  layer like another makes no new neighbourhood, so no child starts at all; what was
  remembered for the model's keys is said again. The memory is per set of opsets and
  IR version (ONNX Runtime's kernels and fusions are registered per opset). The default load fails → the
  neighbourhoods with optimisations off, as above, for the verdict; where they fail
  there too (an artefact of the cut is possible), or fail naming no node a key can be
  charged with (`neighbourhoods.Plan.learn`), or cannot be cut, the whole model
  is loaded as before and its load decides: a cut never makes an exit 70. A model
  with local functions is loaded whole: the keys do not see inside them.
  `whole` loads the whole model every time.
- `onnx.checker` checks the whole model; its full check (strict type and shape
  inference, node by node) runs unless every neighbourhood of the model is remembered
  and a mixed model of the same origin (the prepared graph it was converted from)
  passed the full check before (`needs_full_check`). Why that suffices: a key is remembered only
  after a whole model holding it passed the full check (and ONNX Runtime's load), by a
  judge of the same onnx version; a node's inference reads what its key holds (op,
  domain, attributes, its values' element types and ranks, small constants; the opsets
  key the memory) and the dims, which are not in the key (keys are shared by models)
  but are the origin's: a conversion never changes a dim, so the origin's record says
  they fit. A rule edit like an earlier one then pays the graph's own checks (names,
  order, each node against its schema), 15 ms on 10k nodes and not 50 to 80.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import onnx

from trtbuild.errors import UsageError
from trtbuild.graph import structure
from trtbuild.policy.specs import ORT_CHECKS
from trtbuild.precision import neighbourhoods, ort_child

TIMEOUT_KEY = "build.ort_check_timeout"  # the policy's key that sets `timeout` (0: skip)
# Idle children a check keeps started ahead (`ort_child.Spares`): the "off" load beside
# round 2, the next round and `_judge`'s load each find one whose import is done.
SPARES = 1
# Children a caller starts before a cold check of neighbourhoods (`start_ahead`), as its
# prepared graph is made: the loads such a check waits for in turn where its first load
# fails, as it does on every transformer whose LayerNorms are pinned (three rounds, and
# the load with optimisations off beside the second). More loads than that (the whole
# model's, a crash's probes) find spares started as these are taken.
AHEAD = neighbourhoods.ROUNDS + 1


def open_spares() -> ort_child.Spares:
    """The children a check's loads are given, for a caller that starts some ahead
    (`start_ahead`) and passes them as `spares=` (they are closed when the check ends, and
    by the caller's `with` block where it fails before)."""
    return ort_child.Spares(keep=SPARES)


def start_ahead(spares: ort_child.Spares, scope: str = ORT_CHECKS[0]) -> None:
    """Start the children a cold check of `scope` will load in, before the caller's graph
    passes, so their imports run beside them: `AHEAD` for neighbourhoods, one for the
    whole model (its one load; a failure's next loads find spares started as it is taken).

    Why the first at the default priority and the others lower (`ort_child.SPARE_NICE`):
    the first load takes the first child, and a small model's passes end before a
    lower-priority import, sharing a core with three others, would (all four lower made
    a cold `convert` of the NAFNet example 0.1 s slower, 0.26 s with one core busy); the
    others use the CPU the passes leave (at the default priority, four importing at once
    slowed the passes as much as they saved).
    """
    spares.fill(1)
    if scope == "neighbourhoods":
        spares.fill(AHEAD, ort_child.SPARE_NICE)


class InvalidMixedModel(RuntimeError):
    """The converted graph fails a check: a bug in trtbuild (exit 70, with its traceback)."""


@contextlib.contextmanager
def blamed_on_model(path: str | os.PathLike[str]) -> Iterator[None]:
    """An `InvalidMixedModel` of onnx.checker, raised inside, is the model's own fault where
    the model file fails onnx.checker's full check too: `UsageError` (exit 2) naming it.

    Why: the model is read with the checker's light check (its full check, shape inference
    node by node, costs 0.1 s on 10k nodes where it is read), so a shape an exporter
    declared that inference contradicts first failed the mixed model's full check, which
    calls trtbuild at fault (exit 70; found by mutating a model's bytes). Read again only
    here, where the mixed model has already failed.
    """
    try:
        yield
    except InvalidMixedModel:
        try:
            onnx.checker.check_model(os.fspath(path), full_check=True)
        except Exception as exc:  # ValidationError and the inference's errors
            said = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UsageError(
                f"invalid ONNX model (onnx.checker's full check): {said}",
                where=str(path),
                hint="fix the exporter output: a shape or type it declares that shape "
                "inference contradicts (onnx.checker.check_model(path, full_check=True))",
            ) from None
        raise


class CheckFailed(UsageError):
    """ONNX Runtime's check could not end (out of time, killed from outside): exit 2, the
    machine's to fix or the check's to skip, no verdict on the model."""


def validate_mixed(
    model: onnx.ModelProto,
    cache: Any = None,
    timeout: float | None = None,
    scope: str = ORT_CHECKS[0],
    origin: str = "",
    spares: ort_child.Spares | None = None,
    data: bytes | None = None,
) -> list[str]:
    """Both checks, waited for: the warnings (ONNX Runtime's own failures), or an
    `InvalidMixedModel`. `cache` (a `trtbuild.cache.Cache`) remembers a pass; `origin`
    and `data` as `start_mixed_check`'s."""
    return start_mixed_check(model, cache, timeout, scope, origin, spares, data).result()


def start_mixed_check(
    model: onnx.ModelProto,
    cache: Any = None,
    timeout: float | None = None,
    scope: str = ORT_CHECKS[0],
    origin: str = "",
    spares: ort_child.Spares | None = None,
    data: bytes | None = None,
) -> MixedCheck:
    """Start ONNX Runtime's load in a child, run `onnx.checker` here meanwhile, and return
    the load to join with `result()` before anything is published.

    `timeout`: seconds `result()` waits for each child (None: `ort_child.default_timeout`
    of the model's size; 0: no ONNX Runtime check, only `onnx.checker`'s). `scope`:
    "neighbourhoods" loads one of each neighbourhood not yet known (no child where all
    are), "whole" the whole model. `origin`: what the model was converted from (the
    prepared graph's cache key; "" unknown), for `needs_full_check`. `spares`: children
    started ahead (`open_spares`), the check's from now on: closed when it ends, and
    where it cannot start. `data`: `model` serialized, where the caller has it (`convert`
    writes those bytes: a 10k-node model is serialized once, not twice).
    """
    try:
        check = _start_check(model, cache, timeout, scope, origin, spares, data)
    except BaseException:  # and KeyboardInterrupt: no child outlives the check
        if spares is not None:
            spares.close()
        raise
    if spares is not None and check.spares is not spares:
        spares.close()  # nothing to load in them (a record, or no ONNX Runtime check)
    return check


def _start_check(
    model: onnx.ModelProto,
    cache: Any,
    timeout: float | None,
    scope: str,
    origin: str,
    spares: ort_child.Spares | None,
    data: bytes | None = None,
) -> MixedCheck:
    if scope not in ORT_CHECKS:
        raise ValueError(f"scope {scope!r} is none of {ORT_CHECKS}")
    data = model.SerializeToString() if data is None else data
    remembers = cache is not None and cache.enabled
    digest = _digest(data) if remembers else ""  # a record's key: none without a cache
    if remembers and timeout != 0:
        record = cache.get("converted", digest)
        if record is not None:
            return MixedCheck(None, None, list(record.warnings))
    misstored = _misstored(model)
    if misstored:
        raise InvalidMixedModel(f"the mixed model's {misstored}: trtbuild wrote it wrong")
    seconds = ort_child.default_timeout(len(data)) if timeout is None else float(timeout)
    check = MixedCheck(
        None, model, cache=cache, digest=digest, timeout=seconds, size=len(data), origin=origin
    )
    try:
        _start(check, data, scope, spares)
        check.full = needs_full_check(check.plan, check.cache, check.origin)
        _checked(data, check.full)
    except BaseException:  # and KeyboardInterrupt: no child outlives the check
        check.cancel()
        raise
    return check


def needs_full_check(plan: neighbourhoods.Plan | None, cache: Any, origin: str) -> bool:
    """Whether `onnx.checker` runs its full check on a mixed model of `plan`'s keys, made
    from `origin`: unless every key is remembered and a model of that origin passed the
    full check (the module's docstring says why that suffices)."""
    if plan is None or plan.pending:
        return True
    return not _origin_checked(cache, origin)


def full_check_once(model: onnx.ModelProto, cache: Any = None, origin: str = "") -> None:
    """onnx.checker's full check of a mixed model, unless a mixed model of `origin` (the
    prepared graph's cache key) passed it before under this judge; remembered where it
    passes. `InvalidMixedModel` where it fails (`blamed_on_model` says whose fault).

    Why `check` runs it: it is what makes a shape the model declares and inference
    contradicts exit 2 from `convert` and `build`; without it `check` said nothing of
    such a model, one verdict for one model at one door and another at the next. The
    record is `convert`'s own (`needs_full_check`): paid once per prepared graph.
    """
    if _origin_checked(cache, origin):
        return
    _checked(model.SerializeToString(), True)
    _remember_origin(cache, origin)


def _checked(data: bytes, full: bool = True) -> None:
    """`onnx.checker`'s check of the model's bytes (not serialized again), full or not
    (`needs_full_check`), or `InvalidMixedModel`."""
    try:
        onnx.checker.check_model(data, full_check=full)
    except Exception as exc:  # the checker's own ValidationError and inference errors
        said = "full check" if full else "every neighbourhood remembered: the graph's check"
        raise InvalidMixedModel(f"the mixed model fails onnx.checker ({said}): {exc}") from exc


def _start(
    check: MixedCheck, data: bytes, scope: str, spares: ort_child.Spares | None = None
) -> None:
    """Start the check's first load in a child, where there is one to load (a spare
    started beside the plan's keys, `_planned`, where one is); where the plan finds every
    neighbourhood known, no child runs (and none was started: a memory was read)."""
    if check.timeout <= 0:
        return
    check.spares = spares if spares is not None else open_spares()
    source = data
    if scope == "neighbourhoods":
        check.plan, source = _planned(check.model, data, check.cache, check.spares)  # type: ignore[arg-type]
    if not source:
        check.spares.close()
        return
    check.proc = check.take(source, "default")
    check.source = source if check.plan is not None else b""


def _misstored(model: onnx.ModelProto) -> str:
    """The first tensor (initializers and tensor attributes, bodies' and functions' too)
    whose stored data does not fit its declared type and dims, said; "" where none.

    Why here: onnx.checker does not look, and the neighbourhoods' load reads only their
    own weights, where ONNX Runtime's load of the whole model refuses any such tensor
    ("buffer size mismatch"). Lengths only, no copy to numpy: a few ms for 10k tensors.
    """
    kind = onnx.AttributeProto
    holding = {kind.GRAPH, kind.GRAPHS, kind.TENSOR, kind.TENSORS}
    todo = [("", model.graph.initializer, model.graph.node)]
    todo += [(f" in function {f.name}", (), f.node) for f in model.functions]
    while todo:
        where, tensors, nodes = todo.pop()
        found = [*tensors]
        # most nodes hold no attribute, or only numbers: one look each (half the walk)
        held = [(n, a) for n in nodes if n.attribute for a in n.attribute if a.type in holding]
        for n, a in held:
            if a.type == kind.GRAPH or a.type == kind.GRAPHS:
                inner = f" in {n.name or n.op_type}'s {a.name}"
                todo += [(inner, g.initializer, g.node) for g in (a.graphs or [a.g])]
            else:
                found += a.tensors or [a.t]
        for t in found:
            why = _stored_wrong(t)
            if why:
                return f"tensor {t.name!r}{where} ({_type_name(t.data_type)}, dims {list(t.dims)}) {why}"
    return ""


def _stored_wrong(t: onnx.TensorProto) -> str:
    """How `t`'s stored data does not fit its type and dims ("" where it fits, or where
    its type has no fixed size: strings, an unknown type)."""
    layout = _layout(t.data_type)
    if layout is None:
        return ""
    per_byte, size, field_name, per_value = layout
    n = math.prod(t.dims)
    need = -(-n // per_byte) if per_byte else n * size  # 4-bit, 2-bit types: packed
    if t.data_location == onnx.TensorProto.EXTERNAL:
        said = [e.value for e in t.external_data if e.key == "length"]
        if said and said[0].isdigit() and int(said[0]) != need:
            return f"says {said[0]} bytes of external data where it needs {need}"
        return ""
    if t.HasField("raw_data"):
        got = len(t.raw_data)
        return f"holds {got} bytes where it needs {need}" if got != need else ""
    got, want = len(getattr(t, field_name)), -(-n // per_byte) if per_byte else n * per_value
    return f"holds {got} values in {field_name} where it needs {want}" if got != want else ""


@functools.cache
def _layout(data_type: int) -> tuple[int, int, str, int] | None:
    """(values per byte where packed else 0, bytes per value, typed field, its entries per
    value) of an element type; None for strings and types this onnx does not know."""
    packed = {"INT4": 2, "UINT4": 2, "FLOAT4E2M1": 2, "INT2": 4, "UINT2": 4}
    try:
        name = onnx.TensorProto.DataType.Name(data_type)
        if name in ("STRING", "UNDEFINED"):
            return None
        size = onnx.helper.tensor_dtype_to_np_dtype(data_type).itemsize
        field_name = onnx.helper.tensor_dtype_to_field(data_type)
    except (KeyError, ValueError, TypeError):
        return None
    return packed.get(name, 0), size, field_name, 2 if name.startswith("COMPLEX") else 1


def _type_name(data_type: int) -> str:
    try:
        return onnx.TensorProto.DataType.Name(data_type)
    except ValueError:
        return str(data_type)


def _planned(
    model: onnx.ModelProto, data: bytes, cache: Any, spares: ort_child.Spares
) -> tuple[neighbourhoods.Plan | None, bytes]:
    """The neighbourhoods to load and their model's bytes (b"": all known, no child); no
    plan (the whole model's bytes, `data`) where one cannot be made (a value of unknown
    type), or where the model has local functions (the keys see a call, not the
    function's body, which ONNX Runtime inlines and optimises): the whole model is loaded.

    Where nothing is remembered (a cold check: every key is new, a load follows), a spare
    is started before the keys are computed (about 0.2 s on a 10k-node model), so its
    `import onnxruntime` runs beside them. Not where a memory is read: a rule edit whose
    neighbourhoods are all known must not pay a child it kills."""
    if model.functions:
        return None, data
    try:
        memory = neighbourhoods.read_memory(cache, model)
        if not memory:
            spares.fill(1)
        plan = neighbourhoods.plan(model, memory)
        return plan, plan.neighbourhood() if plan.pending else b""
    except Exception:  # Unbuildable, or a graph the keys do not expect: never a verdict
        return None, data


@dataclass
class MixedCheck:
    """ONNX Runtime's load of one mixed model (or of its new neighbourhoods), under way in
    a child process."""

    proc: subprocess.Popen | None
    # the model (the caller's, not a copy), serialized again only for a second child where
    # the first one failed: no copy of its bytes is held while the build runs
    model: onnx.ModelProto | None
    warnings: list[str] = field(default_factory=list)
    cache: Any = None
    digest: str = ""
    timeout: float = 0.0
    size: int = 0  # bytes of the serialized model
    plan: neighbourhoods.Plan | None = None  # where neighbourhoods are loaded
    source: bytes = b""  # the neighbourhoods' model the child loads
    spares: ort_child.Spares | None = None  # the check's children, reaped by `cancel`
    origin: str = ""  # what the model was converted from ("" unknown): `needs_full_check`
    full: bool = True  # whether `onnx.checker` ran its full check

    def result(self) -> list[str]:
        """Wait for the load: its warnings, or `InvalidMixedModel` where the model is
        invalid, or `CheckFailed` where the check could not end."""
        if self.model is None or (self.proc is None and self.plan is None):
            return self.warnings  # a record's, or no ONNX Runtime check (timeout 0)
        try:
            if self.plan is None:
                self.warnings = self._whole(self.proc)  # type: ignore[arg-type]
            else:
                self.warnings = self._neighbourhoods(self.plan)
        finally:
            self.cancel()
        if self.cache is not None and self.cache.enabled:
            self.cache.put("converted", self.digest, _record(self.warnings))
            if self.full and self.origin:  # its dims fit: `needs_full_check` may leave out the next
                _remember_origin(self.cache, self.origin)
        return self.warnings

    def _whole(self, proc: subprocess.Popen, data: bytes | None = None) -> list[str]:
        """The whole model's load (of `data`, its bytes where the caller has them): []
        where it loaded, else `_judge`'s verdict."""
        first = _ended(proc, self.timeout, self.size)
        if first.ok or first.no_kernel:
            return []
        if data is None:
            data = self.model.SerializeToString()  # type: ignore[union-attr]
        return _judge(first, data, self)

    def _neighbourhoods(self, plan: neighbourhoods.Plan) -> list[str]:
        """Load the pending neighbourhoods (the first child runs already), attribute each
        failure, load the rest again (`neighbourhoods.ROUNDS` loads at most), remember
        what was learned. A neighbourhood that does not load even with optimisations off
        may be an artefact of its cut: the whole model's load gives the verdict then.
        Only the first round's failure is loaded with optimisations off (beside the next
        round's load): a later round loads a part of the same nodes, which loaded then.
        Every child is a spare's (`take`): `cancel` reaps them all, however this ends."""
        source, plain = self.source, None
        for left in range(neighbourhoods.ROUNDS - 1, -1, -1):
            if self.proc is None:
                break
            first = _ended(self.proc, self.timeout, len(source))
            self.proc = None
            if first.ok or first.no_kernel:
                plan.learn("", "")
                break
            if source is self.source:
                plain = self.take(source, "off")
            said = ort_child.warning(first, source, self.timeout, self.take)
            given = plan.learn(said, first.message)
            if given and plan.pending and left:
                source = _rest(plan)  # a spare only where a round after the next may take it
                self.proc = self.take(source, "default", refill=left > 1) if source else None
            if not given or (
                plain is not None and not _loads(_ended(plain, self.timeout, len(self.source)))
            ):  # a failure no key can be charged with, or the cut at fault: the whole decides
                for proc in (plain, self.proc):
                    ort_child.stop(proc)
                data = self.model.SerializeToString()  # type: ignore[union-attr]
                self.proc = self.take(data, "default")
                return self._whole(self.proc, data)
            plain = None
        neighbourhoods.remember(self.cache, plan.learned, plan.model)
        return plan.warnings()

    def take(
        self, source: bytes, level: str, verbose: bool = False, refill: bool = True
    ) -> subprocess.Popen:
        """A child of the check's spares loading `source` at `level` (`ort_child.Spares`,
        `refill` as its), or `CheckFailed` where the machine cannot start a process."""
        if self.spares is None:  # made from a record: it loads nothing
            raise RuntimeError("this check has no children: it loads nothing")
        try:
            return self.spares.take(source, level, verbose, refill)
        except OSError as exc:  # EAGAIN (too many processes), ENOMEM
            raise _cannot_start(exc) from None

    def cancel(self) -> None:
        """Stop every child of the check, loading or spare, and wait for each; the model
        is let go."""
        ort_child.stop(self.proc)
        self.proc = None
        if self.spares is not None:
            self.spares.close()
        self.model = None


def _loads(done: ort_child.Outcome) -> bool:
    """Whether a load with optimisations off loaded (no CPU kernel for a type is no
    fault of the model: the execution provider's)."""
    return done.ok or done.no_kernel


def _rest(plan: neighbourhoods.Plan) -> bytes:
    """The model of the neighbourhoods still pending after a failure was attributed; b""
    where it cannot be built (they stay unknown: the next check loads them)."""
    try:
        return plan.neighbourhood()
    except structure.Unbuildable:
        return b""


def _cannot_start(exc: OSError) -> CheckFailed:
    """What to say where the machine cannot start the check's child process."""
    return CheckFailed(
        f"ONNX Runtime's check of the mixed model could not start a child process "
        f"({exc.strerror or exc})",
        hint=f"free memory or processes, or set {TIMEOUT_KEY}: 0 in the policy to skip this check",
    )


def _ended(proc: subprocess.Popen, timeout: float, size: int) -> ort_child.Outcome:
    """The child's outcome, or `CheckFailed` where it took too long or was killed."""
    what = f"ONNX Runtime's check of the mixed model ({size / (1 << 20):.1f} MiB, a session "
    try:
        done = ort_child.outcome(proc, timeout)
    except ort_child.TimedOut:
        raise CheckFailed(
            what + f"created in a child process) gave no answer within {timeout:.0f} s",
            hint=f"set {TIMEOUT_KEY} in the policy to more seconds (the default grows with "
            f"the model: {ort_child.BASE_SECONDS:.0f} s and 1 s per "
            f"{ort_child.BYTES_PER_SECOND >> 20} MiB), or to 0 to skip this check; a stopped "
            "or swapping machine does this too",
        ) from None
    if done.kind == "ImportError":  # the child's Python is not the parent's environment
        raise CheckFailed(
            what + f"created in a child process) could not import ONNX Runtime: {done.message}",
            hint=f"install onnxruntime where {sys.executable} finds it, or set "
            f"{TIMEOUT_KEY}: 0 in the policy to skip this check",
        )
    if done.killed:
        why = (
            "the kernel's out-of-memory killer does this when the machine runs out of memory"
            if done.crash == "SIGKILL"
            else "a signal from outside trtbuild"
        )
        raise CheckFailed(
            what + f"created in a child process) was killed ({done.crash}): {why}",
            hint="free memory or use a machine with more, or set "
            f"{TIMEOUT_KEY}: 0 in the policy to skip this check",
        )
    return done


def _judge(first: ort_child.Outcome, data: bytes, check: MixedCheck) -> list[str]:
    """The default load failed: load with optimisations off (a child of `check`'s spares)
    to tell ONNX Runtime's fault (a warning) from the model's (`InvalidMixedModel`). No CPU
    kernel for a type (BF16 ReduceMean) is no failure: the model is valid, the execution
    provider is not."""
    timeout = check.timeout
    plain = _ended(check.take(data, "off"), timeout, len(data))
    if not (plain.ok or plain.no_kernel):
        said = plain.message if plain.crash is None else f"it crashed ({plain.crash})"
        raise InvalidMixedModel(
            f"the mixed model does not load in ONNX Runtime {ort_child.version()} "
            f"(graph optimisations off): {said}"
        )
    return [ort_child.warning(first, data, timeout, check.take)]


def _digest(data: bytes) -> str:
    """The record's key: the model's bytes and what judged them."""
    h = hashlib.sha256(b"trtbuild-validated\0")
    h.update(ort_child.judge().encode() + b"\0")
    h.update(data)  # not joined to the judge first: a copy of a large model's bytes
    return h.hexdigest()


def _origin_checked(cache: Any, origin: str) -> bool:
    """Whether a mixed model converted from `origin` passed the full check under this judge
    (remembered by `_remember_origin`; False without a cache or an origin)."""
    if cache is None or not cache.enabled or not origin:
        return False
    return cache.get("converted", _origin_digest(origin)) is not None


def _remember_origin(cache: Any, origin: str) -> None:
    """Remember that a mixed model converted from `origin` passed the full check (read by
    `_origin_checked`): a later edit of the rules on that graph skips it."""
    if cache is not None and cache.enabled and origin:
        cache.put("converted", _origin_digest(origin), _record([]))


def _origin_digest(origin: str) -> str:
    """The key of the record that a mixed model converted from `origin` passed the full
    check under this judge."""
    h = hashlib.sha256(b"trtbuild-origin-checked\0")
    h.update(ort_child.judge().encode() + b"\0" + origin.encode())
    return h.hexdigest()


def _record(warnings: list[str]) -> Any:
    """A `converted` value holding only the check's warnings (a tiny model, no casts)."""
    from onnx import helper

    from trtbuild.precision.convert import Converted

    graph = helper.make_graph([], "validated", [], [])
    return Converted(helper.make_model(graph), [], list(warnings))
