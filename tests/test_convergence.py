"""Convergence, as Liger tests it: the same Llama trained with and without the kernels from the same seed and batches
gives the same per-step losses and final params (the training step of examples/train_llama.py, AdamW).

``LIGER_JAX_CONVERGENCE`` picks the setting: ``ci`` (default; small enough for Triton's interpreter on CPU) or
``mini`` (Liger's mini Llama 3: hidden 1024, 4 layers, vocab 32000, sequences of 512; for a GPU)::

    LIGER_JAX_CONVERGENCE=mini LIGER_JAX_IMPLEMENTATION=triton python -m pytest tests/test_convergence.py

Measured on CPU (interpreter, ``ci``): fp32 per-step losses agree to ~3e-7 relative and final params to ~1e-7
absolute, well inside the fp32 bound of 1e-5; bf16 losses to ~1e-4 relative and params to ~2e-3 absolute, inside
1e-2. Matmuls run at full fp32 precision (no TF32 on GPUs) so that only the kernels differ.
"""

import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from liger_jax.flax_layers import apply_liger
from liger_jax.models import LlamaForCausalLM, llama_config, training
from tests import harness

STEPS = 32
SETTINGS = {
    "ci": {
        "preset": "tiny",
        "overrides": {"hidden_size": 64, "intermediate_size": 128, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2},
        "batch_size": 2,
        "seq_len": 16,  # the interpreter runs RoPE one program per token: its time grows with batch × seq
    },
    "mini": {"preset": "mini", "overrides": {}, "batch_size": 4, "seq_len": 512},
}
SETTING = os.environ.get("LIGER_JAX_CONVERGENCE", "ci")
if SETTING not in SETTINGS:
    raise ValueError(f"LIGER_JAX_CONVERGENCE must be one of {tuple(SETTINGS)}, got {SETTING!r}")
CORPUS = Path(__file__).parents[1] / "examples" / "data" / "alice_in_wonderland.txt"


def _batches(batch_size: int, seq_len: int) -> list[np.ndarray]:
    """``STEPS`` batches of ``seq_len + 1`` byte tokens from the shipped corpus, the same on every call."""
    tokens = np.frombuffer(CORPUS.read_bytes(), dtype=np.uint8).astype(np.int32)
    starts = np.random.default_rng(0).integers(0, len(tokens) - seq_len - 1, size=(STEPS, batch_size))
    return [tokens[row[:, None] + np.arange(seq_len + 1)[None, :]] for row in starts]


def _train(dtype: str, liger: bool) -> tuple[np.ndarray, nnx.State]:
    setting = SETTINGS[SETTING]
    config = llama_config(setting["preset"], **setting["overrides"], dtype=dtype)
    model = LlamaForCausalLM(config, rngs=nnx.Rngs(0))
    if liger:
        apply_liger(model, implementation=harness.KERNEL_IMPLEMENTATION)
    optimizer = training.adamw_cosine(1e-3, STEPS, warmup_steps=3)
    graphdef, state = training.init_train_state(model, optimizer)
    step = training.make_train_step(graphdef, optimizer)
    losses = []
    with jax.default_matmul_precision("highest"):
        for batch in _batches(setting["batch_size"], setting["seq_len"]):
            state, loss = step(state, batch[:, :-1], batch[:, 1:])
            losses.append(loss)
    return np.asarray(losses), state.params


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_liger_trains_like_flax(dtype):
    expected_losses, expected_params = _train(dtype, liger=False)
    actual_losses, actual_params = _train(dtype, liger=True)
    assert expected_losses[-1] < expected_losses[0] - 0.5  # it learns: the comparison is not of two flat lines
    harness.assert_close(actual_losses, expected_losses, jnp.dtype(dtype))
    jax.tree.map(lambda a, e: harness.assert_close(a, e, jnp.dtype(dtype)), actual_params, expected_params)
