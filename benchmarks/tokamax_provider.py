"""The tokamax provider: Google's JAX kernel library (``pip install tokamax``), what a JAX user would pick instead.

tokamax is imported only here, only when the provider runs; where it does not import, :func:`unavailable` says why
and the rows are skipped with that reason. Each tokamax op has several implementations (Pallas kernels for GPUs and
TPUs, an XLA path) and fails over between them only on errors raised while tracing, so a case pins one: the first of
:data:`PREFERENCES` that compiles and runs a small forward and backward here (a probe, once per op and dtype in a
process). Each row names it (``implementation``) and says why those before it did not run (``implementation_note``).
tokamax's ``"triton"`` kernels are Pallas kernels, lowered by jaxlib's own Triton pipeline: jax-triton plays no part.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import logging
from collections.abc import Callable, Iterator
from typing import Any

from benchmarks import draws

# Implementations in the order tokamax itself tries them on a GPU: its Pallas kernels first, its XLA path last.
PREFERENCES = {
    "layer_norm": ("triton", "xla"),
    "gated_linear_unit": ("triton", "mosaic", "xla"),
    # "chunked_xla" computes the logits chunk by chunk (tokamax after 0.0.12); 0.0.12 has only "xla" off TPU, which
    # materialises the logits (in the input dtype) and recomputes them in the backward.
    "linear_softmax_cross_entropy_loss": ("chunked_xla", "xla"),
}
PROBE_ROWS = 256  # small, but a multiple of any row block the kernels tile by


def tokamax_module() -> Any:
    """The ``tokamax`` module. tokamax reads its options from absl flags, parsing ``sys.argv`` on first use, where
    the benchmark's own arguments would fail as unknown flags: the flags are marked parsed (their defaults) first."""
    import tokamax
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    return tokamax


@functools.cache
def unavailable() -> str | None:
    """Why tokamax cannot run here, or None when it can."""
    if importlib.util.find_spec("tokamax") is None:
        return "tokamax is not installed"
    try:
        tokamax_module()
    except Exception as error:  # a broken install raises more than ImportError
        return f"tokamax does not import ({type(error).__name__}: {error})"
    return None


@dataclasses.dataclass(frozen=True)
class TokamaxOp:
    """A case's tokamax provider, called as ``fn(*case_args)``.

    Attributes:
        name: the case's op (``"rms_norm"``): with ``dtype``, the key under which the probe's answer is kept.
        dtype: the case's activation dtype name.
        tokamax_op: the tokamax function, a key of :data:`PREFERENCES`.
        call: ``call(tokamax, implementation, *case_args)``: the case's output through one implementation.
        probe_args: ``probe_args()``: small inputs in the case's argument order and dtypes.
        diff_argnums: the arguments the probe differentiates.
    """

    name: str
    dtype: str
    tokamax_op: str
    call: Callable[..., Any]
    probe_args: Callable[[], tuple[Any, ...]]
    diff_argnums: tuple[int, ...]

    def __call__(self, *args: Any) -> Any:
        implementation, _ = self.chosen()
        return self.call(tokamax_module(), implementation, *args)

    def chosen(self) -> tuple[str, str]:
        """``(implementation, note)``: the first of :data:`PREFERENCES` that runs here, and why earlier ones did not.

        Raises:
            RuntimeError: no implementation runs here (the message gives each one's error).
        """
        key = (self.name, self.dtype)
        if key not in _CHOSEN:
            _CHOSEN[key] = _first_that_runs(self)
        return _CHOSEN[key]


_CHOSEN: dict[tuple[str, str], tuple[str, str]] = {}


def _first_that_runs(op: TokamaxOp) -> tuple[str, str]:
    tokamax, args = tokamax_module(), op.probe_args()
    failures = []
    for implementation in PREFERENCES[op.tokamax_op]:
        try:
            with _absl_errors_muted():
                _forward_and_backward(functools.partial(op.call, tokamax, implementation), args, op.diff_argnums)
        except Exception as error:  # any failure means: not this implementation, here
            failures.append(f"{implementation}: {_reason(error)}")
            continue
        return implementation, "; ".join(failures)
    raise RuntimeError(f"no tokamax {op.tokamax_op} implementation runs here: {'; '.join(failures)}")


def _forward_and_backward(fn: Callable[..., Any], args: tuple[Any, ...], diff_argnums: tuple[int, ...]) -> None:
    """Compiles and runs the gradient of ``sum(fn(*args))`` with respect to ``diff_argnums``."""
    import jax
    import jax.numpy as jnp

    def loss(*differentiated):
        full = list(args)
        for argnum, value in zip(diff_argnums, differentiated, strict=True):
            full[argnum] = value
        return jnp.sum(fn(*full).astype(jnp.float32))

    gradient = jax.jit(jax.grad(loss, argnums=tuple(range(len(diff_argnums)))))
    jax.block_until_ready(gradient(*(args[i] for i in diff_argnums)))


def _reason(error: BaseException) -> str:
    """One line on why an implementation failed; an ExceptionGroup (tokamax's "all implementations failed") by its
    first member."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return f"{type(error).__name__}: {error}".splitlines()[0][:200]


@contextlib.contextmanager
def _absl_errors_muted() -> Iterator[None]:
    """tokamax logs a traceback for each implementation it cannot run; the probe reports them in one line."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _normal(seed: int, shape: tuple[int, ...], dtype: str, scale: float = 1.0, mean: float = 0.0) -> Any:
    import jax

    return draws.normal(jax.random.key(seed), shape, dtype, scale, mean)


def _norm_probe(dtype: str, n_params: int) -> Callable[[], tuple[Any, ...]]:
    hidden = 1024
    return lambda: (
        _normal(0, (PROBE_ROWS, hidden), dtype),
        *(_normal(1 + i, (hidden,), dtype, 0.1, 1.0 - i) for i in range(n_params)),
    )


def rms_norm(dtype: str, epsilon: float) -> TokamaxOp:
    """RMSNorm as tokamax spells it, ``tokamax.layer_norm(x, scale, None, subtract_mean=False)``: ``fn(x, scale)``
    with x (rows, D) and scale (D,)."""

    def call(tokamax, implementation, x, scale):
        return tokamax.layer_norm(x, scale, None, epsilon=epsilon, subtract_mean=False, implementation=implementation)

    return TokamaxOp("rms_norm", dtype, "layer_norm", call, _norm_probe(dtype, 1), (0, 1))


def layer_norm(dtype: str, epsilon: float) -> TokamaxOp:
    """``tokamax.layer_norm``: ``fn(x, scale, bias)`` with x (rows, D), scale and bias (D,)."""

    def call(tokamax, implementation, x, scale, bias):
        return tokamax.layer_norm(x, scale, bias, epsilon=epsilon, implementation=implementation)

    return TokamaxOp("layer_norm", dtype, "layer_norm", call, _norm_probe(dtype, 2), (0, 1, 2))


def linear_cross_entropy(dtype: str) -> TokamaxOp:
    """``tokamax.linear_softmax_cross_entropy_loss``, mean over rows: ``fn(x, weight, labels)`` with x (N, H),
    weight (H, V) and int32 labels (N,), liger_jax's argument order."""

    def call(tokamax, implementation, x, weight, labels):
        return tokamax.linear_softmax_cross_entropy_loss(
            x, labels, weight, reduction="mean", implementation=implementation
        )

    def probe_args():
        import jax

        hidden, vocab = 512, 2048
        labels = draws.labels(jax.random.key(2), PROBE_ROWS, vocab)
        return _normal(0, (PROBE_ROWS, hidden), dtype), _normal(1, (hidden, vocab), dtype, hidden**-0.5), labels

    return TokamaxOp("fused_linear_cross_entropy", dtype, "linear_softmax_cross_entropy_loss", call, probe_args, (0, 1))


def swiglu_projection(dtype: str) -> TokamaxOp:
    """``tokamax.gated_linear_unit`` with SiLU and the two weights unfused, as a Llama checkpoint holds them:
    ``fn(x, w_gate, w_up) = silu(x @ w_gate) * (x @ w_up)`` with x (N, K) and each weight (K, F)."""

    def call(tokamax, implementation, x, w_gate, w_up):
        import jax

        return tokamax.gated_linear_unit(x, (w_gate, w_up), activation=jax.nn.silu, implementation=implementation)

    def probe_args():
        hidden, intermediate = 512, 1024
        weights = (_normal(1 + i, (hidden, intermediate), dtype, hidden**-0.5) for i in range(2))
        return _normal(0, (PROBE_ROWS, hidden), dtype), *weights

    return TokamaxOp("gated_linear_unit", dtype, "gated_linear_unit", call, probe_args, (0, 1, 2))
