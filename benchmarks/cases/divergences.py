"""Divergences on (tokens, vocab) distributions: KL, generalised JSD and TVD between a student's and a teacher's.

Inputs are log-probability-like draws around -log(V) (probabilities, their exponentials, for KL's target and
TVD's operands). The ``xla`` baseline is what JAX users write today, upcast to fp32: ``optax.kl_divergence``
(KL), the JSD formula in jax.numpy, ``0.5 · |p - q|`` (TVD), each summed and divided by the rows ("batchmean").
Only the student (the first operand) is differentiated. Bytes: the forward reads both operands; the backward and
``full`` read both and write the gradient once (the gradient is known when the forward has run, so no
implementation must read the operands twice).
"""

from __future__ import annotations

import functools

from benchmarks import draws
from benchmarks.case import Case, Op, TorchProgram, itemsize
from benchmarks.providers import LIGER_JAX, XLA, kernel_provider

VOCAB = 128256
TOKENS = 8192
SMALL_VOCAB = 32000  # the main job's small preset, at batch 16 × 128 = 2048 tokens
BETA = 0.5
# Log-probabilities of a V-way distribution sit around -log(V) ≈ -12 at V = 128256.
LOG_PROB_MEAN, LOG_PROB_SCALE = -12.0, 2.0


def _xla_kl_div(input, target):
    import jax.numpy as jnp
    import optax

    return optax.kl_divergence(input.astype(jnp.float32), target.astype(jnp.float32)).mean()


def _xla_jsd(input, target):
    import jax.numpy as jnp

    log_q, log_p = input.astype(jnp.float32), target.astype(jnp.float32)
    q, p = jnp.exp(log_q), jnp.exp(log_p)
    log_m = jnp.log(BETA * p + (1.0 - BETA) * q)
    return jnp.sum(BETA * p * (log_p - log_m) + (1.0 - BETA) * q * (log_q - log_m)) / input.shape[0]


def _xla_tvd(input, target):
    import jax.numpy as jnp

    return jnp.sum(0.5 * jnp.abs(input.astype(jnp.float32) - target.astype(jnp.float32))) / input.shape[0]


# op -> (input is probabilities, target is probabilities, XLA baseline, Liger's functional name, options)
_OPS = {
    "kl_div": (False, True, _xla_kl_div, "liger_kl_div", {"reduction": "batchmean"}),
    "jsd": (False, False, _xla_jsd, "liger_jsd", {"beta": BETA}),
    "tvd": (True, True, _xla_tvd, "liger_tvd", {"reduction": "batchmean"}),
}


def _draw(key, shape, dtype, probabilities):
    """Log-probability-like draws, or their exponentials (computed in fp32) for probabilities."""
    import jax.numpy as jnp

    values = draws.normal(key, shape, dtype, LOG_PROB_SCALE, LOG_PROB_MEAN)
    return jnp.exp(values.astype(jnp.float32)).astype(dtype) if probabilities else values


def _torch_draw(shape, dtype, probabilities, grad):
    """The torch twin of :func:`_draw`: a leaf that records gradients if ``grad``."""
    values = draws.torch_normal(shape, dtype, LOG_PROB_SCALE, LOG_PROB_MEAN, grad=grad and not probabilities)
    return values.float().exp().to(values.dtype).requires_grad_(grad) if probabilities else values


def _divergence_case(op: str):
    """A builder for ``op(input, target)`` on (tokens, vocab) operands."""
    input_probs, target_probs, xla_fn, torch_name, options = _OPS[op]

    def build(params, dtype: str) -> Case:
        shape = (params["tokens"], params["vocab"])

        def make_inputs(key):
            k_input, k_target = draws.keys(key, 2)
            return _draw(k_input, shape, dtype, input_probs), _draw(k_target, shape, dtype, target_probs)

        def torch_program():
            from liger_kernel.transformers import functional

            return TorchProgram(
                functools.partial(getattr(functional, torch_name), **options),
                lambda: (
                    _torch_draw(shape, dtype, input_probs, grad=True),
                    _torch_draw(shape, dtype, target_probs, grad=False),
                ),
                (0,),
            )

        operand = shape[0] * shape[1] * itemsize(dtype)
        return Case(
            op,
            params,
            dtype,
            make_inputs,
            (0,),
            {LIGER_JAX: kernel_provider(op, **options), XLA: xla_fn},
            {"forward": 2 * operand, "backward": 3 * operand, "full": 3 * operand},
            {"forward": 0.0, "backward": 0.0, "full": 0.0},
            torch_program,
        )

    return build


TARGETS = [({"tokens": TOKENS, "vocab": VOCAB}, "bfloat16")]
SWEEPS = {
    "tokens": (
        "tokens",
        [{"tokens": 2048, "vocab": SMALL_VOCAB}, *({"tokens": n, "vocab": VOCAB} for n in (2048, 8192, 16384))],
    ),
    "vocab": ("vocab", [{"tokens": TOKENS, "vocab": v} for v in (32000, 65536, 128256, 256000)]),
}
SMOKE = [({"tokens": 37, "vocab": 300}, "float32"), ({"tokens": 64, "vocab": 512}, "bfloat16")]
OPS = [Op(op, _divergence_case(op), TARGETS, SWEEPS, SMOKE) for op in _OPS]
