"""jax-triton 0.3's legacy custom call re-lowered as jaxlib's FFI target (checked on the lowered module: CPU has no
Triton launcher to run it)."""

import zlib

import jax
import jax.extend
import jax.numpy as jnp
import pytest
from jax.interpreters import mlir

from liger_jax import _triton_ffi, _wire

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


def _triton_proto_classes():
    """``(TritonAnyKernelCall, TritonKernelCall, TritonKernel)`` built by protobuf from the part of jaxlib's
    jaxlib/gpu/triton.proto (0.11) that a launch fills: an oracle for the hand-written wire format."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name="liger_jax_test_triton.proto", package="jax_triton", syntax="proto3")

    def message(name, *fields):
        proto = file.message_type.add(name=name)
        for number, field_name, kind, type_name, repeated in fields:
            label = field.LABEL_REPEATED if repeated else field.LABEL_OPTIONAL
            proto.field.add(name=field_name, number=number, type=kind, type_name=type_name, label=label)
        return proto

    message(
        "TritonKernel",
        (1, "kernel_name", field.TYPE_STRING, None, False),
        (2, "num_warps", field.TYPE_UINT32, None, False),
        (3, "shared_mem_bytes", field.TYPE_UINT32, None, False),
        (4, "ptx", field.TYPE_STRING, None, False),
        (5, "ttir", field.TYPE_STRING, None, False),
        (6, "compute_capability", field.TYPE_UINT32, None, False),
        (12, "global_scratch_size", field.TYPE_UINT32, None, False),
        (13, "global_scratch_align", field.TYPE_UINT32, None, False),
    )
    message(
        "Parameter",
        (3, "i32", field.TYPE_INT32, None, False),
        (7, "f32", field.TYPE_FLOAT, None, False),
        (8, "f64", field.TYPE_DOUBLE, None, False),
    )
    message(
        "TritonKernelCall",
        (1, "kernel", field.TYPE_MESSAGE, ".jax_triton.TritonKernel", False),
        (2, "grid_0", field.TYPE_UINT32, None, False),
        (5, "parameters", field.TYPE_MESSAGE, ".jax_triton.Parameter", True),
    )
    message(
        "TritonAnyKernelCall",
        (1, "kernel_call", field.TYPE_MESSAGE, ".jax_triton.TritonKernelCall", False),
        (3, "metadata", field.TYPE_BYTES, None, False),
        (4, "name", field.TYPE_STRING, None, False),
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return tuple(
        message_factory.GetMessageClass(pool.FindMessageTypeByName(f"jax_triton.{name}"))
        for name in ("TritonAnyKernelCall", "TritonKernelCall", "TritonKernel")
    )


def _serialized_call(ptx: str):
    """A launch's call as jax-triton 0.3 serializes it (every wire type in it), and its protobuf message."""
    any_call_class, _, _ = _triton_proto_classes()
    call = any_call_class(name="liger_jax.rms_norm_bwd", metadata=b"\x00\xffmeta")
    call.kernel_call.grid_0 = 300
    kernel = call.kernel_call.kernel
    kernel.kernel_name, kernel.num_warps, kernel.shared_mem_bytes = "rms_norm_bwd", 16, 98320
    kernel.ptx, kernel.ttir, kernel.compute_capability = ptx, "module { tt.func }", 90
    call.kernel_call.parameters.add(i32=-7)
    call.kernel_call.parameters.add(f32=0.25)
    call.kernel_call.parameters.add(f64=1e-300)
    return zlib.compress(call.SerializeToString()), call


@pytest.fixture
def jaxlib_with_global_scratch(monkeypatch):
    """The jaxlib the GPU image has (0.11.2), whatever this machine's."""
    monkeypatch.setattr(_triton_ffi, "_jaxlib_version", lambda: (0, 11, 2))


TWO_DESCRIPTORS = (
    ".entry k(\n tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.gpu.sync.aligned\n" * 2
)


def test_a_kernel_with_descriptors_gets_128_bytes_of_global_scratch_each_and_the_rest_of_its_call_unchanged(
    jaxlib_with_global_scratch,
):
    serialized, call = _serialized_call(TWO_DESCRIPTORS)
    with_scratch = type(call).FromString(zlib.decompress(_triton_ffi.with_global_scratch(serialized)))
    assert with_scratch.kernel_call.kernel.global_scratch_size == 2 * _triton_ffi.DESCRIPTOR_SCRATCH_BYTES == 256
    assert with_scratch.kernel_call.kernel.global_scratch_align == 128
    call.kernel_call.kernel.global_scratch_size, call.kernel_call.kernel.global_scratch_align = 256, 128
    assert with_scratch == call


def test_a_kernel_without_descriptors_keeps_its_call_byte_for_byte():
    serialized, _ = _serialized_call(".entry k(\n ld.global.v4.b32\n")
    assert _triton_ffi.with_global_scratch(serialized) == serialized


def test_descriptors_under_a_jaxlib_without_global_scratch_raise(monkeypatch):
    monkeypatch.setattr(_triton_ffi, "_jaxlib_version", lambda: (0, 10, 3))
    serialized, _ = _serialized_call(TWO_DESCRIPTORS)
    with pytest.raises(ValueError, match="jaxlib >= 0.11.2"):
        _triton_ffi.with_global_scratch(serialized)


def test_the_lowered_launch_carries_the_global_scratch_into_the_ffi_call(jaxlib_with_global_scratch):
    serialized, call = _serialized_call(TWO_DESCRIPTORS)
    primitive = jax.extend.core.Primitive("fake_legacy_launch_with_descriptors")
    primitive.def_abstract_eval(lambda x: jax.core.ShapedArray(x.shape, x.dtype))
    primitive.multiple_results = False

    def lowering(ctx, x):
        legacy = jax.ffi.ffi_lowering("triton_kernel_call", api_version=2, backend_config=serialized)(ctx, x)
        _triton_ffi.give_global_scratch(legacy[0].owner)
        return _triton_ffi.as_ffi_call(ctx, (x,), legacy, {})

    mlir.register_lowering(primitive, lowering)
    module = jax.jit(primitive.bind).lower(jnp.ones((3,), jnp.float32)).compiler_ir("stablehlo")
    [ffi_call] = _custom_calls(module)
    opaque = mlir.ir.StringAttr(mlir.ir.DictAttr(ffi_call.attributes["mhlo.backend_config"])["opaque"]).value_bytes
    kernel = type(call).FromString(zlib.decompress(opaque)).kernel_call.kernel
    assert (kernel.global_scratch_size, kernel.global_scratch_align, kernel.ptx) == (256, 128, TWO_DESCRIPTORS)


@pytest.mark.parametrize("message", [b"\x08", b"\x12\x05ab", b"\x0b\x00"], ids=["cut_varint", "cut_bytes", "group"])
def test_malformed_messages_raise(message):
    with pytest.raises(ValueError):
        _wire.fields(message)


def test_the_wire_format_splits_and_joins_every_wire_type_byte_for_byte():
    _, call = _serialized_call(TWO_DESCRIPTORS)
    serialized = call.SerializeToString()
    assert _wire.encode(_wire.fields(serialized)) == serialized
    parameters = [payload for number, _, payload in _wire.fields(_wire.field(serialized, 1)) if number == 5]
    assert [_wire.fields(p)[0][:2] for p in parameters] == [(3, _wire.VARINT), (7, _wire.FIXED32), (8, _wire.FIXED64)]
