"""Swapping liger_jax kernels into an existing Flax model: :func:`apply_liger` (NNX) and :func:`liger_intercept`
(linen), driven by one registry of ``module class → replacement`` (:func:`register_swap`).

Example (NNX, in place; params, optimizer state and checkpoints carry over)::

    model = MyModel(rngs=nnx.Rngs(0))
    counts = apply_liger(model)          # {"rms_norm": 9, "layer_norm": 0, ...}

Example (linen; trace jit inside the context)::

    with liger_intercept():
        params = model.init(key, x)
        train_step = jax.jit(train_step).lower(params, batch).compile()
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import warnings
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import flax.linen as nn
from flax import nnx
from flax.nnx import graphlib

from liger_jax import runtime
from liger_jax.flax_layers import linen as liger_linen
from liger_jax.flax_layers import nnx as liger_nnx

KINDS: tuple[str, ...] = (
    "rms_norm",
    "fused_add_rms_norm",
    "layer_norm",
    "group_norm",
    "swiglu",
    "geglu",
    "rope",
    "fused_linear_cross_entropy",
    "embedding",
    "custom",
)

# Other libraries' models: the classes defined in modules under each prefix are swapped by the recipes of the named
# liger_jax module, which registers them (register_swap) when imported. It is imported the first time apply_liger or
# liger_intercept meets such a class, so importing liger_jax never imports the library. Adding a model family is one
# recipe module and one line here.
_RECIPE_MODULES: dict[str, str] = {
    f"tunix.models.{family}.": f"liger_jax.integrations.tunix.{family}"
    for family in ("gemma", "gemma3", "gemma4", "llama3", "qwen2", "qwen3")
}

MakeReplacement = Callable[[Any, "runtime.Implementation | None"], Any]


class _Swap(NamedTuple):
    kind: str
    make: MakeReplacement


_NNX_SWAPS: dict[type, _Swap] = {}
_LINEN_SWAPS: dict[type, _Swap] = {}


def register_swap(cls: type, make_replacement: MakeReplacement, *, kind: str = "custom") -> None:
    """Registers how modules of exactly class ``cls`` are replaced by liger-backed ones.

    ``make_replacement(module, implementation)`` returns the replacement, or None to leave this module as it is
    (an option the kernels do not compute).

    * NNX (``cls`` subclasses ``nnx.Module``): the replacement must hold ``module``'s own ``nnx.Variable`` objects
      at the same attribute paths (reuse its submodules and Params; never copy them). :func:`apply_liger` checks
      this, so ``nnx.state(model)`` keeps its tree and the optimizer state stays valid.
    * linen (``cls`` subclasses ``flax.linen.Module``): the replacement is an unbound module (construct it with
      ``parent=None``) whose ``__call__`` declares the same variables as ``module``'s; :func:`liger_intercept`
      binds it to ``module``'s scope, so it reads and initialises ``module``'s own params.

    Only the exact class matches (a subclass may compute something else); register subclasses separately.
    Registering a class again replaces its entry.

    Args:
        cls: the module class to swap.
        make_replacement: ``(module, implementation) -> replacement | None``; ``implementation`` is the one given
            to :func:`apply_liger` / :func:`liger_intercept` (None: the default).
        kind: which switch of :func:`apply_liger` / :func:`liger_intercept` turns this swap on and which count it
            adds to; one of :data:`KINDS`.

    Raises:
        ValueError: ``kind`` is unknown.
        TypeError: ``cls`` is neither an NNX nor a linen module class.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if isinstance(cls, type) and issubclass(cls, nnx.Module):
        _NNX_SWAPS[cls] = _Swap(kind, make_replacement)
    elif isinstance(cls, type) and issubclass(cls, nn.Module):
        _LINEN_SWAPS[cls] = _Swap(kind, make_replacement)
    else:
        raise TypeError(f"cls must be a flax.nnx.Module or flax.linen.Module subclass, got {cls!r}")


def _registered(swaps: dict[type, _Swap], cls: type) -> _Swap | None:
    """The swap registered for ``cls``, after importing the recipes for its module (once) if it has any."""
    for prefix, recipes in list(_RECIPE_MODULES.items()):
        if cls.__module__.startswith(prefix):
            importlib.import_module(recipes)
            _RECIPE_MODULES.pop(prefix, None)
    return swaps.get(cls)


def swapped_or_none(module: Any, implementation: runtime.Implementation | None, *, kind: str) -> Any | None:
    """The replacement :func:`apply_liger` would make for the NNX ``module`` if its ``kind`` were on (for a swap that
    builds on another: a layer fusing its norm), or None where no swap of that kind is registered for its class or
    the swap declines it."""
    swap = _registered(_NNX_SWAPS, type(module))
    return swap.make(module, implementation) if swap is not None and swap.kind == kind else None


def _enabled_kinds(implementation: runtime.Implementation | None, switches: dict[str, Any]) -> frozenset[str]:
    """Validates ``implementation`` (when given) and returns the kinds whose switch is on in ``switches`` (the
    caller's arguments, one per kind in :data:`KINDS`)."""
    if implementation is not None:
        runtime.resolve_implementation(implementation)
    return frozenset(kind for kind in KINDS if switches[kind])


def apply_liger(
    model: nnx.Module,
    *,
    rms_norm: bool = True,
    fused_add_rms_norm: bool = True,
    layer_norm: bool = True,
    group_norm: bool = True,
    swiglu: bool = True,
    geglu: bool = True,
    rope: bool = True,
    fused_linear_cross_entropy: bool = True,
    embedding: bool = True,
    custom: bool = True,
    implementation: runtime.Implementation | None = None,
) -> dict[str, int]:
    """Replaces, in place, every registered submodule of an NNX ``model`` with its liger-backed twin.

    Built in: ``nnx.RMSNorm`` → :class:`liger_jax.flax_layers.nnx.RMSNorm`, ``nnx.LayerNorm`` →
    :class:`liger_jax.flax_layers.nnx.LayerNorm`, ``nnx.GroupNorm`` → :class:`liger_jax.flax_layers.nnx.GroupNorm`
    and ``nnx.Embed`` → :class:`liger_jax.flax_layers.nnx.Embed` (kind ``embedding``);
    :mod:`liger_jax.models` registers its Llama's MLP (SwiGLU), RoPE, LM head (fused linear cross-entropy) and
    decoder layer (the residual add before the MLP fused with the RMSNorm after it, ``fused_add_rms_norm``);
    Tunix's Llama3, Qwen2, Qwen3, Gemma, Gemma3 and Gemma4 models get their RMSNorms, gated MLPs and RoPE swapped
    (:mod:`liger_jax.integrations.tunix`, imported on first sight of a Tunix class); :func:`register_swap` adds
    your own classes. Each replacement holds the module's own ``nnx.Param`` objects (nothing is copied), so
    ``nnx.state(model)`` has the same tree and leaves before and after, and outputs agree with the flax model within
    the kernels' tolerance. A module shared by several parents is replaced once, everywhere. Modules whose options
    the kernels do not compute (e.g. normalising over several axes) are left as they are, with a warning.

    Swap before ``nnx.split``/``jax.jit`` tracing: a function traced earlier keeps the flax modules.

    Args:
        model: the NNX module whose submodules are swapped (the root itself is not).
        rms_norm, fused_add_rms_norm, layer_norm, group_norm, swiglu, geglu, rope, fused_linear_cross_entropy,
            embedding, custom: which kinds to swap (``custom`` is every registration without one of the other kinds).
        implementation: passed to every replacement ("triton", "interpret", "xla"; None: the default).

    Returns:
        ``{kind: number of modules replaced}`` for every kind in :data:`KINDS`.

    Raises:
        TypeError: ``model`` is not an ``nnx.Module``.
        ValueError: the root itself is registered, a registered module sits in an immutable container (a tuple;
            use ``nnx.List``), or a replacement does not hold the module's own Variables.
    """
    if not isinstance(model, nnx.Module):
        raise TypeError(f"model must be a flax.nnx.Module, got {type(model).__name__}")
    enabled = _enabled_kinds(implementation, locals())
    swap = _registered(_NNX_SWAPS, type(model))
    if swap is not None and swap.kind in enabled:
        raise ValueError(
            f"apply_liger replaces submodules in place and cannot replace the model itself, a "
            f"{type(model).__name__}; build the liger module directly or wrap it in a parent module"
        )
    walk = _NnxSwapWalk(enabled, implementation)
    walk.visit(model, ())
    if walk.left:
        warnings.warn(
            f"apply_liger left {', '.join(walk.left)} as they are: their options are not computed by the liger_jax "
            "kernels",
            stacklevel=2,
        )
    return walk.counts


class _NnxSwapWalk:
    """Post-order walk of an NNX graph that replaces registered modules through their parents' ``set_key``."""

    def __init__(self, enabled: frozenset[str], implementation: runtime.Implementation | None):
        self.enabled = enabled
        self.implementation = implementation
        self.counts = dict.fromkeys(KINDS, 0)
        self.left: list[str] = []  # registered modules whose make_replacement declined them
        self.visited: set[int] = set()
        self.replaced: dict[int, Any] = {}

    def visit(self, node: Any, path: tuple) -> Any:
        """Swaps inside ``node`` and returns ``node`` or its replacement."""
        if id(node) in self.replaced:
            return self.replaced[id(node)]
        if id(node) in self.visited:
            return node
        self.visited.add(id(node))
        node_impl = graphlib.get_node_impl(node)
        for key, child in node_impl.node_dict(node).items():
            if isinstance(child, nnx.Variable) or graphlib.get_node_impl(child) is None:
                continue
            new_child = self.visit(child, (*path, key))
            if new_child is not child:
                if node_impl.set_key is None:
                    raise ValueError(
                        f"apply_liger cannot replace the module at {_format(path, key)}: it sits in an immutable "
                        f"{type(node).__name__}; hold submodules in nnx.List / nnx.Dict or a list"
                    )
                node_impl.set_key(node, key, new_child)
        return self._swapped(node, path)

    def _swapped(self, module: Any, path: tuple) -> Any:
        swap = _registered(_NNX_SWAPS, type(module))
        if swap is None or swap.kind not in self.enabled:
            return module
        replacement = swap.make(module, self.implementation)
        if replacement is None:
            self.left.append(f"{_format(path)} ({type(module).__name__})")
            return module
        _check_same_variables(module, replacement, path)
        self.counts[swap.kind] += 1
        self.replaced[id(module)] = replacement
        return replacement


def _format(path: tuple, *more: Any) -> str:
    return "model." + ".".join(str(part) for part in (*path, *more)) if path or more else "model"


def _variables(module: Any) -> dict[tuple, nnx.Variable]:
    return {path: node for path, node in nnx.iter_graph(module) if isinstance(node, nnx.Variable)}


def _check_same_variables(module: Any, replacement: Any, path: tuple) -> None:
    """Raises ValueError unless ``replacement`` holds exactly ``module``'s Variable objects at the same paths."""
    before, after = _variables(module), _variables(replacement)
    if before.keys() != after.keys() or any(before[key] is not after[key] for key in before):
        raise ValueError(
            f"the replacement {type(replacement).__name__} for the {type(module).__name__} at {_format(path)} must "
            f"hold the module's own nnx.Variable objects at the same paths (got {sorted(after)} for "
            f"{sorted(before)}, or copies); reuse the module's submodules and Params"
        )


def _rebuild_nnx(liger_cls: type, module: nnx.Module, **extra: Any) -> nnx.Module:
    """A ``liger_cls`` built with ``module``'s constructor arguments and holding ``module``'s own Variables.

    For drop-in twins whose constructor takes the flax class's arguments: the arguments ``type(module).__init__``
    takes and ``module`` stores as attributes of the same name are passed on (and ``rngs`` when it takes one),
    plus ``extra``, which takes the place of stored values (a constructor argument the module does not store, or
    stores otherwise); the twin is built
    abstractly (``nnx.eval_shape``, nothing allocated), then each ``nnx.Variable`` attribute of ``module`` is set
    on it.

    Args:
        liger_cls: the twin class (an ``nnx.Module``).
        module: the flax module it replaces.
        **extra: further constructor keywords (``implementation=``, ...).

    Returns:
        The ``liger_cls`` instance.
    """
    stored = vars(module)
    parameters = inspect.signature(type(module).__init__).parameters
    positional, keywords, by_keyword = [], {}, False
    for name, parameter in list(parameters.items())[1:]:  # after self
        if name in extra or name not in stored:
            # The arguments after one that is not passed positionally go by name.
            by_keyword = True
        elif parameter.kind is inspect.Parameter.KEYWORD_ONLY or by_keyword:
            keywords[name] = stored[name]
        else:
            positional.append(stored[name])
    # The abstract twin's own Params are initialised from throwaway rngs, then replaced.
    rngs = (lambda: {"rngs": nnx.Rngs(0)}) if "rngs" in parameters else dict
    twin = nnx.eval_shape(lambda: liger_cls(*positional, **keywords, **extra, **rngs()))
    for name, value in stored.items():
        if isinstance(value, nnx.Variable):
            setattr(twin, name, value)
    return twin


@contextlib.contextmanager
def liger_intercept(
    *,
    rms_norm: bool = True,
    fused_add_rms_norm: bool = True,
    layer_norm: bool = True,
    group_norm: bool = True,
    swiglu: bool = True,
    geglu: bool = True,
    rope: bool = True,
    fused_linear_cross_entropy: bool = True,
    embedding: bool = True,
    custom: bool = True,
    implementation: runtime.Implementation | None = None,
) -> Iterator[dict[str, int]]:
    """Routes linen modules to the liger_jax kernels while the context is open (``flax.linen.intercept_methods``).

    Calls of ``nn.RMSNorm`` / ``nn.LayerNorm`` / ``nn.GroupNorm`` / ``nn.Embed`` (and classes registered with
    :func:`register_swap`) run their liger twin bound to the module's own scope: the same param names and tree,
    during ``init`` and ``apply``. The model's code and params are untouched; leave the context and the flax modules
    run again.

    Interception happens when the model is traced. ``jax.jit`` must therefore trace *inside* the context, and a
    jitted function first traced inside keeps the kernels in its compiled cache even when later called outside
    (and vice versa): jit a fresh function per mode.

    Args:
        rms_norm, fused_add_rms_norm, layer_norm, group_norm, swiglu, geglu, rope, fused_linear_cross_entropy,
            embedding, custom: which kinds to route.
        implementation: passed to every replacement ("triton", "interpret", "xla"; None: the default).

    Yields:
        ``{kind: number of intercepted calls}``, counted as modules are traced (a call inside a jitted function
        counts once per trace).
    """
    enabled = _enabled_kinds(implementation, locals())
    counts = dict.fromkeys(KINDS, 0)

    def interceptor(next_fun, args, kwargs, context):
        swap = _registered(_LINEN_SWAPS, type(context.module))
        if swap is None or swap.kind not in enabled or context.method_name != "__call__":
            return next_fun(*args, **kwargs)
        replacement = swap.make(context.module, implementation)
        if replacement is None:
            return next_fun(*args, **kwargs)
        counts[swap.kind] += 1
        return replacement.clone(parent=context.module.scope)(*args, **kwargs)

    with nn.intercept_methods(interceptor):
        yield counts


def _last_axis_only(module: Any) -> bool:
    """Whether a flax norm's options are ones the kernels compute: last-axis statistics, no cross-device groups."""
    return (
        all(axes in (-1, (-1,)) for axes in (module.reduction_axes, module.feature_axes))
        and module.axis_name is None
        and module.axis_index_groups is None
        and getattr(module, "force_float32_reductions", True)
    )


def _default_group_axes(module: Any) -> bool:
    """Whether a flax GroupNorm's options are ones the kernels compute: flax's default reduction axes (every axis
    but the first), no cross-device groups."""
    return (
        module.reduction_axes is None
        and module.axis_name is None
        and module.axis_index_groups is None
        and getattr(module, "force_float32_reductions", True)
    )


def _nnx_twin(liger_cls: type, supported: Callable[[Any], bool] = _last_axis_only) -> MakeReplacement:
    def make(module, implementation):
        return _rebuild_nnx(liger_cls, module, implementation=implementation) if supported(module) else None

    return make


def _nnx_group_norm_twin(module: nnx.GroupNorm, implementation: runtime.Implementation | None) -> nnx.Module | None:
    """The liger twin of an ``nnx.GroupNorm``, which stores its group count and size but not ``num_features``."""
    if not _default_group_axes(module):
        return None
    return _rebuild_nnx(
        liger_nnx.GroupNorm,
        module,
        num_features=module.num_groups * module.group_size,
        num_groups=module.num_groups,
        group_size=None,
        implementation=implementation,
    )


def _linen_twin(liger_cls: type, supported: Callable[[Any], bool] = _last_axis_only) -> MakeReplacement:
    def make(module, implementation):
        if not supported(module):
            return None
        fields = {f.name: getattr(module, f.name) for f in dataclasses.fields(module) if f.init}
        del fields["parent"], fields["name"]
        return liger_cls(**fields, implementation=implementation, parent=None)

    return make


_FLAX_PROMOTIONS = (inspect.signature(nnx.Embed.__init__).parameters["promote_dtype"].default, nn.Embed.promote_dtype)


def _flax_promotion(module: Any) -> bool:
    """Whether a flax Embed promotes dtypes as flax does by default (a custom ``promote_dtype`` is left alone)."""
    return module.promote_dtype in _FLAX_PROMOTIONS


register_swap(nnx.RMSNorm, _nnx_twin(liger_nnx.RMSNorm), kind="rms_norm")
register_swap(nn.RMSNorm, _linen_twin(liger_linen.RMSNorm), kind="rms_norm")
register_swap(nnx.LayerNorm, _nnx_twin(liger_nnx.LayerNorm), kind="layer_norm")
register_swap(nn.LayerNorm, _linen_twin(liger_linen.LayerNorm), kind="layer_norm")
register_swap(nnx.GroupNorm, _nnx_group_norm_twin, kind="group_norm")
register_swap(nn.GroupNorm, _linen_twin(liger_linen.GroupNorm, _default_group_axes), kind="group_norm")
register_swap(nnx.Embed, _nnx_twin(liger_nnx.Embed, _flax_promotion), kind="embedding")
register_swap(nn.Embed, _linen_twin(liger_linen.Embed, _flax_promotion), kind="embedding")
