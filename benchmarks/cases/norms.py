"""Row-wise normalisations: RMSNorm, LayerNorm, fused add+RMSNorm over (tokens, hidden) activations."""

from __future__ import annotations

from benchmarks import draws, tokamax_provider
from benchmarks.case import Case, Op, TorchProgram, itemsize
from benchmarks.providers import LIGER_JAX, TOKAMAX, XLA, kernel_provider, xla_provider

HIDDEN = 4096  # Llama-3-8B
TOKENS = 16384  # a 4 × 4096-token batch
SMALL = {"tokens": 2048, "hidden": 768}  # the main job's small preset, batch 16 × 128: launch-bound
SWEEPS = {
    "tokens": ("tokens", [SMALL, *({"tokens": n, "hidden": HIDDEN} for n in (2048, 8192, 16384, 65536))]),
    # 16384: Llama-3-405B's width; 256 to 65536: issue 19's range, where no width may fall off a cliff (the widest
    # rows are split among programs in the backward).
    "hidden": (
        "hidden",
        [{"tokens": TOKENS, "hidden": d} for d in (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)],
    ),
}
SMOKE = [({"tokens": 37, "hidden": 96}, "float32"), ({"tokens": 64, "hidden": 128}, "bfloat16")]


def _bytes(params, dtype, *, forward_passes: int, backward_passes: int, n_params: int) -> dict[str, float]:
    """Fewest HBM bytes: ``passes`` full reads or writes of the activations, plus the (D,) params and grads."""
    rows, cols, size = params["tokens"], params["hidden"], itemsize(dtype)
    activations, weights = rows * cols * size, n_params * cols * size
    forward = forward_passes * activations + weights
    backward = backward_passes * activations + 2 * weights
    return {"forward": forward, "backward": backward, "full": forward + backward}


def _no_flops() -> dict[str, float]:
    return {"forward": 0.0, "backward": 0.0, "full": 0.0}


def _row_case(op: str, params, dtype: str, make_inputs, diff_argnums, bytes_moved, torch_program, others=None) -> Case:
    """A bandwidth-bound row-wise ``op``: its liger_jax kernel, its XLA reference and ``others`` (provider name →
    fn), no matmul flops."""
    return Case(
        op,
        params,
        dtype,
        make_inputs,
        diff_argnums,
        {LIGER_JAX: kernel_provider(op), XLA: xla_provider(op), **(others or {})},
        bytes_moved,
        _no_flops(),
        torch_program,
    )


def rms_norm_case(params, dtype: str) -> Case:
    """``rms_norm(x, scale)``: forward reads x, writes y; backward reads dy and x, writes dx (3 passes)."""
    rows, cols = params["tokens"], params["hidden"]

    def make_inputs(key):
        kx, ks = draws.keys(key, 2)
        return draws.normal(kx, (rows, cols), dtype), draws.normal(ks, (cols,), dtype, 0.1, 1.0)

    def torch_program():
        from liger_kernel.transformers.functional import liger_rms_norm

        return TorchProgram(
            lambda x, w: liger_rms_norm(x, w, 1e-6),
            lambda: (draws.torch_normal((rows, cols), dtype), draws.torch_normal((cols,), dtype, 0.1, 1.0)),
            (0, 1),
        )

    bytes_moved = _bytes(params, dtype, forward_passes=2, backward_passes=3, n_params=1)
    others = {TOKAMAX: tokamax_provider.rms_norm(dtype, epsilon=1e-6)}
    return _row_case("rms_norm", params, dtype, make_inputs, (0, 1), bytes_moved, torch_program, others)


def layer_norm_case(params, dtype: str) -> Case:
    """``layer_norm(x, scale, bias)``: the same passes as RMSNorm, two (D,) params."""
    rows, cols = params["tokens"], params["hidden"]

    def make_inputs(key):
        kx, ks, kb = draws.keys(key, 3)
        x = draws.normal(kx, (rows, cols), dtype)
        return x, draws.normal(ks, (cols,), dtype, 0.1, 1.0), draws.normal(kb, (cols,), dtype, 0.1)

    def torch_program():
        from liger_kernel.transformers.functional import liger_layer_norm

        return TorchProgram(
            lambda x, w, b: liger_layer_norm(x, w, b, 1e-5),
            lambda: (
                draws.torch_normal((rows, cols), dtype),
                draws.torch_normal((cols,), dtype, 0.1, 1.0),
                draws.torch_normal((cols,), dtype, 0.1),
            ),
            (0, 1, 2),
        )

    bytes_moved = _bytes(params, dtype, forward_passes=2, backward_passes=3, n_params=2)
    others = {TOKAMAX: tokamax_provider.layer_norm(dtype, epsilon=1e-5)}  # the epsilon liger_jax's and Liger's take
    return _row_case("layer_norm", params, dtype, make_inputs, (0, 1, 2), bytes_moved, torch_program, others)


def fused_add_rms_norm_case(params, dtype: str) -> Case:
    """``fused_add_rms_norm(x, residual, scale) -> (normed, sum)``, differentiated in x and scale.

    Forward reads x and residual, writes normed and sum (4 passes); backward reads both cotangents and the saved
    sum and writes one gradient, which dx and dresidual share (4 passes). dresidual is that same array, so the
    program does not ask for it: a program that returned both would copy it into a second output (2 more passes
    that a model, where each branch consumes the one array, never makes).
    """
    rows, cols = params["tokens"], params["hidden"]

    def make_inputs(key):
        kx, kr, ks = draws.keys(key, 3)
        x, residual = draws.normal(kx, (rows, cols), dtype), draws.normal(kr, (rows, cols), dtype)
        return x, residual, draws.normal(ks, (cols,), dtype, 0.1, 1.0)

    def torch_program():
        import torch
        from liger_kernel.transformers import LigerFusedAddRMSNorm

        module = LigerFusedAddRMSNorm(cols, eps=1e-6).to(device="cuda", dtype=getattr(torch, dtype))
        return TorchProgram(
            lambda x, r, w: torch.func.functional_call(module, {"weight": w}, (x, r)),
            lambda: (
                draws.torch_normal((rows, cols), dtype),
                draws.torch_normal((rows, cols), dtype),
                draws.torch_normal((cols,), dtype, 0.1, 1.0),
            ),
            (0, 2),
        )

    bytes_moved = _bytes(params, dtype, forward_passes=4, backward_passes=4, n_params=1)
    return _row_case("fused_add_rms_norm", params, dtype, make_inputs, (0, 2), bytes_moved, torch_program)


OPS = [
    Op(
        "rms_norm",
        rms_norm_case,
        targets=[
            ({"tokens": 16384, "hidden": 4096}, "bfloat16"),
            ({"tokens": 16384, "hidden": 4096}, "float32"),
            ({"tokens": 4096, "hidden": 8192}, "bfloat16"),
            ({"tokens": 65536, "hidden": 1024}, "bfloat16"),
        ],
        sweeps=SWEEPS,
        smoke=SMOKE,
    ),
    Op("layer_norm", layer_norm_case, [({"tokens": 16384, "hidden": 4096}, "bfloat16")], SWEEPS, SMOKE),
    Op("fused_add_rms_norm", fused_add_rms_norm_case, [({"tokens": 16384, "hidden": 4096}, "bfloat16")], SWEEPS, SMOKE),
]
