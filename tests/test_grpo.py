"""The GRPO family fused with the LM head, against a float64 oracle written from Liger's and TRL's definitions:
every loss type, token- and sequence-level importance sampling, the KL term, metrics and gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import liger_jax
from liger_jax.ops import grpo
from tests import collectives, harness

pytestmark = pytest.mark.usefixtures("full_precision_matmuls")

B, T, H, V = 4, 6, 5, 11
F64 = {"atol": 1e-10, "rtol": 1e-9}
# fused_linear_logprobs accumulates dweight and dbias over its chunks in fp32 whatever the dtype.
F64_PARAM_GRADS = {"atol": 1e-7, "rtol": 1e-6}  # one fp32 rounding of O(1) partial sums
sg = jax.lax.stop_gradient


def _sigmoid(z):
    return 1.0 / (1.0 + jnp.exp(-z))


def oracle_grpo(logps, mask, advantages, ref=None, old=None, vllm=None, **o):
    """Liger 0.8.5's GRPOTrainer-matching loss, sequence by sequence."""
    loss_type, level, beta = (
        o.get("loss_type", "dapo"),
        o.get("importance_sampling_level", "token"),
        o.get("beta", 0.04),
    )
    low, high, delta = o.get("epsilon_low", 0.2), o.get("epsilon_high", 0.2), o.get("delta")
    mask = mask.astype(jnp.float64)
    old = sg(logps) if old is None else old
    ref = sg(logps) if ref is None else ref
    if vllm is not None and vllm.ndim == 1:
        vllm = vllm[:, None]
    rows, kls, clipped_flags = [], [], []
    for i in range(logps.shape[0]):
        lp, m, adv = logps[i], mask[i], advantages[i]
        log_ratio = lp - old[i]
        log_w = log_ratio if level == "token" else jnp.sum(log_ratio * m) / max(float(m.sum()), 1.0) * jnp.ones(1)
        w = jnp.exp(log_w)
        if loss_type == "cispo":
            loss_t = -sg(jnp.minimum(w, high)) * adv * lp
            flag = (w > high) & (adv > 0)
        elif loss_type == "sapo":
            tau = o.get("sapo_temperature_pos", 1.0) if adv > 0 else o.get("sapo_temperature_neg", 1.05)
            loss_t = -(4.0 / tau) * _sigmoid(tau * (w - 1.0)) * adv
            flag = jnp.zeros_like(w, bool)
        elif loss_type == "vespo":
            k, lam = (o.get("vespo_k_pos", 2.0), o.get("vespo_lambda_pos", 3.0))
            if adv < 0:
                k, lam = (o.get("vespo_k_neg", 3.0), o.get("vespo_lambda_neg", 2.0))
            lam = max(lam, 1e-4)
            seq_log = jnp.sum(jnp.clip(sg(log_ratio), -20, 20) * m)
            if vllm is not None:
                seq_log = seq_log + jnp.sum(jnp.clip(jnp.log(vllm[i]), np.log(1e-8), 20))
            seq_log = jnp.clip(seq_log, np.log(1e-8), 20)
            phi = jnp.exp(lam + k * seq_log - lam * jnp.exp(seq_log))  # φ(w) = e^λ w^k e^{-λ w}
            loss_t = -sg(phi) * adv * lp
            flag = jnp.zeros_like(w, bool)
        else:
            clipped = jnp.clip(w, 1 - low, 1 + high)
            unclipped = w if delta is None else jnp.minimum(w, delta)
            loss_t = -jnp.minimum(unclipped * adv, clipped * adv)
            flag = ((w < 1 - low) & (adv < 0)) | ((w > 1 + high) & (adv > 0))
        if vllm is not None and loss_type != "vespo":
            loss_t = loss_t * vllm[i]
        if beta != 0:
            kl = jnp.exp(ref[i] - lp) - (ref[i] - lp) - 1.0
            if o.get("use_bias_correction_kl"):
                kl = kl * w
            loss_t = loss_t + beta * kl
            kls.append(kl)
        rows.append(loss_t)
        clipped_flags.append(jnp.broadcast_to(flag, m.shape))
    tokens = max(float(mask.sum()), 1.0)
    if loss_type in ("grpo", "sapo"):
        loss = sum(jnp.sum(r * m) / max(float(m.sum()), 1.0) for r, m in zip(rows, mask, strict=True)) / len(rows)
    elif loss_type == "bnpo":
        loss = sum(jnp.sum(r * m) for r, m in zip(rows, mask, strict=True)) / tokens
    elif loss_type == "dr_grpo":
        loss = sum(jnp.sum(r * m) for r, m in zip(rows, mask, strict=True)) / (len(rows) * o["max_completion_length"])
    elif loss_type == "luspo":  # TRL: mean of loss_t · |y| over the loss's own [B, T or 1] shape
        loss = sum(jnp.sum(r * m.sum()) for r, m in zip(rows, mask, strict=True)) / (len(rows) * rows[0].shape[0])
    else:
        normalizer = o.get("num_items_in_batch") or tokens
        loss = sum(jnp.sum(r * m) for r, m in zip(rows, mask, strict=True)) / max(normalizer, 1.0)
    aux = {"clip_ratio": sum(jnp.sum(f * m) for f, m in zip(clipped_flags, mask, strict=True)) / tokens}
    if beta != 0:
        aux["kl"] = sum(jnp.sum(k * m) for k, m in zip(kls, mask, strict=True)) / tokens
    return loss, aux


def _logps_inputs(seed, batch=B, length=T):
    logps = -jnp.abs(harness.random_normal(seed, (batch, length), jnp.float64, scale=2.0))
    old = logps + harness.random_normal(seed + 1, (batch, length), jnp.float64, scale=0.3)
    ref = logps + harness.random_normal(seed + 2, (batch, length), jnp.float64, scale=0.5)
    mask = jnp.asarray(np.random.default_rng(seed + 3).random((batch, length)) < 0.8)
    mask = mask.at[:, 0].set(True).at[-1].set(False)
    advantages = harness.random_normal(seed + 4, (batch,), jnp.float64)
    return logps, mask, advantages, ref, old


LOSS_CASES = [(loss_type, "token", {}) for loss_type in grpo.GRPO_LOSS_TYPES] + [
    (loss_type, "sequence", {}) for loss_type in ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
]
OPTION_CASES = [
    ("dapo", "token", {"delta": 1.1, "use_bias_correction_kl": True, "num_items_in_batch": 40.0}),
    ("grpo", "sequence", {"beta": 0.0, "epsilon_low": 0.1, "epsilon_high": 0.28}),
    ("bnpo", "token", {"vllm_is_ratio": (B,)}),
    ("vespo", "token", {"vllm_is_ratio": (B, T), "vespo_k_pos": 1.5, "vespo_lambda_neg": 2.5}),
    ("vespo", "token", {"vllm_is_ratio": (B,), "vespo_lambda_pos": 0.0, "vespo_lambda_neg": 0.0}),
    ("vespo", "token", {"vllm_is_ratio": (B, 1), "vespo_k_pos": -1.0, "vespo_k_neg": -1.0}),
    ("cispo", "token", {"vllm_is_ratio": (B, 1), "epsilon_high": 1.1}),
    ("sapo", "token", {"sapo_temperature_pos": 0.8, "sapo_temperature_neg": 1.3}),
    ("luspo", "sequence", {"beta": 0.0}),
]


def _case_id(case):
    return "-".join([case[0], case[1], *case[2]])


def test_every_liger_loss_type_is_covered():
    assert {case[0] for case in LOSS_CASES} == set(grpo.GRPO_LOSS_TYPES)


@pytest.mark.parametrize("case", LOSS_CASES + OPTION_CASES, ids=_case_id)
def test_loss_from_logps_matches_oracle(case):
    loss_type, level, options = case
    logps, mask, advantages, ref, old = _logps_inputs(10)
    options = dict(options, loss_type=loss_type, importance_sampling_level=level, beta=options.get("beta", 0.05))
    if loss_type == "dr_grpo":
        options["max_completion_length"] = T + 2
    if "vllm_is_ratio" in options:
        shape = options.pop("vllm_is_ratio")
        options["vllm_is_ratio"] = jnp.exp(harness.random_normal(20, shape, jnp.float64, scale=0.2)).at[0].set(1e-12)
    vllm = options.pop("vllm_is_ratio", None)

    def ours(logps):
        return grpo.grpo_loss_from_logps(
            logps, mask, advantages, ref_per_token_logps=ref, old_per_token_logps=old, vllm_is_ratio=vllm, **options
        )

    def oracle(logps):
        return oracle_grpo(logps, mask, advantages, ref, old, vllm, **options)

    (loss, aux), grads = jax.value_and_grad(ours, has_aux=True)(logps)
    (expected, expected_aux), expected_grads = jax.value_and_grad(oracle, has_aux=True)(logps)
    assert set(aux) == set(expected_aux)
    np.testing.assert_allclose(loss, expected, **F64)
    jax.tree.map(lambda a, e: np.testing.assert_allclose(a, e, **F64), aux, expected_aux)
    np.testing.assert_allclose(grads, expected_grads, **F64)
    assert np.any(grads != 0)


def test_clip_ratio_counts_clipped_tokens():
    logps, mask, advantages, ref, old = _logps_inputs(30)
    _, aux = grpo.grpo_loss_from_logps(logps, mask, advantages, old_per_token_logps=old, epsilon_low=0.01)
    assert 0.0 < float(aux["clip_ratio"]) < 1.0
    _, aux = grpo.grpo_loss_from_logps(logps, mask, advantages, old_per_token_logps=None)
    assert float(aux["clip_ratio"]) == 0.0 and float(aux["kl"]) == 0.0  # on-policy, no reference: nothing moves


def _head_inputs(seed, dtype=jnp.float64, layout="hv", batch=B, length=T):
    x = harness.random_normal(seed, (batch, length, H), dtype)
    weight = harness.random_normal(seed + 1, (H, V) if layout == "hv" else (V, H), dtype, scale=0.6)
    bias = harness.random_normal(seed + 2, (V,), dtype, scale=0.5)
    tokens = jnp.asarray(np.random.default_rng(seed + 3).integers(0, V, (batch, length)), jnp.int32)
    return x, weight, bias, tokens


def oracle_token_logps(x, weight, bias, tokens, temperature=1.0, layout="hv", logits_dtype=None):
    logits = jnp.einsum("bth,hv->btv", x, weight if layout == "hv" else weight.T)
    if logits_dtype is not None:
        logits = logits + sg(logits.astype(logits_dtype).astype(logits.dtype) - logits)
    logits = (logits + bias[None, None, :]) / temperature
    if logits_dtype is not None:
        logits = logits + sg(logits.astype(logits_dtype).astype(logits.dtype) - logits)
    picked = jnp.take_along_axis(logits, tokens[..., None], axis=-1)[..., 0]
    return picked - jax.nn.logsumexp(logits, axis=-1)


def _assert_fused_matches(ours, oracle, primals, tolerance, param_tolerance):
    (loss, aux), grads = jax.jit(jax.value_and_grad(ours, argnums=(0, 1, 2), has_aux=True))(*primals)
    (expected, expected_aux), expected_grads = jax.value_and_grad(oracle, argnums=(0, 1, 2), has_aux=True)(
        *harness.as_float64(*primals)
    )
    assert set(aux) == set(expected_aux)
    compare = lambda a, e, tol=tolerance: np.testing.assert_allclose(np.asarray(a, np.float64), e, **tol)  # noqa: E731
    compare(loss, expected)
    jax.tree.map(compare, aux, expected_aux)
    compare(grads[0], expected_grads[0])
    jax.tree.map(lambda a, e: compare(a, e, param_tolerance), grads[1:], expected_grads[1:])
    assert [g.dtype for g in grads] == [p.dtype for p in primals]


# (loss_type, level, reference: "model" / "logps" / None, layout, temperature)
FUSED_CASES = [
    ("dapo", "token", "model", "hv", 0.7),
    ("grpo", "sequence", "logps", "vh", 1.3),
    ("dr_grpo", "token", None, "hv", 1.0),
]


@pytest.mark.parametrize("case", FUSED_CASES, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.usefixtures("float64_on_host")
def test_fused_grpo_matches_oracle_float64(case):
    loss_type, level, reference, layout, temperature = case
    x, weight, bias, tokens = _head_inputs(40, layout=layout)
    ref_x, ref_weight, ref_bias, _ = _head_inputs(50, layout=layout)
    _, mask, advantages, _, _ = _logps_inputs(60)
    old = oracle_token_logps(x, weight, bias, tokens, temperature, layout) + harness.random_normal(
        61, (B, T), jnp.float64, scale=0.2
    )
    ref_logps = oracle_token_logps(ref_x, ref_weight, ref_bias, tokens, temperature, layout)
    options = dict(loss_type=loss_type, importance_sampling_level=level, beta=0.1, max_completion_length=T)
    ref_kwargs = {}
    if reference == "model":
        ref_kwargs = dict(ref_x=ref_x, ref_weight=ref_weight, ref_bias=ref_bias)
    elif reference == "logps":
        ref_kwargs = dict(ref_per_token_logps=ref_logps)

    def ours(x, weight, bias):
        return liger_jax.fused_linear_grpo(
            x, weight, tokens, mask, advantages, bias=bias, old_per_token_logps=old, temperature=temperature,
            weight_layout=layout, implementation="xla", **ref_kwargs, **options,
        )  # fmt: skip

    def oracle(x, weight, bias):
        logps = oracle_token_logps(x, weight, bias, tokens, temperature, layout)
        return oracle_grpo(logps, mask, advantages, ref_logps if reference else None, old, **options)

    _assert_fused_matches(ours, oracle, (x, weight, bias), F64, F64_PARAM_GRADS)


# Every option case in chunks of two whole completions and a remainder of one, and a few in one-completion
# chunks and in a single chunk.
CHUNK_CASES = [(case, 2) for case in OPTION_CASES] + [
    (("dapo", "sequence", {}), 1),
    (("grpo", "token", {}), None),
    (("luspo", "token", {}), 1),
]


@pytest.mark.parametrize("case, chunk_size", CHUNK_CASES, ids=lambda c: _case_id(c) if isinstance(c, tuple) else c)
@pytest.mark.usefixtures("float64_on_host")
def test_whole_completion_chunks_match_oracle(case, chunk_size):
    """Five completions of odd length with a reference model, walked in chunks of whole completions: the loss, the
    metrics and the gradients each chunk makes in its forward pass match the oracle under jit."""
    loss_type, level, options = case
    batch, length = 5, 7
    x, weight, bias, tokens = _head_inputs(210, batch=batch, length=length)
    ref_head = _head_inputs(220, batch=batch, length=length)[:3]
    _, mask, advantages, _, _ = _logps_inputs(230, batch=batch, length=length)
    old = oracle_token_logps(x, weight, bias, tokens) + harness.random_normal(231, (batch, length), jnp.float64, 0.2)
    options = dict(options, loss_type=loss_type, importance_sampling_level=level, beta=options.get("beta", 0.05))
    options |= {"max_completion_length": length + 2} if loss_type == "dr_grpo" else {}
    vllm = None
    if "vllm_is_ratio" in options:
        shape = tuple({B: batch, T: length}.get(size, size) for size in options.pop("vllm_is_ratio"))
        vllm = jnp.exp(harness.random_normal(232, shape, jnp.float64, scale=0.2))

    def ours(x, weight, bias):
        return liger_jax.fused_linear_grpo(
            x, weight, tokens, mask, advantages, bias=bias, old_per_token_logps=old, vllm_is_ratio=vllm,
            ref_x=ref_head[0], ref_weight=ref_head[1], ref_bias=ref_head[2], chunk_size=chunk_size,
            implementation="xla", **options,
        )  # fmt: skip

    def oracle(x, weight, bias):
        logps = oracle_token_logps(x, weight, bias, tokens)
        return oracle_grpo(logps, mask, advantages, oracle_token_logps(*ref_head, tokens), old, vllm, **options)

    _assert_fused_matches(ours, oracle, (x, weight, bias), F64, F64_PARAM_GRADS)


def test_whole_completion_chunks_on_the_kernels():
    """The kernels (interpreter on CPU) in fp32 with GSPO's sequence-level weights, one completion per chunk."""
    x, weight, bias, tokens = _head_inputs(240, jnp.float32, batch=3, length=5)
    _, mask, advantages, _, old = _logps_inputs(250, batch=3, length=5)

    def ours(x, weight, bias):
        return liger_jax.fused_linear_grpo(
            x, weight, tokens, mask, advantages, bias=bias, old_per_token_logps=old, loss_type="grpo",
            importance_sampling_level="sequence", temperature=0.9, chunk_size=1,
            implementation=harness.KERNEL_IMPLEMENTATION,
        )  # fmt: skip

    def oracle(x, weight, bias):
        logps = oracle_token_logps(x, weight, bias, tokens, 0.9)
        options = dict(loss_type="grpo", importance_sampling_level="sequence")
        return oracle_grpo(logps, mask, advantages, None, old, **options)

    tolerance = harness.tolerance(jnp.float32)
    _assert_fused_matches(ours, oracle, (x, weight, bias), tolerance, tolerance)


def test_sequence_sharded_completions_stay_whole_in_their_chunks():
    """x sharded along the completion axis (sequence parallelism) gives the unsharded loss and gradients: the chunk
    loop never splits a completion across devices."""
    x, weight, _, tokens = _head_inputs(260, jnp.float32, batch=2, length=6)
    mask, advantages = jnp.ones((2, 6), bool).at[1, 4].set(False), jnp.array([1.0, -0.5])

    @jax.jit
    def loss_and_grads(x, weight):
        def loss(x, weight):
            return liger_jax.fused_linear_grpo(
                x, weight, tokens, mask, advantages, loss_type="grpo", importance_sampling_level="sequence",
                chunk_size=1, implementation="xla",
            )[0]  # fmt: skip

        return jax.value_and_grad(loss, argnums=(0, 1))(x, weight)

    expected, expected_grads = loss_and_grads(x, weight)
    loss, grads = loss_and_grads(collectives.place(x, collectives.mesh((2,), ("seq",)), None, "seq"), weight)
    np.testing.assert_allclose(loss, expected, rtol=1e-6)
    jax.tree.map(lambda a, e: np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6), grads, expected_grads)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_vocabulary_sharded_heads_give_the_one_device_loss_and_gradients(level):
    """Tensor parallelism: the policy's and the reference model's heads sharded on the vocabulary give the
    one-device loss, metrics and gradients; dweight stays vocabulary-sharded."""
    vocab = 12  # two devices' slices of 6
    x, _, _, tokens = _head_inputs(270, jnp.float32)
    ref_x = _head_inputs(271, jnp.float32)[0]
    weight, ref_weight = (harness.random_normal(s, (H, vocab), jnp.float32, scale=0.6) for s in (272, 273))
    bias = harness.random_normal(274, (vocab,), jnp.float32, scale=0.5)
    _, mask, advantages, _, old = _logps_inputs(275)
    tokens, advantages, old = tokens % vocab, advantages.astype(jnp.float32), old.astype(jnp.float32)

    @jax.jit
    def loss_and_grads(x, weight, bias, ref_weight):
        def loss(x, weight, bias):
            return liger_jax.fused_linear_grpo(
                x, weight, tokens, mask, advantages, bias=bias, ref_x=ref_x, ref_weight=ref_weight,
                old_per_token_logps=old, importance_sampling_level=level,
                implementation=harness.KERNEL_IMPLEMENTATION,
            )  # fmt: skip

        return jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(x, weight, bias)

    mesh_ = collectives.mesh((2,), ("tp",))
    sharded_weight = collectives.place(weight, mesh_, None, "tp")
    expected = loss_and_grads(x, weight, bias, ref_weight)
    got = loss_and_grads(
        x, sharded_weight, collectives.place(bias, mesh_, "tp"), collectives.place(ref_weight, mesh_, None, "tp")
    )
    for a, e in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)
    assert got[1][1].sharding.is_equivalent_to(sharded_weight.sharding, 2)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_fused_grpo_kernel_implementation(dtype):
    """The Triton path (interpreter on CPU) against the oracle on the same rounded inputs; bf16 at temperature 1
    (the primitive scales x, not the logits, by the temperature, which rounds differently in bf16)."""
    temperature = 0.8 if dtype == jnp.float32 else 1.0
    x, weight, bias, tokens = _head_inputs(70, dtype)
    ref_x, ref_weight, ref_bias, _ = _head_inputs(80, dtype)
    _, mask, advantages, _, _ = _logps_inputs(90)
    advantages = advantages.astype(dtype)

    def ours(x, weight, bias):
        return liger_jax.fused_linear_grpo(
            x, weight, tokens, mask, advantages, bias=bias, ref_x=ref_x, ref_weight=ref_weight, ref_bias=ref_bias,
            temperature=temperature, loss_type="bnpo", implementation=harness.KERNEL_IMPLEMENTATION,
        )  # fmt: skip

    def oracle(x, weight, bias):
        logits_dtype = dtype if dtype != jnp.float32 else None
        logps = oracle_token_logps(x, weight, bias, tokens, temperature, logits_dtype=logits_dtype)
        ref = oracle_token_logps(
            *harness.as_float64(ref_x, ref_weight, ref_bias), tokens, temperature, logits_dtype=logits_dtype
        )
        return oracle_grpo(logps, mask, jnp.asarray(advantages, jnp.float64), ref, None, loss_type="bnpo", beta=0.04)

    tolerance = harness.tolerance(dtype)
    _assert_fused_matches(ours, oracle, (x, weight, bias), tolerance, tolerance)


def test_reference_and_old_inputs_get_no_gradient():
    # float32: a GPU's XLA has no float64 GEMM, and a zero gradient is exact in any dtype.
    x, weight, bias, tokens = _head_inputs(100, jnp.float32)
    ref_x, ref_weight, ref_bias, _ = _head_inputs(110, jnp.float32)
    logps, mask, advantages, ref, old = _logps_inputs(120)

    def with_model(ref_x, ref_weight, ref_bias, old):
        return liger_jax.fused_linear_grpo(
            x, weight, tokens, mask, advantages, bias=bias, ref_x=ref_x, ref_weight=ref_weight, ref_bias=ref_bias,
            old_per_token_logps=old, implementation="xla",
        )[0]  # fmt: skip

    def with_logps(ref, old, advantages):
        return grpo.grpo_loss_from_logps(logps, mask, advantages, ref_per_token_logps=ref, old_per_token_logps=old)[0]

    for grad in jax.grad(with_model, argnums=(0, 1, 2, 3))(ref_x, ref_weight, ref_bias, old):
        np.testing.assert_array_equal(grad, 0.0)
    for grad in jax.grad(with_logps, argnums=(0, 1))(ref, old, advantages):
        np.testing.assert_array_equal(grad, 0.0)


def _call(**overrides):
    x, weight, _, tokens = _head_inputs(130, jnp.float32)
    mask, advantages = jnp.ones((B, T), bool), jnp.ones((B,), jnp.float32)
    args = dict(x=x, weight=weight, selected_token_ids=tokens, attention_mask=mask, advantages=advantages)
    args |= overrides
    positional = [args.pop(k) for k in ("x", "weight", "selected_token_ids", "attention_mask", "advantages")]
    return liger_jax.fused_linear_grpo(*positional, **args)


BAD_CALLS = [
    (ValueError, "loss_type", dict(loss_type="ppo")),
    (ValueError, "importance_sampling_level", dict(importance_sampling_level="batch")),
    (ValueError, "does not apply", dict(importance_sampling_level="sequence", loss_type="cispo")),
    (ValueError, "max_completion_length", dict(loss_type="dr_grpo")),
    (ValueError, "epsilon_low", dict(epsilon_low=-0.1)),
    (ValueError, "temperature", dict(temperature=0.0)),
    (ValueError, "sapo_temperature_neg", dict(sapo_temperature_neg=-1.0)),
    (ValueError, "delta", dict(delta=0.0)),
    (ValueError, "beta", dict(beta=float("inf"))),
    (ValueError, "attention_mask", dict(attention_mask=jnp.ones((B, T + 1)))),
    (ValueError, "advantages", dict(advantages=jnp.ones((B, 1)))),
    (TypeError, "advantages", dict(advantages=jnp.ones((B,), jnp.int32))),
    (ValueError, "old_per_token_logps", dict(old_per_token_logps=jnp.ones((B, T - 1)))),
    (ValueError, "vllm_is_ratio", dict(vllm_is_ratio=jnp.ones((B, 2)))),
    (TypeError, "integer dtype", dict(selected_token_ids=jnp.ones((B, T)))),
    (ValueError, "must be in", dict(selected_token_ids=jnp.full((B, T), V, jnp.int32))),
    (
        ValueError,
        "not both",
        dict(ref_per_token_logps=jnp.ones((B, T)), ref_x=jnp.ones((B, T, H)), ref_weight=jnp.ones((H, V))),
    ),
    (ValueError, "together", dict(ref_weight=jnp.ones((H, V)))),
]


@pytest.mark.parametrize("error, match, overrides", BAD_CALLS, ids=[c[1] for c in BAD_CALLS])
def test_bad_inputs_raise_before_any_launch(error, match, overrides):
    with pytest.raises(error, match=match):
        _call(**overrides)


def test_flax_grpo_modules_compute_the_functional_loss():
    from flax import linen as nn
    from flax import nnx

    from liger_jax.flax_layers import preference_linen, preference_nnx

    x, _, _, tokens = _head_inputs(140, jnp.float32)
    _, mask, advantages, _, _ = _logps_inputs(141)
    advantages = advantages.astype(jnp.float32)
    head, ref_head = nnx.Linear(H, V, rngs=nnx.Rngs(0)), nnx.Linear(H, V, rngs=nnx.Rngs(1))
    options = dict(loss_type="grpo", temperature=0.9, implementation="xla")
    loss, aux = preference_nnx.FusedLinearGRPOLoss(**options)(
        head, x, tokens, mask, advantages, ref_head=ref_head, ref_hidden=x
    )
    expected, expected_aux = liger_jax.fused_linear_grpo(
        x, head.kernel[...], tokens, mask, advantages, bias=head.bias[...], ref_x=x, ref_weight=ref_head.kernel[...],
        ref_bias=ref_head.bias[...], **options,
    )  # fmt: skip
    np.testing.assert_allclose(loss, expected, rtol=1e-6)
    jax.tree.map(lambda a, e: np.testing.assert_allclose(a, e, rtol=1e-6, atol=1e-7), aux, expected_aux)

    module = preference_linen.FusedLinearGRPOLoss(V, **options)
    params = module.init(jax.random.key(0), x, tokens, mask, advantages)
    assert jax.tree.map(jnp.shape, params) == jax.tree.map(jnp.shape, nn.Dense(V).init(jax.random.key(0), x))
    loss, _ = module.apply(params, x, tokens, mask, advantages)
    kernel, bias = params["params"]["kernel"], params["params"]["bias"]
    expected, _ = liger_jax.fused_linear_grpo(x, kernel, tokens, mask, advantages, bias=bias, **options)
    np.testing.assert_allclose(loss, expected, rtol=1e-6)
