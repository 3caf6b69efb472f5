"""The H200's measured ceilings, the floors they imply, and a description of the machine a row was taken on."""

from __future__ import annotations

import importlib.metadata
import platform

# Measured ceilings by JAX device kind: a large device-to-device copy's bytes read plus written per second, and a
# large bf16 matrix product's rate (H200: DESIGN.md "Machines"; H100: the device tool's KINDS.md copy, 3.0 TB/s,
# and a JAX 8192³ product, 646 TFLOP/s, 2026-12-05). The floors use these, not the datasheets' 4.8 / 3.35 TB/s and
# 990 TFLOP/s. Other devices (and CPU smoke runs) get the H200's.
CEILINGS = {
    "NVIDIA H200": (3.4e12, 650e12),
    "NVIDIA H100 80GB HBM3": (3.0e12, 650e12),
}
# H200 L2 is 60 MB (the H100's 50): inputs are rotated over copies adding up to several times this, so no timed call
# finds its inputs in cache.
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


def ceilings() -> tuple[float, float]:
    """``(HBM bytes/s, bf16 matmul flop/s)`` of the first JAX device, from :data:`CEILINGS` (the H200's when its kind
    is not listed)."""
    import jax

    return CEILINGS.get(jax.devices()[0].device_kind, CEILINGS["NVIDIA H200"])


def floor_ms(bytes_moved: float, flops: float) -> float:
    """The least time the work can take on this device: the larger of bytes over its HBM bandwidth and flops over its
    matmul rate (ms)."""
    bandwidth, rate = ceilings()
    return 1e3 * max(bytes_moved / bandwidth, flops / rate)


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
