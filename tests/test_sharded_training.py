"""examples/train_llama.py on a device mesh: data, fully-sharded and tensor parallel training gives the losses of
one device (kernels as the environment runs them: Triton's interpreter on the 8 host devices of CPU runs)."""

import importlib
from pathlib import Path

import jax
import numpy as np
import pytest

EXAMPLES = Path(__file__).parents[1] / "examples"
RUN = ["--steps", "10", "--batch-size", "4", "--seq-len", "8", "--log-every", "5", "--eval-batches", "0"]
# The same program twice: bitwise on CPU; a GPU run is bf16 with atomics in some of XLA's and cuDNN's reductions.
SAME_PROGRAM_RTOL = 1e-6 if jax.default_backend() == "cpu" else 1e-2


@pytest.fixture(scope="module")
def train_llama():
    """The example script as a module (in-process: the suite's devices and compiled kernels are reused)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(EXAMPLES))
        yield importlib.import_module("train_llama")


def _losses(train_llama, out: Path, *flags: str) -> list[float]:
    summary = train_llama.train(train_llama.parse_args([*RUN, "--sample", "0", "--out", str(out), *flags]))
    return summary["losses"]


@pytest.fixture(scope="module")
def one_device_losses(train_llama, tmp_path_factory):
    return _losses(train_llama, tmp_path_factory.mktemp("one_device"))


def test_one_device_mesh_trains_as_without_a_mesh(train_llama, one_device_losses, tmp_path):
    losses = _losses(train_llama, tmp_path, "--mesh", "dp=1")
    np.testing.assert_allclose(losses, one_device_losses, rtol=SAME_PROGRAM_RTOL)


@pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 devices")
def test_data_fsdp_and_tensor_parallel_training_matches_one_device(train_llama, one_device_losses, tmp_path):
    losses = _losses(train_llama, tmp_path, "--mesh", "dp=2,fsdp=2,tp=2")
    assert len(losses) == 10 and losses[-1] < losses[0]
    # Sums over devices change the order of fp32 additions; ten AdamW steps keep them within ~1e-6.
    np.testing.assert_allclose(losses, one_device_losses, rtol=1e-5)


@pytest.mark.parametrize(
    "flags",
    [["--mesh", "xy=1"], ["--mesh", "dp=1,dp=1"], ["--mesh", f"dp={len(jax.devices()) + 1}"]]
    + ([["--mesh", "dp=8", "--batch-size", "4"]] if len(jax.devices()) >= 8 else []),
)
def test_bad_mesh_flags_are_refused(train_llama, flags):
    with pytest.raises(SystemExit):
        train_llama.parse_args(flags)


@pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 devices")
def test_parameter_rules():
    from liger_jax.models import llama_config, sharding

    mesh = sharding.make_mesh("dp=2,fsdp=2,tp=2")
    config = llama_config("tiny")  # 6 query and 2 key-value heads, tied [256, 192] embedding

    def spec(path, shape, on=mesh):
        return tuple(sharding.parameter_spec(path.split("/"), shape, on, config))

    assert spec("layers/0/self_attn/q_proj/kernel/value", (192, 192)) == ("fsdp", "tp")
    assert spec("opt_state/mu/layers/0/mlp/down_proj/kernel", (512, 192)) == ("tp", "fsdp")
    assert spec("embed_tokens/embedding", (256, 192)) == (("tp", "fsdp"), None)
    assert spec("layers/0/input_layernorm/scale", (192,)) == (None,)
    assert spec("layers/0/self_attn/k_proj/kernel", (192, 64), sharding.make_mesh("tp=8")) == (None, None)
