"""The norms' kernels on rows of more than one tile, on a GPU, against XLA: ``python -m benchmarks.wide_rows_check``.

The CPU suite reaches the column-block kernels through forced tilings at small widths; the rule sends rows to them
from D > 16384 only, widths Triton's interpreter cannot run in CI time. On the GPU this runs RMSNorm, LayerNorm and
fused add+RMSNorm in fp32 at 20000-131072 columns (one row to 300) through the kernels and through XLA, and
compares values and the vjp of a random cotangent (every output and gradient, as its largest error over its
largest magnitude), and each kernel program run twice for a bitwise-equal repeat. Prints one line per (op, shape)
and ``PASS`` or ``FAIL`` (errors above 2e-5 of the largest, a non-finite value, or a repeat that differs); exits
non-zero on ``FAIL``.
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np

import liger_jax

SHAPES = ((300, 20000), (300, 32768), (300, 65536), (129, 131072), (1, 65537))
TOLERANCE = 2e-5


def _op(name: str, implementation: str):
    """``(x, residual, scale, bias) -> output(s)`` of ``name``; the arguments it does not take get zero gradients."""
    match name:
        case "rms_norm":
            return lambda x, r, s, b: liger_jax.rms_norm(x, s, implementation=implementation)
        case "layer_norm":
            return lambda x, r, s, b: liger_jax.layer_norm(x, s, b, implementation=implementation)
        case "fused_add_rms_norm":
            return lambda x, r, s, b: liger_jax.fused_add_rms_norm(x, r, s, implementation=implementation)
    raise ValueError(f"unknown op {name!r}")


def _forward_and_vjp(name: str, implementation: str):
    """A jitted ``(x, residual, scale, bias, cotangent) -> (outputs, gradients)``; every output gets the cotangent."""
    op = _op(name, implementation)

    @jax.jit
    def run(x, r, s, b, cotangent):
        outputs, vjp = jax.vjp(op, x, r, s, b)
        return outputs, vjp(jax.tree.map(lambda _: cotangent, outputs))

    return run


def _relative_errors(got, want) -> list[float]:
    errors = []
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        errors.append(
            float(np.max(np.abs(g - w)) / max(np.max(np.abs(w)), 1e-30)) if np.all(np.isfinite(g)) else np.inf
        )
    return errors


def main() -> int:
    """Checks every (op, shape); returns the exit status."""
    failed = False
    for rows, cols in SHAPES:
        keys = jax.random.split(jax.random.key(cols), 5)
        x, r, cotangent = (jax.random.normal(k, (rows, cols), jnp.float32) * 2.0 + 0.5 for k in keys[:3])
        s, b = (jax.random.normal(k, (cols,), jnp.float32) for k in keys[3:])
        for name in ("rms_norm", "layer_norm", "fused_add_rms_norm"):
            kernel = _forward_and_vjp(name, "triton")
            first, second = kernel(x, r, s, b, cotangent), kernel(x, r, s, b, cotangent)
            errors = _relative_errors(first, _forward_and_vjp(name, "xla")(x, r, s, b, cotangent))
            repeats = all(
                np.array_equal(np.asarray(p), np.asarray(q))
                for p, q in zip(jax.tree.leaves(first), jax.tree.leaves(second), strict=True)
            )
            failed |= max(errors) > TOLERANCE or not repeats
            shown = ", ".join(f"{e:.1e}" for e in errors)
            print(f"{name:20s} {rows:4d} x {cols:6d}: errors [{shown}], bitwise repeat {repeats}", flush=True)
    print("FAIL" if failed else "PASS")
    return int(failed)


if __name__ == "__main__":
    sys.exit(main())
