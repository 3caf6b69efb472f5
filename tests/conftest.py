"""Test setup: Triton's interpreter on machines without a GPU, 8 host devices, float64 references, strict rank
promotion."""

import os

# tests/test_sharding.py needs several devices: on CPU, XLA makes 8 of the host. Set before the backend starts (the
# default_backend() call below starts it); one-device tests still run on the first.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8".strip()

import jax  # noqa: E402
import pytest  # noqa: E402

if jax.default_backend() == "cpu":
    # Must precede the first import of triton: Triton decides at decoration time whether a kernel is interpreted.
    os.environ.setdefault("TRITON_INTERPRET", "1")

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")


@pytest.fixture
def float64_on_host():
    """Float64 oracles on the host CPU: the GPU image's XLA has no float64 GEMM (cublasLt refuses it)."""
    with jax.default_device(jax.devices("cpu")[0]):
        yield


@pytest.fixture
def full_precision_matmuls():
    """fp32 matmuls at fp32 (not TF32 on GPUs), so that comparisons with an oracle see only the kernels' errors."""
    with jax.default_matmul_precision("highest"):
        yield
