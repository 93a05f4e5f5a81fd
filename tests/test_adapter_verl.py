"""llm.adapters.verl: sandbox objectives as verl policy losses, parity with verl's own losses.

Everything runs verl's loss functions on CPU tensors (no Ray, no model). Tolerances: float64
inputs, so both sides agree to 1e-12 (relative) unless a test says otherwise.
"""

from __future__ import annotations

import inspect
import math

import pytest
import torch

pytest.importorskip("verl")

from verl.trainer.ppo.core_algos import (
    POLICY_LOSS_REGISTRY,
    agg_loss,
    get_policy_loss_fn,
    kl_penalty,
)
from verl.workers.config import ActorConfig, PolicyLossConfig

import llm.adapters.verl as adapter
from sandbox.aggregate import AGGREGATION_MODES, aggregate
from sandbox.kl import k3
from sandbox.objectives import available_objectives, available_presets

F64 = torch.float64
RTOL = 1e-12


def actor_config(policy_loss=None, batch_info=None, **actor) -> ActorConfig:
    # strategy and rollout_n are MISSING by default and __post_init__ wants a micro batch size.
    cfg = ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        policy_loss=policy_loss or PolicyLossConfig(),
        **actor,
    )
    cfg.global_batch_info.update(batch_info or {})
    return cfg


def sandbox_loss_config(objective_params=None, **kwargs) -> adapter.SandboxPolicyLossConfig:
    return adapter.SandboxPolicyLossConfig(objective_params=objective_params or {}, **kwargs)


def make_data(seed=0, B=8, T=12, noise=0.7):
    """float64 [B, T]: log-probs, old log-probs, per-sequence advantages of both signs, a ragged
    bool mask with one empty sequence (verl excludes it from its sequence counts)."""
    g = torch.Generator().manual_seed(seed)
    old = torch.nn.functional.logsigmoid(2 * torch.randn(B, T, generator=g, dtype=F64) + 1)
    logp = old + noise * torch.randn(B, T, generator=g, dtype=F64)
    adv = torch.randn(B, 1, generator=g, dtype=F64)
    adv[::2] = adv[::2].abs()
    adv[1::2] = -adv[1::2].abs()
    lengths = torch.randint(2, T + 1, (B,), generator=g)
    lengths[0], lengths[-1] = T, 0
    mask = torch.arange(T)[None, :] < lengths[:, None]
    weights = torch.rand(B, T, generator=g, dtype=F64) + 0.5
    return logp, old, adv.expand(B, T).contiguous(), mask, weights


def run(name, cfg, data, mode="token-mean", weights=False):
    """(loss, grad on log_prob, metrics) of verl policy loss ``name``."""
    logp, old, adv, mask, w = data
    logp = logp.clone().requires_grad_()
    loss, metrics = get_policy_loss_fn(name)(
        old_log_prob=old,
        log_prob=logp,
        advantages=adv,
        response_mask=mask,
        loss_agg_mode=mode,
        config=cfg,
        rollout_is_weights=w if weights else None,
    )
    loss.backward()
    return loss.detach(), logp.grad, metrics


def assert_same(a, b, rtol=RTOL):
    (la, ga, _), (lb, gb, _) = a, b
    assert la.item() == pytest.approx(lb.item(), rel=rtol, abs=1e-15)
    scale = gb.abs().max().clamp(min=1e-30)
    assert ((ga - gb).abs().max() / scale).item() <= rtol


# --------------------------------------------------------------------------------------------------
# Registration
# --------------------------------------------------------------------------------------------------


def test_every_objective_and_preset_is_registered_with_verls_signature():
    names = [*available_objectives(), *available_presets()]
    assert [f"sandbox_{n}" for n in names] == adapter.REGISTERED
    vanilla = inspect.signature(POLICY_LOSS_REGISTRY["vanilla"])
    for name in adapter.REGISTERED:
        fn = get_policy_loss_fn(name)
        assert list(inspect.signature(fn).parameters) == list(vanilla.parameters)
    assert adapter.register_all() == adapter.REGISTERED  # idempotent


@pytest.mark.parametrize("name", available_objectives())
def test_every_objective_runs_under_verl_defaults(name):
    data = make_data(noise=0.3)
    cfg = actor_config(clip_ratio_low=0.2, clip_ratio_high=0.28)
    loss, grad, metrics = run(f"sandbox_{name}", cfg, data, "token-mean", weights=True)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    assert (grad[~data[3]] == 0).all()  # no gradient on padding
    assert {"actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"} <= set(metrics)
    assert "actor/sandbox/ratio_mean" in metrics
    assert all(isinstance(v, float) for v in metrics.values())


# --------------------------------------------------------------------------------------------------
# Configuration: verl fields, presets, objective_params
# --------------------------------------------------------------------------------------------------


def test_params_precedence_objective_params_over_preset_over_verl_fields():
    cfg = actor_config(clip_ratio=0.1, clip_ratio_low=None, clip_ratio_high=0.5, clip_ratio_c=4.0)
    # verl fields with verl's meaning: clip_ratio_low falls back to clip_ratio
    assert adapter.resolve_params("ppo_clip", cfg) == {
        "eps_low": 0.1,
        "eps_high": 0.5,
        "clip_c": 4.0,
    }
    # a preset's values win over verl's fields (which always have values)
    assert adapter.resolve_params("dapo", cfg)["eps_high"] == 0.28
    over = actor_config(policy_loss=sandbox_loss_config({"eps_high": 0.3}), clip_ratio_high=0.5)
    assert adapter.resolve_params("dapo", over)["eps_high"] == 0.3
    # CISPO: verl's relative bounds become absolute ones; clip_ratio_low > 1 means no lower bound
    cispo = adapter.resolve_params("cispo", actor_config(clip_ratio_low=0.2, clip_ratio_high=0.3))
    assert cispo == pytest.approx({"lower": 0.8, "upper": 1.3})
    assert adapter.resolve_params("cispo", actor_config(clip_ratio_low=10.0))["lower"] == 0.0
    sapo = adapter.resolve_params("sapo", actor_config(tau_pos=2.0, tau_neg=3.0))
    assert sapo == {"tau_pos": 2.0, "tau_neg": 3.0}
    pl = PolicyLossConfig(kl_cov_ratio=0.01, ppo_kl_coef=0.5)
    assert adapter.resolve_params("kl_cov", actor_config(policy_loss=pl)) == {
        "kl_cov_ratio": 0.01,
        "ppo_kl_coef": 0.5,
    }


def test_objective_params_from_a_dictconfig_and_bad_names():
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(
        {
            "clip_ratio": 0.2,
            "policy_loss": {"objective_params": {"noise": "band", "sigma": 0.05, "seed": 7}},
        }
    )
    params = adapter.resolve_params("nsr", cfg)
    assert params == {"eps_low": 0.2, "eps_high": 0.2, "noise": "band", "sigma": 0.05, "seed": 7}
    bad = actor_config(policy_loss=sandbox_loss_config({"sigmaa": 0.1}))
    with pytest.raises(ValueError, match="sigmaa"):
        run("sandbox_nsr", bad, make_data())
    with pytest.raises(ValueError, match="actor config"):
        run("sandbox_ppo_clip", None, make_data())


def test_stochastic_objective_is_cached_and_seeded_by_rank(monkeypatch):
    cfg = actor_config(clip_ratio_low=0.2, clip_ratio_high=0.28)
    obj = adapter.objective_for("nsr", cfg)
    assert adapter.objective_for("nsr", cfg) is obj  # its generator advances between calls
    data = make_data(noise=1.0)
    first, second = run("sandbox_nsr", cfg, data)[1], run("sandbox_nsr", cfg, data)[1]
    assert not torch.equal(first, second)  # fresh draws each call
    monkeypatch.setenv("RANK", "3")
    assert adapter.resolve_params("nsr", cfg)["seed"] == 3


#: The verl overrides of the multi-node command line in docs/adapters.md (keep them in sync).
DOC_OVERRIDES = [
    "algorithm.adv_estimator=grpo",
    "data.train_files=/data/gsm8k/train.parquet",
    "data.val_files=/data/gsm8k/test.parquet",
    "data.train_batch_size=512",
    "data.max_prompt_length=1024",
    "data.max_response_length=4096",
    "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct",
    "actor_rollout_ref.model.external_lib=llm.adapters.verl",
    "actor_rollout_ref.actor.policy_loss.loss_mode=sandbox_nsr",
    "actor_rollout_ref.actor.policy_loss._target_=llm.adapters.verl.SandboxPolicyLossConfig",
    "+actor_rollout_ref.actor.policy_loss.objective_params.noise=band",
    "+actor_rollout_ref.actor.policy_loss.objective_params.sigma=0.1",
    "actor_rollout_ref.actor.clip_ratio_low=0.2",
    "actor_rollout_ref.actor.clip_ratio_high=0.28",
    "actor_rollout_ref.actor.loss_agg_mode=token-mean",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.actor.ppo_mini_batch_size=128",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.actor.use_kl_loss=False",
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.n=8",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
    "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES=llm.adapters.verl",
    "trainer.nnodes=2",
    "trainer.n_gpus_per_node=8",
    "trainer.project_name=clip-sandbox",
    "trainer.experiment_name=nsr-band-qwen7b",
]


def test_documented_command_line_composes_and_activates_the_objective():
    """The overrides of docs/adapters.md compose with verl's own ppo_trainer.yaml and build a
    SandboxPolicyLossConfig carrying objective_params (needs hydra-core, a verl dependency that
    the minimal CI install leaves out)."""
    pytest.importorskip("hydra")
    import os

    import verl
    from hydra import compose, initialize_config_dir
    from verl.utils.config import omega_conf_to_dataclass

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=DOC_OVERRIDES)
    assert cfg.actor_rollout_ref.model.external_lib == "llm.adapters.verl"
    env = cfg.ray_kwargs.ray_init.runtime_env.env_vars
    assert env.VERL_USE_EXTERNAL_MODULES == "llm.adapters.verl"
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert isinstance(actor.policy_loss, adapter.SandboxPolicyLossConfig)
    assert actor.policy_loss.loss_mode == "sandbox_nsr"
    obj = adapter.objective_for("nsr", actor)
    assert (obj.noise, obj.sigma, obj.eps_low, obj.eps_high) == ("band", 0.1, 0.2, 0.28)


@pytest.mark.slow
def test_verl_use_external_modules_registers_the_losses():
    """``VERL_USE_EXTERNAL_MODULES=llm.adapters.verl``: a fresh process (a Ray worker) that
    imports verl gets every sandbox_<name> loss registered, without importing the adapter itself."""
    import os
    import subprocess
    import sys

    code = (
        "import verl\n"
        "from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY as R\n"
        "print(sorted(k for k in R if k.startswith('sandbox_')))"
    )
    env = {**os.environ, "VERL_USE_EXTERNAL_MODULES": "llm.adapters.verl"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == str(sorted(adapter.REGISTERED))


# --------------------------------------------------------------------------------------------------
# Parity with verl's own losses
# --------------------------------------------------------------------------------------------------

# (verl loss, sandbox loss, actor config kwargs); the sandbox side reads the same config.
PAIRS = {
    "vanilla": ("vanilla", "sandbox_ppo_clip", {}),  # verl's clip_ratio_c = 3 -> clip_c = 3
    "vanilla_dapo": (
        "vanilla",
        "sandbox_ppo_clip",
        {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 2.0},
    ),
    "gspo": ("gspo", "sandbox_gspo", {"clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4}),
    "gspo_wide": ("gspo", "sandbox_gspo", {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28}),
    "cispo": ("cispo", "sandbox_cispo", {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28}),
    "kl_cov": (
        "kl_cov",
        "sandbox_kl_cov",
        {"policy_loss": sandbox_loss_config(kl_cov_ratio=0.05, ppo_kl_coef=1.0)},
    ),
    # clip_cov_ratio = 1: every candidate is cut, so verl's randperm draw has no effect; verl's
    # clip_cov has no dual clip, hence clip_c = None (see test_verl_clip_cov_ignores_clip_ratio_c).
    "clip_cov": (
        "clip_cov",
        "sandbox_clip_cov",
        {"policy_loss": sandbox_loss_config({"clip_c": None}, clip_cov_ratio=1.0)},
    ),
}


@pytest.mark.parametrize("weights", [False, True], ids=["plain", "rollout_is_weights"])
@pytest.mark.parametrize("mode", AGGREGATION_MODES)
@pytest.mark.parametrize("pair", PAIRS)
def test_loss_and_gradient_parity(pair, mode, weights):
    verl_name, sandbox_name, actor = PAIRS[pair]
    cfg = actor_config(**actor)
    data = make_data(seed=1)
    assert_same(
        run(sandbox_name, cfg, data, mode, weights), run(verl_name, cfg, data, mode, weights)
    )


@pytest.mark.parametrize("weights", [False, True], ids=["plain", "rollout_is_weights"])
def test_sapo_parity(weights):
    cfg = actor_config(tau_pos=1.0, tau_neg=1.05)
    data = make_data(seed=2)
    mode = "seq-mean-token-mean"  # verl's sapo always aggregates so
    assert_same(
        run("sandbox_sapo", cfg, data, mode, weights), run("sapo", cfg, data, mode, weights)
    )


@pytest.mark.parametrize("mode", [*AGGREGATION_MODES, "token-sum"])
def test_parity_with_global_batch_info(mode):
    """dp_size, global token / sequence counts and loss_scale_factor act as in verl's losses."""
    data = make_data(seed=3)
    info = {"dp_size": 4, "batch_num_tokens": 300, "global_batch_size": 30, "loss_scale_factor": 64}
    cfg = actor_config(batch_info=info, clip_ratio_low=0.2, clip_ratio_high=0.28)
    assert_same(run("sandbox_ppo_clip", cfg, data, mode), run("vanilla", cfg, data, mode))


def test_metrics_match_verls_keys():
    cfg = actor_config(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=2.0)
    data = make_data(seed=4, noise=1.0)
    _, _, ours = run("sandbox_ppo_clip", cfg, data)
    _, _, theirs = run("vanilla", cfg, data)
    assert theirs["actor/pg_clipfrac_lower"] > 0  # the dual clip is exercised
    for key, value in theirs.items():
        assert ours[key] == pytest.approx(value, rel=1e-6, abs=1e-9)
    # pg_clipfrac is the dead-zone share Z = Z_lo + Z_hi, split by sign in the sandbox metrics
    z = ours["actor/sandbox/clip_low_frac"] + ours["actor/sandbox/clip_high_frac"]
    assert ours["actor/pg_clipfrac"] == pytest.approx(z)
    assert ours["actor/sandbox/dual_clip_frac"] == pytest.approx(theirs["actor/pg_clipfrac_lower"])


def test_clip_cov_random_pick_same_law():
    """With few picks, verl draws them with torch.randperm on the global RNG and the sandbox
    from its own generator: not the same tokens, but the same number, among the same candidates,
    and every other token keeps verl's loss."""
    kw = {"objective_params": {"clip_c": None}, "clip_cov_lb": 0.1}
    cfg = actor_config(policy_loss=sandbox_loss_config(clip_cov_ratio=0.02, **kw))
    cands_cfg = actor_config(policy_loss=sandbox_loss_config(clip_cov_ratio=1.0, **kw))
    data = make_data(seed=5, B=16, T=24)
    mask = data[3]
    torch.manual_seed(0)
    _, g_verl, m_verl = run("clip_cov", cfg, data)
    _, g_sb, _ = run("sandbox_clip_cov", cfg, data)
    _, g_all, _ = run("clip_cov", cands_cfg, data)
    _, g_none, _ = run("vanilla", actor_config(clip_ratio_c=1e9), data)  # no pick at all
    candidates = mask & (g_all == 0) & (g_none != 0)
    cut_verl = mask & (g_verl == 0) & (g_none != 0)
    cut_sb = mask & (g_sb == 0) & (g_none != 0)
    n_cut = max(1, math.floor(0.02 * int(mask.sum())))
    assert int(candidates.sum()) > n_cut  # a real random choice
    assert int(cut_verl.sum()) == int(cut_sb.sum()) == n_cut
    assert not (cut_sb & ~candidates).any() and not (cut_verl & ~candidates).any()
    keep = ~(cut_verl | cut_sb)
    assert torch.allclose(g_sb[keep], g_verl[keep], rtol=1e-12, atol=0)
    assert m_verl["actor/pg_clipfrac"] == pytest.approx(n_cut / int(mask.sum()))


# --------------------------------------------------------------------------------------------------
# Semantic differences (each backs a row of the table in docs/adapters.md)
# --------------------------------------------------------------------------------------------------


def test_verl_vanilla_always_dual_clips():
    """verl's vanilla applies clip_ratio_c (default 3) to A < 0; the sandbox's ppo_clip has no dual
    clip unless clip_c is set. The adapter maps clip_ratio_c -> clip_c, so sandbox_ppo_clip under
    verl equals vanilla; with clip_c=None it differs exactly on {A < 0, r > 3}."""
    data = make_data(seed=6, noise=1.5)
    logp, old, adv, mask, _ = data
    dual = mask & (adv < 0) & ((logp - old).exp() > 3.0)
    assert dual.any()
    off = actor_config(policy_loss=sandbox_loss_config({"clip_c": None}))
    _, g_off, _ = run("sandbox_ppo_clip", off, data)
    _, g_verl, _ = run("vanilla", actor_config(), data)
    assert (g_verl[dual] == 0).all() and (g_off[dual] != 0).all()
    assert torch.allclose(g_off[~dual], g_verl[~dual], rtol=1e-12, atol=0)


def test_verl_clip_cov_ignores_clip_ratio_c():
    """verl's clip_cov never dual-clips, and neither does sandbox_clip_cov: clip_ratio_c in the
    config is not read for it (tokens with A < 0 and r > c keep their -A r gradient in both)."""
    data = make_data(seed=6, noise=1.5)
    logp, old, adv, mask, _ = data
    dual = mask & (adv < 0) & ((logp - old).exp() > 3.0)
    cfg = actor_config(
        policy_loss=PolicyLossConfig(clip_cov_ratio=1e-6, clip_cov_lb=50.0, clip_cov_ub=60.0)
    )
    assert adapter.resolve_params("clip_cov", cfg).get("clip_c") is None
    _, g_sb, _ = run("sandbox_clip_cov", cfg, data)  # lb = 50: no candidate, pure clip
    _, g_verl, _ = run("clip_cov", cfg, data)
    assert dual.any() and (g_verl[dual] != 0).all()
    torch.testing.assert_close(g_sb, g_verl)


def test_verl_sapo_ignores_loss_agg_mode():
    """verl's sapo always uses seq-mean-token-mean; sandbox_sapo honours loss_agg_mode."""
    cfg = actor_config()
    data = make_data(seed=7)
    verl_tm = run("sapo", cfg, data, "token-mean")[0]
    verl_sm = run("sapo", cfg, data, "seq-mean-token-mean")[0]
    ours_tm = run("sandbox_sapo", cfg, data, "token-mean")[0]
    assert verl_tm.item() == pytest.approx(verl_sm.item(), rel=1e-15)
    assert ours_tm.item() != pytest.approx(verl_tm.item(), rel=1e-3)


def test_verl_gspo_clamps_sequence_log_ratio_at_10():
    """verl clamps the GSPO-token log-ratio at +10 with the gradient (cut above 10); the sandbox
    clamps the detached sequence mean at ±20, so the gradient keeps flowing (A < 0, s > u)."""
    B, T = 2, 4
    old = torch.full((B, T), -20.0, dtype=F64)
    logp = torch.full((B, T), -8.0, dtype=F64)  # mean log-ratio 12 in both sequences
    adv = torch.tensor([[-1.0], [1.0]], dtype=F64).expand(B, T)
    mask = torch.ones(B, T, dtype=torch.bool)
    data = (logp, old, adv, mask, None)
    cfg = actor_config(clip_ratio_low=0.2, clip_ratio_high=0.28)
    _, g_verl, _ = run("gspo", cfg, data, "seq-mean-token-mean")
    _, g_sb, _ = run("sandbox_gspo", cfg, data, "seq-mean-token-mean")
    assert (g_verl == 0).all()
    # A = -1, s = e^12 > u: PPO's min-form keeps r A, so each token gets -s A / |o| = e^12 / 4 / 2
    assert torch.allclose(g_sb[0], torch.full((T,), math.exp(12) / T / B, dtype=F64), rtol=1e-12)
    assert (g_sb[1] == 0).all()  # A > 0, s > u: clipped on both sides


def test_verl_kl_cov_does_not_clamp_the_log_ratio():
    """verl's kl_cov (and clip_cov) use exp(log_prob - old_log_prob) unclamped; the sandbox clamps
    the log-ratio at ±20 (docs/objectives.md §1)."""
    logp = torch.tensor([[5.0, -1.0, -2.0, -3.0]], dtype=F64)
    old = torch.tensor([[-20.0, -1.0, -2.0, -3.0]], dtype=F64)  # log r = 25 on the first token
    adv = torch.full((1, 4), -1.0, dtype=F64)
    mask = torch.ones(1, 4, dtype=torch.bool)
    cfg = actor_config(policy_loss=PolicyLossConfig(kl_cov_ratio=1e-6, ppo_kl_coef=0.0))
    verl_loss = run("kl_cov", cfg, (logp, old, adv, mask, None))[0].item()
    ours = run("sandbox_kl_cov", cfg, (logp, old, adv, mask, None))[0].item()
    assert verl_loss == pytest.approx((math.exp(25) + 3) / 4, rel=1e-12)  # -A r, token mean
    assert ours == pytest.approx((math.exp(20) + 3) / 4, rel=1e-12)


def test_verl_cispo_clipfrac_is_unsigned():
    """verl's cispo counts every token whose ratio leaves [1 - low, 1 + high]; the sandbox's clip
    fractions count the sign-aware truncations only (A > 0, r > upper) and (A < 0, r < lower)."""
    cfg = actor_config(clip_ratio_low=0.2, clip_ratio_high=0.28)
    data = make_data(seed=8, noise=1.0)
    logp, old, adv, mask, _ = data
    r = (logp - old).exp()
    outside = mask & ((r < 0.8) | (r > 1.28))
    signed = mask & (((adv > 0) & (r > 1.28)) | ((adv < 0) & (r < 0.8)))
    n = mask.sum().item()
    theirs = run("cispo", cfg, data)[2]["actor/pg_clipfrac"]
    ours = run("sandbox_cispo", cfg, data)[2]["actor/pg_clipfrac"]
    assert theirs == pytest.approx(outside.sum().item() / n)
    assert ours == pytest.approx(signed.sum().item() / n)
    assert ours < theirs


def test_verl_ppo_kl_metric_is_k1_except_kl_cov():
    """``actor/ppo_kl`` is mean(old_log_prob - log_prob) (k1) in verl's losses and in every
    sandbox_<name>; verl's kl_cov alone reports mean |log r| under that key."""
    pl = PolicyLossConfig(kl_cov_ratio=0.05, ppo_kl_coef=1.0)
    data = make_data(seed=10)
    logp, old, _, mask, _ = data
    k1 = ((old - logp) * mask).sum().item() / mask.sum().item()
    abs_lr = ((logp - old).abs() * mask).sum().item() / mask.sum().item()
    assert run("vanilla", actor_config(), data)[2]["actor/ppo_kl"] == pytest.approx(k1)
    assert run("kl_cov", actor_config(policy_loss=pl), data)[2]["actor/ppo_kl"] == pytest.approx(
        abs_lr
    )
    ours = run("sandbox_kl_cov", actor_config(policy_loss=pl), data)[2]["actor/ppo_kl"]
    assert ours == pytest.approx(k1)


def verl_aggregate_kwargs(mode: str, info: dict) -> dict:
    """How verl's agg_loss normalisers map onto sandbox.aggregate's keyword arguments."""
    dp = info.get("dp_size", 1)
    if mode == "token-mean":
        return {"num_tokens": info["batch_num_tokens"] / dp}
    return {"num_seqs": info["global_batch_size"] / dp, "max_len": info.get("loss_scale_factor")}


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_verl_agg_loss_normalisers_map_onto_sandbox_aggregate(mode):
    """verl's agg_loss = sandbox.aggregate with num_tokens = batch_num_tokens / dp_size,
    num_seqs = global_batch_size / dp_size, max_len = loss_scale_factor (default: padded T in
    both); without global info both count non-empty sequences. The only numerical difference:
    verl divides a sequence's sum by (length + 1e-8), the sandbox by max(length, 1)."""
    loss, _, _, mask, _ = make_data(seed=9)
    assert agg_loss(loss, mask, mode).item() == pytest.approx(
        aggregate(loss, mask, mode).item(), rel=1e-8
    )
    info = {"dp_size": 4, "batch_num_tokens": 300, "global_batch_size": 30, "loss_scale_factor": 64}
    kwargs = verl_aggregate_kwargs(mode, info)
    assert agg_loss(loss, mask, mode, **info).item() == pytest.approx(
        aggregate(loss, mask, mode, **kwargs).item(), rel=1e-8
    )


def test_verl_low_var_kl_clamps_k3_at_10():
    """verl's KL loss ``low_var_kl`` is k3 clamped to [-10, 10]; sandbox.kl.k3 (and TRL's KL) is
    not clamped beyond the ±20 log-ratio clamp."""
    logp = torch.tensor([[-6.0, -1.0]], dtype=F64)
    ref = torch.tensor([[-1.0, -1.5]], dtype=F64)  # d = ref - logp = 5 and -0.5
    theirs = kl_penalty(logp, ref, "low_var_kl")
    ours = k3(logp, ref)
    assert ours[0, 0].item() == pytest.approx(math.exp(5) - 6)
    assert theirs[0, 0].item() == pytest.approx(10.0)
    assert theirs[0, 1].item() == pytest.approx(ours[0, 1].item(), rel=1e-12)
