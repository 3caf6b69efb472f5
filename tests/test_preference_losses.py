"""DPO, ORPO, CPO, SimPO and KTO fused with the LM head, against float64 oracles written from the papers and Liger's
definitions over materialised logits: values, Liger's metrics and gradients."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import liger_jax
from liger_jax.ops import preference
from tests import collectives, harness

pytestmark = pytest.mark.usefixtures("full_precision_matmuls")

B, S, H, V = 4, 5, 6, 13  # two pairs of 5 tokens; H and V not powers of two
IGNORE = -100
F64 = {"atol": 1e-10, "rtol": 1e-9}
# fused_linear_logprobs accumulates dweight and dbias over its chunks in fp32 whatever the dtype.
F64_PARAM_GRADS = {"atol": 1e-7, "rtol": 1e-6}  # one fp32 rounding of O(1) partial sums


def _sigmoid(z):
    return 1.0 / (1.0 + jnp.exp(-z))


def _softplus(z):  # -log σ(-z)
    return jnp.log1p(jnp.exp(z))


def _inputs(seed, dtype=jnp.float64, layout="hv", batch=B):
    x = harness.random_normal(seed, (batch, S, H), dtype)
    weight = harness.random_normal(seed + 1, (H, V) if layout == "hv" else (V, H), dtype, scale=0.5)
    bias = harness.random_normal(seed + 2, (V,), dtype, scale=0.5)
    rng = np.random.default_rng(seed + 3)
    labels = rng.integers(0, V, (batch, S))
    labels[rng.random((batch, S)) < 0.3] = IGNORE
    labels[:, 0] = rng.integers(0, V, batch)  # every sequence counts at least one token
    labels[1, 1:] = IGNORE  # and one counts exactly one
    return x, weight, bias, jnp.asarray(labels, jnp.int32)


def _reference_inputs(seed, dtype=jnp.float64, layout="hv", batch=B):
    ref_x = harness.random_normal(seed, (batch, S, H + 2), dtype)  # a reference model of another width
    ref_weight = harness.random_normal(seed + 1, (H + 2, V) if layout == "hv" else (V, H + 2), dtype, scale=0.5)
    return ref_x, ref_weight, harness.random_normal(seed + 2, (V,), dtype, scale=0.5)


def oracle_logits(x, weight, bias, layout, logits_dtype=None):
    """``x @ weight + bias`` in float64, rounded where a ``logits_dtype`` computation rounds."""
    matrix = weight if layout == "hv" else weight.T
    logits = jnp.einsum("bsh,hv->bsv", x, matrix)
    if logits_dtype is not None:
        logits = harness_rounded(logits, logits_dtype)
    if bias is not None:
        logits = logits + bias[None, None, :]
        if logits_dtype is not None:
            logits = harness_rounded(logits, logits_dtype)
    return logits


def harness_rounded(value, dtype):
    return value + jax.lax.stop_gradient(value.astype(dtype).astype(value.dtype) - value)


def oracle_sequence_logps(x, weight, bias, labels, layout="hv", average=False, logits_dtype=None):
    """Per-sequence log-probs by definition: ``Σ_t (z_t[y_t] - logsumexp z_t)`` over the counted positions."""
    logits = oracle_logits(x, weight, bias, layout, logits_dtype)
    mask = labels != IGNORE
    picked = jnp.take_along_axis(logits, jnp.where(mask, labels, 0)[..., None], axis=-1)[..., 0]
    token_logps = jnp.where(mask, picked - jax.nn.logsumexp(logits, axis=-1), 0.0)
    total = token_logps.sum(-1)
    return (total / jnp.maximum(mask.sum(-1), 1) if average else total), token_logps, mask, logits


# Each DPO variant from its paper (with Liger's constants), in the pair's log-ratios a (chosen) and b (rejected).
DPO_ORACLES = {
    "sigmoid": lambda a, b, beta, eps, tau: _softplus(-beta * (a - b)),
    "hinge": lambda a, b, beta, eps, tau: jnp.maximum(0.0, 1.0 - beta * (a - b)),
    "exo_pair": lambda a, b, beta, eps, tau: (
        _sigmoid(beta * (a - b)) * jnp.log(_sigmoid(beta * (a - b)) / (1 - eps))
        + _sigmoid(-beta * (a - b)) * jnp.log(_sigmoid(-beta * (a - b)) / eps)
    ),
    "nca_pair": lambda a, b, beta, eps, tau: (
        _softplus(-beta * a) + 0.5 * _softplus(beta * a) + 0.5 * _softplus(beta * b)
    ),
    "robust": lambda a, b, beta, eps, tau: (
        ((1 - eps) * _softplus(-beta * (a - b)) - eps * _softplus(beta * (a - b))) / (1 - 2 * eps)
    ),
    "bco_pair": lambda a, b, beta, eps, tau: _softplus(-beta * a) + _softplus(beta * b),
    "sppo_hard": lambda a, b, beta, eps, tau: (a - 1 / (2 * beta)) ** 2 + (b + 1 / (2 * beta)) ** 2,
    "apo_zero": lambda a, b, beta, eps, tau: 1 - _sigmoid(beta * a) + _sigmoid(beta * b),
    "apo_down": lambda a, b, beta, eps, tau: _sigmoid(beta * a) + 1 - _sigmoid(beta * (a - b)),
    "discopop": lambda a, b, beta, eps, tau: (
        _softplus(-beta * (a - b)) * (1 - _sigmoid(beta * (a - b) / tau))
        + jnp.exp(-beta * (a - b)) * _sigmoid(beta * (a - b) / tau)
    ),
}
SMOOTHING = {"exo_pair": 1e-3, "robust": 0.2}


def test_every_liger_dpo_loss_type_has_an_oracle():
    assert set(DPO_ORACLES) == set(preference.DPO_LOSS_TYPES)


@pytest.mark.parametrize("loss_type", preference.DPO_LOSS_TYPES)
def test_dpo_pair_losses_match_the_papers(loss_type):
    a = harness.random_normal(11, (7,), jnp.float64, scale=3.0)
    b = harness.random_normal(12, (7,), jnp.float64, scale=3.0)
    beta, eps, tau = 0.7, SMOOTHING.get(loss_type, 0.0), 0.3

    def ours(a, b):
        losses = preference.dpo_pair_losses(a, b, beta=beta, loss_type=loss_type, label_smoothing=eps, discopop_tau=tau)
        return jnp.sum(losses * jnp.arange(1.0, 8.0))

    def oracle(a, b):
        return jnp.sum(DPO_ORACLES[loss_type](a, b, beta, eps, tau) * jnp.arange(1.0, 8.0))

    np.testing.assert_allclose(ours(a, b), oracle(a, b), **F64)
    jax.tree.map(
        lambda g, e: np.testing.assert_allclose(g, e, **F64),
        jax.grad(ours, (0, 1))(a, b),
        jax.grad(oracle, (0, 1))(a, b),
    )


def oracle_dpo(x, weight, bias, labels, ref=None, *, beta, alpha, loss_type, eps, tau, average, nll, **kw):
    logps, token_logps, mask, logits = oracle_sequence_logps(x, weight, bias, labels, average=average, **kw)
    ref_logps = 0.0 if ref is None else oracle_sequence_logps(*ref, labels, average=average, **kw)[0]
    ratios = logps - jax.lax.stop_gradient(ref_logps)
    half = labels.shape[0] // 2
    a, b = ratios[:half], ratios[half:]
    nll_loss = -token_logps[:half].sum() / mask[:half].sum() if nll else 0.0
    loss = alpha * nll_loss + DPO_ORACLES[loss_type](a, b, beta, eps, tau).mean()
    aux = {
        "chosen_logps": logps[:half],
        "rejected_logps": logps[half:],
        "chosen_logits_mean": logits[:half].mean(),
        "rejected_logits_mean": logits[half:].mean(),
        "nll_loss": nll_loss,
        "chosen_rewards": beta * a,
        "rejected_rewards": beta * b,
    }
    return loss, aux


def _scaled(loss_fn, factor=1.7):
    """``loss_fn`` with its loss (not its aux) times ``factor``: the backward then gets a loss cotangent ≠ 1."""

    def scaled(*primals):
        loss, aux = loss_fn(*primals)
        return factor * loss, aux

    return scaled


def _assert_loss_aux_and_grads(ours, oracle, primals, tolerance):
    ours, oracle = _scaled(ours), _scaled(oracle)
    (loss, aux), grads = jax.jit(jax.value_and_grad(ours, argnums=(0, 1, 2), has_aux=True))(*primals)
    (expected, expected_aux), expected_grads = jax.value_and_grad(oracle, argnums=(0, 1, 2), has_aux=True)(
        *harness.as_float64(*primals)
    )
    assert set(aux) == set(expected_aux)
    param_tolerance = F64_PARAM_GRADS if tolerance is F64 else tolerance

    def compare(actual, wanted, tolerance=tolerance):
        np.testing.assert_allclose(np.asarray(actual, np.float64), wanted, **tolerance)

    compare(loss, expected)
    jax.tree.map(compare, aux, expected_aux)
    compare(grads[0], expected_grads[0])
    jax.tree.map(lambda a, e: compare(a, e, param_tolerance), grads[1:], expected_grads[1:])
    assert [g.dtype for g in grads] == [p.dtype for p in primals]


# (loss_type, reference model, layout, average_log_prob, compute_nll_loss)
DPO_CASES = [
    ("sigmoid", True, "hv", False, False),
    ("robust", True, "vh", True, True),
    ("discopop", False, "hv", False, True),
    ("sppo_hard", True, "hv", True, False),
]


@pytest.mark.parametrize("case", DPO_CASES, ids=lambda case: "-".join(map(str, case)))
@pytest.mark.usefixtures("float64_on_host")
def test_fused_dpo_matches_oracle_float64(case):
    loss_type, with_ref, layout, average, nll = case
    x, weight, bias, labels = _inputs(20, layout=layout)
    ref = _reference_inputs(30, layout=layout) if with_ref else None
    options = dict(beta=0.5, alpha=0.7, loss_type=loss_type, average=average, nll=nll)
    options |= dict(eps=SMOOTHING.get(loss_type, 0.0), tau=0.05)

    def ours(x, weight, bias):
        ref_kwargs = {} if ref is None else dict(zip(("ref_x", "ref_weight", "ref_bias"), ref, strict=True))
        return liger_jax.fused_linear_dpo(
            x, weight, labels, bias=bias, beta=0.5, alpha=0.7, loss_type=loss_type, average_log_prob=average,
            compute_nll_loss=nll, label_smoothing=options["eps"], weight_layout=layout, implementation="xla",
            **ref_kwargs,
        )  # fmt: skip

    def oracle(x, weight, bias):
        return oracle_dpo(x, weight, bias, labels, ref, layout=layout, **options)

    _assert_loss_aux_and_grads(ours, oracle, (x, weight, bias), F64)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_fused_dpo_kernel_implementation(dtype):
    """The Triton path (interpreter on CPU) in fp32 and bf16 against the oracle on the same rounded inputs."""
    x, weight, bias, labels = _inputs(40, dtype)
    ref = _reference_inputs(50, dtype)
    options = dict(beta=0.5, alpha=1.0, loss_type="sigmoid", eps=0.0, tau=0.05, average=False, nll=True)

    def ours(x, weight, bias):
        return liger_jax.fused_linear_dpo(
            x, weight, labels, bias=bias, ref_x=ref[0], ref_weight=ref[1], ref_bias=ref[2], beta=0.5,
            compute_nll_loss=True, implementation=harness.KERNEL_IMPLEMENTATION,
        )  # fmt: skip

    def oracle(x, weight, bias):
        ref64 = harness.as_float64(*ref)
        return oracle_dpo(x, weight, bias, labels, ref64, logits_dtype=dtype, **options)

    _assert_loss_aux_and_grads(ours, oracle, (x, weight, bias), harness.tolerance(dtype))


def oracle_orpo(x, weight, bias, labels, nll_target, *, beta, alpha):
    logps, _, _, logits = oracle_sequence_logps(x, weight, bias, labels, average=True)
    half = labels.shape[0] // 2
    c, r = logps[:half], logps[half:]
    odds = lambda lp: jnp.exp(lp) / (1 - jnp.exp(lp))  # noqa: E731
    log_odds = jnp.log(odds(c) / odds(r))
    _, nll_logps, nll_mask, _ = oracle_sequence_logps(x, weight, bias, nll_target)
    nll_loss = -nll_logps[:half].sum() / nll_mask[:half].sum()
    ratio = -_softplus(-log_odds)
    loss = alpha * nll_loss - beta * ratio.mean()
    aux = {
        "chosen_logps": c,
        "rejected_logps": r,
        "chosen_logits_mean": logits[:half].mean(),
        "rejected_logits_mean": logits[half:].mean(),
        "nll_loss": nll_loss,
        "chosen_rewards": beta * c,
        "rejected_rewards": beta * r,
        "log_odds_ratio": ratio.mean(),
        "log_odds_chosen": log_odds.mean(),
    }
    return loss, aux


@pytest.mark.usefixtures("float64_on_host")
def test_fused_orpo_with_nll_target_matches_oracle():
    x, weight, bias, labels = _inputs(60)
    nll_target = _inputs(61)[3]

    def ours(x, weight, bias):
        return liger_jax.fused_linear_orpo(
            x, weight, labels, bias=bias, beta=0.3, alpha=0.6, nll_target=nll_target, implementation="xla"
        )

    oracle = lambda x, weight, bias: oracle_orpo(x, weight, bias, labels, nll_target, beta=0.3, alpha=0.6)  # noqa: E731
    _assert_loss_aux_and_grads(ours, oracle, (x, weight, bias), F64)


def oracle_smoothed_sigmoid(x, weight, bias, labels, *, beta, alpha, gamma, eps, average, layout):
    logps, token_logps, mask, logits = oracle_sequence_logps(x, weight, bias, labels, layout, average)
    half = labels.shape[0] // 2
    c, r = logps[:half], logps[half:]
    z = beta * (c - r) - gamma
    nll_loss = -token_logps[:half].sum() / mask[:half].sum()
    loss = alpha * nll_loss + ((1 - eps) * _softplus(-z) + eps * _softplus(z)).mean()
    aux = {
        "chosen_logps": c,
        "rejected_logps": r,
        "chosen_logits_mean": logits[:half].mean(),
        "rejected_logits_mean": logits[half:].mean(),
        "nll_loss": nll_loss,
        "chosen_rewards": beta * c,
        "rejected_rewards": beta * r,
    }
    return loss, aux


@pytest.mark.parametrize("loss", ["cpo", "simpo"])
@pytest.mark.usefixtures("float64_on_host")
def test_fused_cpo_and_simpo_match_oracle(loss):
    x, weight, bias, labels = _inputs(70, layout="vh")
    options = dict(beta=0.8, alpha=0.4, eps=0.15, layout="vh")
    if loss == "cpo":
        options |= dict(gamma=0.0, average=False)
        op = lambda x, w, b: liger_jax.fused_linear_cpo(  # noqa: E731
            x, w, labels, bias=b, beta=0.8, alpha=0.4, label_smoothing=0.15, weight_layout="vh", implementation="xla"
        )
    else:
        options |= dict(gamma=0.3, average=True)
        op = lambda x, w, b: liger_jax.fused_linear_simpo(  # noqa: E731
            x, w, labels, bias=b, beta=0.8, alpha=0.4, gamma=0.3, label_smoothing=0.15, weight_layout="vh",
            implementation="xla",
        )  # fmt: skip
    oracle = lambda x, w, b: oracle_smoothed_sigmoid(x, w, b, labels, **options)  # noqa: E731
    _assert_loss_aux_and_grads(op, oracle, (x, weight, bias), F64)


def test_zero_margin_and_all_ignored_sequences():
    """chosen == rejected gives DPO's log 2 and equal rewards; a sequence with every label ignored counts 0, and a
    batch with every label ignored has no NLL and no gradient."""
    x, weight, _, labels = _inputs(80, batch=2)
    ignored, all_ignored = labels.at[1].set(IGNORE), jnp.full_like(labels, IGNORE)

    @jax.jit
    def run(x):
        same = liger_jax.fused_linear_dpo(
            jnp.concatenate([x[:1], x[:1]]), weight, jnp.concatenate([labels[:1], labels[:1]]), implementation="xla"
        )
        ignored_rows = [
            liger_jax.fused_linear_cpo(x, weight, ignored, average_log_prob=average, implementation="xla")
            for average in (False, True)
        ]
        nothing_counted = jax.value_and_grad(
            lambda x: liger_jax.fused_linear_cpo(x, weight, all_ignored, implementation="xla")[0]
        )(x)
        return same, ignored_rows, nothing_counted

    (loss, aux), ignored_rows, (nothing_loss, nothing_grads) = run(x)
    np.testing.assert_allclose(loss, np.log(2.0), **F64)
    np.testing.assert_array_equal(aux["chosen_rewards"], aux["rejected_rewards"])
    for loss, aux in ignored_rows:
        assert np.isfinite(loss) and aux["rejected_logps"][0] == 0.0 and aux["chosen_logps"][0] != 0.0
    np.testing.assert_allclose(nothing_loss, np.log(2.0), **F64)  # no NLL, zero margin
    np.testing.assert_array_equal(nothing_grads, 0.0)


def test_reference_model_gets_no_gradient():
    x, weight, bias, labels = _inputs(90)
    ref_x, ref_weight, ref_bias = _reference_inputs(91)
    preference_labels = jnp.array([True, False, True, False])

    def dpo(ref_x, ref_weight, ref_bias):
        return liger_jax.fused_linear_dpo(
            x, weight, labels, bias=bias, ref_x=ref_x, ref_weight=ref_weight, ref_bias=ref_bias, implementation="xla"
        )[0]

    def kto(ref_x, ref_weight, ref_bias):
        return liger_jax.fused_linear_kto(
            x, weight, labels, preference_labels, ref_x=ref_x, ref_weight=ref_weight, ref_bias=ref_bias, kl=0.1,
            implementation="xla",
        )[0]  # fmt: skip

    grads = jax.jit(lambda *ref: [jax.grad(loss, argnums=(0, 1, 2))(*ref) for loss in (dpo, kto)])(
        ref_x, ref_weight, ref_bias
    )
    for grad in jax.tree.leaves(grads):
        np.testing.assert_array_equal(grad, 0.0)


def oracle_kto(x, weight, bias, labels, preference_labels, ref, kl, *, beta, average):
    logps, _, _, logits = oracle_sequence_logps(x, weight, bias, labels, average=average)
    ref_logps = 0.0 if ref is None else oracle_sequence_logps(*ref, labels, average=average)[0]
    ratio = logps - jax.lax.stop_gradient(ref_logps)
    chosen_loss = 1 - _sigmoid(beta * (ratio - kl))
    rejected_loss = 1 - _sigmoid(beta * (kl - ratio))
    loss = jnp.where(preference_labels, chosen_loss, rejected_loss).mean()
    logit_sums = logits.sum((1, 2))
    aux = {}
    for name, values in (("logps", logps), ("logits", logit_sums), ("rewards", beta * ratio)):
        aux[f"chosen_{name}_sum"] = values[preference_labels].sum()
        aux[f"rejected_{name}_sum"] = values[~preference_labels].sum()
    return loss, aux


@pytest.mark.parametrize("average, with_ref", [(False, True), (True, False)])
@pytest.mark.usefixtures("float64_on_host")
def test_fused_kto_matches_oracle(average, with_ref):
    x, weight, bias, labels = _inputs(100)
    ref = _reference_inputs(101) if with_ref else None
    preference_labels = jnp.array([True, False, False, True])
    kl = jnp.array([0.3, -0.1, 0.2, 0.05])

    def ours(x, weight, bias):
        ref_kwargs = {} if ref is None else dict(zip(("ref_x", "ref_weight", "ref_bias"), ref, strict=True))
        return liger_jax.fused_linear_kto(
            x, weight, labels, preference_labels, bias=bias, kl=kl, beta=0.9, average_log_prob=average,
            implementation="xla", **ref_kwargs,
        )  # fmt: skip

    def oracle(x, weight, bias):
        return oracle_kto(x, weight, bias, labels, np.asarray(preference_labels), ref, kl, beta=0.9, average=average)

    _assert_loss_aux_and_grads(ours, oracle, (x, weight, bias), F64)


def test_kto_kernel_implementation():
    x, weight, bias, labels = _inputs(110, jnp.float32)
    ref = _reference_inputs(111, jnp.float32)
    preference_labels = jnp.array([True, True, False, True])

    def ours(x, weight, bias):
        return liger_jax.fused_linear_kto(
            x, weight, labels, preference_labels, bias=bias, ref_x=ref[0], ref_weight=ref[1], ref_bias=ref[2],
            implementation=harness.KERNEL_IMPLEMENTATION,
        )  # fmt: skip

    def oracle(x, weight, bias):
        ref64 = harness.as_float64(*ref)
        return oracle_kto(x, weight, bias, labels, np.asarray(preference_labels), ref64, 0.0, beta=0.1, average=False)

    _assert_loss_aux_and_grads(ours, oracle, (x, weight, bias), harness.tolerance(jnp.float32))


BAD_CALLS = [
    (ValueError, "even batch", lambda x, w, y: liger_jax.fused_linear_dpo(x[:3], w, y[:3])),
    (TypeError, "integer dtype", lambda x, w, y: liger_jax.fused_linear_dpo(x, w, y.astype(jnp.float32))),
    (ValueError, "labels must be in", lambda x, w, y: liger_jax.fused_linear_dpo(x, w, y.at[0, 1].set(V))),
    (ValueError, "x must have shape", lambda x, w, y: liger_jax.fused_linear_dpo(x[0], w, y)),
    (ValueError, "weight must have shape", lambda x, w, y: liger_jax.fused_linear_dpo(x, w.T, y)),
    (ValueError, "loss_type", lambda x, w, y: liger_jax.fused_linear_dpo(x, w, y, loss_type="ipo")),
    (ValueError, "exo_pair", lambda x, w, y: liger_jax.fused_linear_dpo(x, w, y, loss_type="exo_pair")),
    (
        ValueError,
        "robust",
        lambda x, w, y: liger_jax.fused_linear_dpo(x, w, y, loss_type="robust", label_smoothing=0.5),
    ),
    (ValueError, "beta", lambda x, w, y: liger_jax.fused_linear_dpo(x, w, y, beta=0.0)),
    (ValueError, "together", lambda x, w, y: liger_jax.fused_linear_dpo(x, w, y, ref_x=x)),
    (ValueError, "ref_weight", lambda x, w, y: liger_jax.fused_linear_dpo(x, w, y, ref_x=x, ref_weight=w[:, :-1])),
    (ValueError, "ref_x", lambda x, w, y: liger_jax.fused_linear_dpo(x, w, y, ref_x=x[:, :-1], ref_weight=w)),
    (ValueError, "nll_target", lambda x, w, y: liger_jax.fused_linear_orpo(x, w, y, nll_target=y[:, :-1])),
    (ValueError, "label_smoothing", lambda x, w, y: liger_jax.fused_linear_cpo(x, w, y, label_smoothing=1.5)),
    (ValueError, "gamma", lambda x, w, y: liger_jax.fused_linear_simpo(x, w, y, gamma=float("nan"))),
    (TypeError, "ignore_index", lambda x, w, y: liger_jax.fused_linear_simpo(x, w, y, ignore_index=1.0)),
    (TypeError, "preference_labels", lambda x, w, y: liger_jax.fused_linear_kto(x, w, y, jnp.ones(B))),
    (ValueError, "preference_labels", lambda x, w, y: liger_jax.fused_linear_kto(x, w, y, jnp.ones(3, bool))),
    (ValueError, "kl", lambda x, w, y: liger_jax.fused_linear_kto(x, w, y, jnp.ones(B, bool), kl=jnp.ones(3))),
]


@pytest.mark.parametrize("error, match, call", BAD_CALLS, ids=[c[1] for c in BAD_CALLS])
def test_bad_inputs_raise_before_any_launch(error, match, call):
    x, weight, _, labels = _inputs(120, jnp.float32)
    with pytest.raises(error, match=match):
        call(x, weight, labels)


@pytest.mark.usefixtures("full_precision_matmuls")
def test_nnx_loss_modules_compute_the_functional_losses():
    from flax import nnx

    from liger_jax.flax_layers import preference_nnx

    x, _, _, labels = _inputs(140, jnp.float32)
    head, ref_head = nnx.Linear(H, V, rngs=nnx.Rngs(0)), nnx.Embed(V, H, rngs=nnx.Rngs(1))
    ref_x = harness.random_normal(141, (B, S, H), jnp.float32)
    with pytest.raises(ValueError, match="same kind of head"):
        preference_nnx.FusedLinearDPOLoss()(head, x, labels, ref_head=ref_head, ref_hidden=ref_x)
    tied = nnx.Embed(V, H, rngs=nnx.Rngs(2))
    loss, aux = jax.jit(lambda x: preference_nnx.FusedLinearDPOLoss(beta=0.3, implementation="xla")(
        tied, x, labels, ref_head=ref_head, ref_hidden=ref_x))(x)  # fmt: skip
    expected, expected_aux = jax.jit(lambda x: liger_jax.fused_linear_dpo(
        x, tied.embedding[...], labels, ref_x=ref_x, ref_weight=ref_head.embedding[...], beta=0.3,
        weight_layout="vh", implementation="xla",
    ))(x)  # fmt: skip
    np.testing.assert_allclose(loss, expected, rtol=1e-6)
    jax.tree.map(lambda a, e: np.testing.assert_allclose(a, e, rtol=1e-6, atol=1e-7), aux, expected_aux)
    preference_labels = jnp.array([True, False, False, True])
    loss, _ = preference_nnx.FusedLinearKTOLoss(beta=0.2, implementation="xla")(head, x, labels, preference_labels)
    expected, _ = liger_jax.fused_linear_kto(
        x, head.kernel[...], labels, preference_labels, bias=head.bias[...], beta=0.2, implementation="xla"
    )
    np.testing.assert_allclose(loss, expected, rtol=1e-6)
    with pytest.raises(ValueError, match="no reference model"):
        preference_nnx.FusedLinearSimPOLoss()(head, x, labels, ref_head=head, ref_hidden=x)


def test_linen_loss_modules_create_dense_params_and_compute_the_functional_losses():
    from flax import linen as nn

    from liger_jax.flax_layers import preference_linen

    x, _, _, labels = _inputs(150, jnp.float32)
    module = preference_linen.FusedLinearORPOLoss(V, beta=0.2, implementation="xla")
    params = module.init(jax.random.key(0), x, labels)
    dense_params = nn.Dense(V).init(jax.random.key(0), x)
    assert jax.tree.map(jnp.shape, params) == jax.tree.map(jnp.shape, dense_params)
    loss, aux = module.apply(params, x, labels)
    kernel, bias = params["params"]["kernel"], params["params"]["bias"]
    expected, expected_aux = liger_jax.fused_linear_orpo(x, kernel, labels, bias=bias, beta=0.2, implementation="xla")
    np.testing.assert_allclose(loss, expected, rtol=1e-6)
    assert set(aux) == set(expected_aux)
    ref_x, ref_kernel = (
        harness.random_normal(151, (B, S, 3), jnp.float32),
        harness.random_normal(152, (3, V), jnp.float32),
    )
    dpo = preference_linen.FusedLinearDPOLoss(V, use_bias=False, loss_type="hinge", implementation="xla")
    params = dpo.init(jax.random.key(1), x, labels)
    loss, _ = dpo.apply(params, x, labels, ref_inputs=ref_x, ref_kernel=ref_kernel)
    expected, _ = liger_jax.fused_linear_dpo(
        x, params["params"]["kernel"], labels, ref_x=ref_x, ref_weight=ref_kernel, loss_type="hinge",
        implementation="xla",
    )  # fmt: skip
    np.testing.assert_allclose(loss, expected, rtol=1e-6)


def test_batch_sharded_inputs_give_the_same_loss_and_sharded_gradients():
    """Data parallelism: the batch sharded over devices gives the unsharded loss and gradients, dx sharded alike."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    x, weight, bias, labels = _inputs(160, jnp.float32)
    ref_x, ref_weight, ref_bias = _reference_inputs(161, jnp.float32)

    @jax.jit
    def loss_and_grads(x, weight):
        def loss(x, weight):
            return liger_jax.fused_linear_dpo(
                x, weight, labels, bias=bias, ref_x=ref_x, ref_weight=ref_weight, ref_bias=ref_bias,
                implementation=harness.KERNEL_IMPLEMENTATION,
            )[0]  # fmt: skip

        return jax.value_and_grad(loss, argnums=(0, 1))(x, weight)

    batch_sharding = NamedSharding(collectives.mesh((2,), ("data",)), P("data"))
    expected, expected_grads = loss_and_grads(x, weight)
    loss, grads = loss_and_grads(jax.device_put(x, batch_sharding), weight)
    np.testing.assert_allclose(loss, expected, rtol=1e-6)
    jax.tree.map(lambda a, e: np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6), grads, expected_grads)
    assert grads[0].sharding.spec[0] == "data"


def _fused_losses(labels, preference_labels, ref):
    """Each fused preference loss of ``(x, weight, bias)`` on the kernels, as ``(loss, aux)``."""
    ref_kwargs = dict(zip(("ref_x", "ref_weight", "ref_bias"), ref, strict=True))
    options = dict(implementation=harness.KERNEL_IMPLEMENTATION)
    return {
        "dpo": lambda x, w, b: liger_jax.fused_linear_dpo(x, w, labels, bias=b, **ref_kwargs, **options),
        "orpo": lambda x, w, b: liger_jax.fused_linear_orpo(x, w, labels, bias=b, **options),
        "cpo": lambda x, w, b: liger_jax.fused_linear_cpo(x, w, labels, bias=b, **options),
        "simpo": lambda x, w, b: liger_jax.fused_linear_simpo(x, w, labels, bias=b, **options),
        "kto": lambda x, w, b: liger_jax.fused_linear_kto(
            x, w, labels, preference_labels, bias=b, **ref_kwargs, kl=0.3, **options
        ),
    }


PREFERENCE_LABELS = jnp.asarray([True, False, True, True])


@pytest.mark.parametrize("loss", ["dpo", "orpo", "kto"])
def test_vmap_over_microbatches_matches_each_microbatch(loss):
    """``jax.vmap`` over a leading microbatch axis of x, labels and the reference's hidden states gives each
    microbatch's own loss, metrics and gradients."""
    x, weight, bias, labels = _inputs(170, jnp.float32)
    x2, _, _, labels2 = _inputs(171, jnp.float32)
    ref_x, ref_weight, ref_bias = _reference_inputs(172, jnp.float32)
    ref_x2 = _reference_inputs(173, jnp.float32)[0]

    def value_and_grads(x, labels, ref_x):
        op = _fused_losses(labels, PREFERENCE_LABELS, (ref_x, ref_weight, ref_bias))[loss]
        return jax.value_and_grad(op, argnums=(0, 1, 2), has_aux=True)(x, weight, bias)

    batched = jax.jit(jax.vmap(value_and_grads))(
        jnp.stack([x, x2]), jnp.stack([labels, labels2]), jnp.stack([ref_x, ref_x2])
    )
    step = jax.jit(value_and_grads)
    for i, one in enumerate([step(x, labels, ref_x), step(x2, labels2, ref_x2)]):
        assert jax.tree.structure(batched) == jax.tree.structure(one)
        for b, o in zip(jax.tree.leaves(batched), jax.tree.leaves(one), strict=True):
            np.testing.assert_allclose(b[i], o, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("loss", ["dpo", "cpo", "simpo", "kto"])
def test_checkpoint_gives_the_same_gradients(loss):
    x, weight, bias, labels = _inputs(180, jnp.float32)
    op = _fused_losses(labels, PREFERENCE_LABELS, _reference_inputs(181, jnp.float32))[loss]
    harness.assert_checkpoint_gives_the_same_gradients(lambda x, w, b: op(x, w, b)[0], (x, weight, bias))


def _chunked_loss_and_oracle(loss, labels, ref, chunk_size, implementation):
    """``(ours, oracle)`` of ``(x, weight, bias)`` for one fused preference loss in chunks of ``chunk_size`` whole
    pairs (sequences for KTO), with options that reach every term (NLL, reference model, averaging, smoothing)."""
    ref_kwargs = dict(zip(("ref_x", "ref_weight", "ref_bias"), ref, strict=True))
    preference_labels = jnp.arange(labels.shape[0]) % 3 != 1
    options = dict(chunk_size=chunk_size, implementation=implementation)
    match loss:
        case "dpo":
            ours = lambda x, w, b: liger_jax.fused_linear_dpo(  # noqa: E731
                x, w, labels, bias=b, **ref_kwargs, beta=0.5, alpha=0.7, loss_type="robust", label_smoothing=0.2,
                average_log_prob=True, compute_nll_loss=True, **options,
            )  # fmt: skip
            dpo = dict(beta=0.5, alpha=0.7, loss_type="robust", eps=0.2, tau=0.05, average=True, nll=True)
            return ours, lambda x, w, b: oracle_dpo(x, w, b, labels, ref, **dpo)
        case "orpo":
            ours = lambda x, w, b: liger_jax.fused_linear_orpo(x, w, labels, bias=b, beta=0.3, alpha=0.6, **options)  # noqa: E731
            return ours, lambda x, w, b: oracle_orpo(x, w, b, labels, labels, beta=0.3, alpha=0.6)
        case "cpo" | "simpo":
            gamma = 0.0 if loss == "cpo" else 0.3
            smoothed = dict(beta=0.8, alpha=0.4, eps=0.15, layout="hv", gamma=gamma, average=loss == "simpo")
            fused = (
                liger_jax.fused_linear_cpo
                if loss == "cpo"
                else functools.partial(liger_jax.fused_linear_simpo, gamma=gamma)
            )
            ours = lambda x, w, b: fused(x, w, labels, bias=b, beta=0.8, alpha=0.4, label_smoothing=0.15, **options)  # noqa: E731
            return ours, lambda x, w, b: oracle_smoothed_sigmoid(x, w, b, labels, **smoothed)
        case _:
            kl = harness.random_normal(7, labels.shape[:1], jnp.float64, scale=0.2)
            ours = lambda x, w, b: liger_jax.fused_linear_kto(  # noqa: E731
                x, w, labels, preference_labels, bias=b, **ref_kwargs, kl=kl, beta=0.9, **options
            )
            oracle_options = dict(beta=0.9, average=False)
            return ours, lambda x, w, b: oracle_kto(
                x, w, b, labels, np.asarray(preference_labels), ref, kl, **oracle_options
            )


# (loss, whole pairs (KTO: sequences) per chunk): one, two and a remainder of one (KTO: three chunks of two), all.
CHUNK_CASES = [("dpo", 1), ("dpo", 2), ("dpo", None), ("kto", 1), ("kto", 2), ("orpo", 2), ("cpo", 2), ("simpo", 1)]


@pytest.mark.parametrize("loss, chunk_size", CHUNK_CASES)
@pytest.mark.usefixtures("float64_on_host")
def test_whole_pair_chunks_match_oracle(loss, chunk_size):
    """Three pairs (six sequences for KTO) of odd length in chunks of whole pairs: the loss, the metrics and the
    gradients each chunk makes in its forward pass match the oracle under jit (and through jax.grad of a jitted
    loss)."""
    x, weight, bias, labels = _inputs(190, batch=6)
    ref = _reference_inputs(191, batch=6)
    ours, oracle = _chunked_loss_and_oracle(loss, labels, ref, chunk_size, "xla")
    _assert_loss_aux_and_grads(ours, oracle, (x, weight, bias), F64)
    if chunk_size == 2:
        dx = jax.grad(jax.jit(lambda *primals: ours(*primals)[0]))(x, weight, bias)
        np.testing.assert_allclose(dx, jax.grad(lambda *primals: oracle(*primals)[0])(x, weight, bias), **F64)


@pytest.mark.parametrize("loss", ["dpo", "kto"])
def test_whole_pair_chunks_on_the_kernels(loss):
    """The kernels (interpreter on CPU) in fp32, one pair (sequence) per chunk with a reference model."""
    x, weight, bias, labels = _inputs(200, jnp.float32, batch=6)
    ref = _reference_inputs(201, jnp.float32, batch=6)
    ours, _ = _chunked_loss_and_oracle(loss, labels, ref, 1, harness.KERNEL_IMPLEMENTATION)
    _, oracle = _chunked_loss_and_oracle(loss, labels, harness.as_float64(*ref), 1, None)
    _assert_loss_aux_and_grads(ours, oracle, (x, weight, bias), harness.tolerance(jnp.float32))


def test_vocabulary_sharded_heads_give_the_one_device_loss_and_gradients():
    """Tensor parallelism: the policy's and the reference's heads sharded on the vocabulary (x replicated) give
    the one-device loss, metrics and gradients, and dweight stays vocabulary-sharded."""
    vocab = 14  # two devices' slices of 7
    x, _, _, labels = _inputs(180, jnp.float32)
    weight = harness.random_normal(181, (H, vocab), jnp.float32, scale=0.6)
    bias = harness.random_normal(182, (vocab,), jnp.float32, scale=0.5)
    ref_x = _reference_inputs(183, jnp.float32)[0]
    ref_weight = harness.random_normal(184, (H + 2, vocab), jnp.float32, scale=0.6)
    labels = jnp.where(labels == IGNORE, IGNORE, labels % vocab)
    mesh_ = collectives.mesh((2,), ("tp",))
    sharded_weight = collectives.place(weight, mesh_, None, "tp")
    sharded = (sharded_weight, collectives.place(bias, mesh_, "tp"), collectives.place(ref_weight, mesh_, None, "tp"))
    for name in ("dpo", "orpo", "cpo", "simpo", "kto"):

        @jax.jit
        def loss_and_grads(x, weight, bias, ref_weight, name=name):
            op = _fused_losses(labels, PREFERENCE_LABELS, (ref_x, ref_weight, None))[name]
            return jax.value_and_grad(op, argnums=(0, 1, 2), has_aux=True)(x, weight, bias)

        expected = loss_and_grads(x, weight, bias, ref_weight)
        got = loss_and_grads(x, *sharded)
        for a, e in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
            np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6, err_msg=name)
        assert got[1][1].sharding.is_equivalent_to(sharded_weight.sharding, 2), name
