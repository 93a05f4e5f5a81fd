"""docs/claims.md from a claims-study folder's tables (``python -m llm.claims --tables-only
--out results/claims --doc docs/claims.md``): every number in the page comes from the CSVs that
:func:`sandbox.experiments.study.write_tables` rebuilt from the committed parts."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pandas as pd

from sandbox.experiments.results import NOT_RECORDED, PROVENANCE, read_provenance, write_text
from sandbox.streams import RNG
from sandbox.study import MARGINS, RUNGS, evidence
from sandbox.study.analysis import fmt_interval
from sandbox.study.claims import CLAIMS
from sandbox.study.config import NEVER_BINDS, STEP_SIZE_RULE

GPU_COMMAND = (
    "python -m llm.claims --profile gpu --device cuda --llm-ensemble 8 --workers 1 "
    "--out results/claims"
)


def _table(frame: pd.DataFrame) -> str:
    """A markdown table of ``frame`` (values already formatted)."""
    head = "| " + " | ".join(frame.columns) + " |"
    rule = "|" + "---|" * len(frame.columns)
    body = ["| " + " | ".join(str(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([head, rule, *body])


def _pct(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{100 * x:.1f}%"


def _num(x: float, digits: int = 4) -> str:
    return "n/a" if not math.isfinite(x) else f"{x:.{digits}f}"


def ledger_section(ledger: pd.DataFrame) -> str:
    rows = ledger.assign(
        estimate_ci=[
            fmt_interval(e, lo, hi)
            for e, lo, hi in zip(ledger["estimate"], ledger["lo"], ledger["hi"], strict=True)
        ],
        clip=[
            f"{_pct(a)} / {_pct(b)}"
            for a, b in zip(ledger["clip_frac_a"], ledger["clip_frac_b"], strict=True)
        ],
        needed=[("n/a" if not math.isfinite(x) else str(int(x))) for x in ledger["seeds_needed"]],
        verdict=[
            f"{v} †" if small and v in (evidence.SUPPORTED, evidence.REVERSED) else v
            for v, small in zip(ledger["verdict"], ledger["below_margin"], strict=True)
        ],
        p=ledger["p"].map(_p),
        p_holm=ledger["p_holm"].map(_p),
    )
    table = rows[
        [
            "claim",
            "rung",
            "metric",
            "estimate_ci",
            "verdict",
            "p",
            "p_holm",
            "seeds",
            "clip",
            "diff_sd",
            "needed",
            "reason",
        ]
    ].copy()
    table["diff_sd"] = table["diff_sd"].map(_num)
    table.columns = [
        "claim",
        "rung",
        "metric",
        "A − B [95% CI]",
        "verdict",
        "p",
        "p (Holm)",
        "seeds",
        "clip share A / B",
        "SD of diffs",
        "seeds for the margin",
        "why",
    ]
    return _table(table)


def _p(x: float) -> str:
    return "—" if not math.isfinite(x) else "<0.0001" if x < 1e-4 else f"{x:.4f}"


#: The order in which the page lists what a ledger found: the five verdict classes, then the rows
#: that carry none.
CLASSES = (*evidence.VERDICTS, *evidence.NOT_VERDICTS)


def summary_text(ledger: pd.DataFrame, summary: pd.DataFrame, title: str = "") -> str:
    """What a ledger says, rung by rung and class by class (:data:`CLASSES`: a reversal and a
    margin-only result are never listed under one word), in words generated from it; a
    supported or reversed row says whether it survives Holm's adjustment."""

    def named(row: pd.Series) -> str:
        if row.get("holm") in ("survives", "does not survive"):
            return f"{row['claim']} ({'survives Holm' if row['holm'] == 'survives' else 'not after Holm'})"
        return row["claim"]

    lines = [title] if title else []
    for rung, part in ledger.groupby("rung", sort=False):
        said = []
        for verdict in CLASSES:
            names = [named(row) for _, row in part[part["verdict"] == verdict].iterrows()]
            if names:
                said.append(f"{verdict}: {', '.join(names)}")
        lines.append(f"- **{rung}** — " + "; ".join(said) + ".")
    ledger = ledger.assign(effective=ledger["verdict"])
    across = ledger.pivot_table(index="claim", columns="rung", values="effective", aggfunc="first")
    same = [
        f"{c} ({row.dropna().iloc[0]})"
        for c, row in across.iterrows()
        if row.dropna().nunique() == 1 and len(row.dropna()) > 1
    ]
    differ = [c for c, row in across.iterrows() if row.dropna().nunique() > 1]
    lines.append("")
    lines.append(
        f"The same reading on every rung that ran it: {', '.join(same) or 'none'}. "
        f"Readings that change between rungs: {', '.join(differ) or 'none'}."
    )
    if summary is None:
        return "\n".join(lines)
    idle = summary[summary["never_binds"]]
    if len(idle):
        pairs = ", ".join(f"{r} on {g}" for g, r in zip(idle["rung"], idle["rule"], strict=True))
        lines.append("")
        lines.append(
            f"Rules whose bounds never bind (clip share below {NEVER_BINDS:.1%}): {pairs}. "
            "`unclipped` has no bounds by design; any other rule listed is the unclipped rule "
            "in disguise at this step size, and its claims test nothing about clipping there."
        )
    inert = summary[summary.get("like_unclipped", pd.Series(False, summary.index)).astype(bool)]
    if len(inert):
        pairs = ", ".join(f"{r} on {g}" for g, r in zip(inert["rung"], inert["rule"], strict=True))
        lines.append("")
        lines.append(
            f"Rules whose realised effect cannot be told from `unclipped` (paired `reward_auc` "
            f"interval within ±{MARGINS['reward_auc']:g}): {pairs}. Their claims there measure "
            "the absence of a clip, not their own mechanism."
        )
    return "\n".join(lines)


def headroom_text(ledger: pd.DataFrame) -> str:
    """Per rung, how many of its pass-rate rows (both readings' primary table) have no headroom,
    and why, in the ledger's own words."""
    bounded = ledger[ledger["metric"].isin(["final_pass", "reward_auc"])]
    said = []
    for rung, part in bounded.groupby("rung", sort=False):
        none = part[part["verdict"] == evidence.NO_HEADROOM]
        if len(none):
            said.append(
                f"On {rung}, {len(none)} of {len(part)} pass-rate claims have no headroom "
                f"(e.g. {none['reason'].iloc[0]})."
            )
    return " ".join(said) or "Every pass-rate claim has headroom on every rung."


def llm_floor() -> float:
    """The llm rung's answer baseline at its default settings (:func:`llm.claims.llm_bounds`)."""
    from llm.claims import llm_bounds
    from sandbox.study import StudyConfig

    return llm_bounds(StudyConfig()).floor


def transfer_section(scores_csv: Path) -> str:
    """The earlier transfer study's caveats, recomputed from its committed ``scores.csv``."""
    if not scores_csv.exists():
        return f"(no {scores_csv}: the transfer study's committed scores are missing)"
    import numpy as np

    from sandbox.experiments.agreement import kendall_tau

    s = pd.read_csv(scores_csv)
    clip = s.groupby(["rung", "rule"])["clip_frac"].mean()
    t = {
        r: g.pivot_table(index="seed", columns="rule", values="score") for r, g in s.groupby("rung")
    }

    def taus(a: str, b: str, without: str = "") -> tuple[float, float]:
        rules = [r for r in t[a].columns if r in t[b].columns and r != without]
        x, y = t[a][rules].to_numpy(), t[b][rules].to_numpy()
        signs = (evidence.pair_signs(m, tol=1e-6) for m in (x, y))
        return kendall_tau(np.nanmean(x, 0), np.nanmean(y, 0)), evidence.kendall_tau_b(*signs)

    bl, bl_wo = taus("bandit_sampled", "llm"), taus("bandit_sampled", "llm", "gspo")
    ex = taus("bandit_exact", "bandit_sampled")
    cispo = clip.xs("cispo_trl", level="rule").max()
    return (
        "`python -m llm.transfer` (`results/transfer/`, [transfer.md](transfer.md)) ran 7 rules x "
        "3 seeds on four rungs, SmolLM2-135M on one H100 among them. Recomputed here from its "
        f"committed `scores.csv`: on the LLM rung dapo clipped {100 * clip['llm', 'dapo']:.2f}% "
        f"of tokens and `cispo_trl` at most {100 * cispo:.2f}% on any rung, so the rules barely "
        "acted; "
        f"its bandit~LLM tau ({bl[0]:+.2f}) is carried by GSPO's preset ranking last on every "
        f"rung (without GSPO {bl_wo[0]:+.2f}; tau-b with near-ties as ties {bl[1]:+.2f} and "
        f"{bl_wo[1]:+.2f}); its exact~sampled tau {ex[0]:+.2f} is {ex[1]:+.2f} with near-ties as "
        "ties; its +- were unpaired and its aggregation differed by rule. This study replaces its "
        "method (calibration, one aggregation, pairing, tau-b with near-ties, a power line); its "
        "committed H100 evidence stays as it was."
    )


def learning_curve(results: Path, rung: str, rule: str) -> str:
    """``rule``'s mean sampled pass rate on ``rung`` at a few steps of the study, in words."""
    rows = pd.read_parquet(results)
    run = rows[(rows["phase"] == "study") & (rows["rung"] == rung) & (rows["rule"] == rule)]
    if run.empty:
        return f"no {rule} run on {rung}"
    curve = run.groupby("step")["pass_rate"].mean()
    steps = curve.index.to_numpy()
    marks = sorted(
        {int(steps[0]), *(int(steps[len(steps) * q // 4]) for q in (1, 2, 3)), int(steps[-1])}
    )
    said = ", ".join(f"{curve[m]:.3f} at step {m}" for m in marks)
    return f"{rule}'s mean sampled pass rate: {said}"


def read_tables(out: Path) -> dict[str, pd.DataFrame]:
    """The study's tables in ``out``, rungs in ladder order and claims in ledger order."""
    names = ("calibration", "summary", "ledger", "ledger_auc", "power", "agreement", "entropy_law")
    read = {n: pd.read_csv(out / f"{n}.csv") for n in names}
    bounds = out / "bounds.csv"  # absent in a folder written before the headroom rule
    read["bounds"] = pd.read_csv(bounds) if bounds.exists() else pd.DataFrame()
    noise = out / "grad_noise.csv"  # absent in a folder written before mechanism check (c)
    read["grad_noise"] = pd.read_csv(noise) if noise.exists() else pd.DataFrame()
    order = {rung: i for i, rung in enumerate(RUNGS)}
    claim_order = {c.name: i for i, c in enumerate(CLAIMS)}
    for name in ("summary", "ledger", "ledger_auc", "power"):
        keys = {"summary": ["rung", "rule"], "power": ["rung", "metric"]}.get(
            name, ["claim", "rung"]
        )
        read[name] = read[name].sort_values(
            keys,
            key=lambda c: (
                c.map(order) if c.name == "rung" else c.map(claim_order) if c.name == "claim" else c
            ),
            kind="stable",
        )
    return read


def calibration_rows(cal: pd.DataFrame, summ: pd.DataFrame) -> pd.DataFrame:
    """The calibration curve as printed, the chosen (step size, epochs) of each rung marked."""
    first = summ.groupby("rung", sort=False)[["lr", "epochs"]].first()
    chosen = {r: (row.lr, row.epochs) for r, row in first.iterrows()}
    by_rung = [g.sort_values(["epochs", "lr"]) for _, g in cal.groupby("rung", sort=False)]
    return pd.concat(by_rung).assign(
        chosen=lambda c: [
            "**←**" if chosen.get(r) == (lr, mu) else ""
            for r, lr, mu in zip(c["rung"], c["lr"], c["epochs"], strict=True)
        ],
        clip_share=lambda c: c["clip_share"].map(_pct),
        pass_rate=lambda c: c["pass_rate"].map(lambda x: _num(x, 3)),
    )[["rung", "epochs", "lr", "clip_share", "pass_rate", "seeds", "chosen"]]


def rule_rows(summ: pd.DataFrame) -> pd.DataFrame:
    """Per rung and rule: the metrics, clip share and gradient-mass shares as printed."""
    return summ.assign(
        final_pass=summ["final_pass"].map(lambda x: _num(x, 3)),
        reward_auc=summ["reward_auc"].map(lambda x: _num(x, 3)),
        final_entropy=summ["final_entropy"].map(lambda x: _num(x, 3)),
        clip_frac=summ["clip_frac"].map(_pct),
        zero_lo=summ["grad_mass_zero_lo"].map(_pct),
        zero_hi=summ["grad_mass_zero_hi"].map(_pct),
        rescued=summ["grad_mass_rescued"].map(_pct),
        binds=[
            "**never**" if n else "no bounds" if not math.isfinite(c) else ""
            for n, c in zip(summ["never_binds"], summ["clip_frac"], strict=True)
        ],
    )[
        [
            "rung",
            "rule",
            "seeds",
            "lr",
            "epochs",
            "final_pass",
            "reward_auc",
            "final_entropy",
            "clip_frac",
            "zero_lo",
            "zero_hi",
            "rescued",
            "binds",
        ]
    ]


def grad_noise_section(noise: pd.DataFrame) -> str:
    """Mechanism check (c) as printed: per rung and rule, the noise shares and the variance
    ratio with its interval over seeds; "(not logged)" without rows."""
    if noise.empty:
        return "(not logged)"
    ratio = [
        _num(e)
        if not (math.isfinite(lo) and math.isfinite(hi))
        else f"{e:.4f} [{lo:.4f}, {hi:.4f}]"
        for e, lo, hi in zip(noise["variance_ratio"], noise["lo"], noise["hi"], strict=True)
    ]
    rows = noise.assign(
        rescue_to_signal=noise["rescue_to_signal"].map(_num),
        sampling_to_signal=noise["sampling_to_signal"].map(_num),
        variance_ratio=ratio,
    )
    cols = ["rung", "rule", "seeds", "points", "rescue_to_signal", "sampling_to_signal"]
    return _table(rows[[*cols, "variance_ratio"]])


def power_rows(power: pd.DataFrame) -> pd.DataFrame:
    """The power lines as printed."""
    return power.assign(
        residual_sd=power["residual_sd"].map(_num),
        diff_sd=power["diff_sd"].map(_num),
        seeds_needed=power["seeds_needed"].map(
            lambda x: "n/a" if not math.isfinite(x) else str(int(x))
        ),
    )[["rung", "metric", "seeds", "rules", "residual_sd", "diff_sd", "margin", "seeds_needed"]]


def agreement_rows(agree: pd.DataFrame) -> pd.DataFrame:
    """The rank agreement between rungs as printed (tau-b with its bootstrap interval)."""
    return agree.assign(
        without=agree["without"].fillna("").map(lambda w: f"without {w}" if w else "all rules"),
        tau=[
            fmt_interval(t, lo, hi)
            if math.isfinite(t)
            else f"undefined (a rung resolves no pair); bootstrap [{lo:+.2f}, {hi:+.2f}]"
            for t, lo, hi in zip(agree["tau_b"], agree["lo"], agree["hi"], strict=True)
        ],
    )[["metric", "rung_a", "rung_b", "without", "rules", "tau"]]


def _machine(entry: dict) -> str:
    """One provenance entry's machine and software, in words."""

    def get(key: str) -> str:
        value = entry.get(key)
        return NOT_RECORDED if value is None or value == "" else str(value)

    device = get("device")
    if entry.get("gpu"):
        device += f" ({entry['gpu']})"
    commit = get("git_commit")
    if entry.get("git_dirty") is True:
        commit += " with uncommitted changes"
    return (
        f"device {device}, CPU {get('cpu_model')}, torch {get('torch')}, Python {get('python')}, "
        f"torch threads {get('torch_threads')}, OS {get('os')}, code {commit}"
    )


def provenance_text(out: Path) -> str:
    """The folder's ``provenance.json`` as a list: each command that computed parts (date,
    parts, machine), then the command that last rebuilt the tables."""
    record = read_provenance(out)
    if not record:
        return f"- {NOT_RECORDED} (the folder has no readable `{PROVENANCE}`)"
    lines = []
    for run in record.get("runs", []):
        parts = f", {run['parts']} parts" if "parts" in run else ""
        note = f" ({run['note']})" if run.get("note") else ""
        lines.append(
            f"- runs: `{run.get('command', NOT_RECORDED)}` — {run.get('date', NOT_RECORDED)}"
            f"{parts}; {_machine(run)}{note}"
        )
    tables = record.get("tables")
    if tables:
        lines.append(
            f"- tables and figures: `{tables.get('command', NOT_RECORDED)}` — "
            f"{tables.get('date', NOT_RECORDED)}; {_machine(tables)}"
        )
    return "\n".join(lines) or f"- {NOT_RECORDED} (`{PROVENANCE}` lists no command)"


def write_doc(out: Path, path: Path) -> None:
    """Write the page ``path`` from the tables in ``out`` (rewritten only when it changes)."""
    read = read_tables(out)
    config = json.loads((out / "config.json").read_text()) if (out / "config.json").exists() else {}
    summ, led, law = read["summary"], read["ledger"], read["entropy_law"]
    agree = agreement_rows(read["agreement"])
    claims = pd.DataFrame(
        [
            (c.name, c.rule_a, c.rule_b, c.metric, c.direction, f"{c.source}, {c.where}")
            for c in CLAIMS
        ],
        columns=["claim", "A", "B", "metric", "A is", "source"],
    )
    numbers = ("observed_mean", "predicted_mean", "corr", "slope", "rms_error")
    text = TEMPLATE.format(
        rel=os.path.relpath(out, path.parent),
        provenance=provenance_text(out),
        config="\n".join(f"    {k}: {v}" for k, v in config.items()),
        claims=_table(claims),
        calibration=_table(calibration_rows(read["calibration"], summ)),
        ledger=ledger_section(led),
        ledger_auc=ledger_section(read["ledger_auc"]),
        bounds=_table(read["bounds"].assign(floor=read["bounds"]["floor"].map(_num)))
        if len(read["bounds"])
        else "(not computed)",
        entropy_law=_table(law.assign(**{c: law[c].map(_num) for c in numbers}))
        if len(law)
        else "(not logged)",
        grad_noise=grad_noise_section(read["grad_noise"]),
        summary=summary_text(led, summ, "On each claim's own (primary, pre-registered) metric:")
        + "\n\n"
        + summary_text(
            read["ledger_auc"], None, "Secondary reading, `reward_auc` (the pass-rate claims):"
        ),
        rules=_table(rule_rows(summ)),
        power=_table(power_rows(read["power"])),
        agreement=_table(agree) if len(agree) else "(fewer than two rungs with 3 rules in common)",
        margins=", ".join(f"`{k}` {v:g}" for k, v in MARGINS.items()),
        step_size_rule=STEP_SIZE_RULE,
        gpu=GPU_COMMAND,
        transfer=transfer_section(Path("results/transfer/scores.csv")),
        tf_curve=learning_curve(out / "results.parquet", "tiny_tf", "dapo"),
        headroom=headroom_text(led),
        llm_floor=_num(llm_floor(), 3),
        calib_seeds=config.get("calib_seeds", "?"),
        exact_mu_command=f"`{EXACT_MU_COMMAND}`",
        calib_steps=config.get("calib_steps", "?"),
        **scheme_notes(config.get("rng")),
    )
    write_text(text, path)


def scheme_notes(rng: str | None) -> dict[str, str]:
    """What the page adds where the run's random-number scheme (its ``config.json``'s ``rng``)
    is not this code's (:data:`sandbox.streams.RNG`): the run predates it."""
    if rng == RNG:
        return {"pairing_note": "", "held_out_note": ""}
    return {
        "pairing_note": " The committed run predates these streams (one generator per run, so a "
        "rule that draws extra numbers, NSR or Clip-Cov, fell out of step with the others after "
        "the first update).",
        "held_out_note": " (the committed run predates per-replicate held-out sets: there every "
        "replicate and every rule scored one set of 512)",
    }


#: The exact flow's calibration over mu (the page cites its folder).
EXACT_MU_COMMAND = (
    "python -m llm.claims --rungs bandit_exact --epochs 2 4 8 --out results/claims_exact_mu"
)

TEMPLATE = """# The claims ledger: the seed papers' claims, tested rung by rung

<!-- generated by `python -m llm.claims --tables-only --out results/claims --doc docs/claims.md`;
     edit llm/claims_doc.py, not this file -->

Each claim below is one record in `sandbox/experiments/claims.py` (`CLAIMS`): rule A beats rule B
on a metric, as a paper says. The study (`python -m llm.claims`, `sandbox/experiments/study.py`)
runs every claim rule on each rung of the ladder, **calibrated** so that the reference rule
(`dapo`) clips a comparable share of tokens everywhere, **paired by seed**, and reports per
(claim, rung) the paired difference A − B with its 95% interval, the paired t-test's p (raw, and
Holm-adjusted over the rung's family of claims on one reading) and a verdict in one of five
symmetric classes, read in the claimed direction against the claim's pre-registered margin m
(`sandbox.experiments.evidence.verdict`): *supported* (the interval lies above 0), *reversed*
(below 0), *equivalent* (it contains 0 and lies within ±m), *no gain of the margin* (it contains
0, excludes a gain of m, not a loss of m) or *not resolved at this power* (it contains 0 and a
gain of m). Two answers are not verdicts: *no headroom* (the comparator sits within two margins of
the rung's ceiling, or the reference rule does not clear the task's answer baseline by two
margins: the comparison cannot show an effect of the margin) and *identical by construction*
(NSR and its decay on the exact flow, which uses each rule's expected coefficient).

Provenance (`{rel}/provenance.json`; what was not recorded when the results were made says so):

{provenance}

Commands (the toy rungs at full power, 22 min; then this page):

    python -m llm.claims --profile cpu --out results/claims --workers 2
    python -m llm.claims --tables-only --out results/claims --doc docs/claims.md   # this page

The parts are in `{rel}/parts/` (one parquet per run); the tables beside them (`ledger.csv`,
`summary.csv`, `power.csv`, `agreement.csv`, `calibration.csv`, `scores.csv`, `entropy_law.csv`,
`grad_noise.csv`) and the figures are
rebuilt from them by the second command. Settings of the committed run (`config.json`):

{config}

## The claims

{claims}

## Design

- **Rungs.** `bandit_exact`: the expected-gradient flow on the contextual bandit `mixed` (8 prompts
  from unsolvable to always solved), exact finite-group GRPO advantage; deterministic, one "seed",
  verdict by the sign of the exact difference (Clip-Cov and KL-Cov have no exact flow: their batch
  ranking has no closed-form expectation). `bandit_sampled`: the sampled trainer on the same bandit.
  `tiny_tf`: tiny transformers trained from scratch on `mod_arith` (two chained operations mod 7).
  The task was chosen by a 10-step pilot of dapo (16 seeds, lr 1e-3, 8 prompts × 8 per step,
  held-out 512 × 2): the sampled pass rate went 0.023 → 0.047 and held-out pass@1 was 0.046,
  against 0.0002 on 2-digit addition and 0.000 on 5-symbol reversal (no signal to learn from in
  10 steps); mod_arith starts near 0 and climbs through the run ({tf_curve}), and has 9,000
  distinct problems (8,999 seen in 100,000 draws), so a replicate's 160 training prompts share
  about a dozen problems with the 512 held-out ones (11 in one draw; bits-reverse-3 of the
  transfer study has 8 prompts and is solved in ~20 steps).
- **Calibration.** Per rung, dapo on a grid of step sizes × μ (epochs × 2 minibatches;
  {calib_seeds} seeds, the rung's full run length); its clip share (`clip_low_frac +
  clip_high_frac`, averaged over steps) picks the (step size, μ) inside the target band (5–10%)
  nearest its middle, or the one nearest the band when none is inside (fewer epochs first at equal
  distance). Every rule then runs there. The full length matters: the share falls as the policy
  sharpens (a first calibration over 20 steps picked lr 1e-2 on tiny_tf at 7.3%, and dapo then
  clipped 3.0% over the 40-step study). So does μ: on tiny_tf no step size reached the band at
  4 × 2 (best 4.9%), and 8 × 2 reaches 6.3% at lr 1e-3, between 3.8% at 3e-4 and 4.6% at 3e-3
  — the share is not monotone in the step size, because a larger step sharpens the policy sooner. The bandit rungs keep μ = 2 × 2: the
  sampled bandit is in the band there, and the exact flow stays below it at every μ (its grid at
  2, 4 and 8 epochs peaks at 1.6%, 2.1% and 2.3%: `results/claims_exact_mu/`, {exact_mu_command};
  the expected-gradient flow moves smoothly to the optimum, so few expected tokens ever leave the
  trust region).
- **Aggregation.** Token-mean for every rule (`--paper-aggregation` restores each paper's own:
  grpo and gspo average per sequence), so an aggregation difference is not read as a clipping one.
- **Pairing.** A seed fixes the prompts, the held-out set and the initial model for every rule on a
  rung. The toy rungs' 16 paired seeds are the 16 replicates of one vectorised run per rule;
  replicate *s* of every rule starts from the same weights and draws the same first rollout
  (`tests/test_experiments_study.py::test_a_seed_fixes_initial_state_and_first_rollout_for_every_rule`),
  and every later one from the same fixed noise (common random numbers: rollouts, minibatch order,
  objective noise and evaluation from separate streams keyed by step, `sandbox/streams.py`), so
  two rules draw the same samples while their policies agree (`tests/test_streams.py`).{pairing_note}
- **Metrics.** `final_pass`: bandits — the exact expected reward of the last logged policy (the
  policy before the last update); tiny_tf — held-out pass@1 of the final model on 512 problems,
  2 samples each (temperature 1); the problems are drawn from the run's base seed and the
  replicate, so replicate *s* of every rule scores the same 512 and each replicate a set of its
  own{held_out_note}. `reward_auc`: the mean per-step
  training reward. `final_entropy`: policy entropy at the last step (nats).
- **Margins** (the smallest effect of interest, pre-registered in each claim record; the power
  lines, the margin classes and the headroom rule): {margins}.
- **Readings.** Each claim's own metric is its primary reading; the pass-rate claims restated on
  `reward_auc` are a secondary reading, added after `final_pass` was seen to saturate on the
  bandits (post hoc), and labelled so. Holm's adjustment runs per rung and reading (it controls
  the family-wise error under any dependence between claims that share a comparator's runs).

## Calibration

![calibration]({rel}/calibration.png)

{calibration}

## The ledger

{ledger}

`seeds for the margin`: paired seeds a two-sided paired t-test at 5% needs for 80% power to detect
the margin, given this claim's SD of paired differences. `clip share`: each rule's
`clip_low_frac + clip_high_frac` over the study's steps (n/a: the rule reports none). On
`bandit_exact` the difference is exact (no interval, no test): a gap within ±m is *equivalent*,
a larger one supported or reversed by its sign. †: a supported or reversed row whose whole
interval lies within ±m. The headroom rule uses each rung's bounds (`bounds.csv`): the pass
metrics' ceiling (the bandit's optimum, `sandbox.experiments.runs.optimum`; 1 on a task) and the
best score of a policy that ignores the prompt (the constant answer, or an answer drawn from the
held-out answers' own frequencies; `envs.reasoning.answer_baselines`, on the held-out set the runs
score):

{bounds}

### Secondary reading: the same claims on `reward_auc` (how fast, not where it ends)

{ledger_auc}

## What transfers and what does not

{summary}

Reading of the committed run (2026-11-25; the lists above are regenerated from the parts, this
paragraph is not):

- **Headroom, not the rules, decides the pass-rate rows.** {headroom}
  These rungs, as run, cannot answer the pass-rate claims; regimes with headroom (a bandit setting
  and horizon where rules separate, a task the tiny transformer learns beyond its answer prior)
  need a rerun.
- **Calibration.** The sampled bandit and tiny_tf run inside the 5–10% band (tiny_tf by searching
  μ: 8 × 2 epochs at lr 1e-3); the exact flow cannot reach it (≤ 2.3% at any step size and μ
  tried). The ledger's `clip share` column shows where each comparison sits. A toy result holds
  for its regime, and the regime has to be stated with it.
- **Where the ledger reads something** (the lists above): the entropy claims, which have no
  ceiling, and the secondary `reward_auc` reading on the sampled bandit, which has headroom. A
  supported or reversed row that does not survive Holm is listed so. These are toy findings, not
  verdicts on the papers' LLM claims.
- **tiny_tf is under-powered at 16 seeds** for most claims: its residual SD (the power table)
  asks for ~43 (`reward_auc`) to ~71 (`final_pass`) paired seeds to resolve 0.02. "Not resolved
  at this power" is a result: it says how many seeds a claim needs, not that the claim fails to
  transfer.
- **Rank agreement** between the two bandit rungs is positive with or without gspo. Between a
  bandit and the tiny transformer, the orders by `final_pass` do not agree (the bandits' final
  values are saturated); by `reward_auc` they agree with gspo and weakly without it (exact ~
  tiny_tf +0.32 [+0.18, +0.59]; sampled ~ tiny_tf +0.27 [0.00, +0.58]).
- **Mechanism (b)** needs no ranking: the hard clips (dapo, grpo, atr_grpo, clip_cov, gspo) zero a
  sizeable share of the advantage-weighted gradient mass — mostly on the Z_hi side, 20–32% of it on
  tiny_tf (gspo 54%) — while DGPO and NSR's decay zero none of it and keep 20–36% of the mass a hard clip
  would drop; NSR keeps part of it (its noise rescues some tokens and drops others).
- **Mechanism (a)** on two rungs: the entropy–covariance law predicts the measured per-step
  entropy change well for dapo, atr_grpo and gspo on both (correlation 0.91–0.95, slope
  0.92–0.97; grpo and clip_cov on tiny_tf less so: 0.77 / 0.60 and 0.85 / 0.80) and poorly for
  the rules that zero nothing — `unclipped`, `kl_cov_verl`, DGPO, NSR (correlation 0.38–0.85 on
  the bandit, 0.51–0.73 on tiny_tf, where four of their five mean predictions even have the wrong
  sign): their steps are large enough that the second-order term dominates, more so on tiny_tf, whose policy starts near uniform where the
  first-order term vanishes. The law, like the trust region, is a small-step statement, and a hard
  clip is what keeps the steps small.
- **Mechanism (c)**: NSR's stochastic rescue changes the gradient only by noise — given the batch,
  its expectation is its decay's gradient (by construction) — and that noise adds 17% (bandit) and 30% (tiny_tf) of the
  gradient's squared norm, so its gradient variance is 1.19 [1.16, 1.23] and 1.34 [1.27, 1.41]
  times the decay's. The ledger finds no gain of NSR over its decay where it can look (the sampled
  bandit's `reward_auc`, secondary); tiny_tf has no headroom and on the exact flow the two are
  identical by construction. The paper's "consistently more effective" has no support on the
  toys; whether the noise helps at LLM scale is the llm rung's question.

## Every rule: scores, clip share and where its gradient goes (mechanism check b)

`zero_lo` / `zero_hi`: share of the unclipped gradient's advantage-weighted mass (Σ|r·A|) on tokens
the rule gives a zero coefficient, ratio below / above 1 (its Z_lo and Z_hi); `rescued`: share on
tokens where the hard clip at the rule's own bounds (dapo's for a rule without bounds) would bind
but the rule keeps a gradient. Read off `out.coef` in the one loss assembly
(`sandbox.loss.grad_mass_shares`); averaged over steps and seeds (n/a on the exact flow: it takes expected gradients and reports no per-sample coefficients).

![mechanism]({rel}/mechanism.png)

{rules}

## Mechanism check (a): the entropy–covariance law on measured steps

Every step logs the entropy change of the policy under the step's updates (`entropy_change`) and
the law's first-order prediction from the same updates' logit change, ΔH ≈ −Cov_π(log π, Δz)
(arXiv 2505.22617; `sandbox.exact.softmax.entropy_covariance_prediction`). On the sampled bandit
both are exact over the whole policy, prompt-weighted. On tiny_tf they are taken at the visited
prefixes of the step's own rollout (every completion position): the next-token logits over the
task's allowed tokens before the step's updates and after them (no-grad forwards of the same
rows), ΔH and the prediction per prefix, then the token mean the `entropy` column uses; the
prefixes are those the rollout policy visited, not the whole sequence space. On the llm rung
(`llm.train --entropy-law`) the same is measured on the first 8 completions of each step (the
full vocabulary, in row chunks). Over every step and
seed of each rule: `slope` is the least-squares slope of observed on predicted through 0 (1 where
the law holds), `corr` their correlation. It needs no ranking: it says whether the
rule's coefficients predict what happens to the entropy, at the calibrated step size.

{entropy_law}

## Mechanism check (c): NSR's gradient noise against its deterministic decay's

On every optimizer update (toy trainers; `llm.train --grad-noise` on the llm rung), a rule with a deterministic counterpart (NSR →
NSR-decay, the same expected coefficient: `Objective.expectation`) also takes the counterpart's
gradient g_det on the same rows (`sandbox.grad_noise`): `rescue_var` = ‖g_NSR − g_det‖² (one draw
of the rescue noise's variance given the batch), `sampling_var` = ‖h₁ − h₂‖² with h₁ + h₂ = g_det
split over two halves of the rows (the batch-sampling variance of the minibatch gradient) and
`signal` = ‖g_det‖², per seed's model, averaged over a step's updates; `variance_ratio` =
1 + rescue_var / sampling_var (per seed, from its step-means; mean over seeds with a 95% t
interval) estimates Var(NSR) / Var(decay), the share columns are the seeds' means of the
step-means' ratios to `signal`.

{grad_noise}

## Power

Residual SD of the seeds × rules table (seed and rule effects removed), the SD of a paired
difference (√2 × residual) and the paired seeds needed to resolve the margin at 80% power:

{power}

## Rank agreement between rungs

Kendall's τ-b of the rule orders by `final_pass` and by `reward_auc`, a pair of rules counted as tied where its paired
95% interval contains 0 (the exact flow: where the exact gap is below 1e-6), with a percentile
bootstrap over seeds; with and without `{step_size_rule}`, whose 3e-4/4e-4 bounds make its gap a
step-size effect rather than a clipping finding.

{agreement}

## The earlier transfer study

{transfer}

## What remains: the llm rung

Not run here: this machine has no GPU, and SmolLM2-135M is not run on this CPU beyond the `quick`
smoke test (the tiny Llama, `python -m llm.claims --quick`). The plan, as a command and settings —
no timing below is a measurement:

    {gpu}

- rung `llm`: SmolLM2-135M-Instruct on `mod_arith` (two chained operations mod 7, the tiny_tf
  rung's own task) through the chat template, 100 steps, 32 prompts × 8 completions per step,
  μ = 2 × 2, token-mean aggregation, held-out pass@1 on 512 problems at steps 0, 50, 100, with
  mechanism checks (a) and (c) logged per step (`--entropy-law`, `--grad-noise` for NSR). The task
  was chosen by a CPU pilot of the base model, `results/llm_pilot/pilot.csv` (`python -m
  llm.pilot`, 64 held-out problems each, 16 new tokens, temperature 1, 2026-11-25): pass@1 0.047
  on mod_arith (a group of 8 has a success 32% of the time), and 0.000 on 2-digit addition, 3-digit
  addition and 3-term 2-digit addition; with the format forced ("The answer is", greedy) 3-digit
  and 3-term addition stay at 0 of 64 (the model cannot add them: no learning signal), 2-digit
  addition reaches 0.109 and saturated within ~20 steps on the H100 in the transfer study.
  **This task fails the headroom rule for the llm rung as planned:** always answering the most
  frequent answer ("0") scores {llm_floor} on its held-out sets, far above SmolLM2's 0.047 at
  step 0 (the tiny_tf row of the bounds table is the same task). Before the rung runs, a pilot has
  to choose a task or a balanced variant where the reference rule can clear that baseline;
- calibration: dapo at lr 2e-6, 5e-6, 1e-5, 2e-5 (the transfer study's 5e-6 clipped 0.85%; the
  ledger asks for ≥ 3%), one seed per step size (an llm spec trains one seed), then every claim
  rule at the chosen (lr, μ); if no point reaches 3%, widen the grids (`--llm lrs=[...]
  epochs=[2,4]`, which calibrates over μ as tiny_tf does) before running the rules;
- 8 paired seeds per rule, one spec per seed; with `--llm-ensemble 8` a rule's 8 seeds train as
  one job, one `llm.ensemble` (the 8 models' training forward and backward batched as one `vmap`;
  their rollouts still one model after another), one job at a time (`--workers 1`). Each seed is
  still its own part with the rows its separate run gives (to float rounding,
  `tests/test_claims_ensemble.py`), written when its job finishes, and the setting may change
  between sessions (`--llm-ensemble 1`: separate runs, up to 4 side by side by default; the parts
  are the same either way);
- runs longer than one command: a session reruns the command under `timeout 570` (the GPU
  machine's 10-minute commands) until the study is done; a cut llm run (or ensemble) resumes
  mid-way from its checkpoint in `<out>/llm_scratch/` (written every 10 steps,
  `--llm checkpoint_every=N`, and on SIGTERM; removed once the run's part is written) and gives
  the rows of an uninterrupted run (`tests/test_llm_resume_study.py`). Each checkpoint holds the
  optimizer (~1.6 GB for SmolLM2-135M), so the runs in flight (workers × ensemble members) must
  fit the machine's disk. Whether the ensemble is faster, and whether 8 models with their optimizer states and
  activations (no gradient checkpointing inside the ensemble) fit one GPU, is unmeasured;
- the page is then rebuilt (`python -m llm.claims --tables-only --out results/claims --doc
  docs/claims.md`) and the ledger gains the `llm` rows.
"""
