"""Engine builders for TensorRT (full) and TensorRT-RTX: one strongly typed path.

Why the TensorRT API directly and not Polygraphy's loaders: the build needs its
own logger (the builder's memory figures, parser errors for exit code 3) and
the parsed network for the layer audit, which Polygraphy's loaders route to
their global logger. Running engines is left to Polygraphy's `TrtRunner`.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtbuild import words
from trtbuild.errors import BackendError, UsageError
from trtbuild.graph.shape_inputs import ShapeValues
from trtbuild.policy.specs import OPSET_FIX, BuildSpec, InputSpec

MODULES = {"tensorrt": "tensorrt", "tensorrt-rtx": "tensorrt_rtx"}
_MEMORY_LINES = {
    "weights_bytes": r"Total Weights Memory: (\d+) bytes",
    "activation_bytes": r"Total Activation Memory: (\d+) bytes",
    "device_persistent_bytes": r"Total Device Persistent Memory: (\d+) bytes",
    "host_persistent_bytes": r"Total Host Persistent Memory: (\d+) bytes",
    "scratch_bytes": r"Max Scratch Memory: (\d+) bytes",
}


# The CUDA driver's library, by the names it has (Linux, then Windows): no CUDA toolkit needed
CUDA_DRIVERS = ("libcuda.so.1", "libcuda.so", "nvcuda.dll")


def _drivers() -> Iterator[Any]:
    """Each CUDA driver library that loads, in `CUDA_DRIVERS`' order."""
    for lib in CUDA_DRIVERS:
        try:
            cuda = ctypes.CDLL(lib)
        except OSError:
            continue
        yield cuda


def gpu_available() -> bool:
    """True when the CUDA driver reports at least one device (no CUDA toolkit needed)."""
    for cuda in _drivers():
        count = ctypes.c_int(0)
        try:
            return (
                cuda.cuInit(0) == 0
                and cuda.cuDeviceGetCount(ctypes.byref(count)) == 0
                and count.value > 0
            )
        except AttributeError:
            return False
    return False


def gpu_name() -> str | None:
    """The first CUDA device's name ("NVIDIA A10"), from the driver; None without one."""
    for cuda in _drivers():
        device, name = ctypes.c_int(0), ctypes.create_string_buffer(256)
        try:
            ok = cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(device), 0) == 0
            if ok and cuda.cuDeviceGetName(name, len(name), device) == 0:
                return name.value.decode(errors="replace") or None
        except AttributeError:
            return None
    return None


# Why each backend module that is installed did not import (`_importable`), by its name
_BROKEN: dict[str, str] = {}


def _importable(module: str) -> Any | None:
    """The module, or None where it does not import: not installed, or installed and
    failing (a stub that raises, libraries that cannot map under `ulimit -v`: kept in
    `_BROKEN`, so `auto` falls back without a word and `_refuse_broken` says why)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module:  # one of its own imports is missing: installed, broken
            _BROKEN[module] = str(exc)
        return None
    except Exception as exc:
        _BROKEN[module] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return None


def resolve_backend(requested: str) -> str:
    """Map `auto` to a concrete backend; fail with exit 3 when the requested one is missing.

    `auto` prefers full TensorRT where it imports and a GPU is present (it cannot build
    without one), else TensorRT-RTX, which compiles ahead of time on the CPU.
    """
    if requested == "none":
        return "none"
    if requested == "auto":
        if gpu_available() and _importable("tensorrt") is not None:
            return "tensorrt"
        if _importable("tensorrt_rtx") is not None:
            return "tensorrt-rtx"
        _refuse_broken("tensorrt_rtx")
        raise BackendError(
            "no TensorRT backend is installed",
            hint='pip install -e ".[rtx]" (TensorRT-RTX builds on the CPU), or set build.backend: none '
            "to write the mixed model and the emulated report only",
        )
    if _importable(MODULES[requested]) is None:
        _refuse_broken(MODULES[requested])
        extra = "rtx" if requested == "tensorrt-rtx" else "trt"
        raise BackendError(
            f"backend '{requested}' is not installed (python module '{MODULES[requested]}')",
            hint=f'pip install -e ".[{extra}]", or choose another build.backend',
        )
    if requested == "tensorrt" and not gpu_available():
        raise BackendError(
            "backend 'tensorrt' needs a GPU to build engines and none is visible",
            hint="use backend tensorrt-rtx to build ahead of time on the CPU",
        )
    return requested


def _refuse_broken(module: str) -> None:
    """A backend installed that does not import, said as that (not "not installed", whose
    fix, installing it, does nothing): under `ulimit -v` its libraries failed to map."""
    said = _BROKEN.get(module)
    if said is not None:
        raise BackendError(
            f"the python module '{module}' is installed but does not import: {said}",
            hint="its libraries could not be loaded (too little memory or address space, "
            "`ulimit -v`; a missing system library): fix that, or set build.backend: none",
        )


def backend_version(backend: str) -> str | None:
    if backend == "none":
        return None
    module = _importable(MODULES[backend])
    return getattr(module, "__version__", None)


@dataclass
class EngineBuild:
    backend: str
    version: str
    engine: bytes
    seconds: float
    layers: list[dict[str, Any]] = field(default_factory=list)
    memory: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    int8_kernels: dict[str, Any] | None = None  # a quantized model's: `int8_check`
    # each input TensorRT took for a shape tensor: the profile's values (`ShapeValues.to_json`)
    shape_inputs: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        out = {
            "backend": self.backend,
            "version": self.version,
            "engine_bytes": len(self.engine),
            "build_seconds": round(self.seconds, 3),
            "memory": self.memory,
            "builder_warnings": self.warnings,  # TensorRT's own, as its logger said them
            "shape_inputs": self.shape_inputs,
        }
        if self.int8_kernels is not None:
            out["int8_kernels"] = self.int8_kernels
        return out


@contextlib.contextmanager
def _deferred_interrupt() -> Iterator[threading.Event]:
    """Hold Ctrl-C while TensorRT runs, then raise it in Python.

    Why: TensorRT calls back into Python (logger, progress monitor) from C++,
    and a KeyboardInterrupt raised inside a callback is caught and printed by
    TensorRT, which then finishes the build as if nothing happened. So SIGINT
    only sets a flag, the progress monitor asks TensorRT to stop, and the
    interrupt is raised once TensorRT has returned.
    """
    flag = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return
    previous = signal.signal(signal.SIGINT, lambda *_: flag.set())
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)
    if flag.is_set():
        raise KeyboardInterrupt


def build_here(
    onnx_path: Path,
    backend: str,
    spec: BuildSpec,
    inputs: tuple[InputSpec, ...] = (),
    echo: Callable[[str, str], None] | None = None,
    shape_values: tuple[ShapeValues, ...] = (),
) -> EngineBuild:
    """Parse a strongly typed ONNX model and build a serialized engine, in this process:
    what `engine.child.build_engine`'s child runs. `echo(severity, message)` is also told
    each error TensorRT logs, as it logs it (the child's record should TensorRT crash).
    `shape_values`: the profile's values of the inputs that may be shape tensors."""
    with _deferred_interrupt() as interrupted:
        try:
            return _build_engine(onnx_path, backend, spec, inputs, interrupted, echo, shape_values)
        except BackendError as exc:
            refused = _memory_refused(exc, backend, onnx_path)
            if refused is None:
                raise
            raise refused from None


# TensorRT's words for memory refused: the host's (a C++ bad_alloc, at parse or build) and
# its own error code for host or device memory ("Error Code 2: OutOfMemory")
_OUT_OF_MEMORY = re.compile(r"bad_alloc|OutOfMemory|out of memory", re.IGNORECASE)


def _memory_refused(exc: BackendError, backend: str, onnx_path: Path) -> UsageError | None:
    """`exc` as the machine's fault where TensorRT said memory was refused; else None.

    Why: under `ulimit -v`, in a container's memory limit or on a full machine, TensorRT
    fails the parse ("INTERNAL_ERROR: std::bad_alloc", said to check the op is supported)
    or the build ("OutOfMemory"), and that was exit 3, a fault of TensorRT's on the model;
    it is the user's to fix (exit 2), as the out-of-memory killer's SIGKILL is."""
    said = exc.hint if exc.hint and exc.hint.startswith("TensorRT said") else exc.message
    if not _OUT_OF_MEMORY.search(said):
        return None
    return UsageError(
        f"not enough memory: {backend} could not allocate building the engine of "
        f"{onnx_path.name} ({said})",
        hint="free memory, raise the address-space limit (ulimit -v), or build on a machine "
        "with more (on a GPU, a smaller build.workspace)",
    )


def _build_engine(
    onnx_path: Path,
    backend: str,
    spec: BuildSpec,
    inputs: tuple[InputSpec, ...],
    interrupted: threading.Event,
    echo: Callable[[str, str], None] | None = None,
    shape_values: tuple[ShapeValues, ...] = (),
) -> EngineBuild:
    """Parse, configure, build; then read the network's layers and the builder's log."""
    trt = importlib.import_module(MODULES[backend])
    messages: list[tuple[str, str]] = []
    logger = _logger(trt, messages, echo)
    builder = trt.Builder(logger)
    if builder is None:
        raise BackendError(f"{backend}: cannot create a builder", hint=_last_errors(messages))
    network, _parser = _parse(trt, builder, logger, onnx_path, backend, inputs)
    if spec.decomposable_attention:
        _decomposable_attention(trt, network)
    config = _config(trt, builder, spec, backend)
    layers = _layers(network)
    quantized = any(layer["type"] == "DEQUANTIZE" for layer in layers)
    if quantized and backend == "tensorrt":  # the inspector then names each layer's formats
        config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    shaped = _add_profile(trt, builder, network, config, inputs, shape_values)
    cache = _load_timing_cache(config, spec.timing_cache)
    monitor = _cancel_monitor(trt, interrupted)
    if monitor is not None:
        config.progress_monitor = monitor

    started = time.perf_counter()
    serialized = builder.build_serialized_network(network, config)
    seconds = time.perf_counter() - started
    if serialized is None:
        if interrupted.is_set():
            return EngineBuild(backend, trt.__version__, b"", seconds)  # raised on exit
        raise BackendError(f"{backend} engine build failed", hint=_build_fix(messages, spec))
    _save_timing_cache(config, cache, spec.timing_cache)
    warnings = [msg for sev, msg in messages if sev == "WARNING"]
    engine = bytes(serialized)
    return EngineBuild(
        backend,
        trt.__version__,
        engine,
        seconds,
        layers,
        _memory(messages),
        warnings,
        int8_check(engine, backend, onnx_path) if quantized else None,
        shaped,
    )


# Whether a quantized engine really runs INT8 kernels is TensorRT's choice, made in the build
# (full TensorRT) or when the engine is loaded (TensorRT-RTX); only the engine itself says it.
INSPECTOR = "tensorrt engine inspector (needs a GPU)"
NEEDS_GPU = (
    "not checked: needs a GPU (the engine inspector reads the engine deserialized on a CUDA "
    "device); build on a GPU machine with backend tensorrt to see which layers run INT8"
)
RTX_JIT = (
    "not checked: TensorRT-RTX chooses its kernels when the engine is loaded on the GPU; build "
    "with backend tensorrt on a GPU machine to see which layers run INT8"
)


def int8_check(engine: bytes, backend: str, onnx_path: Path) -> dict[str, Any]:
    """Which of the model's quantized ops (Conv/MatMul/Gemm fed by DQs) run INT8 kernels in the
    engine, from TensorRT's engine inspector; said as not checked, never guessed, where no GPU
    (or no full TensorRT) can read the engine."""
    ops = quantized_op_names(onnx_path)
    base: dict[str, Any] = {"evaluator": INSPECTOR, "quantized_ops": len(ops)}
    if not gpu_available():
        return {**base, "checked": False, "why": NEEDS_GPU}
    if backend != "tensorrt":
        return {**base, "checked": False, "why": RTX_JIT}
    return {**base, "checked": True, **int8_layers(_engine_information(engine, backend), ops)}


def quantized_op_names(onnx_path: Path) -> list[str]:
    """The names of the ops TensorRT should run as INT8 (or FP8) kernels (`graph.qdq`)."""
    import onnx

    from trtbuild.graph.qdq import QdqGraph
    from trtbuild.graph.view import GraphView

    view = GraphView(onnx.load(str(onnx_path)))
    return [view.nodes[i].name for i in QdqGraph(view).quantized_ops]


def _engine_information(engine: bytes, backend: str) -> dict[str, Any]:
    """The engine inspector's layer information (JSON), the engine deserialized on the GPU."""
    import json

    trt = importlib.import_module(MODULES[backend])
    runtime = trt.Runtime(_logger(trt, []))
    deserialized = runtime.deserialize_cuda_engine(engine)
    if deserialized is None:
        raise BackendError(f"{backend} cannot deserialize the engine it built on this GPU")
    inspector = deserialized.create_engine_inspector()
    return json.loads(inspector.get_engine_information(trt.LayerInformationFormat.JSON))


def int8_layers(information: dict[str, Any], ops: list[str]) -> dict[str, Any]:
    """From the inspector's `Layers`: the INT8 layers and which quantized ops none of them holds.

    A layer runs INT8 math when an input's `Format/Datatype` is Int8 and neither its weights
    nor its tactic are float (an Int8 input to a float kernel is only a reformat); the ONNX
    nodes a layer holds are its `Metadata` entries (`[ONNX Layer: NAME]`), else the parts of
    its fused name.
    """
    int8, held = [], set()
    for layer in information.get("Layers", []):
        if not isinstance(layer, dict) or not _runs_int8(layer):
            continue
        int8.append(str(layer.get("Name", "")))
        held.update(_onnx_names(layer))
    return {
        "int8_layers": len(int8),
        "int8_ops": [op for op in ops if op in held],
        "not_int8": [op for op in ops if op not in held],
    }


def _runs_int8(layer: dict[str, Any]) -> bool:
    formats = [
        str(t.get("Format/Datatype", "")) for t in layer.get("Inputs", []) if isinstance(t, dict)
    ]
    if not any(f.lower().startswith("int8") for f in formats):
        return False
    weights = layer.get("Weights")
    if isinstance(weights, dict) and str(weights.get("Type", "Int8")).lower() != "int8":
        return False
    tactic = str(layer.get("TacticName", "")).lower()
    return not any(f in tactic for f in ("f32f32", "f16f16", "h884", "s1688"))


def _onnx_names(layer: dict[str, Any]) -> set[str]:
    meta = str(layer.get("Metadata", ""))
    names = set(re.findall(r"\[ONNX Layer: ([^\]]+)\]", meta))
    return names or {n.strip() for n in str(layer.get("Name", "")).split(" + ")}


def _logger(
    trt: Any, messages: list[tuple[str, str]], echo: Callable[[str, str], None] | None = None
) -> Any:
    """TensorRT's messages kept in `messages`; its errors also told to `echo`."""

    class _Logger(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)

        def log(self, severity, msg):  # called from C++; must not raise
            said = str(severity).rsplit(".", 1)[-1]
            messages.append((said, msg))
            if echo is not None and said in ("ERROR", "INTERNAL_ERROR"):
                with contextlib.suppress(Exception):
                    echo(said, msg)

    return _Logger()


def _parse(
    trt: Any,
    builder: Any,
    logger: Any,
    onnx_path: Path,
    backend: str,
    inputs: tuple[InputSpec, ...],
) -> tuple[Any, Any]:
    """A strongly typed network (TensorRT 11 has no other kind) parsed from the mixed model.

    The parser is returned too: it owns the weights, so it must outlive the build.
    """
    flags = 0
    strongly = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
    if strongly is not None:
        flags |= 1 << int(strongly)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        said = _without_driver_noise("; ".join(errors[:3]))
        old = "Pre-opset" in said  # an opset 6 export's broadcasting, say
        raise BackendError(
            f"{backend} cannot parse {onnx_path.name}: {said}",
            hint=OPSET_FIX if old else _parse_fix(said, network, inputs, onnx_path),
        )
    return network, parser


# A line TensorRT-RTX's parser adds to its error on a machine without a CUDA driver (where
# it builds ahead of time): the CUDA runtime finding no driver, which is not why it refused
_NO_DRIVER = "CUDA driver version is insufficient"


def _without_driver_noise(said: str) -> str:
    """The parser's error without the no-driver line, where there is no GPU to speak of."""
    if _NO_DRIVER not in said or gpu_available():
        return said
    return "\n".join(line for line in said.splitlines() if _NO_DRIVER not in line) or said


UNSUPPORTED_FIX = "check the op is supported by this TensorRT version"
# A dim TensorRT's messages print for a dynamic one: "-1", not part of a number or a name.
_DYNAMIC_DIM = re.compile(r"(?<![\w.])-1(?!\w|\.\d)")


def _parse_fix(said: str, network: Any, inputs: tuple[InputSpec, ...], onnx_path: Path) -> str:
    """The hint for a model the parser refuses. Where its message names a dynamic dim (-1)
    and the policy holds a dynamic dim of an input at one value at every point, the fix is
    to make that dim static: some importers check dims before any profile is known
    (TensorRT-RTX's `RotaryEmbedding` compares its cos cache's batch of 1, as torch.onnx
    exports a Llama's at opset 23, with the input's -1), and an engine built for one value
    of a dim loses nothing by it."""
    if not _DYNAMIC_DIM.search(said):
        return UNSUPPORTED_FIX
    try:
        fixed = _held_static(network, inputs, onnx_path)
    except Exception:  # a hint must not hide TensorRT's refusal
        fixed = {}
    if not fixed:
        return UNSUPPORTED_FIX
    shapes = ", ".join(
        f"{json.dumps(name)}: [{', '.join(map(json.dumps, dims))}]" for name, dims in fixed.items()
    )  # names quoted: YAML reads `on` or `0` as no string
    return (
        "the parser met a dynamic dim (-1) that the policy holds at one value at every "
        f"point; make it static: `passes: {{override_input_shapes: {{{shapes}}}}}` in the "
        f"policy (a name keeps a dim dynamic); else {UNSUPPORTED_FIX}"
    )


def _held_static(
    network: Any, inputs: tuple[InputSpec, ...], onnx_path: Path
) -> dict[str, list[int | str]]:
    """Each input with a dynamic dim the policy's points hold at one value: its dims, those
    made static, the others as the model names them (a dim a name, for the override)."""
    import onnx

    specs = {s.name: s for s in inputs}
    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    names = {i.name: [d.dim_param for d in i.type.tensor_type.shape.dim] for i in graph.input}
    fixed: dict[str, list[int | str]] = {}
    for i in range(network.num_inputs):
        tensor = network.get_input(i)
        dims, spec = list(tensor.shape), specs.get(tensor.name)
        if spec is None:
            continue
        low, high = (spec.shape, spec.shape) if spec.shape is not None else (spec.min, spec.max)
        if low is None or high is None or len(low) != len(dims):
            continue
        declared = names.get(tensor.name, [])
        made = [
            d if d >= 0 else low[k] if low[k] == high[k] else _dim_name(declared, k, tensor.name)
            for k, d in enumerate(dims)
        ]
        if any(d < 0 and low[k] == high[k] for k, d in enumerate(dims)):
            fixed[tensor.name] = made
    return fixed


def _dim_name(declared: list[str], k: int, name: str) -> str:
    """The model's name of dim `k` (inputs that share it keep sharing it), else one made of
    the input's, either made fit for the override's schema (`DIM_NAME`)."""
    given = declared[k] if k < len(declared) else ""
    made = re.sub(r"[^A-Za-z0-9_]", "_", given or f"{name}_{k}")
    return (made if re.match(r"[A-Za-z_]", made) else f"_{made}")[:64]  # DIM_NAME's form


def _config(trt: Any, builder: Any, spec: BuildSpec, backend: str) -> Any:
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, spec.workspace)
    if backend != "tensorrt-rtx":
        return config
    config.num_compute_capabilities = len(spec.compute_capabilities)
    for i, cc in enumerate(spec.compute_capabilities):
        name = "SM" + cc.replace(".", "")
        if not hasattr(trt.ComputeCapability, name):
            known = sorted(n for n in dir(trt.ComputeCapability) if n.startswith("SM"))
            raise UsageError(
                f"compute capability {cc} is not a TensorRT-RTX target",
                field=("build", "compute_capabilities"),
                hint="choose from " + ", ".join(k[2:-1] + "." + k[-1] for k in known),
            )
        config.set_compute_capability(getattr(trt.ComputeCapability, name), i)
    return config


def _cancel_monitor(trt: Any, interrupted: threading.Event) -> Any:
    """A progress monitor that cancels the build on Ctrl-C (None where TensorRT has none)."""
    if not hasattr(trt, "IProgressMonitor"):
        return None

    class _Cancel(trt.IProgressMonitor):
        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)

        def phase_start(self, phase_name, parent_phase, num_steps):
            pass

        def phase_finish(self, phase_name):
            pass

        def step_complete(self, phase_name, step):  # False cancels the build
            return not interrupted.is_set()

    return _Cancel()


def _layers(network: Any) -> list[dict[str, Any]]:
    """Every layer of the parsed network with its output dtypes: the layer audit reads them."""
    layers = []
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        layers.append(
            {
                "name": layer.name,
                "type": str(layer.type).rsplit(".", 1)[-1],
                "outputs": [
                    _dtype_name(layer.get_output(j).dtype) for j in range(layer.num_outputs)
                ],
            }
        )
    return layers


def _memory(messages: list[tuple[str, str]]) -> dict[str, int]:
    memory = {}
    for key, pattern in _MEMORY_LINES.items():
        for _, msg in messages:
            m = re.search(pattern, msg)
            if m:
                memory[key] = int(m.group(1))
    return memory


def _dtype_name(dtype) -> str:
    return {"HALF": "fp16", "FLOAT": "fp32", "BF16": "bf16"}.get(
        str(dtype).rsplit(".", 1)[-1], str(dtype).rsplit(".", 1)[-1].lower()
    )


# What TensorRT says where an IAttention has no fused kernel and may not be split.
_UNFUSED_ATTENTION = "Attention operation was not supported by a dedicated kernel"


def _decomposable_attention(trt: Any, network: Any) -> None:
    """Every attention the parser made (from an ONNX `Attention`) may be split into several
    kernels where TensorRT has no fused one: `build.decomposable_attention`.

    Why: the parser leaves them whole, and TensorRT-RTX 1.7 has no fused kernel for any
    FP32 attention (the all-FP32 variant's, a pinned one's) nor for some FP16 ones (a
    RoBERTa exported by torch.onnx at opset 23, behind its padding mask): the build fails.
    A fused kernel is still taken where there is one (the FP16 engines came out the same).
    """
    boundary = getattr(trt, "IAttentionBoundaryLayer", None)
    if boundary is None:  # a TensorRT without IAttention makes none
        return
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        if layer.type == trt.LayerType.ATTENTION_OUTPUT:
            layer.__class__ = boundary  # the bindings hand out the base class (as Polygraphy)
            layer.attention.decomposable = True


def _build_fix(messages: list[tuple[str, str]], spec: BuildSpec) -> str:
    """What TensorRT said, and the policy's fix where trtbuild knows one."""
    said = _last_errors(messages)
    unfused = any(_UNFUSED_ATTENTION in m for _, m in messages)  # not only the last three
    if unfused and not spec.decomposable_attention:
        said += (
            "; to let TensorRT split that attention into several kernels, set "
            "`build: {decomposable_attention: true}` in the policy (its default), or export "
            "below opset 23, where the attention is MatMul and Softmax nodes"
        )
    return said


def _last_errors(messages: list[tuple[str, str]]) -> str:
    """TensorRT's last errors, each on one line: Myelin's run over several, which a message
    (one line, `errors.printable`) showed as `\\n` escapes."""
    errors = [" ".join(m.split()) for s, m in messages if s in ("ERROR", "INTERNAL_ERROR")]
    return (
        ("TensorRT said: " + " | ".join(errors[-3:]))
        if errors
        else "no error message from TensorRT"
    )


def _handed_out_as(name: str, tensors: list) -> str:
    """The model's input name of network input `name` where TensorRT's parser renamed it
    (`__x` for `x`: an input that is a graph output too, no node between), else "".

    Why: the profile is the policy's, by the model's names; the renamed input found no
    policy entry and the build said "inputs.__x: ... dynamic shape", an input the model
    does not have.
    """
    taken = {t.name for t in tensors}
    return name[2:] if name.startswith("__") and name[2:] not in taken else ""


def _add_profile(
    trt,
    builder,
    network,
    config,
    inputs: tuple[InputSpec, ...],
    shape_values: tuple[ShapeValues, ...] = (),
) -> dict[str, Any]:
    """The optimization profile: each dynamic input's dims from the policy, each shape
    tensor's values from the data judged (`accuracy.shape_values`); none where the network
    has neither. A shape tensor whose values are not known is refused here, after the
    parse (only TensorRT says which inputs are shape tensors) and before the build.
    Returns the values each shape tensor was given, for build.json."""
    specs = {s.name: s for s in inputs}
    tensors = [network.get_input(i) for i in range(network.num_inputs)]
    dynamic = [t for t in tensors if any(d < 0 for d in t.shape)]
    shaped = [t for t in tensors if getattr(t, "is_shape_tensor", False)]
    if not dynamic and not shaped:
        return {}
    profile = builder.create_optimization_profile()
    for tensor in dynamic:
        spec = specs.get(tensor.name) or specs.get(_handed_out_as(tensor.name, tensors))
        if spec is None or (spec.shape is None and spec.opt is None):
            raise UsageError(
                f"input '{tensor.name}' has dynamic shape {tuple(tensor.shape)}",
                field=("inputs", tensor.name),
                hint="give 'shape: [...]' or an optimization profile 'min/opt/max' in the policy",
            )
        if spec.shape is not None:
            profile.set_shape(tensor.name, spec.shape, spec.shape, spec.shape)
        else:
            profile.set_shape(tensor.name, spec.min, spec.opt, spec.max)
    values = {v.name: v for v in shape_values}
    renamed = {t.name: _handed_out_as(t.name, tensors) for t in shaped}
    values.update({n: values[o] for n, o in renamed.items() if o in values})
    for tensor in shaped:
        found = values.get(tensor.name, ShapeValues(tensor.name, refused=_unknown(tensor.name)))
        if found.refused is not None:
            raise found.error()
        profile.set_shape_input(tensor.name, found.min, found.opt, found.max)
    config.add_optimization_profile(profile)
    return {t.name: values[t.name].to_json() for t in shaped}


def _unknown(name: str) -> tuple[str, str | None, str | None]:
    """The refusal of a shape tensor no data was judged for (a caller that gave no values)."""
    return (
        f"{words.field('inputs', name)}: the input is a shape tensor to TensorRT, whose "
        "optimization profile holds the values it may be fed, and none are known",
        None,
        f"give its values under {words.field('inputs', name, 'data')} (a file or a range)",
    )


def _load_timing_cache(config, path: Path | None):
    if path is None or not hasattr(config, "create_timing_cache"):
        return None
    data = path.read_bytes() if path.is_file() else b""
    cache = config.create_timing_cache(data)
    config.set_timing_cache(cache, ignore_mismatch=True)
    return cache


def _save_timing_cache(config, cache, path: Path | None) -> None:
    if cache is None or path is None:
        return
    from trtbuild.fsutil import write_bytes

    serialized = config.get_timing_cache().serialize()
    write_bytes(path, bytes(serialized))
