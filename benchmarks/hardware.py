"""The H200's measured ceilings, the floors they imply, and a description of the machine a row was taken on."""

from __future__ import annotations

import importlib.metadata
import platform

# Measured on the H200 (DESIGN.md "Machines"): a large device-to-device copy moves ≈3.4 TB/s counting bytes read
# plus bytes written, and a large bf16 matrix product runs at ≈650 TFLOP/s. The floors below use these, not the
# datasheet's 4.8 TB/s and 990 TFLOP/s.
HBM_BYTES_PER_S = 3.4e12
MATMUL_FLOPS_PER_S = 650e12
# H200 L2 is 60 MB; inputs are rotated over copies adding up to several times this, so no timed call finds its
# inputs in cache.
L2_BYTES = 60 * 2**20

VERSIONED_PACKAGES = (
    "jax",
    "jaxlib",
    "jax-triton",
    "triton",
    "flax",
    "optax",
    "torch",
    "liger-kernel",
    "liger-jax",
    "tokamax",
)


def floor_ms(bytes_moved: float, flops: float) -> float:
    """The least time the work can take: the larger of bytes over HBM bandwidth and flops over matmul rate (ms)."""
    return 1e3 * max(bytes_moved / HBM_BYTES_PER_S, flops / MATMUL_FLOPS_PER_S)


def package_versions() -> dict[str, str]:
    """Installed versions of the packages a result depends on (absent ones are left out)."""
    versions = {"python": platform.python_version()}
    for name in VERSIONED_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def jax_device_description() -> dict[str, object]:
    """The first JAX device: its kind, the backend and (GPU only) its memory limit in bytes."""
    import jax

    device = jax.devices()[0]
    stats = device.memory_stats() or {}
    return {
        "device": f"{jax.default_backend()}:{device.device_kind}",
        "device_memory_bytes": stats.get("bytes_limit"),
    }
