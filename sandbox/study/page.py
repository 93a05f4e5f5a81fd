"""docs/claims.md from a claims-study folder (``python -m llm.claims --tables-only --out
results/claims --doc docs/claims.md``).

The prose is ``page.md`` beside this module, a :class:`string.Template` (``$name`` /
``${name}``). Method prose (how the study works) is fixed text there; every number and every
sentence that states a result (which rule wins, what is supported, headroom, baselines, power,
rank agreement, the mechanism checks) is a placeholder filled here from the folder's tables
(``ledger.csv``, ``ledger_auc.csv``, ``summary.csv``, ``power.csv``, ``agreement.csv``,
``bounds.csv``, ``calibration.csv``, ``entropy_law.csv``, ``grad_noise.csv``, ``transfer.csv``,
``config.json``, ``provenance.json``). A placeholder without a value, or a value a table lacks,
is a ``ValueError`` naming the placeholder, never a blank. Every path is resolved from the study
folder, never the working directory.
"""

from __future__ import annotations

import json
import math
import os
import re
import textwrap
from collections.abc import Callable, Iterable
from pathlib import Path
from string import Template

import pandas as pd

from sandbox.experiments.results import NOT_RECORDED, PROVENANCE, read_provenance, write_text
from sandbox.streams import RNG

from . import evidence
from .analysis import fmt_interval, same_on_exact_flow
from .claims import CLAIMS
from .config import FIELDS, MARGINS, NEVER_BINDS, REFERENCE, STEP_SIZE_RULE, StudyConfig
from .rungs import RUNGS, Rung
from .settings import knob_text, migrate, section_settings

TEMPLATE = Path(__file__).with_name("page.md")

GPU_COMMAND = (
    "python -m llm.claims --profile gpu --device cuda --llm-ensemble 8 --workers 1 "
    "--out results/claims"
)
#: The exact flow's calibration over mu, a folder beside the study's (the page cites it).
EXACT_MU = "claims_exact_mu"
EXACT_MU_COMMAND = (
    f"python -m llm.claims --rungs bandit_exact --epochs 2 4 8 --out results/{EXACT_MU}"
)
#: Where the entropy-covariance law counts as predicting a rule's steps well (correlation).
LAW_HOLDS = 0.9
#: The order in which the page lists what a ledger found: the five verdict classes, then the rows
#: that carry none.
CLASSES = (*evidence.VERDICTS, *evidence.NOT_VERDICTS)
TRANSFER_COLUMNS = ("claim", "metric", "rung", "estimate", "lo", "hi", "verdict")
#: The gradient-mass shares of ``summary.csv`` and their names on the page.
SHARES = {
    "grad_mass_zero_lo": "zero_lo",
    "grad_mass_zero_hi": "zero_hi",
    "grad_mass_rescued": "rescued",
}
NO_AGREEMENT = "(fewer than two rungs with 3 rules in common)"
UNDEFINED_TAU = "undefined (a rung resolves no pair)"


# -- formatting -------------------------------------------------------------------------------


def _fmt(spec: str, nan: str = "n/a") -> Callable[[float], str]:
    """``format(x, spec)``, or ``nan`` where ``x`` is not finite."""
    return lambda x: format(x, spec) if math.isfinite(x) else nan


_pct, _num, _num3, _count = _fmt(".1%"), _fmt(".4f"), _fmt(".3f"), _fmt(".0f")


def _p(x: float) -> str:
    return "—" if not math.isfinite(x) else "<0.0001" if x < 1e-4 else f"{x:.4f}"


def _ci(lo: float, hi: float, spec: str) -> str:
    return f"[{lo:{spec}}, {hi:{spec}}]"


def _span(values: Iterable[float], fmt: Callable[[float], str] = "{:.2f}".format) -> str:
    """``0.91–0.95`` (one value where they agree at the printed precision)."""
    xs = sorted(values)
    lo, hi = fmt(xs[0]), fmt(xs[-1])
    return lo if lo == hi else f"{lo}–{hi}"


def _and(words: Iterable[str]) -> str:
    words = list(words)
    return ", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 else "".join(words)


def _on(frame: pd.DataFrame) -> str:
    """``rule on rung, ...`` for the rows of ``frame``."""
    return ", ".join(f"{r.rule} on {r.rung}" for r in frame.itertuples())


def _table(
    frame: pd.DataFrame,
    cols: list[str] | None = None,
    empty: str | None = None,
    **formats: Callable[[object], str],
) -> str:
    """A Markdown table of ``frame``'s ``cols`` (all by default), each column named in
    ``formats`` mapped through its function; ``empty`` instead where ``frame`` has no rows."""
    if empty is not None and frame.empty:
        return empty
    shown = frame.assign(**{c: frame[c].map(f) for c, f in formats.items()})
    shown = shown[cols] if cols else shown
    head, *body = (
        "| " + " | ".join(map(str, row)) + " |"
        for row in [shown.columns, *shown.itertuples(index=False)]
    )
    return "\n".join([head, "|" + "---|" * shown.shape[1], *body])


# -- the tables as printed --------------------------------------------------------------------


def ledger_table(ledger: pd.DataFrame) -> str:
    """A ledger as printed; † marks a supported or reversed row within ±m."""
    strong = ledger["verdict"].isin([evidence.SUPPORTED, evidence.REVERSED])
    small = strong & ledger["below_margin"].astype(bool)
    shown = pd.DataFrame(
        {
            "claim": ledger["claim"],
            "rung": ledger["rung"],
            "metric": ledger["metric"],
            "A − B [95% CI]": list(
                map(fmt_interval, ledger["estimate"], ledger["lo"], ledger["hi"])
            ),
            "verdict": ledger["verdict"] + small.map({True: " †", False: ""}),
            "p": ledger["p"].map(_p),
            "p (Holm)": ledger["p_holm"].map(_p),
            "seeds": ledger["seeds"],
            "clip share A / B": ledger["clip_frac_a"].map(_pct)
            + " / "
            + ledger["clip_frac_b"].map(_pct),
            "SD of diffs": ledger["diff_sd"].map(_num),
            "seeds for the margin": ledger["seeds_needed"].map(_count),
            "why": ledger["reason"],
        }
    )
    return _table(shown)


def calibration_table(cal: pd.DataFrame, summ: pd.DataFrame) -> str:
    """The calibration curve as printed, the chosen (step size, epochs) of each rung marked."""
    chosen = _chosen(summ)
    rows = pd.concat([g.sort_values(["epochs", "lr"]) for _, g in cal.groupby("rung", sort=False)])
    marks = [
        "**←**" if chosen.get(r) == (lr, mu) else ""
        for r, lr, mu in zip(rows["rung"], rows["lr"], rows["epochs"], strict=True)
    ]
    cols = ["rung", "epochs", "lr", "clip_share", "pass_rate", "seeds", "chosen"]
    return _table(rows.assign(chosen=marks), cols, clip_share=_pct, pass_rate=_num3)


def rules_table(summ: pd.DataFrame) -> str:
    """Per rung and rule: the metrics, clip share and gradient-mass shares as printed."""
    binds = [
        "**never**" if n else "no bounds" if not math.isfinite(c) else ""
        for n, c in zip(summ["never_binds"], summ["clip_frac"], strict=True)
    ]
    metrics = ["final_pass", "reward_auc", "final_entropy"]
    cols = ["rung", "rule", "seeds", "lr", "epochs", *metrics, "clip_frac", *SHARES.values()]
    shown = summ.rename(columns=SHARES).assign(binds=binds)
    shares = dict.fromkeys(["clip_frac", *SHARES.values()], _pct)
    return _table(shown, [*cols, "binds"], **dict.fromkeys(metrics, _num3), **shares)


def grad_noise_table(noise: pd.DataFrame) -> str:
    """Mechanism check (c) as printed: per rung and rule, the noise shares and the variance
    ratio with its interval over seeds; "(not logged)" without rows."""
    if noise.empty:
        return "(not logged)"
    ratio = [
        f"{e:.4f} {_ci(lo, hi, '.4f')}" if math.isfinite(lo) and math.isfinite(hi) else _num(e)
        for e, lo, hi in zip(noise["variance_ratio"], noise["lo"], noise["hi"], strict=True)
    ]
    cols = ["rung", "rule", "seeds", "points", "rescue_to_signal", "sampling_to_signal"]
    shown = noise.assign(variance_ratio=ratio)
    return _table(shown, [*cols, "variance_ratio"], **dict.fromkeys(cols[-2:], _num))


def _without(agree: pd.DataFrame) -> pd.Series:
    """The rules an agreement row leaves out, in words."""
    return agree["without"].fillna("").map(lambda w: f"without {w}" if w else "all rules")


def agreement_table(agree: pd.DataFrame) -> str:
    """The rank agreement between rungs as printed (tau-b with its bootstrap interval)."""
    tau = [
        fmt_interval(t, lo, hi)
        if math.isfinite(t)
        else UNDEFINED_TAU + (f"; bootstrap {_ci(lo, hi, '+.2f')}" if math.isfinite(lo) else "")
        for t, lo, hi in zip(agree["tau_b"], agree["lo"], agree["hi"], strict=True)
    ]
    shown = agree.assign(without=_without(agree), tau=tau)
    return _table(shown, ["metric", "rung_a", "rung_b", "without", "rules", "tau"], NO_AGREEMENT)


def transfer_section(out: Path) -> str:
    """The folder's ``transfer.csv`` (per claim, the paired effect on each rung side by side)
    and the sign agreement between rungs, or a line saying the folder has none."""
    path = out / "transfer.csv"
    if not path.exists():
        return "The transfer table (`transfer.csv`) is not in this folder."
    t = pd.read_csv(path)
    missing = [c for c in TRANSFER_COLUMNS if c not in t.columns]
    if missing:
        raise ValueError(f"{path} lacks the columns {missing}")
    t = t.assign(effect=list(map(fmt_interval, t["estimate"], t["lo"], t["hi"])))

    def by_rung(values: str) -> pd.DataFrame:
        index, aggfunc = ["claim", "metric"], "first"
        return t.pivot_table(
            index=index, columns="rung", values=values, aggfunc=aggfunc, sort=False
        )

    effect = by_rung("effect")
    verdict = by_rung("verdict").reindex_like(effect)
    text = _table(
        (
            effect.fillna("—") + verdict.map(lambda v: f" ({v})" if isinstance(v, str) else "")
        ).reset_index()
    )
    if not (out / "transfer_agreement.csv").exists():
        return text
    a = pd.read_csv(out / "transfer_agreement.csv")
    a = a[a["counted"] == "verdicts"]
    interval = [
        "—" if pd.isna(lo) else _ci(lo, hi, ".2f") for lo, hi in zip(a["lo"], a["hi"], strict=True)
    ]
    cols = ["metric", "rung_a", "rung_b", "claims", "resolved", "result", "interval"]
    signs = _table(a.assign(interval=interval), cols)
    return f"{text}\n\nAgreement of signs between rungs:\n\n{signs}"


def regimes_section(out: Path) -> str:
    """How the regimes were chosen: the regime pilot beside the folder (``../regimes``), its rule
    and per candidate whether it passes and the seeds its claims need; else a line saying so."""
    folder = out.parent / "regimes"
    if not (folder / "choice.csv").exists():
        return (
            "No regime pilot beside this folder (`../regimes`: `python -m sandbox.study.regimes`)."
        )
    choice, per, pilot = (
        pd.read_csv(folder / f"{n}.csv") for n in ("choice", "candidates", "pilot")
    )
    keys = ["rung", "candidate"]
    first = pilot.groupby(keys, sort=False).first().reset_index()
    per = per.merge(first[[*keys, "reference_pass", "floor"]], on=keys)
    picked = "; ".join(
        f"`{r.rung}`: "
        + (
            f"{r.candidate} at {int(r.seeds)} seeds ({r.why})"
            if isinstance(r.candidate, str)
            else r.why
        )
        for r in choice.itertuples()
    )
    cols = [*keys, "ok", "reference_pass", "floor", "needed", "seeds", "power"]
    table = _table(per, cols, reference_pass=_num, floor=_num, power="{:.2f}".format)
    return f"Chosen: {picked}.\n\n{table}"


def llm_pilot(out: Path) -> str:
    """The llm task pilot's table (``../llm_pilot/pilot.csv`` beside the folder), or a line."""
    path = out.parent / "llm_pilot" / "pilot.csv"
    if not path.exists():
        return "  (no llm task pilot beside this folder: `../llm_pilot/pilot.csv`)"
    p = pd.read_csv(path)
    cols = ["task", "knobs", "pass_at_1", "group_signal", "constant", "prior", "target"]
    if not set(cols) <= set(p.columns):
        return "  (the llm task pilot beside this folder predates its baseline columns)"
    return textwrap.indent(_table(p, cols, **dict.fromkeys(cols[2:], "{:.3f}".format)), "  ")


# -- provenance and settings ------------------------------------------------------------------


def _machine(entry: dict) -> str:
    """One provenance entry's machine and software, in words."""

    def get(key: str) -> str:
        value = entry.get(key)
        return NOT_RECORDED if value is None or value == "" else str(value)

    device = get("device") + (f" ({entry['gpu']})" if entry.get("gpu") else "")
    dirty = " with uncommitted changes" if entry.get("git_dirty") is True else ""
    return (
        f"device {device}, CPU {get('cpu_model')}, torch {get('torch')}, Python {get('python')}, "
        f"torch threads {get('torch_threads')}, OS {get('os')}, code {get('git_commit')}{dirty}"
    )


def provenance_text(out: Path) -> str:
    """The folder's ``provenance.json`` as a list: each command that computed parts (date,
    parts, machine), then the command that last rebuilt the tables."""
    record = read_provenance(out)
    if not record:
        return f"- {NOT_RECORDED} (the folder has no readable `{PROVENANCE}`)"

    def said(what: str, entry: dict, parts: str = "", note: str = "") -> str:
        command, date = entry.get("command", NOT_RECORDED), entry.get("date", NOT_RECORDED)
        return f"- {what}: `{command}` — {date}{parts}; {_machine(entry)}{note}"

    lines = [
        said(
            "runs",
            run,
            f", {run['parts']} parts" if "parts" in run else "",
            f" ({run['note']})" if run.get("note") else "",
        )
        for run in record.get("runs", [])
    ]
    if record.get("tables"):
        lines.append(said("tables and figures", record["tables"]))
    return "\n".join(lines) or f"- {NOT_RECORDED} (`{PROVENANCE}` lists no command)"


def run_dates(out: Path) -> str:
    """The dates of the runs that computed the folder's parts (``provenance.json``)."""
    runs = read_provenance(out).get("runs", [])
    return _and(sorted({str(r.get("date", NOT_RECORDED))[:10] for r in runs})) or NOT_RECORDED


def scheme_notes(rng: str | None) -> tuple[str, str]:
    """What the page says of the run's random-number scheme (its ``config.json``'s ``rng``)
    against this code's (:data:`sandbox.streams.RNG`): the pairing and held-out notes."""
    if rng == RNG:
        return (
            f" The run used these streams (`rng` {RNG} in `config.json`).",
            f" (as this run did: `rng` {RNG})",
        )
    return (
        " The committed run predates these streams (one generator per run, so a rule that draws "
        "extra numbers, NSR or Clip-Cov, fell out of step with the others after the first update).",
        " (the committed run predates per-replicate held-out sets: there every replicate and every "
        "rule scored one set of 512)",
    )


def toy_seeds(config: dict) -> str:
    """The toy rungs' paired seeds (the bandit and tf sections'; an old record's ``seeds``)."""
    sections = migrate(config, FIELDS)["sections"]
    seeds = [sections[n]["seeds"] for n in ("bandit", "tf") if "seeds" in sections.get(n, {})]
    return " / ".join(str(n) for n in dict.fromkeys(seeds))


def rungs_design(config: dict) -> str:
    """The Rungs bullet: each toy rung's regime as the folder's ``config.json`` records it."""
    from envs import make_bandit_suite

    sections = migrate(config, FIELDS)["sections"]
    b = section_settings("bandit", sections.get("bandit"))
    t = section_settings("tf", sections.get("tf"))
    about = make_bandit_suite()[b.setting].description
    knobs = ", ".join(f"{k}={v}" for k, v in sorted(t.knobs.items()))
    parts = {
        "bandit_exact": f"`bandit_exact`: the expected-gradient flow on the bandit `{b.setting}` "
        f"({about}), {b.steps} steps, exact finite-group GRPO advantage; deterministic, one "
        '"seed", verdict by the sign of the exact difference (Clip-Cov and KL-Cov have no exact '
        "flow: their batch ranking has no closed-form expectation).",
        "bandit_sampled": f"`bandit_sampled`: the sampled trainer on the same bandit, "
        f"{b.prompts_per_step} prompts x G per step, {b.steps} steps, {b.seeds} paired seeds.",
        "tiny_tf": f"`tiny_tf`: tiny transformers trained from scratch on `{t.task}` ({knobs}), "
        f"{t.steps} steps of {t.prompts_per_step} prompts x G, {t.seeds} paired seeds; held-out "
        f"pass@1 on {t.eval_prompts} problems x {t.eval_k} samples.",
    }
    return " ".join(parts[r] for r in config.get("rungs", []) if r in parts)


def _llm_rung() -> Rung:
    """The registered llm rung (``llm.claims`` registers it; ``sandbox`` never imports ``llm``)."""
    rung = RUNGS.get("llm")
    if rung is None or rung.bounds is None:
        raise ValueError("the llm rung is not registered (python -m llm.claims registers it)")
    return rung


def llm_task() -> str:
    """The llm rung's model and task at its default settings (the registered rung's)."""
    s = section_settings(_llm_rung().section)
    knobs = ", ".join(f"{k}={knob_text(v)}" for k, v in sorted(s.task_knobs.items()))
    return f"`{s.model}` on `{s.task}` ({knobs})"


def llm_floor() -> str:
    """The llm rung's answer baseline at its default settings."""
    return _num3(_llm_rung().bounds(StudyConfig()).floor)


# -- reading the tables -----------------------------------------------------------------------


def read_tables(out: Path) -> dict[str, pd.DataFrame]:
    """The study's tables in ``out``, rungs in ladder order and claims in ledger order; an
    optional table a folder predates (``bounds``, ``grad_noise``) is empty."""
    names = ("calibration", "summary", "ledger", "ledger_auc", "power", "agreement", "entropy_law")
    read = {n: pd.read_csv(out / f"{n}.csv") for n in names}
    for name in ("bounds", "grad_noise"):
        path = out / f"{name}.csv"
        read[name] = pd.read_csv(path) if path.exists() else pd.DataFrame()
    rank = {"rung": {r: i for i, r in enumerate(RUNGS)}}
    rank["claim"] = {c.name: i for i, c in enumerate(CLAIMS)}
    keys = {"summary": ["rung", "rule"], "power": ["rung", "metric"]}
    for name in ("summary", "ledger", "ledger_auc", "power"):
        read[name] = read[name].sort_values(
            keys.get(name, ["claim", "rung"]),
            key=lambda c: c.map(rank[c.name]) if c.name in rank else c,
            kind="stable",
        )
    return read


def _chosen(summ: pd.DataFrame) -> dict[str, tuple[float, int]]:
    """Each rung's calibrated (step size, epochs), as every rule ran it."""
    first = summ.groupby("rung", sort=False)[["lr", "epochs"]].first()
    return {r: (row.lr, row.epochs) for r, row in first.iterrows()}


def _band(config: dict) -> tuple[float, float, str]:
    low, high = config["target_low"], config["target_high"]
    return low, high, f"{100 * low:g}–{100 * high:g}%"


def _exact_mu(out: Path) -> pd.DataFrame:
    """The exact flow's calibration over mu, from the folder beside ``out`` (empty if absent)."""
    path = out.parent / EXACT_MU / "calibration.csv"
    return pd.read_csv(path) if path.exists() else pd.DataFrame(columns=["rung"])


def _shares(summ: pd.DataFrame) -> pd.DataFrame:
    """The rows with gradient-mass shares, each marked a hard clip (zeroes more of the mass than
    it keeps where a hard clip binds) or not."""
    s = summ.dropna(subset=["grad_mass_zero_hi"])
    zero = s["grad_mass_zero_lo"] + s["grad_mass_zero_hi"]
    return s.assign(zero=zero, hard=zero > s["grad_mass_rescued"])


# -- result sentences, generated from the tables ----------------------------------------------


def summary_text(ledger: pd.DataFrame, summary: pd.DataFrame | None = None) -> str:
    """What a ledger says, rung by rung and class by class (:data:`CLASSES`: a reversal and a
    margin-only result are never listed under one word); a supported or reversed row says
    whether it survives Holm's adjustment. With ``summary``: the rules that never bind and
    those whose realised effect cannot be told from ``unclipped``."""
    holm = {"survives": " (survives Holm)", "does not survive": " (not after Holm)"}
    named = ledger["claim"] + (ledger["holm"].map(holm).fillna("") if "holm" in ledger else "")
    lines = []
    for rung, part in ledger.assign(named=named).groupby("rung", sort=False):
        found = {v: part.loc[part["verdict"] == v, "named"] for v in CLASSES}
        said = [f"{v}: {', '.join(names)}" for v, names in found.items() if len(names)]
        lines.append(f"- **{rung}** — " + "; ".join(said) + ".")
    across = ledger.pivot_table(index="claim", columns="rung", values="verdict", aggfunc="first")
    read = {c: row.dropna() for c, row in across.iterrows()}
    same = [f"{c} ({v.iloc[0]})" for c, v in read.items() if v.nunique() == 1 and len(v) > 1]
    differ = [c for c, v in read.items() if v.nunique() > 1]
    lines.append(
        f"\nThe same reading on every rung that ran it: {', '.join(same) or 'none'}. "
        f"Readings that change between rungs: {', '.join(differ) or 'none'}."
    )
    if summary is None:
        return "\n".join(lines)
    idle = summary[summary["never_binds"]]
    if len(idle):
        lines.append(
            f"\nRules whose bounds never bind (clip share below {NEVER_BINDS:.1%}): {_on(idle)}. "
            "`unclipped` has no bounds by design; any other rule listed is the unclipped rule "
            "in disguise at this step size, and its claims test nothing about clipping there."
        )
    inert = summary[summary.get("like_unclipped", pd.Series(False, summary.index)).astype(bool)]
    if len(inert):
        lines.append(
            f"\nRules whose realised effect cannot be told from `unclipped` (paired `reward_auc` "
            f"interval within ±{MARGINS['reward_auc']:g}): {_on(inert)}. Their claims there "
            "measure the absence of a clip, not their own mechanism."
        )
    return "\n".join(lines)


def baseline_text(summ: pd.DataFrame, bounds: pd.DataFrame) -> str:
    """Per rung with an answer baseline above 0: whether any rule's mean ``final_pass`` beats it."""
    if bounds.empty:
        return "(No `bounds.csv` in this folder: the answer baselines were not computed.)"
    said = []
    for b in bounds[bounds["floor"] > 0].itertuples():
        part = summ[summ["rung"] == b.rung]
        above = part[part["final_pass"] > b.floor]
        base = f"its answer baseline {b.floor:.3f} ({b.source})"
        if part.empty:
            continue
        if above.empty:
            best = part.loc[part["final_pass"].idxmax()]
            said.append(
                f"No rule's mean `final_pass` on {b.rung} beats {base}; the best is "
                f"{best['rule']}'s {best['final_pass']:.3f}."
            )
        else:
            names = ", ".join(f"{r.rule} {r.final_pass:.3f}" for r in above.itertuples())
            said.append(
                f"On {b.rung}, {len(above)} of {len(part)} rules' mean `final_pass` beat {base}: "
                f"{names}."
            )
    return " ".join(said) or "No rung has an answer baseline above 0."


def headroom_text(ledger: pd.DataFrame, summ: pd.DataFrame, bounds: pd.DataFrame) -> str:
    """How many pass-rate rows have no headroom, per rung and why (the ledger's own words), the
    answer baselines against the rules' means, and which rungs cannot answer a pass-rate claim."""
    bounded = ledger[ledger["metric"].isin(["final_pass", "reward_auc"])]
    said, closed = [], []
    for rung, part in bounded.groupby("rung", sort=False):
        none = part[part["verdict"] == evidence.NO_HEADROOM]
        if len(none):
            said.append(
                f"On {rung}, {len(none)} of {len(part)} pass-rate claims have no headroom "
                f"(e.g. {none['reason'].iloc[0]})."
            )
            if part["verdict"].isin(evidence.NOT_VERDICTS).all():
                closed.append(rung)
    n = int((bounded["verdict"] == evidence.NO_HEADROOM).sum())
    head = (
        "**Headroom, not the rules, decides the pass-rate rows.**"
        if 0 < len(closed) == bounded["rung"].nunique()
        else f"**Headroom decides {n} of {len(bounded)} pass-rate rows.**"
    )
    text = " ".join([head, *said, baseline_text(summ, bounds)])
    if not closed:
        return text
    return (
        f"{text}\n  {_and(closed)}, as run, cannot answer the pass-rate claims (at this horizon "
        "the comparators end within two margins of the ceiling); the secondary `reward_auc` "
        "reading there still compares how fast the rules get there."
    )


def calibration_mu(cal: pd.DataFrame, config: dict, exact_mu: pd.DataFrame) -> str:
    """Per rung and mu, the best clip share over the step sizes and whether it is in the band;
    the grids on which the share is not monotone in the step size."""
    low, high, band = _band(config)
    mb = config["minibatches"]
    rungs, bumpy = [], []
    for rung, part in cal.groupby("rung", sort=False):
        said = []
        for mu, g in part.groupby("epochs"):
            best = g.loc[g["clip_share"].idxmax()]
            share = best["clip_share"]
            where = "above" if share > high else "in" if share >= low else "below"
            said.append(f"{mu} × {mb}: {_pct(share)} at lr {best['lr']:g} ({where} the band)")
            steps = g.sort_values("lr")["clip_share"].diff().dropna()
            if (steps > 0).any() and (steps < 0).any():
                bumpy.append(f"{rung} at {mu} × {mb}")
        more = exact_mu[exact_mu["rung"] == rung]
        if len(more):
            peaks = more.groupby("epochs")["clip_share"].max()
            said.append(
                f"over μ = {', '.join(map(str, peaks.index))} (`results/{EXACT_MU}/`, "
                f"`{EXACT_MU_COMMAND}`): at most {', '.join(map(_pct, peaks))}"
            )
            part = pd.concat([part, more])
        if RUNGS.get(rung) and RUNGS[rung].traits.deterministic and part["clip_share"].max() < low:
            said.append(
                "the expected-gradient flow moves smoothly to the optimum, so few expected tokens "
                "ever leave the trust region"
            )
        rungs.append(f"{rung} — " + "; ".join(said))
    text = f"Per rung and μ, the best clip share over the step sizes (band {band}): "
    text += "; ".join(rungs) + "."
    if bumpy:
        text += (
            f" The share is not monotone in the step size on {_and(bumpy)}: a larger step "
            "sharpens the policy sooner."
        )
    return text


def calibration_band(
    cal: pd.DataFrame, summ: pd.DataFrame, config: dict, exact_mu: pd.DataFrame
) -> str:
    """Which rungs' calibrated point is inside the band, and how close the others came."""
    low, high, band = _band(config)
    inside, outside = [], []
    for rung, (lr, mu) in _chosen(summ).items():
        row = cal[(cal["rung"] == rung) & (cal["lr"] == lr) & (cal["epochs"] == mu)]
        if row.empty:
            raise ValueError(
                f"calibration.csv has no row for {rung}'s point (lr {lr:g}, epochs {mu})"
            )
        share = row["clip_share"].iloc[0]
        point = f"{_pct(share)} at lr {lr:g}, {int(mu)} × {config['minibatches']} epochs"
        if low <= share <= high:
            inside.append(f"{rung} ({point})")
            continue
        tried = pd.concat([cal[cal["rung"] == rung], exact_mu[exact_mu["rung"] == rung]])
        best = _pct(tried["clip_share"].max())
        outside.append(f"{rung} ({point}; at most {best} at any step size and μ tried)")
    said = [f"{_and(inside)} run inside the {band} band"] if inside else []
    said += [f"{_and(outside)} cannot reach it"] if outside else []
    return "; ".join(said) + "."


def where_read(led: pd.DataFrame, auc: pd.DataFrame) -> str:
    """Where the ledgers give a verdict (not no headroom, not identical by construction)."""

    def where(ledger: pd.DataFrame) -> str:
        has = ledger[ledger["verdict"].isin(evidence.VERDICTS)]
        on = [f"`{m}` on {_and(g['rung'].unique())}" for m, g in has.groupby("metric", sort=False)]
        return _and(on) or "nowhere"

    return (
        f"on the primary reading, {where(led)}; on the secondary `reward_auc` reading, {where(auc)}"
    )


def power_text(power: pd.DataFrame) -> str:
    """Per rung: the metrics whose margin needs more paired seeds than the rung ran."""
    said = []
    for rung, part in power.groupby("rung", sort=False):
        seeds = int(part["seeds"].max())
        short = part[part["seeds_needed"] > part["seeds"]]
        unknown = part[part["seeds_needed"].isna()]
        if len(short):
            need = _and(
                f"`{r.metric}` {int(r.seeds_needed)} (margin {r.margin:g})"
                for r in short.itertuples()
            )
            said.append(
                f"**{rung} is under-powered at {seeds} seeds**: paired seeds needed for {need}."
            )
        elif len(unknown) < len(part):
            said.append(f"{rung} has the paired seeds its margins need at {seeds}.")
        if len(unknown):
            said.append(
                f"(No power line for {_and(f'`{m}`' for m in unknown['metric'])} on {rung}.)"
            )
    return " ".join(said)


def agreement_text(agree: pd.DataFrame) -> str:
    """Per metric and pair of rungs, whether the rule orders agree (tau-b interval above 0),
    disagree (below 0) or are not resolved (it contains 0)."""

    def word(t: float, lo: float, hi: float) -> str:
        if not math.isfinite(t):
            return UNDEFINED_TAU
        said = "agree" if lo > 0 else "disagree" if hi < 0 else "not resolved"
        return f"{said}, {t:+.2f} {_ci(lo, hi, '+.2f')}"

    said = []
    for metric, part in agree.assign(without=_without(agree)).groupby("metric", sort=False):
        pairs = [
            f"{a} ~ {b} ("
            + "; ".join(f"{r.without}: {word(r.tau_b, r.lo, r.hi)}" for r in g.itertuples())
            + ")"
            for (a, b), g in part.groupby(["rung_a", "rung_b"], sort=False)
        ]
        said.append(f"By `{metric}`: " + "; ".join(pairs) + ".")
    return " ".join(said) or NO_AGREEMENT


def mechanism_b(summ: pd.DataFrame) -> str:
    """Per rung: what share of the advantage-weighted mass the hard clips zero, and what the
    other rules zero and keep."""
    said = []
    for rung, s in _shares(summ).groupby("rung", sort=False):
        hard, soft = s[s["hard"] & (s["rule"] != STEP_SIZE_RULE)], s[~s["hard"]]
        bits = []
        if len(hard):
            side = f"Z_hi {_span(hard['grad_mass_zero_hi'], _pct)}"
            if (hard["grad_mass_zero_hi"] > hard["grad_mass_zero_lo"]).all():
                side += ", more than Z_lo"
            step = s[s["hard"] & (s["rule"] == STEP_SIZE_RULE)]
            extra = f" ({STEP_SIZE_RULE} {_pct(step['zero'].iloc[0])})" if len(step) else ""
            bits.append(
                f"the hard clips ({', '.join(hard['rule'])}) zero {_span(hard['zero'], _pct)} "
                f"of the advantage-weighted gradient mass{extra} ({side})"
            )
        none = soft[soft["zero"] < NEVER_BINDS]
        if len(none):
            bits.append(
                f"{', '.join(none['rule'])} zero none of it and keep "
                f"{_span(none['grad_mass_rescued'], _pct)} of the mass a hard clip would drop"
            )
        bits += [
            f"{r.rule} zeroes {_pct(r.zero)} and keeps {_pct(r.grad_mass_rescued)} "
            "(it rescues some tokens and drops others)"
            for r in soft[soft["zero"] >= NEVER_BINDS].itertuples()
        ]
        said.append(f"on {rung}, " + "; ".join(bits))
    return "; ".join(said) or "(no gradient-mass shares in this folder)"


def mechanism_a(law: pd.DataFrame, summ: pd.DataFrame) -> str:
    """Where the entropy-covariance law predicts the measured entropy change, rule by rule."""
    if law.empty:
        return "(the entropy law was not logged in this folder)"
    law = law.merge(_shares(summ)[["rung", "rule", "hard"]], on=["rung", "rule"], how="left")
    holds = law.groupby("rule")["corr"].min() >= LAW_HOLDS
    good = law[law["rule"].isin(holds[holds].index)]
    hard_rest = law[(law["corr"] < LAW_HOLDS) & (law["hard"] == True)]  # noqa: E712
    soft = law[law["hard"] == False]  # noqa: E712
    well = f"correlation ≥ {LAW_HOLDS:g} on every rung"
    said = [
        f"the entropy–covariance law predicts the measured per-step entropy change well ({well}) "
        f"for {_and(good['rule'].unique())} on {_and(good['rung'].unique())} "
        f"(correlation {_span(good['corr'])}, slope {_span(good['slope'])})"
        if len(good)
        else f"the entropy–covariance law predicts no rule's steps with {well}"
    ]
    if len(hard_rest):
        less = "; ".join(
            f"{r.rule} on {r.rung} {r.corr:.2f} / {r.slope:.2f}" for r in hard_rest.itertuples()
        )
        said.append(f"hard clips below {LAW_HOLDS:g} (correlation / slope): {less}")
    if len(soft):
        per = "; ".join(
            f"{_span(g['corr'])} on {rung}, "
            f"{int((g['predicted_mean'] * g['observed_mean'] < 0).sum())} of {len(g)} mean "
            "predictions of the wrong sign"
            for rung, g in soft.groupby("rung", sort=False)
        )
        said.append(
            f"{'poorly' if soft['corr'].max() < LAW_HOLDS else 'less well'} for the rules that "
            f"keep more of the mass than they zero — {', '.join(soft['rule'].unique())} "
            f"(correlation {per})"
        )
    text = "; ".join(said) + "."
    # the reading below needs every hard clip under the law
    if (
        not len(hard_rest)
        and len(soft)
        and len(good)
        and soft["corr"].median() < good["corr"].median()
    ):
        text += (
            " Their steps are large enough that the second-order term dominates, more so where the "
            "policy starts near uniform and the first-order term vanishes. The law, like the trust "
            "region, is a small-step statement, and a hard clip is what keeps the steps small."
        )
    return text


def mechanism_c(noise: pd.DataFrame, led: pd.DataFrame, auc: pd.DataFrame) -> str:
    """The rescue noise's share and variance ratio, and what the ledgers say of the noisy rule
    against its deterministic counterpart."""
    if noise.empty:
        return "NSR's gradient noise was not logged in this folder."
    rule = noise["rule"].iloc[0]
    adds = _and(f"{100 * r.rescue_to_signal:.0f}% ({r.rung})" for r in noise.itertuples())
    ratio = _and(
        f"{r.variance_ratio:.2f} "
        + (_ci(r.lo, r.hi, ".2f") if math.isfinite(r.lo) else "(no interval)")
        + f" ({r.rung})"
        for r in noise.itertuples()
    )
    rows = pd.concat([led, auc])
    pairs = {(a, b) for a, b in zip(rows["rule_a"], rows["rule_b"], strict=True) if a == rule}
    twin = [b for a, b in sorted(pairs) if same_on_exact_flow(a, b)]
    text = (
        f"{rule}'s stochastic rescue changes the gradient only by noise — given the batch, its "
        "expectation is its deterministic counterpart's gradient (by construction) — and that noise "
        f"adds {adds} of the gradient's squared norm, so its gradient variance is {ratio} times the "
        "counterpart's."
    )
    if not twin:
        return text + f" The ledger has no claim of {rule} against its counterpart in this folder."
    rows = rows[(rows["rule_a"] == rule) & (rows["rule_b"] == twin[0])]
    found = "; ".join(
        f"{r.rung} `{r.metric}`{' (secondary)' if r.reading != 'primary' else ''}: {r.verdict}"
        for r in rows.itertuples()
    )
    won = rows[rows["verdict"] == evidence.SUPPORTED]
    end = (
        f"A gain of {rule} over {twin[0]} is supported on "
        + _and(f"{r.rung} `{r.metric}`" for r in won.itertuples())
        if len(won)
        else 'The paper\'s "consistently more effective" has no support on the toys; whether the '
        "noise helps at LLM scale is the llm rung's question"
    )
    return (
        f"{text} The ledger's {rows['claim'].iloc[0]} ({rule} against {twin[0]}): {found}. {end}."
    )


# -- the page -----------------------------------------------------------------------------------


def placeholders(template: str) -> set[str]:
    """The names of the template's ``$name`` / ``${name}`` placeholders."""
    found = set()
    for m in Template.pattern.finditer(template):
        if m.group("invalid") is not None:
            line = template[: m.start()].count("\n") + 1
            raise ValueError(f"page.md line {line}: a '$' that is no placeholder (write $$)")
        found.add(m.group("named") or m.group("braced"))
    return found - {None}


def render(template: str, values: dict[str, Callable[[], str]]) -> str:
    """``template`` with every placeholder filled by its value's function; a placeholder without
    one, a function that finds no value in the tables, or an empty or NaN value is a
    ``ValueError`` naming the placeholder."""
    filled = {}
    for name in sorted(placeholders(template)):
        if name not in values:
            raise ValueError(f"page.md: placeholder ${name} has no value")
        try:
            text = values[name]()
        except (KeyError, IndexError, ValueError, AttributeError, OSError) as exc:
            raise ValueError(f"page.md: placeholder ${name}: {type(exc).__name__}: {exc}") from exc
        if not text or re.search(r"\bnan\b", text, re.IGNORECASE):
            raise ValueError(f"page.md: placeholder ${name} has no value in the tables ({text!r})")
        filled[name] = text
    return Template(template).substitute(filled)


def page_values(out: Path, path: Path) -> dict[str, Callable[[], str]]:
    """The function that gives each placeholder of ``page.md`` its text from the folder ``out``
    (the page is written to ``path``; its links are relative to it)."""
    read = read_tables(out)
    config = json.loads((out / "config.json").read_text())
    summ, led, auc, law = read["summary"], read["ledger"], read["ledger_auc"], read["entropy_law"]
    cal, bounds, noise, exact_mu = (
        read["calibration"],
        read["bounds"],
        read["grad_noise"],
        _exact_mu(out),
    )
    claims = pd.DataFrame(
        [
            (c.name, c.rule_a, c.rule_b, c.metric, c.direction, f"{c.source}, {c.where}")
            for c in CLAIMS
        ],
        columns=["claim", "A", "B", "metric", "A is", "source"],
    )
    law_cols = ("observed_mean", "predicted_mean", "corr", "slope", "rms_error")
    pairing_note, held_out_note = scheme_notes(config.get("rng"))
    return {
        "rel": lambda: os.path.relpath(out, path.parent),
        "provenance": lambda: provenance_text(out),
        "config": lambda: "\n".join(f"    {k}: {v}" for k, v in config.items()),
        "claims": lambda: _table(claims),
        "calibration": lambda: calibration_table(cal, summ),
        "calib_seeds": lambda: str(config["calib_seeds"]),
        "calibration_mu": lambda: calibration_mu(cal, config, exact_mu),
        "calibration_band": lambda: calibration_band(cal, summ, config, exact_mu),
        "ledger": lambda: ledger_table(led),
        "ledger_auc": lambda: ledger_table(auc),
        "bounds": lambda: _table(bounds, empty="(not computed)", floor=_num),
        "entropy_law": lambda: _table(law, empty="(not logged)", **dict.fromkeys(law_cols, _num)),
        "grad_noise": lambda: grad_noise_table(noise),
        "summary": lambda: summary_text(led, summ),
        "summary_auc": lambda: summary_text(auc),
        "run_dates": lambda: run_dates(out),
        "headroom": lambda: headroom_text(led, summ, bounds),
        "where_read": lambda: where_read(led, auc),
        "power_reading": lambda: power_text(read["power"]),
        "agreement_reading": lambda: agreement_text(read["agreement"]),
        "mechanism_a": lambda: mechanism_a(law, summ),
        "mechanism_b": lambda: mechanism_b(summ),
        "mechanism_c": lambda: mechanism_c(noise, led, auc),
        "rules": lambda: rules_table(summ),
        "power": lambda: _table(
            read["power"],
            [
                "rung",
                "metric",
                "seeds",
                "rules",
                "residual_sd",
                "diff_sd",
                "margin",
                "seeds_needed",
            ],
            residual_sd=_num,
            diff_sd=_num,
            seeds_needed=_count,
        ),
        "agreement": lambda: agreement_table(read["agreement"]),
        "band": lambda: _band(config)[2],
        "minibatches": lambda: str(config["minibatches"]),
        "seeds": lambda: toy_seeds(config),
        "rungs_design": lambda: rungs_design(config),
        "regimes": lambda: regimes_section(out),
        "margins": lambda: ", ".join(f"`{k}` {v:g}" for k, v in MARGINS.items()),
        "reference": lambda: REFERENCE,
        "step_size_rule": lambda: STEP_SIZE_RULE,
        "gpu": lambda: GPU_COMMAND,
        "transfer": lambda: transfer_section(out),
        "llm_floor": llm_floor,
        "llm_task": llm_task,
        "llm_pilot": lambda: llm_pilot(out),
        "pairing_note": lambda: pairing_note,
        "held_out_note": lambda: held_out_note,
    }


def write_doc(out: Path, path: Path) -> None:
    """Write the page ``path`` from the tables in ``out`` (rewritten only when it changes)."""
    out, path = Path(out), Path(path)
    if not (out / "config.json").exists():
        raise ValueError(f"--out: {out} has no config.json (not a claims-study folder)")
    if not (out / "ledger.csv").read_text().strip():
        raise ValueError("the study's rules make no claim (empty ledger.csv): no page")
    write_text(render(TEMPLATE.read_text(), page_values(out, path)), path)
