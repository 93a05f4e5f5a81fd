"""llm.adapters.trl: SandboxGRPOTrainer against TRL's own GRPOTrainer.

A 2-layer Llama (hidden 32) and a character-level tokenizer are built in code (no download;
HF_HUB_OFFLINE=1 works). Two kinds of checks:

* loss level: the stock trainer (``loss_type=...``) and the sandbox trainer, on identical models,
  run ``_compute_loss`` on the same hand-made off-policy batch (ragged masks, an empty completion,
  gradient accumulation 2, a global token count twice the local one); loss and every parameter's
  gradient agree to 1e-5 relative (TRL's fused LM head returns float32 log-probs);
* training: three optimiser steps of ``trainer.train()`` (generation, rewards, two PPO iterations per
  generation so that the ratio leaves 1) from the same seed give the same parameters to 1e-5 of
  how far they moved. The optimiser is SGD: Adam divides each coordinate by its running RMS, so
  float32 rounding in coordinates whose gradient is ~0 would show as O(lr) noise unrelated to
  the loss.
"""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("trl")
pytest.importorskip("datasets")

from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    set_seed,
)
from trl import GRPOConfig, GRPOTrainer

from llm.adapters.trl import (
    TRL_AGGREGATION,
    SandboxGRPOTrainer,
    fold_vllm_ratio,
    trl_equivalent,
    trl_normalisers,
)
from sandbox.aggregate import aggregate
from sandbox.objectives import get_objective

LOSS_RTOL = 1e-5
GRAD_RTOL = 1e-5
TRAIN_RTOL = 1e-5


VOCAB = {"<pad>": 0, "</s>": 1, "<unk>": 2}
VOCAB.update({c: i + 3 for i, c in enumerate("0123456789+=abcdefghij ")})


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.WordLevel(VOCAB, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")  # one token per character
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )


def make_model(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(VOCAB),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=1,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).train()


DATASET = {"prompt": ["1+2=", "3+4=", "5+1=", "2+2="]}


def reward(completions, **kwargs):
    return [float(c.count("3")) + 0.1 * len(c) for c in completions]


def make_args(tmp_path, **overrides) -> GRPOConfig:
    kwargs = {
        "output_dir": str(tmp_path / "out"),
        "use_cpu": True,
        "report_to": [],
        "save_strategy": "no",
        "bf16": False,
        "seed": 0,
        "max_steps": 3,
        "per_device_train_batch_size": 4,
        "num_generations": 4,
        "max_completion_length": 6,
        "num_iterations": 2,  # the second PPO iteration on a generation is off-policy
        "optim": "sgd",
        "learning_rate": 1.0,
        "logging_steps": 1,
        "disable_tqdm": True,
    }
    kwargs.update(overrides)
    return GRPOConfig(**kwargs)


def make_trainer(cls, tmp_path, tokenizer, args_kwargs, **sandbox_kwargs):
    args = make_args(tmp_path, **args_kwargs)
    return cls(
        model=make_model(),
        reward_funcs=reward,
        args=args,
        train_dataset=Dataset.from_dict(DATASET),
        processing_class=tokenizer,
        **sandbox_kwargs,
    )


def make_inputs(trainer, seed=0, B=8, P=3, T=5, noise=0.5, seq_is=False, is_dropped=0) -> dict:
    """An off-policy micro-batch in the format of TRL's ``_generate_and_score_completions``. The
    per-token vLLM ratio is 1 on padding, as TRL computes it (``exp(diff * mask)``); with
    ``is_dropped=k`` the first k valid tokens of row 0 have ratio 0 (TRL's token_mask)."""
    g = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(3, len(VOCAB), (B, P), generator=g)
    prompt_mask = torch.ones(B, P, dtype=torch.long)
    prompt_ids[0, 0], prompt_mask[0, 0] = 0, 0  # left padding
    completion_ids = torch.randint(3, len(VOCAB), (B, T), generator=g)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0], lengths[1] = T, 0  # one full, one empty completion
    completion_mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model,
            torch.cat([prompt_ids, completion_ids], 1),
            torch.cat([prompt_mask, completion_mask], 1),
            T,
        )
    is_shape = (B, 1) if seq_is else (B, T)
    rho = 0.5 + torch.rand(*is_shape, generator=g)
    if not seq_is:
        rho = torch.where(completion_mask.bool(), rho, 1.0)
        rho[0, :is_dropped] = 0.0
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.randn(B, generator=g),
        "old_per_token_logps": logps + noise * torch.randn(B, T, generator=g),
        "ref_per_token_logps": logps + 0.3 * torch.randn(B, T, generator=g),
        "sampling_per_token_logps": logps + 0.2 * torch.randn(B, T, generator=g),
        "importance_sampling_ratio": rho,
        # the generation batch spans two micro-batches (steps_per_generation = 2)
        "num_items_in_batch": 2 * completion_mask.sum().float(),
    }


def loss_and_grads(trainer, inputs):
    trainer.model.zero_grad()
    loss = trainer._compute_loss(trainer.model, inputs)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in trainer.model.parameters()]


def assert_parity(ours, theirs, loss_rtol=LOSS_RTOL, grad_rtol=GRAD_RTOL):
    (la, ga), (lb, gb) = ours, theirs
    assert la.item() == pytest.approx(lb.item(), rel=loss_rtol, abs=1e-8)
    scale = max(g.abs().max().item() for g in gb)
    assert scale > 0
    err = max((a - b).abs().max().item() for a, b in zip(ga, gb, strict=True))
    assert err <= grad_rtol * scale


def setup_pair(tmp_path, tokenizer, args_kwargs, sandbox_kwargs, tweak=None, train=True):
    """Stock and sandbox trainers on identical models, with the same post-construction tweaks."""
    pair = []
    for cls, kwargs in ((GRPOTrainer, {}), (SandboxGRPOTrainer, sandbox_kwargs)):
        trainer = make_trainer(cls, tmp_path, tokenizer, args_kwargs, **kwargs)
        trainer.current_gradient_accumulation_steps = 2
        trainer.model.train(train)
        if tweak is not None:
            tweak(trainer)
        pair.append(trainer)
    return pair


def set_attrs(**attrs):
    def tweak(trainer):
        for key, value in attrs.items():
            target = trainer.args if key in ("use_bias_correction_kl",) else trainer
            setattr(target, key, value)

    return tweak


# (GRPOConfig kwargs, SandboxGRPOTrainer kwargs, tweak applied to both trainers, inputs kwargs)
LOSS_CASES = {
    "grpo": ({"loss_type": "grpo"}, {}, None, {}),
    "grpo_preset": ({"loss_type": "grpo"}, {"objective": "grpo"}, None, {}),
    "dapo": ({"loss_type": "dapo", "epsilon_high": 0.28}, {"objective": "dapo"}, None, {}),
    "bnpo": ({"loss_type": "bnpo"}, {"objective": "ppo_clip"}, None, {}),
    "dr_grpo": ({"loss_type": "dr_grpo"}, {"objective": "dr_grpo"}, None, {}),
    "luspo_gspo": (
        {"loss_type": "luspo", "importance_sampling_level": "sequence", "epsilon": 0.05},
        {},
        None,
        {},
    ),
    "gspo": (
        {
            "loss_type": "grpo",
            "importance_sampling_level": "sequence",
            "epsilon": 3e-4,
            "epsilon_high": 4e-4,
        },
        {"objective": "gspo"},
        None,
        {"noise": 0.1},
    ),
    "gspo_dapo_normaliser": (
        {"loss_type": "dapo", "importance_sampling_level": "sequence", "epsilon": 0.05},
        {
            "objective": "gspo",
            "objective_params": {"eps_low": 0.05, "eps_high": 0.05},
            "aggregation": "token-mean",
        },
        None,
        {},
    ),
    "cispo": (
        {"loss_type": "cispo", "epsilon_high": 1.2},
        {"objective": "cispo_trl", "objective_params": {"upper": 1.2}},
        None,
        {},
    ),
    "sapo": ({"loss_type": "sapo"}, {"objective": "sapo"}, None, {}),
    "delta_is_dual_clip": (
        {"loss_type": "grpo", "delta": 1.3},
        {"objective": "ppo_clip", "objective_params": {"clip_c": 1.3}, "aggregation": None},
        None,
        {"noise": 1.0},
    ),
    "kl": ({"loss_type": "dapo"}, {}, set_attrs(beta=0.04, use_bias_correction_kl=False), {}),
    "kl_bias_corrected": (
        {"loss_type": "dapo"},
        {},
        set_attrs(beta=0.04, use_bias_correction_kl=True),
        {},
    ),
    "kl_bias_corrected_sequence": (
        {"loss_type": "grpo", "importance_sampling_level": "sequence", "epsilon": 0.05},
        {},
        set_attrs(beta=0.04, use_bias_correction_kl=True),
        {},
    ),
    "vllm_is_token": (
        {"loss_type": "dapo"},
        {},
        set_attrs(use_vllm=True, vllm_importance_sampling_correction=True),
        {},
    ),
    "vllm_is_sequence": (
        {"loss_type": "grpo"},
        {},
        set_attrs(use_vllm=True, vllm_importance_sampling_correction=True),
        {"seq_is": True},
    ),
    "off_policy_mask": ({"loss_type": "dapo"}, {}, set_attrs(off_policy_mask_threshold=0.02), {}),
    "vespo": ({"loss_type": "vespo"}, {}, None, {}),
    "vespo_preset": ({"loss_type": "vespo"}, {"objective": "vespo_trl"}, None, {"noise": 0.2}),
    "vespo_params": (
        {"loss_type": "vespo", "vespo_k_pos": 1.5, "vespo_lambda_neg": 0.5},
        {},
        None,
        {"noise": 1.0},
    ),
    "vespo_kl": ({"loss_type": "vespo"}, {}, set_attrs(beta=0.04), {}),
    "vespo_vllm_is_truncate": (
        {"loss_type": "vespo"},
        {},
        set_attrs(
            use_vllm=True,
            vllm_importance_sampling_correction=True,
            vllm_importance_sampling_mode="token_truncate",
        ),
        {},
    ),
    "vespo_vllm_is_mask": (  # two tokens of row 0 dropped: log rho = log 1e-8 there
        {"loss_type": "vespo"},
        {},
        set_attrs(
            use_vllm=True,
            vllm_importance_sampling_correction=True,
            vllm_importance_sampling_mode="token_mask",
        ),
        {"is_dropped": 2, "noise": 0.2},
    ),
    "top_entropy_quantile": ({"loss_type": "grpo"}, {}, set_attrs(top_entropy_quantile=0.5), {}),
}


@pytest.mark.parametrize("case", LOSS_CASES)
def test_loss_parity(case, tmp_path, tokenizer):
    args_kwargs, sandbox_kwargs, tweak, inputs_kwargs = LOSS_CASES[case]
    if sandbox_kwargs.get("aggregation", "") is None:  # the TRL loss_type's own mode
        sandbox_kwargs = {
            **sandbox_kwargs,
            "aggregation": TRL_AGGREGATION[args_kwargs["loss_type"]],
        }
    stock, ours = setup_pair(tmp_path, tokenizer, args_kwargs, sandbox_kwargs, tweak)
    inputs = make_inputs(stock, **inputs_kwargs)
    assert_parity(loss_and_grads(ours, inputs), loss_and_grads(stock, inputs))


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
def test_loss_parity_in_eval_mode(loss_type, tmp_path, tokenizer):
    """Eval drops the gradient-accumulation terms of the normalisers, as TRL does."""
    stock, ours = setup_pair(tmp_path, tokenizer, {"loss_type": loss_type}, {}, train=False)
    inputs = make_inputs(stock, seed=1)
    with torch.no_grad():
        assert ours._compute_loss(ours.model, inputs).item() == pytest.approx(
            stock._compute_loss(stock.model, inputs).item(), rel=LOSS_RTOL
        )


def test_metrics_match_trls(tmp_path, tokenizer):
    args = {"loss_type": "dapo", "epsilon_high": 0.28}
    stock, ours = setup_pair(tmp_path, tokenizer, args, {"objective": "dapo"}, set_attrs(beta=0.04))
    inputs = make_inputs(stock, seed=2)
    for trainer in (stock, ours):
        trainer._metrics["train"].clear()
        trainer._compute_loss(trainer.model, inputs)
    theirs, mine = stock._metrics["train"], ours._metrics["train"]
    keys = [
        "entropy",
        "kl",
        "clip_ratio/low_mean",
        "clip_ratio/high_mean",
        "clip_ratio/region_mean",
    ]
    for key in keys:
        assert mine[key][0] == pytest.approx(theirs[key][0], rel=1e-5), key
    assert theirs["clip_ratio/region_mean"][0] > 0
    assert mine["sandbox/clip_low_frac"][0] == pytest.approx(theirs["clip_ratio/low_mean"][0])
    for key in ("sandbox/ratio_mean", "sandbox/ratio_max", "sandbox/ratio_min", "sandbox/kl_k3"):
        assert math.isfinite(mine[key][0])
    assert (
        mine["sandbox/ratio_min"][0]
        <= mine["sandbox/ratio_mean"][0]
        <= mine["sandbox/ratio_max"][0]
    )


def test_cispo_clip_metric_is_the_signed_upper_share(tmp_path, tokenizer):
    """TRL's cispo_clip_ratio counts (A > 0, r > epsilon_high): the sandbox's clip_high_frac."""
    args = {"loss_type": "cispo", "epsilon_high": 1.2}
    stock, ours = setup_pair(tmp_path, tokenizer, args, {})
    inputs = make_inputs(stock, seed=2)
    for trainer in (stock, ours):
        trainer._compute_loss(trainer.model, inputs)
    theirs = stock._metrics["train"]["cispo_clip_ratio"][0]
    assert theirs > 0
    assert ours._metrics["train"]["sandbox/clip_high_frac"][0] == pytest.approx(theirs, rel=1e-6)
    assert ours._metrics["train"]["sandbox/clip_low_frac"][0] == 0.0  # lower = 0: never binds


# (GRPOConfig kwargs, SandboxGRPOTrainer kwargs); trainer.train() for 3 steps.
TRAIN_CASES = {
    "grpo": ({"loss_type": "grpo"}, {"objective": "grpo"}),
    "dapo": ({"loss_type": "dapo", "epsilon_high": 0.28}, {"objective": "dapo"}),
    "gspo": (
        {"loss_type": "grpo", "importance_sampling_level": "sequence", "epsilon": 0.05},
        {"objective": "gspo", "objective_params": {"eps_low": 0.05, "eps_high": 0.05}},
    ),
    "cispo": (
        {"loss_type": "cispo", "epsilon_high": 1.1},
        {"objective": "cispo_trl", "objective_params": {"upper": 1.1}},
    ),
    "sapo": ({"loss_type": "sapo"}, {"objective": "sapo"}),
}


def train_params(cls, tmp_path, tokenizer, args_kwargs, **kwargs):
    trainer = make_trainer(cls, tmp_path, tokenizer, args_kwargs, **kwargs)
    set_seed(0)
    trainer.train()
    params = torch.cat([p.detach().flatten() for p in trainer.model.parameters()])
    return params, trainer.state.log_history


@pytest.mark.parametrize("case", TRAIN_CASES)
def test_training_steps_give_the_same_parameters(case, tmp_path, tokenizer):
    args_kwargs, sandbox_kwargs = TRAIN_CASES[case]
    theirs, log_theirs = train_params(GRPOTrainer, tmp_path, tokenizer, args_kwargs)
    ours, log_ours = train_params(
        SandboxGRPOTrainer, tmp_path, tokenizer, args_kwargs, **sandbox_kwargs
    )
    initial = torch.cat([p.detach().flatten() for p in make_model().parameters()])
    moved = (theirs - initial).abs().max().item()
    assert moved > 0.01
    assert (ours - theirs).abs().max().item() <= TRAIN_RTOL * moved
    # the off-policy step (second iteration on the first generation) really moved the ratio
    assert log_ours[1]["sandbox/ratio_max"] > 1.05
    assert log_ours[1]["loss"] == pytest.approx(log_theirs[1]["loss"], rel=1e-4)


def test_stochastic_objective_trains(tmp_path, tokenizer):
    """NSR (stochastic, band noise) runs inside TRL and reports its rescue metrics."""
    _, log = train_params(
        SandboxGRPOTrainer,
        tmp_path,
        tokenizer,
        {"loss_type": "dapo", "max_steps": 2},
        objective="nsr_band_dapo",
        objective_params={"sigma": 0.2},
    )
    assert "sandbox/rescue_frac" in log[1] and math.isfinite(log[1]["loss"])


# --------------------------------------------------------------------------------------------------
# Configuration and refusals
# --------------------------------------------------------------------------------------------------


def test_trl_equivalent_mapping(tmp_path):
    spec = trl_equivalent(make_args(tmp_path, loss_type="grpo", epsilon=0.1, delta=2.0))
    assert (spec.objective, spec.params, spec.aggregation) == (
        "ppo_clip",
        {"eps_low": 0.1, "eps_high": 0.1, "clip_c": 2.0},
        "seq-mean-token-mean",
    )
    seq = trl_equivalent(make_args(tmp_path, importance_sampling_level="sequence"))
    assert seq.objective == "gspo" and seq.aggregation == "token-mean"  # default loss_type dapo
    cispo = trl_equivalent(make_args(tmp_path, loss_type="cispo", epsilon_high=5.0))
    assert (cispo.objective, cispo.params) == ("cispo", {"lower": 0.0, "upper": 5.0})
    vespo = trl_equivalent(make_args(tmp_path, loss_type="vespo", vespo_lambda_neg=2.5))
    assert (vespo.objective, vespo.params, vespo.aggregation) == (
        "vespo",
        {"k_pos": 2.0, "lambda_pos": 3.0, "k_neg": 3.0, "lambda_neg": 2.5},
        "token-mean",
    )
    with pytest.raises(ValueError, match="sequence"):
        trl_equivalent(make_args(tmp_path, loss_type="sapo", importance_sampling_level="sequence"))


def test_refuses_options_that_bypass_or_extend_the_objective(tmp_path, tokenizer):
    args = make_args(tmp_path)
    args.use_liger_loss = True  # the fused GRPO loss of TRL versions that have one
    with pytest.raises(ValueError, match="Liger"):
        SandboxGRPOTrainer(
            model=make_model(),
            reward_funcs=reward,
            args=args,
            train_dataset=Dataset.from_dict(DATASET),
            processing_class=tokenizer,
        )
    with pytest.raises(ValueError, match="entropy_coef"):
        make_trainer(SandboxGRPOTrainer, tmp_path, tokenizer, {"entropy_coef": 0.01})
    with pytest.raises(ValueError, match="token-level"):
        make_trainer(
            SandboxGRPOTrainer,
            tmp_path,
            tokenizer,
            {"importance_sampling_level": "sequence"},
            objective="dapo",
        )
    with pytest.raises(ValueError, match="unknown objective"):
        make_trainer(SandboxGRPOTrainer, tmp_path, tokenizer, {}, objective="ppo_clipp")
    with pytest.raises(ValueError, match="aggregation"):
        make_trainer(SandboxGRPOTrainer, tmp_path, tokenizer, {}, objective="dapo", aggregation="x")


def test_explicit_objective_ignores_trl_loss_fields(tmp_path, tokenizer):
    trainer = make_trainer(
        SandboxGRPOTrainer,
        tmp_path,
        tokenizer,
        {"loss_type": "grpo", "epsilon": 0.1},
        objective="nsr_dapo",
    )
    assert trainer.objective.params["eps_high"] == 0.28  # the preset's, not GRPOConfig's
    assert trainer.aggregation == "token-mean"  # the preset's
    assert trainer.objective_spec.objective == "nsr_dapo"


# --------------------------------------------------------------------------------------------------
# Semantic differences (each backs a row of the table in docs/adapters.md)
# --------------------------------------------------------------------------------------------------


def test_trl_grpo_counts_empty_completions():
    """TRL's grpo/sapo normaliser is a plain mean over rows, so an all-padding completion (e.g.
    mask_truncated_completions) counts; sandbox.aggregate (and verl) count non-empty sequences
    unless num_seqs is passed, which the adapter does."""
    loss = torch.tensor([[1.0, 2.0], [0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1], [0, 0]])
    kwargs = trl_normalisers(
        "seq-mean-token-mean",
        loss_type="grpo",
        mask=mask,
        training=True,
        grad_accum=1,
        num_items_in_batch=None,
        num_processes=1,
        steps_per_generation=1,
        max_completion_length=2,
    )
    assert aggregate(loss, mask, "seq-mean-token-mean", **kwargs).item() == 0.75  # 1.5 / 2 rows
    assert aggregate(loss, mask, "seq-mean-token-mean").item() == 1.5  # 1.5 / 1 non-empty


def test_trl_dr_grpo_constant_is_max_completion_length():
    """Dr. GRPO's constant L: TRL uses max_completion_length; verl's loss_scale_factor and the
    sandbox's max_len default to the padded length T of the batch."""
    loss = torch.ones(2, 3, dtype=torch.float64)
    mask = torch.ones(2, 3)
    kwargs = trl_normalisers(
        "seq-mean-token-sum-norm",
        loss_type="dr_grpo",
        mask=mask,
        training=False,
        grad_accum=1,
        num_items_in_batch=None,
        num_processes=1,
        steps_per_generation=1,
        max_completion_length=6,
    )
    assert aggregate(loss, mask, "seq-mean-token-sum-norm", **kwargs).item() == 0.5  # 3 / 6
    assert aggregate(loss, mask, "seq-mean-token-sum-norm").item() == 1.0  # 3 / T = 3


def test_trl_dapo_normaliser_is_global_and_bnpo_local():
    """TRL's dapo/cispo divide by the generation batch's token count (all processes), rescaled to
    one accumulation window; bnpo by the micro-batch's own count. Same sandbox mode, token-mean."""
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    common = {
        "mask": mask,
        "training": True,
        "grad_accum": 2,
        "num_items_in_batch": torch.tensor(24.0),  # 4 processes, 2 micro-batches each
        "num_processes": 4,
        "steps_per_generation": 2,
        "max_completion_length": 3,
    }
    dapo = trl_normalisers("token-mean", loss_type="dapo", **common)["num_tokens"]
    bnpo = trl_normalisers("token-mean", loss_type="bnpo", **common)["num_tokens"]
    assert float(dapo) == 24 / 4 * 2 / 2  # 6 tokens per process and window
    assert float(bnpo) == 3 * 2  # local tokens * accumulation steps


def test_trl_ratio_is_not_clamped(tmp_path, tokenizer):
    """TRL's log-ratio has no ±20 clamp; the sandbox's (and verl's vanilla) has. With A < 0 and
    log r = 25 on one token (unclipped side of the min-form), TRL's loss carries e^25 there."""
    stock, ours = setup_pair(tmp_path, tokenizer, {"loss_type": "bnpo"}, {"objective": "ppo_clip"})
    inputs = make_inputs(stock, seed=3, noise=0.0)
    logps = inputs["old_per_token_logps"].clone()
    inputs["old_per_token_logps"][0, 0] = logps[0, 0] - 25.0
    inputs["advantages"][0] = -1.0
    with torch.no_grad():
        theirs = stock._compute_loss(stock.model, inputs).item()
        mine = ours._compute_loss(ours.model, inputs).item()
    n = 2 * inputs["completion_mask"].sum().item()  # local tokens * accumulation steps
    assert theirs - mine == pytest.approx((math.exp(25) - math.exp(20)) / n, rel=1e-4)


def test_trl_kl_is_ratio_weighted_by_default(tmp_path, tokenizer):
    """TRL's use_bias_correction_kl defaults to True: the k3 term is multiplied by the
    differentiable importance ratio, which changes its gradient even on-policy (r = 1). verl's KL
    loss and sandbox.kl.k3 are plain k3. The adapter follows the GRPOConfig either way."""
    grads = {}
    for corrected in (True, False):
        tweak = set_attrs(beta=0.5, use_bias_correction_kl=corrected)
        stock, ours = setup_pair(tmp_path, tokenizer, {"loss_type": "dapo"}, {}, tweak)
        inputs = make_inputs(stock, seed=4)
        inputs.pop("old_per_token_logps")  # on-policy: TRL uses the detached current log-probs
        theirs = loss_and_grads(stock, inputs)
        assert_parity(loss_and_grads(ours, inputs), theirs)
        grads[corrected] = theirs
    (l_on, g_on), (l_off, g_off) = grads[True], grads[False]
    assert l_on.item() == pytest.approx(l_off.item(), rel=1e-6)  # same value at r = 1
    diff = max((a - b).abs().max().item() for a, b in zip(g_on, g_off, strict=True))
    assert diff > 1e-3 * max(g.abs().max().item() for g in g_off)  # different gradient


# --------------------------------------------------------------------------------------------------
# VESPO: TRL's gamma weights in float64
# --------------------------------------------------------------------------------------------------

#: TRL builds k and lambda with ``torch.where`` on Python floats, i.e. in float32 (default dtype):
#: values exact in float32 keep the float64 comparison at 1e-12 (0.7 would differ by ~4e-8).
VESPO_PARAMS = {"k_pos": 1.5, "lambda_pos": 2.5, "k_neg": 3.0, "lambda_neg": 0.75}


@pytest.mark.parametrize("with_is", [False, True], ids=["plain", "vllm-is"])
def test_vespo_equals_trls_gamma_weights_in_float64(with_is):
    """sandbox vespo's coefficient and loss are TRL's ``-phi A logp`` (TRL's get_gamma_weights),
    in float64 to 1e-12, with TRL's clamps acting: a sequence whose log w passes 20, one below
    log 1e-8, a token that token_mask dropped (rho = 0), an advantage of 0 and ragged padding
    (where TRL's own rho is 1)."""
    g = torch.Generator().manual_seed(0)
    B, T = 10, 7
    F64 = torch.float64
    old = -torch.rand(B, T, generator=g, dtype=F64) * 3 - 0.1
    lr = 0.4 * torch.randn(B, T, generator=g, dtype=F64)
    lr[3], lr[4] = 12.0, -9.0  # log w = 84 -> 20; -63 -> log 1e-8
    logp = old + lr
    mask = torch.arange(T)[None, :] < torch.randint(1, T + 1, (B, 1), generator=g)
    mask[3:5] = True
    adv = torch.randn(B, 1, generator=g, dtype=F64)
    adv[5] = 0.0
    rho = torch.where(mask, 0.5 + torch.rand(B, T, generator=g, dtype=F64), 1.0)
    rho[1, 0] = 0.0  # dropped by token_mask: log rho -> log 1e-8
    assert lr[1, 0] > -1.58  # the adapter's folded token log-ratio stays inside ±20 (see docs)
    is_ratio = rho if with_is else None
    phi = GRPOTrainer.get_gamma_weights(adv, lr, mask.long(), is_ratio, **VESPO_PARAMS)
    assert phi[3].item() == 0.0 and 0 < phi[4].item() < 1e-10  # TRL's clamps acted
    old_eff = old if is_ratio is None else fold_vllm_ratio(old, rho)
    out = get_objective("vespo", **VESPO_PARAMS)(logp, old_eff, adv, mask)
    theirs = torch.where(mask, phi * adv, 0.0)
    torch.testing.assert_close(out.coef, theirs, rtol=1e-12, atol=0.0)
    torch.testing.assert_close(
        out.loss, torch.where(mask, -theirs * logp, 0.0), rtol=1e-12, atol=0.0
    )


def test_vespo_refuses_a_sequence_level_vllm_ratio(tmp_path, tokenizer):
    # TRL's vespo needs token_truncate / token_mask (it raises at construction otherwise); a
    # [B, 1] ratio cannot be folded token by token, so the adapter says so
    trainer = make_trainer(SandboxGRPOTrainer, tmp_path, tokenizer, {"loss_type": "vespo"})
    with pytest.raises(ValueError, match="per-token vLLM importance ratio"):
        trainer._compute_loss(trainer.model, make_inputs(trainer, seq_is=True))
