"""Named presets: an objective with the hyperparameters (and aggregation) of one paper or framework.

Presets live in code, not in config trees. ``get_objective(preset_name, **overrides)`` resolves
them; ``available_presets()`` lists them. A preset name never shadows an objective name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Preset:
    objective: str
    params: dict[str, Any] = field(default_factory=dict)
    aggregation: str = "token-mean"
    source: str = ""  # paper id and section, or the framework setting it mirrors


PRESETS: dict[str, Preset] = {
    "grpo": Preset(
        "ppo_clip",
        {"eps_low": 0.2, "eps_high": 0.2},  # GRPO, DeepSeekMath arXiv 2402.03300 §4.1
        aggregation="seq-mean-token-mean",  # GRPO's 1/G sum_i 1/|o_i| sum_t
        source="arXiv 2402.03300 (verl vanilla, TRL loss_type=grpo)",
    ),
    "dapo": Preset(
        "ppo_clip",
        {"eps_low": 0.2, "eps_high": 0.28},  # DAPO clip-higher, arXiv 2503.14476 §3.1
        aggregation="token-mean",  # DAPO token-level loss, §3.3
        source="arXiv 2503.14476 (verl clip_ratio_low/high, TRL loss_type=dapo)",
    ),
    "dual_clip": Preset(
        "ppo_clip",
        {"eps_low": 0.2, "eps_high": 0.2, "clip_c": 3.0},  # dual clip, arXiv 1912.09729; verl c=3
        source="arXiv 1912.09729 (verl clip_ratio_c=3)",
    ),
    "dr_grpo": Preset(
        "ppo_clip",
        {"eps_low": 0.2, "eps_high": 0.2},
        aggregation="seq-mean-token-sum-norm",  # Dr. GRPO, arXiv 2503.20783: / constant L
        source="arXiv 2503.20783",
    ),
    "nsr_dapo": Preset(
        "nsr",
        {"level": "token", "eps_low": 0.2, "eps_high": 0.28, "noise": "uniform"},
        aggregation="token-mean",
        source="arXiv 2605.22703 (NSR on DAPO)",
    ),
    "nsr_gspo": Preset(
        "nsr",
        {"level": "sequence", "eps_low": 3e-4, "eps_high": 4e-4, "noise": "uniform"},
        aggregation="seq-mean-token-mean",
        source="arXiv 2605.22703 (NSR on GSPO)",
    ),
    "nsr_band_dapo": Preset(
        "nsr",
        {"level": "token", "eps_low": 0.2, "eps_high": 0.28, "noise": "band", "sigma": 0.1},
        aggregation="token-mean",
        source="arXiv 2605.22703 (boundary-local reading, docs/objectives.md §4)",
    ),
    "nsr_decay_dapo": Preset(
        "nsr_decay",
        {"level": "token", "eps_low": 0.2, "eps_high": 0.28, "noise": "uniform"},
        aggregation="token-mean",
        source="arXiv 2605.22703 (deterministic-decay ablation)",
    ),
    "nsr_decay_gspo": Preset(
        "nsr_decay",
        {"level": "sequence", "eps_low": 3e-4, "eps_high": 4e-4, "noise": "uniform"},
        aggregation="seq-mean-token-mean",
        source="arXiv 2605.22703 (deterministic-decay ablation)",
    ),
    "dgpo_1p5b": Preset(
        "dgpo",
        {"eps_low": 0.2, "eps_high": 0.2, "n": 2.0, "m": 2.0},  # n = 2 suggested for 1.5B models
        source="arXiv 2603.14389",
    ),
    "atr_grpo": Preset(
        "atr",
        {"delta": 0.02314},  # k3 region with l = 0.8 (GRPO's lower bound), u = 1.2308
        source="arXiv 2602.05494",
    ),
    "atr_dapo": Preset(
        "atr",
        {"delta": 0.03314},  # k3 region with u = 1.28 (DAPO's upper bound), l = 0.7642
        source="arXiv 2602.05494",
    ),
    "gmpo_verl": Preset(
        "gmpo",
        {"eps_low": 0.2, "eps_high": 0.2},  # verl geo_mean: clip_ratio_low/high, ActorConfig 0.2
        aggregation="seq-mean-token-mean",  # GMPO's per-sequence objective
        source="verl loss_mode=geo_mean (clip_ratio_low = clip_ratio_high = 0.2, in log space)",
    ),
    "vespo_trl": Preset(
        "vespo",
        # TRL GRPOConfig vespo_k_pos, vespo_lambda_pos, vespo_k_neg, vespo_lambda_neg
        {"k_pos": 2.0, "lambda_pos": 3.0, "k_neg": 3.0, "lambda_neg": 2.0},
        aggregation="token-mean",  # TRL's vespo normaliser: the generation batch's tokens
        source="TRL loss_type=vespo defaults",
    ),
    "cispo_verl": Preset(
        "cispo",
        {"lower": 0.8, "upper": 1.2},  # verl: clamp(r, 1 - clip_ratio_low, 1 + clip_ratio_high)
        source="verl loss_mode=cispo (clip_ratio_low = clip_ratio_high = 0.2)",
    ),
    "cispo_trl": Preset(
        "cispo",
        {"lower": 0.0, "upper": 5.0},  # TRL: clamp(r, max=epsilon_high), epsilon_high = 5.0
        source="TRL loss_type=cispo (epsilon_high=5.0)",
    ),
    "clip_cov_verl": Preset(
        "clip_cov",
        {"eps_low": 0.2, "eps_high": 0.2, "clip_cov_ratio": 2e-4},  # no dual clip, as verl's
        source="verl loss_mode=clip_cov defaults",
    ),
    "kl_cov_verl": Preset(
        "kl_cov",
        {"kl_cov_ratio": 2e-4, "ppo_kl_coef": 0.1},
        source="verl loss_mode=kl_cov defaults",
    ),
}
