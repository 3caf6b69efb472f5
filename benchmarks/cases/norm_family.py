"""The rest of Liger's norms: GroupNorm over (batch, tokens, channels) activations, DyT and PolyNorm over (tokens,
hidden) rows, modulated RMSNorm over (batch, tokens, hidden) with one modulation per example (DiT's AdaLN)."""

from __future__ import annotations

from benchmarks import draws
from benchmarks.case import Case, Op, TorchProgram, itemsize
from benchmarks.cases.norms import SWEEPS as ROW_SWEEPS
from benchmarks.providers import LIGER_JAX, XLA, kernel_provider, xla_provider

# Issue 22's GroupNorm target: 16 examples of 4096 tokens (a 64 × 64 feature map), 512 channels in 32 groups.
GROUP_NORM_TARGET = {"batch": 16, "tokens": 4096, "channels": 512, "groups": 32}
GROUP_NORM_SWEEPS = {
    "positions": ("tokens", [{**GROUP_NORM_TARGET, "tokens": n} for n in (256, 1024, 4096, 16384)]),
    "channels": (
        "channels",
        [{**GROUP_NORM_TARGET, "channels": c, "groups": 32} for c in (128, 256, 512, 1024, 2048)],
    ),
}
ROW_TARGET = {"tokens": 16384, "hidden": 4096}


def _no_flops() -> dict[str, float]:
    return {"forward": 0.0, "backward": 0.0, "full": 0.0}


def _bytes(activations: int, weights: int, *, forward_passes: int, backward_passes: int) -> dict[str, float]:
    """Fewest HBM bytes: ``passes`` full reads or writes of the activations, plus the params (and their grads)."""
    forward = forward_passes * activations + weights
    backward = backward_passes * activations + 2 * weights
    return {"forward": forward, "backward": backward, "full": forward + backward}


def _case(op: str, params, dtype: str, make_inputs, diff_argnums, bytes_moved, torch_program, **options) -> Case:
    """A bandwidth-bound ``op``: its liger_jax kernel and its XLA reference, ``options`` bound to both."""
    providers = {LIGER_JAX: kernel_provider(op, **options), XLA: xla_provider(op, **options)}
    return Case(op, params, dtype, make_inputs, diff_argnums, providers, bytes_moved, _no_flops(), torch_program)


def group_norm_case(params, dtype: str) -> Case:
    """``group_norm(x [B, S, C], scale, bias)``: forward reads x and writes y; backward reads dy and x, writes dx.

    Liger's torch GroupNorm is channels-first: it gets x as ``[B, C, S]``, the same statistics over the same bytes.
    """
    batch, tokens, channels, groups = params["batch"], params["tokens"], params["channels"], params["groups"]

    def make_inputs(key):
        kx, ks, kb = draws.keys(key, 3)
        x = draws.normal(kx, (batch, tokens, channels), dtype, 1.0, 0.5)
        return x, draws.normal(ks, (channels,), dtype, 0.1, 1.0), draws.normal(kb, (channels,), dtype, 0.1)

    def torch_program():
        from liger_kernel.transformers.functional import liger_group_norm

        return TorchProgram(
            lambda x, w, b: liger_group_norm(x, w, b, channels, groups, 1e-5),
            lambda: (
                draws.torch_normal((batch, channels, tokens), dtype, 1.0, 0.5),
                draws.torch_normal((channels,), dtype, 0.1, 1.0),
                draws.torch_normal((channels,), dtype, 0.1),
            ),
            (0, 1, 2),
        )

    size = itemsize(dtype)
    bytes_moved = _bytes(batch * tokens * channels * size, 2 * channels * size, forward_passes=2, backward_passes=3)
    return _case("group_norm", params, dtype, make_inputs, (0, 1, 2), bytes_moved, torch_program, num_groups=groups)


def dyt_case(params, dtype: str) -> Case:
    """``dyt(x, alpha, gamma, beta)``: forward reads x, writes y; backward reads dy and x, writes dx (3 passes)."""
    rows, cols = params["tokens"], params["hidden"]

    def make_inputs(key):
        kx, ka, kg, kb = draws.keys(key, 4)
        x = draws.normal(kx, (rows, cols), dtype)
        alpha = draws.normal(ka, (1,), "float32", 0.1, 0.5)
        return x, alpha, draws.normal(kg, (cols,), dtype, 0.1, 1.0), draws.normal(kb, (cols,), dtype, 0.1)

    def torch_program():
        from liger_kernel.transformers.functional import liger_dyt

        return TorchProgram(
            liger_dyt,
            lambda: (
                draws.torch_normal((rows, cols), dtype),
                draws.torch_normal((1,), "float32", 0.1, 0.5),
                draws.torch_normal((cols,), dtype, 0.1, 1.0),
                draws.torch_normal((cols,), dtype, 0.1),
            ),
            (0, 1, 2, 3),
        )

    size = itemsize(dtype)
    bytes_moved = _bytes(rows * cols * size, 2 * cols * size, forward_passes=2, backward_passes=3)
    return _case("dyt", params, dtype, make_inputs, (0, 1, 2, 3), bytes_moved, torch_program)


def poly_norm_case(params, dtype: str) -> Case:
    """``poly_norm(x, weight, bias)``: the same passes as DyT; the params are 4 scalars."""
    rows, cols = params["tokens"], params["hidden"]

    def make_inputs(key):
        kx, kw, kb = draws.keys(key, 3)
        x = draws.normal(kx, (rows, cols), dtype)
        return x, draws.normal(kw, (3,), "float32", 0.1, 1.0 / 3.0), draws.normal(kb, (1,), "float32", 0.1, 1.0)

    def torch_program():
        from liger_kernel.transformers.functional import liger_poly_norm

        return TorchProgram(
            lambda x, w, b: liger_poly_norm(x, w, b, 1e-6, False),
            lambda: (
                draws.torch_normal((rows, cols), dtype),
                draws.torch_normal((3,), "float32", 0.1, 1.0 / 3.0),
                draws.torch_normal((1,), "float32", 0.1, 1.0),
            ),
            (0, 1, 2),
        )

    bytes_moved = _bytes(rows * cols * itemsize(dtype), 0, forward_passes=2, backward_passes=3)
    return _case("poly_norm", params, dtype, make_inputs, (0, 1, 2), bytes_moved, torch_program)


def modulated_rms_norm_case(params, dtype: str) -> Case:
    """``modulated_rms_norm(x [B, T, D], weight, scale [B, D], shift [B, D])``: forward reads x, writes y; backward
    reads dy and x, writes dx (3 passes); the modulation is B rows."""
    batch, tokens, hidden = params["batch"], params["tokens"], params["hidden"]

    def make_inputs(key):
        kx, kw, ks, kb = draws.keys(key, 4)
        x = draws.normal(kx, (batch, tokens, hidden), dtype)
        weight = draws.normal(kw, (hidden,), dtype, 0.1, 1.0)
        return x, weight, draws.normal(ks, (batch, hidden), dtype, 0.1), draws.normal(kb, (batch, hidden), dtype, 0.1)

    def torch_program():
        from liger_kernel.transformers.functional import liger_modulated_rms_norm

        return TorchProgram(
            lambda x, w, s, b: liger_modulated_rms_norm(x, w, s, b, 1e-6, 0.0, "llama", False),
            lambda: (
                draws.torch_normal((batch, tokens, hidden), dtype),
                draws.torch_normal((hidden,), dtype, 0.1, 1.0),
                draws.torch_normal((batch, hidden), dtype, 0.1),
                draws.torch_normal((batch, hidden), dtype, 0.1),
            ),
            (0, 1, 2, 3),
        )

    size = itemsize(dtype)
    weights = (1 + 2 * batch) * hidden * size
    bytes_moved = _bytes(batch * tokens * hidden * size, weights, forward_passes=2, backward_passes=3)
    return _case("modulated_rms_norm", params, dtype, make_inputs, (0, 1, 2, 3), bytes_moved, torch_program)


MODULATED_TARGET = {"batch": 4, "tokens": 4096, "hidden": 4096}
ROW_SMOKE = [({"tokens": 37, "hidden": 96}, "float32"), ({"tokens": 64, "hidden": 128}, "bfloat16")]
OPS = [
    Op(
        "group_norm",
        group_norm_case,
        targets=[(GROUP_NORM_TARGET, "bfloat16"), (GROUP_NORM_TARGET, "float32")],
        sweeps=GROUP_NORM_SWEEPS,
        smoke=[
            ({"batch": 2, "tokens": 37, "channels": 48, "groups": 6}, "float32"),
            ({"batch": 2, "tokens": 64, "channels": 64, "groups": 4}, "bfloat16"),
        ],
    ),
    Op("dyt", dyt_case, [(ROW_TARGET, "bfloat16")], ROW_SWEEPS, ROW_SMOKE),
    Op("poly_norm", poly_norm_case, [(ROW_TARGET, "bfloat16")], {"tokens": ROW_SWEEPS["tokens"]}, ROW_SMOKE),
    Op(
        "modulated_rms_norm",
        modulated_rms_norm_case,
        targets=[(MODULATED_TARGET, "bfloat16")],
        sweeps={"hidden": ("hidden", [{**MODULATED_TARGET, "hidden": d} for d in (1024, 2048, 4096, 8192, 16384)])},
        smoke=[
            ({"batch": 2, "tokens": 19, "hidden": 96}, "float32"),
            ({"batch": 2, "tokens": 32, "hidden": 128}, "bfloat16"),
        ],
    ),
]
