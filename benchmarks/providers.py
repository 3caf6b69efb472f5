"""Who runs a case: liger_jax's kernels, XLA, or Liger itself under torch; and the process setup they need."""

from __future__ import annotations

import functools
import importlib.util
import os
from typing import Any

LIGER_JAX = "liger_jax"  # liger_jax's Triton kernels ("triton" on a GPU, Triton's interpreter on CPU)
LIGER_JAX_XLA = "liger_jax_xla"  # liger_jax with implementation="xla", where that differs from the baseline
XLA = "xla"  # what JAX users have today: the pure-JAX reference, or the naive optax loss
LIGER_TORCH = "liger_torch"  # Liger-Kernel under torch, where both import
PROVIDERS = (LIGER_JAX, XLA, LIGER_JAX_XLA, LIGER_TORCH)


class MissingOpError(LookupError):
    """liger_jax does not have the op (yet); the case is skipped, not failed."""


def prepare_process() -> None:
    """Sets what must be set before jax allocates and before triton is first imported.

    No preallocation: liger_torch shares the GPU with JAX in one process, the peak-memory subprocesses share it
    with each other, and a preallocated pool would hide nothing but cost both. On a CPU backend, Triton's
    interpreter is switched on (it must be, before ``import triton``, for ``implementation="interpret"``).
    Random draws lower to JAX's CUDA threefry kernel, with the same bits: otherwise XLA inlines every threefry
    call, and compiling them took 75 s for the 1b model's initialiser and most of a second per op case's draws.
    """
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    # The allocator's limit (XLA's default is 75% of the device): the largest XLA baselines need more.
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")
    import jax

    jax.config.update("jax_threefry_gpu_kernel_lowering", True)
    if jax.default_backend() == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")


def kernel_implementation() -> str:
    """The liger_jax implementation that runs the kernels here: ``"triton"`` on a GPU, else ``"interpret"``."""
    import jax

    return "interpret" if jax.default_backend() == "cpu" else "triton"


def liger_op(name: str) -> Any:
    """``liger_jax.<name>``, or :class:`MissingOpError` while the op is not in the package."""
    import liger_jax

    op = getattr(liger_jax, name, None)
    if op is None:
        raise MissingOpError(f"liger_jax has no {name} yet")
    return op


def kernel_provider(name: str, **options: Any) -> Any:
    """``liger_jax.<name>`` with the kernel implementation and ``options`` bound."""
    op = liger_op(name)
    return functools.partial(op, implementation=kernel_implementation(), **options)


def xla_provider(name: str, **options: Any) -> Any:
    """``liger_jax.<name>`` with ``implementation="xla"`` (its pure-JAX reference) and ``options`` bound."""
    return functools.partial(liger_op(name), implementation="xla", **options)


def liger_torch_unavailable() -> str | None:
    """Why the liger_torch provider cannot run here, or None when it can."""
    if importlib.util.find_spec("liger_kernel") is None or importlib.util.find_spec("torch") is None:
        return "liger_kernel or torch is not importable"
    import torch

    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    try:
        import liger_kernel.transformers  # noqa: F401
    except Exception as error:  # a broken install raises more than ImportError
        return f"liger_kernel does not import ({type(error).__name__}: {error})"
    return None
