"""Who runs a case: liger_jax's kernels, XLA, tokamax, or Liger itself under torch; and the process setup they need."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from benchmarks.case import Case

LIGER_JAX = "liger_jax"  # liger_jax's Triton kernels ("triton" on a GPU, Triton's interpreter on CPU)
LIGER_JAX_XLA = "liger_jax_xla"  # liger_jax with implementation="xla", where that differs from the baseline
XLA = "xla"  # what JAX users have today: the pure-JAX reference, or the naive optax loss
TOKAMAX = "tokamax"  # Google's tokamax, the JAX kernel library a user would pick instead, where it imports
LIGER_TORCH = "liger_torch"  # Liger-Kernel under torch, where both import
PROVIDERS = (LIGER_JAX, XLA, LIGER_JAX_XLA, TOKAMAX, LIGER_TORCH)


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


@dataclasses.dataclass(frozen=True, eq=False)
class KernelOp:
    """``liger_jax.<name>`` on its kernels (``"triton"`` on a GPU, the interpreter on CPU), called as ``fn(*args)``.

    Attributes:
        name: the op in liger_jax.
        options: keyword options bound to every call.
        inputs: ``inputs(*case_args) -> op_args`` where the op takes computed inputs (the projections of a gated
            linear unit), else None.
    """

    name: str
    options: Mapping[str, Any]
    inputs: Callable[..., tuple[Any, ...]] | None = None

    def __call__(self, *args: Any) -> Any:
        return self.with_implementation(kernel_implementation())(*args)

    def with_implementation(self, implementation: str | None) -> Callable[..., Any]:
        """The same call with ``implementation=`` set; None leaves the choice to liger_jax (its size rule)."""
        op = liger_op(self.name)

        def call(*args):
            return op(*(self.inputs(*args) if self.inputs else args), implementation=implementation, **self.options)

        return call


def kernel_provider(name: str, inputs: Callable[..., tuple[Any, ...]] | None = None, **options: Any) -> KernelOp:
    """``liger_jax.<name>`` with the kernel implementation and ``options`` bound (MissingOpError if it lacks it);
    ``inputs`` maps the case's arguments to the op's, where they differ."""
    liger_op(name)
    return KernelOp(name, options, inputs)


def xla_provider(name: str, **options: Any) -> Any:
    """``liger_jax.<name>`` with ``implementation="xla"`` (its pure-JAX reference) and ``options`` bound."""
    return functools.partial(liger_op(name), implementation="xla", **options)


def unavailable(provider: str) -> str | None:
    """Why ``provider`` cannot run in this process (its rows are then skipped with this reason), or None."""
    if provider == LIGER_TORCH:
        return liger_torch_unavailable()
    if provider == TOKAMAX:
        from benchmarks import tokamax_provider

        return tokamax_provider.unavailable()
    return None


def implementation(case: Case, provider: str) -> dict[str, str]:
    """The row fields saying what ran for a JAX ``provider`` on ``case``: ``implementation`` (liger_jax's kernel
    path, tokamax's chosen implementation, else ``"xla"``); for liger_jax, ``default_implementation`` (what
    ``implementation=None`` runs at this shape: ``"xla"`` where liger_jax's size rule picks XLA); for tokamax,
    ``implementation_note`` (why its preferred implementations did not run here)."""
    if provider == LIGER_JAX:
        kernel = kernel_implementation()
        try:
            default = "xla" if size_rule_picks_xla(case) else kernel
        except Exception as error:  # the measurement stands without it
            default = f"unknown: {type(error).__name__}: {error}".splitlines()[0][:200]
        return {"implementation": kernel, "default_implementation": default}
    chosen = getattr(case.providers[provider], "chosen", None)
    if chosen is None:
        return {"implementation": "xla"}
    name, note = chosen()
    return {"implementation": name} | ({"implementation_note": note} if note else {})


def size_rule_picks_xla(case: Case) -> bool:
    """Whether liger_jax called with ``implementation=None`` runs its XLA path at ``case``'s shape: its program
    traces to the very one ``implementation="xla"`` gives (function addresses aside). Kept per case key."""
    key = (case.op, case.shape, case.dtype)
    if key not in _PICKS_XLA:
        import jax

        kernel = case.providers[LIGER_JAX]
        specs = jax.eval_shape(case.make_inputs, jax.random.key(0))
        default, xla = (_program_text(kernel.with_implementation(choice), specs) for choice in (None, "xla"))
        _PICKS_XLA[key] = default == xla
    return _PICKS_XLA[key]


_PICKS_XLA: dict[tuple[str, str, str], bool] = {}


def _program_text(fn: Callable[..., Any], specs: Any) -> str:
    import jax

    return re.sub(r" at 0x[0-9a-f]+", "", str(jax.make_jaxpr(fn)(*specs)))


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
