"""Float64 numpy oracles of softmax, sparsemax and ReLU², written from their definitions (not from liger_jax's
references or kernels): values along the last axis, and the pullback of a cotangent by the closed-form Jacobian."""

import numpy as np

# Bisection halves [max - 1, max] this many times: past float64's resolution for any row.
_BISECTIONS = 200


def softmax(x):
    """exp(x - max) / Σ exp(x - max)."""
    x = np.asarray(x, np.float64)
    exps = np.exp(x - x.max(axis=-1, keepdims=True))
    return exps / exps.sum(axis=-1, keepdims=True)


def softmax_pullback(x, dy, rounded_to=None):
    """dyᵀ J with J = diag(y) - y yᵀ; with ``rounded_to`` a dtype, J of y rounded to it (what a backward pass that
    reads a stored y computes)."""
    y, dy = softmax(x), np.asarray(dy, np.float64)
    if rounded_to is not None:
        y = np.asarray(np.asarray(y, np.float32).astype(rounded_to), np.float64)
    return y * (dy - (dy * y).sum(axis=-1, keepdims=True))


def sparsemax_threshold(x):
    """τ with Σ max(x - τ, 0) = 1, per row, by bisection (the sum falls from ≥ 1 at max - 1 to 0 at max), then
    made exact on the support it found."""
    x = np.asarray(x, np.float64)
    low, high = x.max(axis=-1, keepdims=True) - 1.0, x.max(axis=-1, keepdims=True)
    for _ in range(_BISECTIONS):
        middle = (low + high) / 2
        above = np.maximum(x - middle, 0.0).sum(axis=-1, keepdims=True) >= 1.0
        low, high = np.where(above, middle, low), np.where(above, high, middle)
    support = x > low
    return ((x * support).sum(axis=-1, keepdims=True) - 1.0) / support.sum(axis=-1, keepdims=True)


def sparsemax(x):
    """The Euclidean projection onto the simplex: max(x - τ, 0)."""
    return np.maximum(np.asarray(x, np.float64) - sparsemax_threshold(x), 0.0)


def sparsemax_jacobian(x):
    """J = diag(s) - s sᵀ / |S| of one row, s the support's indicator."""
    support = (sparsemax(x) > 0).astype(np.float64)
    return np.diag(support) - np.outer(support, support) / support.sum()


def sparsemax_pullback(x, dy):
    """dyᵀ J: dy minus its mean over the support, on the support; 0 off it."""
    support = sparsemax(x) > 0
    dy = np.asarray(dy, np.float64)
    mean = (dy * support).sum(axis=-1, keepdims=True) / support.sum(axis=-1, keepdims=True)
    return np.where(support, dy - mean, 0.0)


def relu_squared(x):
    """max(x, 0)²."""
    return np.maximum(np.asarray(x, np.float64), 0.0) ** 2


def relu_squared_pullback(x, dy):
    """2 max(x, 0) dy."""
    return 2.0 * np.maximum(np.asarray(x, np.float64), 0.0) * np.asarray(dy, np.float64)


# name -> (value, pullback), each along the last axis.
ORACLES = {
    "softmax": (softmax, softmax_pullback),
    "sparsemax": (sparsemax, sparsemax_pullback),
    "relu_squared": (relu_squared, relu_squared_pullback),
}
