"""A tour of the objective library: gradient-weight tables and figures for every rule.

``weight_table`` evaluates each objective's closed-form gradient weight ``g(r, A) = E[coef] / A``
on a ratio grid, for A > 0 and A < 0, together with the probability-gradient weight
``W * pi_old = g / r`` (docs/objectives.md §1); ``autograd_check`` confirms, on the same grid,
that autograd of each loss equals its realised coefficient. ``clip-sandbox demo`` runs both.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch

from sandbox.objectives import get_objective

DEFAULT_TOUR = (
    "unclipped",
    "grpo",
    "dapo",
    "dual_clip",
    "gspo",
    "nsr_dapo",
    "nsr_band_dapo",
    "dgpo",
    "atr",
    "gppo",
    "ce_gppo",
    "cispo_verl",
    "cispo_trl",
    "sapo",
    "gmpo",
    "vespo",
)


def default_ratios() -> torch.Tensor:
    """301 ratios from 0.1 to 10^0.5 on a log grid (float64)."""
    return torch.logspace(-1, 0.5, 301, dtype=torch.float64)


def weight_table(names=DEFAULT_TOUR, ratios=None) -> pd.DataFrame:
    """Tidy table: one row per (objective, sign of A, ratio) with g and W * pi_old = g / r."""
    ratios = default_ratios() if ratios is None else ratios
    rows = []
    for name in names:
        obj = get_objective(name)
        for sign in (1.0, -1.0):
            g = obj.expected_coef(ratios, torch.full_like(ratios, sign)) / sign
            for r, gi in zip(ratios.tolist(), g.tolist(), strict=True):
                rows.append(
                    {
                        "objective": name,
                        "adv_sign": "A > 0" if sign > 0 else "A < 0",
                        "ratio": r,
                        "g": gi,
                        "w_pi_old": gi / r,
                    }
                )
    return pd.DataFrame(rows)


#: Draws per (ratio, sign) with which a stochastic rule's realised coefficient is averaged and
#: compared with its closed-form expectation (Monte Carlo error of order 1e-2 at r <= 3).
DRAWS = 20_000


def autograd_check(names=DEFAULT_TOUR, ratios=None) -> pd.DataFrame:
    """Per objective: max |autograd - (-coef)|, and max |coef - expected_coef| — exact for
    deterministic rules; for stochastic rules (NSR) the mean realised coef over :data:`DRAWS`
    draws against the closed-form expectation (``closed_form_check`` says which)."""
    ratios = default_ratios() if ratios is None else ratios
    rows = []
    for name in names:
        obj = get_objective(name)
        copies = DRAWS if obj.stochastic else 1
        adv = torch.cat([torch.ones_like(ratios), -torch.ones_like(ratios)])[:, None]
        r = torch.cat([ratios, ratios])[:, None]
        logp_old = torch.full_like(r, -1.0).repeat(copies, 1)
        logp = (logp_old + r.log().repeat(copies, 1)).requires_grad_(True)
        out = obj(logp, logp_old, adv.repeat(copies, 1), generator=torch.Generator().manual_seed(0))
        (grad,) = torch.autograd.grad(out.loss.sum(), logp)
        mean_coef = out.coef.reshape(copies, -1).mean(0)[:, None]
        rows.append(
            {
                "objective": name,
                "max_autograd_error": (grad + out.coef).abs().max().item(),
                "max_closed_form_error": (mean_coef - obj.expected_coef(r, adv)).abs().max().item(),
                "closed_form_check": f"mean of {copies:,} draws" if obj.stochastic else "exact",
            }
        )
    return pd.DataFrame(rows)


def plot_weights(table: pd.DataFrame, path: str | Path) -> Path:
    """One small panel per objective: g(r) for A > 0 and A < 0, with the unclipped g = r dotted."""
    import matplotlib.pyplot as plt  # the backend is the user's (headless machines get Agg)
    import seaborn as sns

    from sandbox.experiments.plots import styled

    with styled():  # seaborn's theme for this figure only
        grid = sns.relplot(
            data=table,
            x="ratio",
            y="g",
            hue="adv_sign",
            col="objective",
            col_wrap=5,
            kind="line",
            height=2.6,
            aspect=1.1,
            linewidth=2,
            palette={"A > 0": "tab:blue", "A < 0": "tab:red"},
        )
        for ax in grid.axes.flat:
            r = sorted(table["ratio"].unique())
            ax.plot(r, r, ls=":", color="grey", lw=1)
        grid.set(xscale="log")
        grid.set_titles("{col_name}")
        grid.set_axis_labels("r = pi / pi_old", "g (coef = g A)")
        grid.figure.suptitle("Gradient weight by objective (dotted: unclipped g = r)", y=1.02)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        grid.figure.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(grid.figure)
        return path
