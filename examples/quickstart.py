"""Quickstart: liger_jax.rms_norm and its gradient under jax.jit, checked against the reference and timed.

    python examples/quickstart.py [--rows 4096] [--cols 4096] [--dtype bfloat16]

Runs the default implementation (Triton on a GPU with jax-triton, the XLA reference elsewhere; set
LIGER_JAX_IMPLEMENTATION=interpret to run the kernels in Triton's interpreter on CPU).
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import liger_jax


def _loss(norm, x, scale, cotangent):
    return jnp.sum(norm(x, scale).astype(jnp.float32) * cotangent)


def _median_ms(fn, *args, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


def main() -> None:
    """Parses the flags, checks kernel against reference (value and gradients) and prints both timings."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--cols", type=int, default=1024)
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()

    dtype = jnp.dtype(args.dtype)
    keys = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(keys[0], (args.rows, args.cols), dtype)
    scale = jax.random.normal(keys[1], (args.cols,), jnp.float32)
    cotangent = jax.random.normal(keys[2], (args.rows, args.cols), jnp.float32)
    implementation = liger_jax.default_implementation()

    value_and_grads = {
        name: jax.jit(jax.value_and_grad(lambda x, s, c, norm=norm: _loss(norm, x, s, c), argnums=(0, 1)))
        for name, norm in [("liger_jax", liger_jax.rms_norm), ("reference", liger_jax.rms_norm_reference)]
    }
    results = {name: fn(x, scale, cotangent) for name, fn in value_and_grads.items()}
    tolerance = 1e-5 if dtype == jnp.float32 else 2e-2
    (loss, (dx, dscale)), (ref_loss, (ref_dx, ref_dscale)) = results["liger_jax"], results["reference"]
    for name, ours, ref in [("loss", loss, ref_loss), ("dx", dx, ref_dx), ("dscale", dscale, ref_dscale)]:
        error = float(jnp.max(jnp.abs(ours.astype(jnp.float32) - ref.astype(jnp.float32))))
        size = float(jnp.max(jnp.abs(ref.astype(jnp.float32))))
        if error > tolerance * max(size, 1.0):
            raise SystemExit(f"{name}: max error {error:.3g} exceeds {tolerance:g} x {size:.3g}")
        print(f"{name:7s} max |liger_jax - reference| = {error:.3g}  (max |reference| = {size:.3g})")

    print(f"implementation={implementation} backend={jax.default_backend()} shape=({args.rows}, {args.cols}) {dtype}")
    for name, fn in value_and_grads.items():
        print(f"{name:10s} forward+backward: {_median_ms(fn, x, scale, cotangent, repeats=args.repeats):.3f} ms")


if __name__ == "__main__":
    main()
