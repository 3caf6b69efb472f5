"""Comparisons for whole models, where errors compound over layers (op tests use harness.assert_close)."""

import jax
import jax.numpy as jnp
import numpy as np

from tests import harness


def relative_error(actual, truth) -> float:
    """``max |actual - truth| / max |truth|`` in float64."""
    actual, truth = np.asarray(actual, np.float64), np.asarray(truth, np.float64)
    return float(np.max(np.abs(actual - truth)) / np.max(np.abs(truth)))


def assert_as_accurate_as_flax(liger, flax, truth) -> None:
    """Asserts a bf16 liger model's outputs are about as close to the fp32 ``truth`` as flax's own bf16 model.

    Through several bf16 layers the two round differently (a kernel rounds once where flax rounds after every op),
    so they are not compared with each other: for every leaf of the trees, the liger error (:func:`relative_error`
    against ``truth``) must stay within twice flax's, or within the bf16 tolerance where flax's error is smaller.
    """
    bf16_tolerance = harness.TOLERANCES[jnp.dtype(jnp.bfloat16)][1]

    def check(liger, flax, truth):
        liger_error, flax_error = relative_error(liger, truth), relative_error(flax, truth)
        assert liger_error <= max(2 * flax_error, bf16_tolerance), f"liger {liger_error:.3g}, flax {flax_error:.3g}"

    jax.tree.map(check, liger, flax, truth)
