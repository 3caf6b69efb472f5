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
"""

from __future__ import annotations

import functools
import os

import jax
from jax.interpreters import mlir

ENV_VAR = "LIGER_JAX_TRITON_CUSTOM_CALL"
CUSTOM_CALLS: tuple[str, ...] = ("ffi", "legacy")
FFI_TARGET = "triton_kernel_call_ffi"
NAME_PREFIX = "liger_jax."
# jax's Pallas-Triton lowering emits the FFI target from jaxlib 0.10.3 on (older jaxlibs lack it).
_FIRST_JAXLIB_WITH_FFI_TARGET = (0, 10, 3)


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
    """Registers, once, the CUDA lowering of jax-triton 0.3's kernel calls that emits the FFI target for liger_jax's
    launches. jax-triton ≥ 0.4 emits it already: nothing is changed there."""
    import jax_triton
    from jax_triton import triton_lib

    if jax_triton.__version_info__ >= (0, 4):
        return
    legacy_rule = functools.partial(triton_lib.triton_kernel_call_lowering, triton_lib.get_cuda_backend)

    def rule(ctx, *arrays, name, input_output_aliases, **params):
        results = legacy_rule(ctx, *arrays, name=name, input_output_aliases=input_output_aliases, **params)
        if not name.startswith(NAME_PREFIX) or custom_call() != "ffi":
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
