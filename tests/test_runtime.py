"""The launch layer: implementation choice, clear errors, poisoned outputs, guarded outputs, aliasing, zeroed
outputs, bf16 rounding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import triton
import triton.language as tl

from liger_jax import runtime
from tests import harness


@triton.jit
def _copy_first(x_ptr, n, y_ptr, BLOCK: tl.constexpr):
    """Copies the first n elements of x into y and leaves the rest of y unwritten."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=offsets < n), mask=offsets < n)


@triton.jit
def _scale_in_place(x_ptr, y_ptr, factor: tl.constexpr, BLOCK: tl.constexpr):
    """y = factor * x in fp32, rounded to y's dtype (y may alias x)."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    value = tl.load(x_ptr + offsets).to(tl.float32) * factor
    tl.store(y_ptr + offsets, value.to(y_ptr.dtype.element_ty))


@triton.jit
def _fill_range(start, stop, y_ptr, BLOCK: tl.constexpr):
    """Stores 1 at y[start:stop] (start may be negative, stop past the end: no bounds of y are checked)."""
    offsets = start + tl.arange(0, BLOCK)
    tl.store(y_ptr + offsets, tl.full((BLOCK,), 1.0, tl.float32), mask=offsets < stop)


@triton.jit
def _count_programs(count_ptr, last_ptr):
    """Adds 1 per program to count[0]; last[0] gets the count the last program saw (the grid's size - 1)."""
    seen = tl.atomic_add(count_ptr, 1)
    if seen == tl.num_programs(0) - 1:
        tl.store(last_ptr, seen)


def _launch_copy(x, n):
    return runtime.launch(
        _copy_first,
        x,
        n,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(1,),
        implementation=harness.KERNEL_IMPLEMENTATION,
        BLOCK=16,
    )


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_unwritten_outputs_are_poisoned(dtype):
    if harness.KERNEL_IMPLEMENTATION != "interpret":
        pytest.skip("only the interpreter pre-fills outputs; GPU buffers are uninitialised")
    x = harness.random_normal(0, (16,), dtype)
    y = jax.jit(_launch_copy, static_argnums=1)(x, 10)
    np.testing.assert_array_equal(np.asarray(y[:10], np.float32), np.asarray(x[:10], np.float32))
    assert np.isnan(np.asarray(y[10:], np.float32)).all()


@pytest.mark.parametrize(("start", "stop"), [(-1, 5), (3, 9), (0, 8)])
def test_stores_past_an_output_are_caught(start, stop, capfd):
    # One element before or after an [8] output: the interpreter writes raw memory, so the launch checks the guard
    # bands around each output; a host call that raises returns NaN and prints why.
    if harness.KERNEL_IMPLEMENTATION != "interpret":
        pytest.skip("only the interpreter's host buffers carry guard bands")

    def fill():
        out_shape = jax.ShapeDtypeStruct((8,), jnp.float32)
        return runtime.launch(_fill_range, start, stop, out_shape=out_shape, grid=(1,), implementation="interpret",
                              BLOCK=16)  # fmt: skip

    y = np.asarray(jax.jit(fill)())
    if 0 <= start and stop <= 8:
        np.testing.assert_array_equal(y, np.ones(8, np.float32))
    else:
        assert np.isnan(y).all()
        assert "kernel _fill_range stored past the bounds of its output 0" in capfd.readouterr().err


def test_aliased_output_reuses_the_input_values():
    x = harness.random_normal(1, (32,), jnp.float32)
    y = runtime.launch(
        _scale_in_place,
        x,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(2,),
        implementation=harness.KERNEL_IMPLEMENTATION,
        input_output_aliases={0: 0},
        factor=3.0,
        BLOCK=16,
    )
    np.testing.assert_allclose(y, 3.0 * np.asarray(x), rtol=1e-6)


def test_zeroed_outputs_start_at_zero():
    ints = jax.ShapeDtypeStruct((1,), jnp.int32)
    count, last = runtime.launch(
        _count_programs, out_shape=[ints, ints], zeroed_outputs=(0,), grid=(5,),
        implementation=harness.KERNEL_IMPLEMENTATION,
    )  # fmt: skip
    assert (int(count[0]), int(last[0])) == (5, 4)


@pytest.mark.parametrize(("zeroed", "aliases"), [((2,), None), ((-1,), None), ((0,), {0: 0})])
def test_zeroed_outputs_must_name_unaliased_outputs(zeroed, aliases):
    with pytest.raises(ValueError, match="zeroed_outputs"):
        runtime.launch(
            _scale_in_place,
            jnp.ones(16),
            out_shape=[jax.ShapeDtypeStruct((16,), jnp.float32)] * 2,
            grid=(1,),
            implementation=harness.KERNEL_IMPLEMENTATION,
            input_output_aliases=aliases,
            zeroed_outputs=zeroed,
            factor=1.0,
            BLOCK=16,
        )


def test_bfloat16_stores_round_to_nearest_even():
    # 1 + 2^-8 + 2^-9 lies above the midpoint of two bf16 neighbours; truncation would give 1.0.
    x = jnp.asarray([1 + 2**-8 + 2**-9, 1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8 + 2**-9)] * 4, jnp.float32)
    y = runtime.launch(
        _scale_in_place,
        x,
        out_shape=jax.ShapeDtypeStruct(x.shape, jnp.bfloat16),
        grid=(1,),
        implementation=harness.KERNEL_IMPLEMENTATION,
        factor=1.0,
        BLOCK=16,
    )
    np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(x.astype(jnp.bfloat16), np.float32))


def test_positional_floats_are_refused():
    with pytest.raises(TypeError, match="constexpr"):
        runtime.launch(
            _scale_in_place,
            jnp.ones(16),
            2.0,
            out_shape=jax.ShapeDtypeStruct((16,), jnp.float32),
            grid=(1,),
            implementation=harness.KERNEL_IMPLEMENTATION,
        )


def test_bad_grid_is_refused():
    with pytest.raises(ValueError, match="grid"):
        runtime.launch(
            _copy_first,
            jnp.ones(16),
            16,
            out_shape=jax.ShapeDtypeStruct((16,), jnp.float32),
            grid=(0,),
            implementation=harness.KERNEL_IMPLEMENTATION,
            BLOCK=16,
        )


def test_unknown_implementation_names_the_argument():
    with pytest.raises(ValueError, match="implementation must be one of"):
        runtime.resolve_implementation("cuda")


def test_environment_variable_overrides_the_default(monkeypatch):
    monkeypatch.setenv(runtime.ENV_VAR, "xla")
    assert runtime.default_implementation() == "xla"
    monkeypatch.setenv(runtime.ENV_VAR, "fast")
    with pytest.raises(ValueError, match=runtime.ENV_VAR):
        runtime.default_implementation()


def test_triton_without_a_gpu_says_so():
    if jax.default_backend() == "gpu":
        pytest.skip("this machine has a GPU")
    with pytest.raises(ValueError, match="needs a GPU backend"):
        runtime.resolve_implementation("triton")


def test_interpret_without_the_interpreter_flag_says_so(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        runtime.resolve_implementation("interpret")


def _double_and_copy(x_ptr, n, y_ptr, z_ptr, BLOCK: tl.constexpr):
    """y = 2x (y may alias x) and z = x: decorated in the test below, for the GPU and not the interpreter."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    value = tl.load(x_ptr + offsets, mask=offsets < n)
    tl.store(z_ptr + offsets, value, mask=offsets < n)
    tl.store(y_ptr + offsets, value * 2.0, mask=offsets < n)


def test_triton_launch_traces_through_the_installed_jax_triton(monkeypatch):
    """The GPU launch binds to the installed ``triton_call`` (0.3: ``out_shape``, 0.4: ``out_type``, where aliased
    outputs lose their kernel parameter) and survives jit's dead-code elimination (jax 0.12's rule arguments)."""
    pytest.importorskip("jax_triton", reason="jax-triton imports only with a CUDA jaxlib before 0.4")
    from jax.interpreters import partial_eval

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    kernel = triton.jit(_double_and_copy)
    x = jnp.arange(10, dtype=jnp.float32)

    def launch(x):
        return runtime.launch(
            kernel,
            x,
            x.size,
            out_shape=(jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct(x.shape, x.dtype)),
            grid=(1,),
            implementation="triton",
            input_output_aliases={0: 0},
            BLOCK=16,
        )

    jaxpr = jax.make_jaxpr(launch)(x).jaxpr
    (call,) = [eqn for eqn in jaxpr.eqns if eqn.primitive.name == "triton_kernel_call"]
    assert [var.aval.shape for var in call.outvars] == [x.shape, x.shape]
    pruned, _ = partial_eval.dce_jaxpr(jaxpr, [False, True])
    assert [eqn.primitive.name for eqn in pruned.eqns].count("triton_kernel_call") == 1
