"""jax-triton 0.3's legacy custom call re-lowered as jaxlib's FFI target (checked on the lowered module: CPU has no
Triton launcher to run it)."""

import zlib

import jax
import jax.extend
import jax.numpy as jnp
import pytest
from jax.interpreters import mlir

from liger_jax import _triton_ffi

# A serialized kernel call is zlib-compressed: bytes that are not UTF-8 must survive the move to an FFI attribute.
OPAQUE = zlib.compress(b"kernel call proto \x00\xff")


def _fake_legacy_launch():
    """A primitive lowered as jax-triton 0.3 lowers a launch (API version 2, serialized call in backend_config),
    then moved to the FFI target; operand 1 aliases result 0."""
    primitive = jax.extend.core.Primitive("fake_legacy_triton_launch")
    primitive.multiple_results = True
    primitive.def_abstract_eval(
        lambda x, y: [jax.core.ShapedArray(y.shape, y.dtype), jax.core.ShapedArray(x.shape[:1], jnp.float32)]
    )

    def lowering(ctx, x, y):
        aliases = {1: 0}
        legacy = jax.ffi.ffi_lowering(
            "triton_kernel_call", api_version=2, backend_config=OPAQUE, operand_output_aliases=aliases
        )(ctx, x, y)
        return _triton_ffi.as_ffi_call(ctx, (x, y), legacy, aliases)

    mlir.register_lowering(primitive, lowering)
    return primitive


def _custom_calls(module) -> list:
    calls = []

    def visit(op):
        if op.name == "stablehlo.custom_call":
            calls.append(op)
        return mlir.ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return calls


def test_the_legacy_call_becomes_one_ffi_call_with_the_same_opaque_and_aliases():
    primitive = _fake_legacy_launch()
    x, y = jnp.ones((4, 3), jnp.bfloat16), jnp.ones((2, 5), jnp.float32)
    module = jax.jit(lambda x, y: primitive.bind(x, y)).lower(x, y).compiler_ir("stablehlo")
    [call] = _custom_calls(module)
    attributes = call.attributes
    assert mlir.ir.StringAttr(attributes["call_target_name"]).value == _triton_ffi.FFI_TARGET
    ffi_config = mlir.ir.DictAttr(attributes["mhlo.backend_config"])
    assert mlir.ir.StringAttr(ffi_config["opaque"]).value_bytes == OPAQUE
    assert "operand_index = 1" in str(attributes["output_operand_aliases"])
    assert [str(result.type) for result in call.results] == ["tensor<2x5xf32>", "tensor<4xf32>"]


def test_the_environment_variable_picks_the_custom_call(monkeypatch):
    monkeypatch.delenv(_triton_ffi.ENV_VAR, raising=False)
    expected = "ffi" if _triton_ffi._jaxlib_version() >= (0, 10, 3) else "legacy"
    assert _triton_ffi.custom_call() == expected
    monkeypatch.setenv(_triton_ffi.ENV_VAR, "legacy")
    assert _triton_ffi.custom_call() == "legacy"
    monkeypatch.setenv(_triton_ffi.ENV_VAR, "fast")
    with pytest.raises(ValueError, match=_triton_ffi.ENV_VAR):
        _triton_ffi.custom_call()
