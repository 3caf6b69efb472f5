"""Python functions on host buffers as an XLA CPU custom call: how interpreted kernels run in sharded programs.

``jax.pure_callback`` finds its Python function through a per-executable table, by index. The per-shard module
that ``jax.experimental.custom_partitioning`` builds is lowered on its own while XLA compiles the outer program,
and jax (0.10) drops that module's table (``mlir.build_mlir_module_helper`` keeps only the module): the index then
names nothing (a segfault) or somebody else's callback. :func:`host_call` instead registers one process-wide
custom-call target that finds the function by a key in the call's backend config, so the same launch works under
plain ``jit``, in the per-shard module of a partitioned op and inside ``jax.shard_map``.
"""

import atexit
import ctypes
import dataclasses
import functools
import itertools
import threading
import traceback
from collections.abc import Callable, Sequence

import jax
import numpy as np

_TARGET = "liger_jax_host_call"
# XLA's "status returning, unified" custom-call API on CPU:
#   void fn(void* out, const void** in, const char* opaque, size_t opaque_len, XlaCustomCallStatus* status)
# ``out`` is the result buffer, or an array of result buffers when there are several.
_API_VERSION = 3
_SIGNATURE = ctypes.CFUNCTYPE(
    None, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p
)
# XLA runs each device's program on its own thread, and Triton's interpreter keeps launch state in module globals:
# host functions run one at a time.
_LOCK = threading.Lock()


@dataclasses.dataclass(frozen=True)
class _Call:
    fn: Callable[..., Sequence[np.ndarray]]
    operands: tuple[jax.ShapeDtypeStruct, ...]
    results: tuple[jax.ShapeDtypeStruct, ...]


# Every traced call, by key. Entries live as long as the process: an executable may run long after its trace.
_CALLS: dict[str, _Call] = {}
_KEYS = itertools.count()


def host_call(
    fn: Callable[..., Sequence[np.ndarray]], result_shapes: Sequence[jax.ShapeDtypeStruct], *arrays: jax.Array
) -> tuple[jax.Array, ...]:
    """Calls ``fn`` on the host buffers of ``arrays``, like ``jax.pure_callback`` on CPU.

    Args:
        fn: ``fn(*numpy_arrays) -> sequence of numpy arrays`` matching ``result_shapes``. It receives read-only
            views of XLA's buffers, valid only during the call, and must be pure. It should close over no tracer:
            it is kept for the life of the process.
        result_shapes: shape and dtype of each result.
        *arrays: the operands.

    Returns:
        The results, one array per entry of ``result_shapes``. Should ``fn`` raise, its traceback goes to stderr
        and floating results come back NaN (integers as the dtype's max): XLA's CPU custom-call API has no
        error channel that Python can reach. On a non-CPU backend this is ``jax.pure_callback`` (not shardable).
    """
    results = tuple(jax.ShapeDtypeStruct(s.shape, s.dtype) for s in result_shapes)
    if jax.default_backend() != "cpu":  # the target is a CPU custom call; elsewhere (interpreting on a GPU host)
        return tuple(jax.pure_callback(fn, results, *arrays))
    key = f"{next(_KEYS)}"
    _CALLS[key] = _Call(fn, tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays), results)
    call = jax.ffi.ffi_call(
        _registered_target(), results, custom_call_api_version=_API_VERSION, legacy_backend_config=key
    )
    return tuple(call(*arrays))


@functools.cache
def _registered_target() -> str:
    """Registers the custom-call target, once per process."""
    new_capsule = ctypes.pythonapi.PyCapsule_New
    new_capsule.restype = ctypes.py_object
    new_capsule.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
    capsule = new_capsule(ctypes.cast(_TRAMPOLINE, ctypes.c_void_p), b"xla._CUSTOM_CALL_TARGET", None)
    jax.ffi.register_ffi_target(_TARGET, capsule, platform="cpu", api_version=0)
    atexit.register(_finish_running_calls)
    return _TARGET


def _finish_running_calls() -> None:
    """Waits for dispatched computations before the interpreter shuts down.

    A host call still running on an XLA thread at exit can no longer take the GIL, while the exiting main thread
    waits for that computation's buffers: a deadlock (seen when an exception ends a script mid-computation).
    """
    jax.block_until_ready(jax.live_arrays())


def _run(out: int, operands, opaque: bytes, opaque_len: int, status: int) -> None:
    """The custom call: looks up the call by its key, runs it on views of the buffers, writes the results."""
    del status
    call = _CALLS[opaque[:opaque_len].decode()]
    inputs = [_view(operands[i], shape, writable=False) for i, shape in enumerate(call.operands)]
    n_results = len(call.results)
    pointers = [out] if n_results == 1 else ctypes.cast(out, ctypes.POINTER(ctypes.c_void_p))[:n_results]
    outputs = [_view(pointer, shape, writable=True) for pointer, shape in zip(pointers, call.results, strict=True)]
    try:
        with _LOCK:
            values = call.fn(*inputs)
        for output, value, shape in zip(outputs, values, call.results, strict=True):
            value = np.asarray(value)
            if value.shape != output.shape or value.dtype != output.dtype:
                raise TypeError(f"host function returned {value.dtype}{list(value.shape)} for {shape}")
            output[...] = value
    except BaseException:
        traceback.print_exc()
        for output in outputs:
            output[...] = poison(output.dtype)


def poison(dtype) -> float | int:
    """The value a result no one wrote holds: NaN for a floating ``dtype`` (bfloat16 included), else its max."""
    return np.nan if jax.numpy.issubdtype(dtype, jax.numpy.inexact) else np.iinfo(dtype).max


# The C function pointer XLA calls; a module global, so it outlives every executable.
_TRAMPOLINE = _SIGNATURE(_run)


def _view(pointer: int | None, shape: jax.ShapeDtypeStruct, writable: bool) -> np.ndarray:
    """The numpy array over an XLA buffer (row-major, as ffi_call lays buffers out by default)."""
    dtype = np.dtype(shape.dtype)
    size = int(np.prod(shape.shape, dtype=np.int64))
    if size == 0 or not pointer:
        return np.empty(shape.shape, dtype)
    buffer = (ctypes.c_char * (size * dtype.itemsize)).from_address(pointer)
    array = np.frombuffer(buffer, dtype).reshape(shape.shape)
    array.flags.writeable = writable
    return array
