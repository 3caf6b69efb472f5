"""What the Tunix recipes share: liger subclasses of Tunix's own module classes, built around the module they replace.

A family's recipe module (``llama3.py``, ``gemma3.py``, ...) is one table ``{Tunix class: recipe}`` given to
:func:`register`; a recipe is :func:`rms_norm`, :func:`gated_mlp` or :func:`rope`. :func:`register` derives, for each
class, a subclass that overrides only the method that computes, and registers it with
:func:`liger_jax.flax_layers.register_swap`. The replacement of a module is an instance of that subclass holding the
module's attributes: its submodules and ``nnx.Param`` objects (shared, never copied) and its settings. So
``nnx.state`` keeps its tree, ``isinstance(replacement, TunixClass)`` holds, and Tunix's own code runs around the
kernels (its remat switches, sharding constraints, KV caches):

* RMSNorm: ``__call__`` is :func:`liger_jax.rms_norm` with the family's numerics (epsilon, offset, casting mode, the
  output dtype), which each family file states against Tunix's code.
* gated MLP: ``block`` gates the module's own projections with :func:`liger_jax.swiglu` or :func:`liger_jax.geglu`,
  then applies Tunix's sharding constraint; Tunix's ``__call__`` (``nnx.remat`` of ``block`` when configured) stays.
* Attention: ``__call__`` is Tunix's own, run while the module-level RoPE function it calls (``apply_rope``; Qwen2's
  ``apply_rotary_embedding``) is liger's :func:`liger_jax.apply_rotary_pos_emb` on the tables Tunix's function would
  build.
* Embedder: ``encode`` is Tunix's own, run on a view of the module whose table gathers by
  :func:`liger_jax.embedding` (the gradient summed in fp32 and rounded once to the table's dtype, where Tunix's
  scatter-adds in the table's dtype: bf16 compare-and-swap additions with bf16 params); its scaling, casts and
  sharding are Tunix's lines. ``decode`` (the tied head) is left as it is.

Why RoPE is a scoped patch rather than an Attention rewritten on the module's projections: the attention blocks are
long and differ per family (fused or grouped qkv einsums, sliding windows, logit soft caps, query norms, TPU splash
attention, KV caches, Gemma4's KV sharing), while RoPE is one call to a module-level function with the positions and
settings as arguments. Swapping that function keeps every line of Tunix's attention and changes only the rotation; a
rewrite would copy about a hundred lines per family and drift from Tunix with each release. The patch is set and
undone around each call, under a lock (it matters while jit traces the call). A thread that runs an unswapped Tunix
attention of the same family at that moment also gets liger's rotation, which computes the same values. Tunix
rotates q and k in two calls, each one launch of the kernel on one tensor.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import sys
import threading
import types
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from liger_jax import runtime
from liger_jax.flax_layers.swap import register_swap
from liger_jax.ops.embedding import embedding as liger_embedding
from liger_jax.ops.glu import geglu, swiglu
from liger_jax.ops.rms_norm import CastingMode
from liger_jax.ops.rms_norm import rms_norm as liger_rms_norm
from liger_jax.ops.rope import apply_rotary_pos_emb

OutputDtype = Literal["input", "promoted", "module"]
_GATES = {"swiglu": swiglu, "geglu": geglu}


class Recipe(NamedTuple):
    """How one Tunix class is swapped: the :data:`liger_jax.flax_layers.KINDS` switch it counts under, the liger
    behaviour mixed into the class, and the family's settings for it."""

    kind: str
    behaviour: type
    options: Any


def register(recipe_module: str, table: Mapping[type, Recipe]) -> None:
    """Registers a liger swap for every Tunix class of ``table``.

    Args:
        recipe_module: ``__name__`` of the calling family file (the liger subclasses are named as defined there).
        table: ``{Tunix module class: recipe}``.
    """
    for cls, recipe in table.items():
        attributes = {"__module__": recipe_module, "liger_options": recipe.options, "liger_replaces": cls}
        bases = (recipe.behaviour, cls)
        liger_cls = types.new_class(cls.__name__, bases, exec_body=lambda namespace, a=attributes: namespace.update(a))
        register_swap(cls, liger_cls, kind=recipe.kind)


class _Rebound:
    """Mixed in before a Tunix class: the object is built around the module it replaces, not by Tunix's __init__.

    Class attributes set by :func:`register`: ``liger_options`` (the recipe's options), ``liger_replaces`` (the Tunix
    class).
    """

    liger_options: Any
    liger_replaces: type

    def __init__(self, module: nnx.Module, implementation: runtime.Implementation | None):
        set_up_by_nnx = set(vars(self))  # NNX's own bookkeeping of this object, made before __init__ runs
        for name, value in vars(module).items():
            if name not in set_up_by_nnx:
                setattr(self, name, value)
        self.liger_implementation = implementation


@dataclasses.dataclass(frozen=True)
class NormNumerics:
    """A Tunix RMSNorm's numerics, in :func:`liger_jax.rms_norm`'s terms.

    Attributes:
        weight: the attribute holding the ``nnx.Param`` ``[D]``.
        epsilon: the value added to ``mean(x²)``, or the name of the attribute holding it.
        casting_mode: where the result is rounded (see :func:`liger_jax.rms_norm`).
        offset: added to the weight (1.0 for Gemma's ``x * (1 + scale)``).
        dtype: the output dtype: x's (``"input"``), x's promoted with the weight's (``"promoted"``) or the module's
            ``dtype`` attribute (``"module"``). The kernel computes in x's dtype promoted with it, then casts.
    """

    weight: str
    epsilon: float | str
    casting_mode: CastingMode
    offset: float = 0.0
    dtype: OutputDtype = "input"


class _RMSNorm(_Rebound):
    liger_options: NormNumerics

    def __call__(self, x: jax.Array) -> jax.Array:
        numerics = self.liger_options
        weight = getattr(self, numerics.weight)[...]
        match numerics.dtype:
            case "input":
                dtype = x.dtype
            case "promoted":
                dtype = jnp.result_type(x, weight)
            case "module":
                dtype = self.dtype
        epsilon = getattr(self, numerics.epsilon) if isinstance(numerics.epsilon, str) else numerics.epsilon
        y = liger_rms_norm(
            x.astype(jnp.promote_types(x.dtype, dtype)),
            weight,
            epsilon=epsilon,
            offset=numerics.offset,
            casting_mode=numerics.casting_mode,
            implementation=self.liger_implementation,
        )
        return y.astype(dtype)


def rms_norm(
    *,
    weight: str,
    epsilon: float | str,
    casting_mode: CastingMode,
    offset: float = 0.0,
    dtype: OutputDtype = "input",
) -> Recipe:
    """The recipe of a Tunix RMSNorm (kind ``"rms_norm"``); arguments as the fields of :class:`NormNumerics`."""
    if dtype not in OutputDtype.__args__:
        raise ValueError(f"dtype must be one of {OutputDtype.__args__}, got {dtype!r}")
    return Recipe("rms_norm", _RMSNorm, NormNumerics(weight, epsilon, casting_mode, offset, dtype))


@dataclasses.dataclass(frozen=True)
class MLPOptions:
    """A Tunix gated MLP: its gate op and the sharding constraint Tunix puts on the gated activations (or None)."""

    gate: Callable[..., jax.Array]
    constrain: Callable[[Any, jax.Array], jax.Array] | None


class _GatedMLP(_Rebound):
    liger_options: MLPOptions

    def block(self, x: jax.Array) -> jax.Array:
        options = self.liger_options
        activations = options.gate(self.gate_proj(x), self.up_proj(x), implementation=self.liger_implementation)
        if options.constrain is not None:
            activations = options.constrain(self, activations)
        return self.down_proj(activations)


def gated_mlp(gate: Literal["swiglu", "geglu"], *, constrain: Callable[[Any, jax.Array], jax.Array] | None) -> Recipe:
    """The recipe of a Tunix MLP computing ``down_proj(act(gate_proj(x)) * up_proj(x))`` in its ``block`` method.

    Args:
        gate: ``"swiglu"`` (SiLU, Llama and Qwen) or ``"geglu"`` (tanh-approximated GELU, Gemma); also the kind.
        constrain: ``(mlp, activations) -> activations``, Tunix's sharding constraint on the gated activations,
            or None where the family has none.
    """
    if gate not in _GATES:
        raise ValueError(f"gate must be one of {tuple(_GATES)}, got {gate!r}")
    return Recipe(gate, _GatedMLP, MLPOptions(_GATES[gate], constrain))


class _Embedder(_Rebound):
    liger_options: str  # the attribute holding the [V, D] table

    def encode(self, x: jax.Array) -> jax.Array:
        return self.liger_replaces.encode(_GatheringView(self), x)


class _GatheringView:
    """A Tunix Embedder seen by its own ``encode``: every attribute is the module's, but ``table[(ids,)]`` of its
    table is :func:`liger_jax.embedding` of the rows."""

    def __init__(self, module: _Embedder):
        self._module = module

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._module, name)
        return _Table(value, self._module.liger_implementation) if name == self._module.liger_options else value


@dataclasses.dataclass(frozen=True)
class _Table:
    param: nnx.Param
    implementation: runtime.Implementation | None

    def __getitem__(self, key):
        (ids,) = key if isinstance(key, tuple) else (key,)  # Tunix writes table[(ids,)]
        return liger_embedding(self.param[...], ids, implementation=self.implementation)


def embedder(table: str = "input_embedding") -> Recipe:
    """The recipe of a Tunix Embedder whose ``encode`` gathers rows as ``self.<table>[(ids,)]`` (kind
    ``"embedding"``); ``table`` names the ``nnx.Param`` ``[V, D]``."""
    return Recipe("embedding", _Embedder, table)


HalfTables = Callable[..., tuple[jax.Array, jax.Array]]


@dataclasses.dataclass(frozen=True)
class RoPEOptions:
    """The module-level RoPE function a Tunix Attention calls, and how liger computes its result.

    Attributes:
        function: its name in the Tunix class's module.
        rotates: its argument holding the ``[B, S, H, D]`` tensor it rotates.
        half_tables: called with all of its arguments by name (defaults filled in); returns ``(cos, sin)``, each
            ``[B, S, D/2]``, the rotate-half tables of one angle per pair, in the dtype the rotation uses them.
    """

    function: str
    rotates: str
    half_tables: HalfTables


class _RoPEAttention(_Rebound):
    liger_options: RoPEOptions

    def __call__(self, *args, **kwargs):
        options = self.liger_options
        library = sys.modules[self.liger_replaces.__module__]
        make_rotation = functools.partial(_liger_rotation, options, self.liger_implementation)
        with _patched(library, options.function, make_rotation):
            return super().__call__(*args, **kwargs)


def rope(function: str, half_tables: HalfTables, *, rotates: str = "inputs") -> Recipe:
    """The recipe of a Tunix Attention whose RoPE is the module-level ``function`` (kind ``"rope"``).

    Args:
        function: the function's name in the Tunix module (``"apply_rope"``).
        half_tables: see :class:`RoPEOptions`.
        rotates: the function's argument holding the tensor it rotates.
    """
    return Recipe("rope", _RoPEAttention, RoPEOptions(function, rotates, half_tables))


_PATCH_LOCK = threading.RLock()


@contextlib.contextmanager
def _patched(namespace: types.ModuleType, name: str, make_replacement: Callable[[Callable], Callable]) -> Iterator:
    """Sets ``namespace.name`` to ``make_replacement(original)`` while the context is open."""
    with _PATCH_LOCK:
        original = getattr(namespace, name)
        setattr(namespace, name, make_replacement(original))
        try:
            yield
        finally:
            setattr(namespace, name, original)


def _liger_rotation(options: RoPEOptions, implementation: runtime.Implementation | None, original: Callable):
    """A stand-in for Tunix's RoPE function ``original``: same signature, the kernel's rotation."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def rotation(*args, **kwargs):
        arguments = signature.bind(*args, **kwargs)
        arguments.apply_defaults()
        cos, sin = options.half_tables(**arguments.arguments)
        return rotate_half(arguments.arguments[options.rotates], cos, sin, implementation=implementation)

    return rotation


def rotate_half(
    x: jax.Array, cos: jax.Array, sin: jax.Array, *, implementation: runtime.Implementation | None = None
) -> jax.Array:
    """``concat(x1·cos - x2·sin, x2·cos + x1·sin)`` for ``x = concat(x1, x2)`` ``[B, S, H, D]``, by the RoPE kernel.

    Args:
        x: ``[B, S, H, D]``, D even.
        cos, sin: ``[B, S, D/2]`` (or ``[S, D/2]``, ``[1, S, D/2]``), one angle per pair.
        implementation: ``"triton"``, ``"interpret"``, ``"xla"`` or None for the default.

    Returns:
        The rotated ``x``, its shape and dtype; computed in fp32, rounded once.
    """
    cos, sin = (jnp.concatenate([table, table], axis=-1) for table in (cos, sin))
    rotated, _ = apply_rotary_pos_emb(x, None, cos, sin, implementation=implementation)
    return rotated


def timescale(head_dim: int, base: float) -> jax.Array:
    """``base ** (2i / head_dim)`` for each of the ``head_dim // 2`` pairs in fp32, as Tunix's ``apply_rope``."""
    return base ** (2 * jnp.arange(0, head_dim // 2, dtype=jnp.float32) / head_dim)


def sinusoids(positions: jax.Array, timescales: jax.Array, scale_factor: float = 1.0) -> tuple[jax.Array, jax.Array]:
    """Tunix's RoPE tables: ``cos`` and ``sin`` of ``positions / timescales / scale_factor``.

    Args:
        positions: ``[B, S]`` integer positions.
        timescales: ``[D/2]`` fp32, one per pair (``inf`` leaves a pair unrotated).
        scale_factor: Tunix's positional interpolation (Gemma3, Gemma4), ≥ 1.

    Returns:
        ``(cos, sin)``, each ``[B, S, D/2]`` fp32.

    Raises:
        ValueError: ``scale_factor`` is below 1, as Tunix raises.
    """
    if scale_factor < 1.0:
        raise ValueError(f"scale_factor must be >= 1.0, got {scale_factor}")
    angles = positions[..., jnp.newaxis] / timescales[jnp.newaxis, jnp.newaxis, :] / scale_factor
    return jnp.cos(angles), jnp.sin(angles)
