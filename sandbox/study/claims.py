"""The seed papers' claims as data, and the ledger that tests them with paired seeds.

A claim (:class:`Claim`) is one record: rule A beats rule B on a metric, in a stated direction,
as a paper says in a stated place; the seed papers' are :data:`CLAIMS`, yours need no edit of
the package (``--claim``: :func:`parse_claim`; ``--claims FILE``: :func:`read_claims`;
CONTRIBUTING.md, "Adding a claim"). The rules are registry names or presets
(``sandbox.objectives.get_objective``). :func:`ledger` tests them on a tidy score table.

Metrics (columns of the score table; a study that reports them fills them per run):

| metric | meaning | better |
|---|---|---|
| ``final_pass`` | held-out pass@1 (expected reward on bandits) at the last step | higher |
| ``reward_auc`` | mean per-step training reward over the run (area under the curve / steps) | higher |
| ``final_entropy`` | policy entropy at the last step (the entropy-collapse claims) | higher |
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sandbox.configs import check_keys, check_number

from . import evidence

METRICS = ("final_pass", "reward_auc", "final_entropy")


@dataclass(frozen=True)
class Claim:
    """``rule_a`` is ``direction`` than ``rule_b`` on ``metric`` ("greater": A's value is higher),
    as ``source`` (arXiv id) says at ``where`` (section or passage), in the words of ``statement``.
    ``margin``: the smallest effect of interest, pre-registered with the claim (None: the study's
    margin for the metric)."""

    name: str
    rule_a: str
    rule_b: str
    direction: evidence.Direction
    metric: str
    source: str = ""
    where: str = ""
    statement: str = ""
    margin: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"a claim's name must be a non-empty string, got {self.name!r}")
        for key in ("rule_a", "rule_b", "source", "where", "statement"):
            if not isinstance(getattr(self, key), str):
                raise ValueError(f"claim {self.name}: {key} must be a string")
        if self.margin is not None:
            check_number(f"claim {self.name}: margin", self.margin)
        if self.direction not in ("greater", "less"):
            raise ValueError(f"direction must be 'greater' or 'less', got {self.direction!r}")
        if self.metric not in METRICS:
            raise ValueError(f"metric must be one of {METRICS}, got {self.metric!r}")
        if self.rule_a == self.rule_b:
            raise ValueError(f"rule_a and rule_b must differ, got {self.rule_a!r} twice")

    @property
    def rules(self) -> tuple[str, str]:
        return self.rule_a, self.rule_b


#: The keys of a claim record (``--claims FILE``, a study's ``config.json``).
CLAIM_KEYS = tuple(f.name for f in fields(Claim))


def claim_from_record(record: Mapping[str, Any], where: str = "claim") -> Claim:
    """A :class:`Claim` from a mapping of its fields (``name``, ``rule_a``, ``rule_b``,
    ``direction``, ``metric``; optional ``margin``, ``source``, ``where``, ``statement``); a
    one-line ``ValueError`` naming ``where`` and the key at fault."""
    if not isinstance(record, Mapping):
        raise ValueError(f"{where}: a claim is a table of keys, got {record!r}")
    check_keys(where, record, CLAIM_KEYS)
    missing = [k for k in ("name", "rule_a", "rule_b", "direction", "metric") if k not in record]
    if missing:
        raise ValueError(f"{where}: missing keys {missing}")
    try:
        return Claim(**record)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def claim_record(claim: Claim) -> dict[str, Any]:
    """The claim as the mapping :func:`claim_from_record` reads (JSON-ready)."""
    return asdict(claim)


def parse_claim(text: str) -> Claim:
    """``NAME:A>B[:metric[:margin]]`` (``A<B``: A lower) -> a :class:`Claim`; the metric defaults
    to ``final_pass``, the margin to the study's for the metric."""
    name, _, rest = text.partition(":")
    parts = rest.split(":") if rest else []
    if not name or not 1 <= len(parts) <= 3:
        raise ValueError(f"--claim takes NAME:A>B[:metric[:margin]], got {text!r}")
    comparison, metric, margin = (*parts, None, None)[:3]
    op = ">" if ">" in comparison else "<"
    rule_a, sep, rule_b = comparison.partition(op)
    if not sep or not rule_a or not rule_b:
        raise ValueError(
            f"--claim {text!r}: expected A>B or A<B after the name, got {comparison!r}"
        )
    record: dict[str, Any] = {
        "name": name,
        "rule_a": rule_a.strip(),
        "rule_b": rule_b.strip(),
        "direction": "greater" if op == ">" else "less",
        "metric": metric or "final_pass",
        "source": "--claim",
        "statement": text,
    }
    if margin is not None:
        try:
            record["margin"] = float(margin)
        except ValueError:
            raise ValueError(f"--claim {text!r}: margin must be a number, got {margin!r}") from None
    return claim_from_record(record, f"--claim {text!r}")


def _paper(spec: str, source: str, where: str, statement: str) -> Claim:
    """A seed paper's claim: :func:`parse_claim`'s ``spec`` with the paper's words and place."""
    return replace(parse_claim(spec), source=source, where=where, statement=statement)


#: The seed papers' claims, each a ``--claim`` spec (A > B, metric, pre-registered margin) and
#: where the paper says it.
CLAIMS: tuple[Claim, ...] = (
    _paper(
        "nsr_beats_dapo:nsr_dapo>dapo:final_pass:0.02",
        "arXiv 2605.22703",
        "abstract; experiments (7B-30B)",
        "NSR improves training stability and performance compared to DAPO",
    ),
    _paper(
        "nsr_beats_its_decay:nsr_dapo>nsr_decay_dapo:final_pass:0.02",
        "arXiv 2605.22703",
        "ablation (implicit decay)",
        "the stochastic, boundary-local rescue is consistently more effective than deterministic "
        "gradient decay",
    ),
    _paper(
        "dgpo_beats_hard_clip:dgpo_1p5b>grpo:final_pass:0.02",
        "arXiv 2603.14389",
        "abstract; experiments (R1-Distill-Qwen 1.5B/7B/14B)",
        "DGPO consistently outperforms strong baselines (the hard clip at the same bounds, "
        "eps 0.2/0.2)",
    ),
    _paper(
        "atr_beats_grpo:atr_grpo>grpo:final_pass:0.02",
        "arXiv 2602.05494",
        "experiments",
        "the KL3 trust region (ATR-GRPO) outperforms GRPO's ratio clip",
    ),
    _paper(
        "clip_cov_keeps_entropy:clip_cov_verl>grpo:final_entropy:0.05",
        "arXiv 2505.22617",
        "§4 (Clip-Cov)",
        "Clip-Cov keeps policy entropy from collapsing where GRPO's entropy collapses",
    ),
    _paper(
        "kl_cov_keeps_entropy:kl_cov_verl>grpo:final_entropy:0.05",
        "arXiv 2505.22617",
        "§4 (KL-Cov)",
        "KL-Cov keeps policy entropy from collapsing where GRPO's entropy collapses",
    ),
    _paper(
        "clip_beats_unclipped:dapo>unclipped:final_pass:0.02",
        "arXiv 1707.06347",
        "§3 (the clipped surrogate's premise); the control",
        "a trust region helps: the clipped rule beats the same update without a clip",
    ),
)


def read_claims(path: str | Path) -> list[Claim]:
    """The claims of a ``.toml`` / ``.yaml`` file: a list ``claims`` of records
    (:func:`claim_from_record`), e.g. in TOML ``[[claims]]`` tables."""
    from sandbox.configs import read_mapping

    data = read_mapping(path, "claims file")
    unknown = sorted(set(data) - {"claims"})
    records = data.get("claims")
    if unknown or not isinstance(records, list) or not records:
        raise ValueError(
            f"--claims {path}: expected a non-empty list 'claims' of claim records"
            + (f" and no other keys, got {unknown}" if unknown else "")
        )
    return [claim_from_record(r, f"--claims {path}: claims[{i}]") for i, r in enumerate(records)]


def claim_rules(claims: Iterable[Claim] = CLAIMS) -> list[str]:
    """Every rule the claims name, each once, in order of first mention."""
    return list(dict.fromkeys(r for c in claims for r in c.rules))


def claim_level(claims: int, alpha: float = 0.05) -> float:
    """The level each of a rung's ``claims`` primary claims is planned and powered at:
    Bonferroni, ``alpha`` / the claims (Holm's first step; Holm, which the study applies, is at
    least as powerful)."""
    return alpha / claims


def seeds_for(sd: float, margin: float, power: float, alpha: float = 0.05) -> float:
    """:func:`.evidence.seeds_needed` for ``margin``; NaN where the SD is not a positive number."""
    ok = np.isfinite(sd) and sd > 0
    return evidence.seeds_needed(sd, margin, power=power, alpha=alpha) if ok else np.nan


def _seed_table(scores: pd.DataFrame, rung: str, metric: str, rules: list[str]) -> pd.DataFrame:
    rows = scores[(scores["rung"] == rung) & scores["rule"].isin(rules)]
    return rows.pivot_table(index="seed", columns="rule", values=metric, dropna=False)


def ledger(
    scores: pd.DataFrame,
    claims: Iterable[Claim] = CLAIMS,
    *,
    level: float = 0.95,
    margins: dict[str, float] | None = None,
    power: float = 0.8,
    reading: str = "primary",
) -> pd.DataFrame:
    """One row per (claim, rung) where both rules have runs: ``estimate`` (mean A - B over the
    seeds both have) with ``lo``/``hi``, ``seeds``, ``verdict`` (:func:`.evidence.verdict`'s
    classes) and ``reason``, ``p`` (the two-sided paired t-test), ``reading`` (``primary``: the
    claim's pre-registered metric; ``secondary``: another reading of it); the claim's
    ``source``; ``clip_frac_a``/``clip_frac_b`` when the table has ``clip_frac``, and
    ``zeroed_a``/``zeroed_b`` (the share of the advantage-weighted gradient mass each rule gives
    a zero coefficient, ``grad_mass_zero_lo + grad_mass_zero_hi``) when it has those; the power line:
    ``diff_sd`` (SD of the paired differences), ``margin`` (the smallest effect of interest for the
    metric, from ``margins``; NaN if none) and ``seeds_needed`` to resolve it at ``power``.

    ``scores`` has columns ``rung``, ``rule``, ``seed`` and the claims' metrics, one row per run.
    """
    missing = {"rung", "rule", "seed"} - set(scores.columns)
    if missing:
        raise ValueError(f"scores lacks the columns {sorted(missing)}")
    margins = margins or {}
    rows = []
    for claim in claims:
        if claim.metric not in scores.columns:
            continue
        for rung in scores["rung"].drop_duplicates():
            table = _seed_table(scores, rung, claim.metric, list(claim.rules))
            if not set(claim.rules) <= set(table.columns):
                continue
            diff = evidence.paired_difference(
                table[claim.rule_a].to_numpy(), table[claim.rule_b].to_numpy(), level
            )
            margin = float(
                claim.margin if claim.margin is not None else margins.get(claim.metric, np.nan)
            )
            verdict, reason = evidence.verdict(diff, claim.direction, np.nan_to_num(margin))
            needed = seeds_for(diff.sd, margin, power) if 0 < margin < np.inf else np.nan
            row = {
                "claim": claim.name,
                "rung": rung,
                **{k: getattr(claim, k) for k in ("metric", "rule_a", "rule_b", "direction")},
                "estimate": diff.estimate,
                "lo": diff.lo,
                "hi": diff.hi,
                "seeds": diff.n,
                "verdict": verdict,
                "reason": reason,
                "p": evidence.paired_p(diff),
                "reading": reading,
                "diff_sd": diff.sd,
                "margin": margin,
                "seeds_needed": needed,
                "source": f"{claim.source}, {claim.where}",
            }
            if "clip_frac" in scores.columns:
                clip = _seed_table(scores, rung, "clip_frac", list(claim.rules)).mean()
                row["clip_frac_a"], row["clip_frac_b"] = clip[claim.rule_a], clip[claim.rule_b]
            if {"grad_mass_zero_lo", "grad_mass_zero_hi"} <= set(scores.columns):
                zeroed = sum(
                    _seed_table(scores, rung, f"grad_mass_zero_{side}", list(claim.rules)).mean()
                    for side in ("lo", "hi")
                )
                row["zeroed_a"], row["zeroed_b"] = zeroed[claim.rule_a], zeroed[claim.rule_b]
            rows.append(row)
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class Bounds:
    """What a rung's pass metrics (``final_pass``, ``reward_auc``) can show: ``ceiling``, the best
    achievable value (a bandit's optimum; 1 on a task), and ``floor``, the best a policy that
    ignores the prompt reaches (a task's constant-answer or answer-prior baseline; 0 if none)."""

    ceiling: float
    floor: float = 0.0
    note: str = ""  # where the numbers come from (printed with the baselines table)


#: The metrics that :class:`Bounds` bound (entropy has no ceiling a rule is pushed against).
BOUNDED = ("final_pass", "reward_auc")
#: The headroom rule's room, in margins: an effect of the margin m needs 2 m between a mean and
#: the bound it is pushed against (:func:`headroom`; the regime rule applies it too).
ROOM = 2


def near_ceiling(mean: float, ceiling: float, margin: float) -> bool:
    """Whether ``mean`` is within :data:`ROOM` margins of ``ceiling`` (no room for a gain)."""
    return mean > ceiling - ROOM * margin


def headroom(
    table: pd.DataFrame,
    scores: pd.DataFrame,
    bounds: Mapping[str, Bounds],
    reference: str | None = None,
) -> pd.DataFrame:
    """``table`` (a :func:`ledger`) with the headroom rule applied to its rows on a bounded metric
    of a rung with ``bounds``: there must be room for an effect of the margin m, i.e.

    - the comparator B's mean at least 2 m below the ceiling (A > B claimed) or above the floor
      (A < B claimed): otherwise the largest possible gain is under two margins;
    - the rung's ``reference`` rule (the comparator where it has no runs) at least 2 m above the
      floor: otherwise the rung measures the answer prior, not the task.

    A row that fails keeps its interval and gets the verdict :data:`.evidence.NO_HEADROOM` and the
    reason. Adds ``comparator_mean``, ``ceiling`` and ``floor`` (NaN where no bounds apply)."""
    out = table.assign(comparator_mean=np.nan, ceiling=np.nan, floor=np.nan)
    for i, row in out.iterrows():
        b = bounds.get(row["rung"])
        if b is None or row["metric"] not in BOUNDED or not np.isfinite(row["margin"]):
            continue
        on_rung = scores[scores["rung"] == row["rung"]]
        mean = on_rung.loc[on_rung["rule"] == row["rule_b"], row["metric"]].mean()
        ref = reference if reference in set(on_rung["rule"]) else row["rule_b"]
        ref_mean = on_rung.loc[on_rung["rule"] == ref, row["metric"]].mean()
        out.loc[i, ["comparator_mean", "ceiling", "floor"]] = mean, b.ceiling, b.floor
        room = ROOM * row["margin"]
        near = f"{row['rule_b']}'s mean {mean:.3f} is within {ROOM} margins of the"
        if row["direction"] == "greater" and near_ceiling(mean, b.ceiling, row["margin"]):
            why = f"{near} ceiling {b.ceiling:.3f}"
        elif row["direction"] == "less" and mean < b.floor + room:
            why = f"{near} floor {b.floor:.3f}"
        elif ref_mean < b.floor + room:
            why = (
                f"{ref}'s mean {ref_mean:.3f} does not clear the answer baseline {b.floor:.3f} "
                f"by {ROOM} margins"
            )
        else:
            continue
        out.loc[i, ["verdict", "reason"]] = evidence.NO_HEADROOM, why
    return out


def holm_by_rung(table: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """``table`` with ``p_holm``: Holm's adjustment (:func:`.evidence.holm`) of ``p`` over each
    family, the rows of one rung and one ``reading`` that carry a verdict and a test (a rung's
    primary family: its claims on their pre-registered metrics; NaN elsewhere), and ``holm``:
    whether a supported or reversed row stays so at ``1 - level`` after it."""
    out = table.assign(p_holm=np.nan)
    family = ~out["verdict"].isin(evidence.NOT_VERDICTS) & out["p"].notna()
    for _, part in out[family].groupby(["reading", "rung"], sort=False):
        out.loc[part.index, "p_holm"] = evidence.holm(part["p"].to_numpy())
    decided = out["verdict"].isin([evidence.SUPPORTED, evidence.REVERSED])
    out["holm"] = np.where(
        decided & out["p_holm"].notna(),
        np.where(out["p_holm"] < 1 - level, "survives", "does not survive"),
        "no decision",  # always text (pandas would read "n/a" back as NaN)
    )
    return out


#: The columns of a ledger that :func:`decided_at_margin` reads.
AT_MARGIN_COLUMNS = ["verdict", "holm", "estimate", "lo", "hi", "margin", "seeds"]


def decided_at_margin(table: pd.DataFrame) -> pd.Series:
    """Per ledger row (:data:`AT_MARGIN_COLUMNS`, as :func:`holm_by_rung` leaves them), whether
    it decides its claim at the margin m: the verdict is supported or reversed, it survives
    Holm's adjustment, and the whole interval lies beyond the margin on its side of 0
    (``lo >= m`` or ``hi <= -m``: every effect it allows is at least m). An exact difference
    (one run, no interval, no test: ``seeds == 1``) has no p to adjust; its gap is the interval.
    What the page calls the same reading on every rung and counts as transfer rests on these
    rows only: a supported row whose interval reaches no effect of the margin, or that Holm
    takes back, is not evidence that a claim holds there."""
    if missing := [c for c in AT_MARGIN_COLUMNS if c not in table.columns]:
        raise ValueError(f"table lacks the columns {missing}")
    exact = (table["seeds"] == 1) & table["lo"].isna() & table["hi"].isna()
    lo = table["lo"].astype(float).where(~exact, table["estimate"])
    hi = table["hi"].astype(float).where(~exact, table["estimate"])
    margin = table["margin"].astype(float)
    strong = table["verdict"].isin([evidence.SUPPORTED, evidence.REVERSED])
    survives = (table["holm"] == "survives") | exact
    return strong & survives & ((lo >= margin) | (hi <= -margin))


def power_lines(
    scores: pd.DataFrame, metric: str, margin: float, *, power: float = 0.8
) -> pd.DataFrame:
    """Per rung: the seed-by-rule residual SD of ``metric`` (``evidence.residual_sd``), the SD of a
    paired difference (sqrt(2) x residual), and the paired seeds needed to resolve ``margin``; over
    the rules with the most seeds (a rule a ``--time-budget`` cut left short would drop every
    seed it lacks from the table)."""
    rows = []
    for rung, part in scores.groupby("rung", sort=False):
        table = part.pivot_table(index="seed", columns="rule", values=metric)
        counts = table.notna().sum()
        table = table.loc[:, counts == counts.max()]  # not a rule short of seeds (a cut study)
        res = evidence.residual_sd(table.to_numpy())
        sd = np.sqrt(2) * res
        needed = seeds_for(sd, margin, power)
        rows.append((rung, metric, len(table), table.shape[1], res, sd, margin, needed))
    return pd.DataFrame(rows, columns=POWER_COLUMNS)


#: The columns of :func:`power_lines` (and of ``power.csv``, empty in a study of exact rungs only).
POWER_COLUMNS = ["rung", "metric", "seeds", "rules", "residual_sd", "diff_sd", "margin"]
POWER_COLUMNS += ["seeds_needed"]
