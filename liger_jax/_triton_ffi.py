"""liger_jax's jax-triton 0.3 launches as jaxlib's command-buffer-compatible FFI custom call.

jax-triton 0.3 lowers ``triton_call`` to the legacy custom call ``triton_kernel_call`` (API version 2). XLA records
no legacy custom call into a command buffer (a CUDA graph): each launch cuts the XLA kernels around it into
separate command buffers and is launched from the host on its own, and jaxlib finds the kernel on every launch by
hashing the whole serialized call (its compressed PTX included). Newer jaxlibs register the same launcher as the
typed FFI target ``triton_kernel_call_ffi`` too — the target jax's own Pallas-Triton lowering and jax-triton ≥ 0.4
emit — marked command-buffer compatible and resolving the kernel once, when the executable is initialised.

:func:`install` re-lowers liger_jax's own launches (named with :data:`NAME_PREFIX`; other users of jax-triton in the
process keep its lowering) to that target: the same serialized kernel call, passed as the FFI attribute ``opaque``.
``$LIGER_JAX_TRITON_CUSTOM_CALL=legacy`` keeps jax-triton's legacy call (for A/B measurements: it is read when a
computation is lowered, so set it before the first call of a jitted function).

Either way the serialized call gets the global scratch its kernel needs (:func:`with_global_scratch`), which
jax-triton 0.3 leaves out (0.4 passes it): Triton keeps each device-side tensor descriptor there.
"""

from __future__ import annotations

import functools
import os
import zlib

import jax
from jax.interpreters import mlir

from liger_jax import _wire

ENV_VAR = "LIGER_JAX_TRITON_CUSTOM_CALL"
CUSTOM_CALLS: tuple[str, ...] = ("ffi", "legacy")
FFI_TARGET = "triton_kernel_call_ffi"
NAME_PREFIX = "liger_jax."
# jax's Pallas-Triton lowering emits the FFI target from jaxlib 0.10.3 on (older jaxlibs lack it).
_FIRST_JAXLIB_WITH_FFI_TARGET = (0, 10, 3)
# The first jaxlib whose TritonKernel is known to carry a global scratch size (its launcher allocates it).
_FIRST_JAXLIB_WITH_GLOBAL_SCRATCH = (0, 11, 2)
# Field numbers in jaxlib's jaxlib/gpu/triton.proto: TritonAnyKernelCall.kernel_call, TritonKernelCall.kernel, and
# TritonKernel's ptx, global_scratch_size and global_scratch_align.
_ANY_CALL_KERNEL_CALL = 1
_KERNEL_CALL_KERNEL = 1
_KERNEL_PTX = 4
_KERNEL_GLOBAL_SCRATCH_SIZE = 12
_KERNEL_GLOBAL_SCRATCH_ALIGN = 13
# Triton 3.6 (NVIDIA) gives each tensor descriptor a kernel makes 128 bytes of global scratch, 128-byte aligned, and
# fences the descriptor's writes with one ``tensormap.cp_fenceproxy``: the count in the PTX (every function inlined)
# is the count of descriptors.
DESCRIPTOR_SCRATCH_BYTES = 128
_DESCRIPTOR_FENCE = "tensormap.cp_fenceproxy"


def custom_call() -> str:
    """``"ffi"`` or ``"legacy"``: how liger_jax's Triton launches are lowered now.

    Returns:
        ``$LIGER_JAX_TRITON_CUSTOM_CALL`` when set, else ``"ffi"``; ``"legacy"`` where jaxlib has no FFI target.

    Raises:
        ValueError: the environment variable names neither.
    """
    chosen = os.environ.get(ENV_VAR) or "ffi"
    if chosen not in CUSTOM_CALLS:
        raise ValueError(f"${ENV_VAR} must be one of {CUSTOM_CALLS}, got {chosen!r}")
    return chosen if _jaxlib_version() >= _FIRST_JAXLIB_WITH_FFI_TARGET else "legacy"


def _jaxlib_version() -> tuple[int, ...]:
    import jaxlib.version

    return tuple(jaxlib.version.__version_info__[:3])


@functools.cache
def install() -> None:
    """Registers, once, the CUDA lowering of jax-triton 0.3's kernel calls that gives liger_jax's launches their
    global scratch and emits the FFI target for them. jax-triton ≥ 0.4 does both already: nothing is changed there."""
    import jax_triton
    from jax_triton import triton_lib

    if jax_triton.__version_info__ >= (0, 4):
        return
    legacy_rule = functools.partial(triton_lib.triton_kernel_call_lowering, triton_lib.get_cuda_backend)

    def rule(ctx, *arrays, name, input_output_aliases, **params):
        results = legacy_rule(ctx, *arrays, name=name, input_output_aliases=input_output_aliases, **params)
        if not name.startswith(NAME_PREFIX):
            return results
        give_global_scratch(results[0].owner)
        if custom_call() != "ffi":
            return results
        return as_ffi_call(ctx, arrays, results, dict(input_output_aliases))

    mlir.register_lowering(triton_lib.triton_kernel_call_p, rule, platform="cuda")


def as_ffi_call(ctx, operands, legacy_results, input_output_aliases: dict[int, int]):
    """Replaces the legacy custom call that produced ``legacy_results`` by an FFI call to :data:`FFI_TARGET`.

    Args:
        ctx: the lowering rule's context (its avals give the results' types and row-major layouts).
        operands: the legacy call's operands.
        legacy_results: its results (ir.Values); the op is erased.
        input_output_aliases: ``{operand index: result index}`` buffers shared by operand and result.

    Returns:
        The FFI call's results, in the order of ``legacy_results``.
    """
    legacy_call = legacy_results[0].owner
    opaque = mlir.ir.StringAttr(legacy_call.attributes["backend_config"]).value_bytes
    getattr(legacy_call, "operation", legacy_call).erase()
    ffi_rule = jax.ffi.ffi_lowering(FFI_TARGET, operand_output_aliases=input_output_aliases)
    return ffi_rule(ctx, *operands, opaque=opaque)


def give_global_scratch(legacy_call) -> None:
    """Sets the serialized kernel call in ``legacy_call``'s backend config to :func:`with_global_scratch`'s."""
    config = mlir.ir.StringAttr(legacy_call.attributes["backend_config"]).value_bytes
    legacy_call.attributes["backend_config"] = mlir.ir.StringAttr.get(with_global_scratch(config))


def global_scratch_bytes(ptx: str) -> int:
    """The global scratch a program of the kernel compiled to ``ptx`` needs: DESCRIPTOR_SCRATCH_BYTES per tensor
    descriptor it makes (0 for none)."""
    return DESCRIPTOR_SCRATCH_BYTES * ptx.count(_DESCRIPTOR_FENCE)


def with_global_scratch(backend_config: bytes) -> bytes:
    """A serialized kernel call (zlib-compressed ``TritonAnyKernelCall``) with the global scratch its kernel needs.

    Args:
        backend_config: the call as jax-triton 0.3 serializes it.

    Returns:
        The same bytes when the kernel makes no tensor descriptor; else the call with its kernel's
        ``global_scratch_size`` set to DESCRIPTOR_SCRATCH_BYTES per descriptor (jaxlib allocates that much per
        program for the launch) and its alignment to DESCRIPTOR_SCRATCH_BYTES.

    Raises:
        ValueError: the kernel makes descriptors but jaxlib is older than the first known to allocate global
            scratch, or the call is not a single kernel call.
    """
    call = zlib.decompress(backend_config)
    kernel_call = _wire.field(call, _ANY_CALL_KERNEL_CALL)
    kernel = _wire.field(kernel_call, _KERNEL_CALL_KERNEL)
    scratch = global_scratch_bytes(_wire.field(kernel, _KERNEL_PTX).decode())
    if not scratch:
        return backend_config
    if _jaxlib_version() < _FIRST_JAXLIB_WITH_GLOBAL_SCRATCH:
        raise ValueError(
            f"a kernel with tensor descriptors (STAGES > 1) needs jaxlib >= "
            f"{'.'.join(map(str, _FIRST_JAXLIB_WITH_GLOBAL_SCRATCH))} to launch through jax-triton 0.3, got "
            f"{'.'.join(map(str, _jaxlib_version()))}"
        )
    kernel = _wire.with_field(kernel, _KERNEL_GLOBAL_SCRATCH_SIZE, _wire.VARINT, _wire.varint(scratch))
    kernel = _wire.with_field(
        kernel, _KERNEL_GLOBAL_SCRATCH_ALIGN, _wire.VARINT, _wire.varint(DESCRIPTOR_SCRATCH_BYTES)
    )
    kernel_call = _wire.with_field(kernel_call, _KERNEL_CALL_KERNEL, _wire.LENGTH_DELIMITED, kernel)
    return zlib.compress(_wire.with_field(call, _ANY_CALL_KERNEL_CALL, _wire.LENGTH_DELIMITED, kernel_call))
