"""The one place that knows how a Triton kernel is launched from JAX.

Three implementations share one switch:

* ``"triton"``: the kernel is compiled and launched on the GPU through ``jax_triton.triton_call``.
* ``"interpret"``: the same kernel is run by Triton's interpreter on host buffers inside a host custom call
  (:mod:`liger_jax._host_call`, which works where ``jax.pure_callback`` cannot: in the per-shard programs of a
  partitioned op), so it works on CPU, under ``jax.jit`` and sharded. Triton builds interpreter kernels only when
  ``TRITON_INTERPRET=1`` is set before ``triton`` is first imported.
* ``"xla"``: no kernel at all; each op falls back to its pure-JAX reference. :func:`launch` is never called.

The default is ``$LIGER_JAX_IMPLEMENTATION`` when set, else ``"interpret"`` when ``TRITON_INTERPRET=1``, else
``"triton"`` on a GPU backend with jax-triton installed, else ``"xla"``. Where that default is ``"triton"``, ops
on small operands run ``"xla"`` instead (the size rule, :mod:`liger_jax.ops._dispatch`). Launches are lowered to
jaxlib's command-buffer-compatible FFI custom call (:mod:`liger_jax._triton_ffi`).
"""

from __future__ import annotations

import functools
import inspect
import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import jax
import numpy as np

from liger_jax import _host_call, _manual_axes, _triton_ffi

Implementation = Literal["triton", "interpret", "xla"]
IMPLEMENTATIONS: tuple[str, ...] = ("triton", "interpret", "xla")
ENV_VAR = "LIGER_JAX_IMPLEMENTATION"


def _interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")


@functools.cache
def _jax_triton_error() -> str | None:
    """Why jax-triton cannot be used here, or None when it can."""
    try:
        _jax_triton()
    except Exception as error:  # jax_triton raises more than ImportError without a GPU.
        return f"jax-triton could not be imported ({type(error).__name__}: {error}); install liger-jax[gpu]"
    return None


def _on_gpu() -> bool:
    return jax.default_backend() in ("gpu", "cuda", "rocm")


def default_implementation() -> Implementation:
    """The implementation used when an op is called with ``implementation=None``.

    Returns:
        ``$LIGER_JAX_IMPLEMENTATION`` when set; ``"interpret"`` when ``TRITON_INTERPRET=1``; ``"triton"`` on a GPU
        backend where jax-triton imports; otherwise ``"xla"`` (with a warning on a GPU without jax-triton).
    """
    chosen = os.environ.get(ENV_VAR)
    if chosen:
        return _validate(chosen, f"${ENV_VAR}")
    if _interpreter_enabled():
        return "interpret"
    if _on_gpu():
        if _jax_triton_error() is None:
            return "triton"
        warnings.warn(f"liger_jax falls back to the XLA reference: {_jax_triton_error()}", stacklevel=3)
    return "xla"


def implementation_from_environment() -> bool:
    """Whether ``$LIGER_JAX_IMPLEMENTATION`` sets the implementation of every op called with None."""
    return bool(os.environ.get(ENV_VAR))


def _validate(implementation: str, source: str) -> Implementation:
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"{source} must be one of {IMPLEMENTATIONS}, got {implementation!r}")
    return implementation  # type: ignore[return-value]


def resolve_implementation(implementation: str | None) -> Implementation:
    """Validates an op's ``implementation=`` argument, filling in the default.

    Args:
        implementation: ``"triton"``, ``"interpret"``, ``"xla"`` or None for :func:`default_implementation`.

    Returns:
        The implementation to use.

    Raises:
        ValueError: an unknown name, or ``"triton"`` without a GPU backend or without jax-triton, or
            ``"interpret"`` without ``TRITON_INTERPRET=1`` set before triton was imported.
    """
    chosen = default_implementation() if implementation is None else _validate(implementation, "implementation")
    match chosen:
        case "triton":
            if not _on_gpu():
                raise ValueError(
                    f"implementation='triton' needs a GPU backend, but jax's backend is {jax.default_backend()!r}; "
                    "use implementation='xla' (or 'interpret' with TRITON_INTERPRET=1) on this machine"
                )
            if _jax_triton_error() is not None:
                raise ValueError(f"implementation='triton': {_jax_triton_error()}")
        case "interpret":
            if not _interpreter_enabled():
                raise ValueError(
                    "implementation='interpret' needs TRITON_INTERPRET=1 in the environment before triton is "
                    "first imported (Triton decides at decoration time whether a kernel is interpreted)"
                )
    return chosen


def launch(
    kernel: Any,
    *args: jax.Array | int,
    out_shape: jax.ShapeDtypeStruct | Sequence[jax.ShapeDtypeStruct],
    grid: tuple[int, ...],
    implementation: Literal["triton", "interpret"],
    num_warps: int = 4,
    num_stages: int = 1,
    input_output_aliases: Mapping[int, int] | None = None,
    zeroed_outputs: Sequence[int] = (),
    **constexprs: Any,
) -> Any:
    """Launches a ``@triton.jit`` kernel on JAX arrays.

    The kernel's parameters are ``args`` in order (arrays become pointers, Python ints become scalars), then one
    pointer per entry of ``out_shape``, then ``constexprs`` (the kernel's ``tl.constexpr`` parameters, passed by
    keyword; float settings such as epsilon go here).

    Args:
        kernel: the ``@triton.jit`` function.
        *args: input arrays and int scalars, in the kernel's parameter order.
        out_shape: shape and dtype of each output; a single struct gives a single array back.
        grid: the launch grid, up to three ints.
        implementation: ``"triton"`` (GPU) or ``"interpret"`` (Triton's interpreter in a host callback).
        num_warps: warps per program (GPU only).
        num_stages: software-pipelining stages (GPU only).
        input_output_aliases: ``{input_index: output_index}`` for inputs that are dead after the call, so the
            output reuses their buffer (the input index counts only array arguments, as jax-triton 0.3 does; with
            jax-triton 0.4 the output gets a buffer of its own). The output still gets its own kernel parameter.
        zeroed_outputs: indices of outputs set to zero before the kernel runs (counters its programs add to).
        **constexprs: the kernel's constexpr parameters.

    Returns:
        One array, or a tuple of arrays matching ``out_shape``. Under ``"interpret"`` floating outputs not in
        ``zeroed_outputs`` start as NaN (integer outputs as the dtype's max), so an element the kernel never writes
        shows up in tests, and a store past either end of an output fails the call (its results come back NaN, the
        reason on stderr).
    """
    for arg in args:
        if isinstance(arg, float):
            raise TypeError(f"launch passes float settings as keyword constexprs, got positional float {arg}")
    grid = tuple(int(g) for g in grid)
    if not 1 <= len(grid) <= 3 or min(grid) < 1:
        raise ValueError(f"grid must be 1 to 3 positive ints, got {grid}")
    aliases = dict(input_output_aliases or {})
    zeroed = tuple(int(i) for i in zeroed_outputs)
    single = isinstance(out_shape, jax.ShapeDtypeStruct)
    out_shapes = (out_shape,) if single else tuple(out_shape)
    if any(not 0 <= i < len(out_shapes) for i in zeroed) or set(zeroed) & set(aliases.values()):
        raise ValueError(f"zeroed_outputs must index outputs that alias no input, got {zeroed}")
    # Inside shard_map: operands and results vary over the same manual axes (see liger_jax._manual_axes).
    varying = _manual_axes.union_of([arg for arg in args if isinstance(arg, jax.Array)])
    args = tuple(_manual_axes.cast_to_varying(arg, varying) if isinstance(arg, jax.Array) else arg for arg in args)
    match implementation:
        case "triton":
            outputs = _launch_triton(kernel, args, out_shapes, grid, num_warps, num_stages, aliases, zeroed, constexprs)
        case "interpret":
            outputs = _launch_interpreted(kernel, args, out_shapes, grid, aliases, zeroed, constexprs)
        case _:
            raise ValueError(f"launch runs 'triton' or 'interpret' kernels, got implementation={implementation!r}")
    outputs = [_manual_axes.cast_to_varying(_manual_axes.on_context_mesh(output), varying) for output in outputs]
    return outputs[0] if single else tuple(outputs)


@functools.cache
def _jax_triton():
    """The jax_triton module, its kernel calls made traceable by the installed jax.

    jax 0.12 calls dead-code-elimination rules as ``rule(used_outputs, live_inputs, eqn)``; jax-triton 0.4.1 registers
    ``rule(used_outputs, eqn)`` for its kernel call, so tracing any jitted launch raised a TypeError. Such a rule is
    wrapped; a jax-triton whose rule takes jax's arguments is left as it is.
    """
    import jax_triton
    from jax.interpreters import partial_eval

    kernel_call = jax_triton.triton_lib.triton_kernel_call_p
    rule = partial_eval.dce_rules.get(kernel_call)
    jax_arity = len(inspect.signature(partial_eval.dce_jaxpr_closed_call_rule).parameters)
    if rule is not None and jax_arity == 3 and len(inspect.signature(rule).parameters) == 2:
        partial_eval.dce_rules[kernel_call] = lambda used_outputs, live_inputs, eqn: rule(used_outputs, eqn)
    return jax_triton


@functools.cache
def _out_shape_keyword() -> str:
    """jax-triton 0.3 names the output argument ``out_shape``; 0.4 renamed it ``out_type``."""
    parameters = inspect.signature(_jax_triton().triton_call).parameters
    return "out_shape" if "out_shape" in parameters else "out_type"


def _kernel_aliases(aliases: dict[int, int]) -> dict[int, int]:
    """The ``input_output_aliases`` to give jax-triton for liger_jax's kernels, which take one pointer per output.

    jax-triton 0.3 passes an aliased output's pointer too (to the input's buffer). 0.4 passes none (the kernel is to
    write through the input's pointer) and counts scalars among the inputs; there every output gets a buffer of its
    own, which only gives up the memory reuse: each kernel writes every element of its outputs.
    """
    return aliases if _out_shape_keyword() == "out_shape" else {}


def _launch_triton(kernel, args, out_shapes, grid, num_warps, num_stages, aliases, zeroed, constexprs):
    jax_triton = _jax_triton()

    _triton_ffi.install()  # jax-triton 0.3's legacy custom call cannot join XLA's command buffers
    outputs = jax_triton.triton_call(
        *args,
        kernel=kernel,
        name=_triton_ffi.NAME_PREFIX + kernel.__name__,
        grid=grid,
        num_warps=num_warps,
        num_stages=num_stages,
        input_output_aliases=_kernel_aliases(aliases),
        zeroed_outputs=zeroed,
        **{_out_shape_keyword(): list(out_shapes)},
        **constexprs,
    )
    return tuple(outputs)


def _launch_interpreted(kernel, args, out_shapes, grid, aliases, zeroed, constexprs):
    from triton.runtime.interpreter import InterpretedFunction

    _round_bfloat16_to_nearest_even()
    if not isinstance(kernel, InterpretedFunction):
        raise ValueError(
            f"kernel {getattr(kernel, '__name__', kernel)} was not built for the interpreter: set TRITON_INTERPRET=1 "
            "before triton is first imported"
        )
    array_positions = [i for i, arg in enumerate(args) if not isinstance(arg, (int, np.integer))]
    arrays = [args[i] for i in array_positions]
    args = [None if i in array_positions else arg for i, arg in enumerate(args)]  # the host keeps no tracers

    def run_on_host(*host_arrays):
        guarded = [_GuardedOutput(shape) for shape in out_shapes]
        outputs = [output.array for output in guarded]
        for input_index, output_index in aliases.items():
            outputs[output_index][...] = host_arrays[input_index]
        for output_index in zeroed:
            outputs[output_index][...] = 0
        kernel_args = list(args)
        for position, array in zip(array_positions, host_arrays, strict=True):
            kernel_args[position] = _HostTensor(np.asarray(array))
        for input_index, output_index in aliases.items():
            kernel_args[array_positions[input_index]] = _HostTensor(outputs[output_index])
        kernel[grid](*kernel_args, *(_HostTensor(out) for out in outputs), **constexprs)
        for index, output in enumerate(guarded):
            output.check_guards(kernel, index)
        return tuple(outputs)

    result_shapes = tuple(jax.ShapeDtypeStruct(s.shape, s.dtype) for s in out_shapes)
    return _host_call.host_call(run_on_host, result_shapes, *arrays)


@functools.cache
def _round_bfloat16_to_nearest_even() -> None:
    """Makes the interpreter round fp32 → bf16 to nearest even, as the GPU does.

    Triton 3.6's interpreter truncates that conversion (and its explicit round-to-nearest drops the carry), which
    biases every bf16 result by up to one ulp towards zero. Its other conversions are numpy's and already round.
    """
    import triton.language as tl
    from triton.runtime import interpreter

    truncating_convert = interpreter._convert_float

    def convert(values, input_dtype, output_dtype, rounding_mode):
        if input_dtype != tl.float32 or output_dtype != tl.bfloat16:
            return truncating_convert(values, input_dtype, output_dtype, rounding_mode)
        bits = np.ascontiguousarray(values).view(np.uint32)
        lowest_kept_bit = (bits >> 16) & 1
        rounded = ((bits.astype(np.uint64) + 0x7FFF + lowest_kept_bit) >> 16).astype(np.uint16)
        quiet_nan = ((bits >> 16) | 0x40).astype(np.uint16)
        return np.where(np.isnan(values), quiet_nan, rounded)

    interpreter._convert_float = convert


class _GuardedOutput:
    """A poisoned output buffer (NaN, or the integer dtype's max) between two guard bands of a fixed byte pattern,
    so that a store past either end of the output — which the interpreter does not fault on — is caught."""

    GUARD_BYTES = 1 << 16
    GUARD_BYTE = 0xA5

    def __init__(self, shape: jax.ShapeDtypeStruct):
        dtype = np.dtype(shape.dtype)
        size = int(np.prod(shape.shape))
        self._memory = np.full(2 * self.GUARD_BYTES + size * dtype.itemsize, self.GUARD_BYTE, np.uint8)
        body = self._memory[self.GUARD_BYTES : self.GUARD_BYTES + size * dtype.itemsize]
        self.array = body.view(dtype).reshape(shape.shape)
        self.array[...] = _host_call.poison(dtype)

    def check_guards(self, kernel: Any, index: int) -> None:
        """Raises RuntimeError if the kernel wrote before or after this output."""
        before = self._memory[: self.GUARD_BYTES]
        after = self._memory[self.GUARD_BYTES + self.array.nbytes :]
        if (before != self.GUARD_BYTE).any() or (after != self.GUARD_BYTE).any():
            name = getattr(kernel, "__name__", kernel)
            raise RuntimeError(f"kernel {name} stored past the bounds of its output {index}")


class _TritonDtype:
    """Stands in for a torch dtype: Triton reads ``str(dtype)`` and caches it by object identity."""

    def __init__(self, name: str):
        self.name = name

    def __str__(self) -> str:
        return f"torch.{self.name}"

    __repr__ = __str__


_TRITON_DTYPES = {
    np.dtype(name): _TritonDtype(name)
    for name in ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool")
}


class _HostTensor:
    """The slice of the torch.Tensor interface Triton's interpreter uses, over a contiguous numpy array.

    The interpreter copies "device" storage to the host and back; here the storage already is host memory, so
    every copy is the identity and the kernel reads and writes the numpy buffer in place.
    """

    def __init__(self, array: np.ndarray):
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        self._array = array
        self.dtype = _TRITON_DTYPES[array.dtype]

    def data_ptr(self) -> int:
        return self._array.ctypes.data

    def untyped_storage(self) -> _HostTensor:
        return self

    def cpu(self) -> _HostTensor:
        return self

    def new_empty(self, *shape: Any, **kwargs: Any) -> _HostTensor:
        return self

    def set_(self, *args: Any) -> _HostTensor:
        return self

    def copy_(self, other: _HostTensor) -> _HostTensor:
        return self

    def storage_offset(self) -> int:
        return 0

    def size(self) -> tuple[int, ...]:
        return self._array.shape

    def stride(self) -> tuple[int, ...]:
        return tuple(s // self._array.itemsize for s in self._array.strides)
