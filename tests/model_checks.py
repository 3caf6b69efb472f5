"""Comparisons for whole models, where errors compound over layers (op tests use harness.assert_close)."""

import jax
import numpy as np


def relative_error(actual, truth) -> float:
    """``max |actual - truth| / max |truth|`` in float64."""
    actual, truth = np.asarray(actual, np.float64), np.asarray(truth, np.float64)
    return float(np.max(np.abs(actual - truth)) / np.max(np.abs(truth)))


def assert_as_accurate_as_flax(liger, flax, truth) -> None:
    """Asserts a bf16 liger model is about as close to the fp32 ``truth`` as flax's own bf16 model.

    Through several bf16 layers the two round differently (a kernel rounds its output once; XLA on a GPU keeps fp32
    between the ops it fuses, on a CPU it rounds after each), so they are not compared with each other. Each leaf's
    :func:`relative_error` against ``truth`` is one random draw: a scalar loss summing terms of both signs cancels,
    and a leaf's error swings by 10x between inputs for both models alike (seen: the loss at 0.2% for flax on the
    H200 and 2.7% on a CPU, same seed). So the leaves are compared as a whole: liger's median error within twice
    flax's (a model-wide loss of precision fails), and its worst leaf within four times flax's worst (a wrong
    gradient, off by O(1), fails).
    """
    liger_errors = jax.tree.leaves(jax.tree.map(relative_error, liger, truth))
    flax_errors = jax.tree.leaves(jax.tree.map(relative_error, flax, truth))
    report = f"liger {np.round(liger_errors, 4)}, flax {np.round(flax_errors, 4)}"
    assert np.median(liger_errors) <= 2 * np.median(flax_errors), report
    assert max(liger_errors) <= 4 * max(flax_errors), report
