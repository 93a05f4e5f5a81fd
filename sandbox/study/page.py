"""docs/claims.md from a claims-study folder (``python -m llm.claims --tables-only --out
results/claims --doc docs/claims.md``).

The words are ``page.md`` beside this module: the page, a :class:`string.Template` (``$name`` /
``${name}``), then its *sentences* (``- name: words`` after ``<!-- sentences``), whose ``{field}``
slots :func:`say` fills. Method prose is fixed text in the page; every number and every sentence
that states a result is a placeholder filled from the folder's tables (:func:`page_values`). A
placeholder without a value, or a value a table lacks, is a ``ValueError`` naming the placeholder,
never a blank. Every path is resolved from the study folder, never the working directory.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import textwrap
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from string import Template

import pandas as pd

from sandbox.experiments.results import NOT_RECORDED, PROVENANCE, read_provenance, write_text
from sandbox.streams import RNG

from . import evidence, transfer
from .analysis import (
    calibrated_points,
    fmt_ci,
    fmt_interval,
    ladder_order,
    same_on_exact_flow,
)
from .claims import BOUNDED, CLAIMS, decided_at_margin
from .config import MARGINS, NEVER_BINDS, ONE_AXIS, REFERENCE, STEP_SIZE_RULE, StudyConfig
from .rungs import RUNGS
from .settings import knob_text, section_settings

TEMPLATE = Path(__file__).with_name("page.md")
#: Where ``page.md``'s sentences start (the page ends before it).
SENTENCES = "\n<!-- sentences"

GPU_COMMAND = "python -m llm.claims --profile gpu --workers 1 --out results/claims"
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
#: The gradient-mass shares of ``summary.csv`` and their names on the page.
SHARES = {
    "grad_mass_zero_lo": "zero_lo",
    "grad_mass_zero_hi": "zero_hi",
    "grad_mass_rescued": "rescued",
}
#: The claims table's columns (a :class:`.claims.Claim`'s fields, renamed).
CLAIM_COLUMNS = ["claim", "A", "B", "metric", "A is", "source"]


# -- words and numbers ------------------------------------------------------------------------


@functools.cache
def sentences() -> dict[str, str]:
    """``page.md``'s sentences by name: each ``- name: words`` item, indented lines joined."""
    text = TEMPLATE.read_text().partition(SENTENCES)[2]
    items = re.findall(r"^- (\w+): (.*(?:\n  .*)*)", text, re.MULTILINE)
    return {name: " ".join(line.strip() for line in words.split("\n")) for name, words in items}


def say(name: str, **fields: object) -> str:
    """Sentence ``name`` of ``page.md``, its ``{field}`` slots filled from ``fields``."""
    return sentences()[name].format(**fields)


def _fmt(spec: str, nan: str = "n/a") -> Callable[[float], str]:
    """``format(x, spec)``, or ``nan`` where ``x`` is not finite."""
    return lambda x: format(x, spec) if math.isfinite(x) else nan


_pct, _num, _num3, _count = _fmt(".1%"), _fmt(".4f"), _fmt(".3f"), _fmt(".0f")


def _p(x: float) -> str:
    return "—" if not math.isfinite(x) else "<0.0001" if x < 1e-4 else f"{x:.4f}"


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
    rows = [shown.columns, *shown.itertuples(index=False)]
    head, *body = ("| " + " | ".join(map(str, row)) + " |" for row in rows)
    return "\n".join([head, "|" + "---|" * shown.shape[1], *body])


# -- the tables as printed --------------------------------------------------------------------


def ledger_table(ledger: pd.DataFrame) -> str:
    """A ledger as printed; † marks a supported or reversed row within ±m."""
    strong = ledger["verdict"].isin([evidence.SUPPORTED, evidence.REVERSED])
    dagger = (strong & ledger["below_margin"].astype(bool)).map({True: " †", False: ""})
    clip = ledger["clip_frac_a"].map(_pct) + " / " + ledger["clip_frac_b"].map(_pct)
    zeroed = ledger.get("zeroed_a", pd.Series(float("nan"), ledger.index)).map(_pct) + " / "
    zeroed += ledger.get("zeroed_b", pd.Series(float("nan"), ledger.index)).map(_pct)
    shown = {
        "claim": ledger["claim"],
        "rung": ledger["rung"],
        "metric": ledger["metric"],
        "A − B [95% CI]": list(map(fmt_interval, ledger["estimate"], ledger["lo"], ledger["hi"])),
        "verdict": ledger["verdict"] + dagger,
        "p": ledger["p"].map(_p),
        "p (Holm)": ledger["p_holm"].map(_p),
        "seeds": ledger["seeds"],
        "clip share A / B": clip,
        "zeroed mass A / B": zeroed,
        "SD of diffs": ledger["diff_sd"].map(_num),
        "seeds for the margin": ledger["seeds_needed"].map(_count),
        "why": ledger["reason"],
    }
    return _table(pd.DataFrame(shown))


def calibration_table(cal: pd.DataFrame, summ: pd.DataFrame) -> str:
    """The calibration curve as printed, the chosen (step size, epochs) of each rung marked."""
    chosen = calibrated_points(summ)
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
    metrics, shares = ["final_pass", "reward_auc", "final_entropy"], ["clip_frac", *SHARES.values()]
    cols = ["rung", "rule", "seeds", "lr", "epochs", *metrics, *shares, "binds"]
    shown = summ.rename(columns=SHARES).assign(binds=binds)
    return _table(shown, cols, **dict.fromkeys(metrics, _num3), **dict.fromkeys(shares, _pct))


def grad_noise_table(noise: pd.DataFrame) -> str:
    """Mechanism check (c) as printed: per rung and rule, the noise shares and the variance
    ratio with its interval over seeds."""
    if noise.empty:
        return say("not_logged")
    ratio = [  # n/a: no seed had sampling variance (every group's rewards tied on every step)
        fmt_interval(e, lo, hi, ".4f") if math.isfinite(e) else "n/a"
        for e, lo, hi in zip(noise["variance_ratio"], noise["lo"], noise["hi"], strict=True)
    ]
    cols = ["rung", "rule", "seeds", "points", "rescue_to_signal", "sampling_to_signal"]
    shown = noise.assign(variance_ratio=ratio)
    return _table(shown, [*cols, "variance_ratio"], **dict.fromkeys(cols[-2:], _num))


def _transfer_cell(row: pd.Series) -> str:
    """``+0.0217 [+0.0017, +0.0417] (supported)``: a claim on one rung in the page's table."""
    verdict = f" ({row['verdict']})" if isinstance(row["verdict"], str) else ""
    return fmt_interval(row["estimate"], row["lo"], row["hi"]) + verdict


def transfer_section(out: Path) -> str:
    """The folder's ``transfer.csv`` (per claim, the paired effect on each rung side by side)
    and the sign agreement between rungs (``transfer_agreement.csv``)."""
    if not (out / "transfer.csv").exists():
        return say("no_transfer")
    t = pd.read_csv(out / "transfer.csv")
    if missing := [c for c in transfer.COLUMNS if c not in t.columns]:
        raise ValueError(f"{out / 'transfer.csv'} lacks the columns {missing}")
    text = _table(transfer.transfer_wide(t, _transfer_cell, missing="—"))
    if not (out / "transfer_agreement.csv").exists():
        return text
    a = pd.read_csv(out / "transfer_agreement.csv").query("counted == 'margin'")
    interval = [
        "—" if pd.isna(lo) else fmt_ci(lo, hi, ".2f")
        for lo, hi in zip(a["lo"], a["hi"], strict=True)
    ]
    cols = ["metric", "rung_a", "rung_b", "claims", "resolved", "result", "interval"]
    signs = _table(a.assign(interval=interval), cols)
    return f"{text}\n\nAgreement of signs between rungs:\n\n{signs}"


def regimes_section(out: Path) -> str:
    """How the regimes were chosen: the regime pilot beside the folder (``../regimes``), its
    choice and per candidate whether it passes and the seeds its claims need."""
    folder = out.parent / "regimes"
    if not (folder / "choice.csv").exists():
        return say("no_regimes")
    choice, per, pilot = (
        pd.read_csv(folder / f"{n}.csv") for n in ("choice", "candidates", "pilot")
    )
    keys = ["rung", "candidate"]
    first = pilot.groupby(keys, sort=False).first().reset_index()
    per = per.merge(first[[*keys, "reference_pass", "floor"]], on=keys)
    picked = "; ".join(
        f"`{r.rung}`: {r.candidate} at {int(r.seeds)} seeds ({r.why})"
        if isinstance(r.candidate, str)
        else f"`{r.rung}`: {r.why}"
        for r in choice.itertuples()
    )
    cols = [*keys, "ok", "reference_pass", "floor", "needed", "seeds", "power"]
    table = _table(per, cols, reference_pass=_num, floor=_num, power="{:.2f}".format)
    return f"Chosen: {picked}.\n\n{table}"


def llm_pilot(out: Path) -> str:
    """The llm task pilot's table (``../llm_pilot/pilot.csv`` beside the folder), indented."""
    path = out.parent / "llm_pilot" / "pilot.csv"
    cols = ["task", "knobs", "pass_at_1", "group_signal", "constant", "prior", "target"]
    if not path.exists():
        text = say("no_llm_pilot")
    elif not set(cols) <= set((p := pd.read_csv(path)).columns):
        text = say("old_llm_pilot")
    else:
        text = _table(p, cols, **dict.fromkeys(cols[2:], "{:.3f}".format))
    return textwrap.indent(text, "  ")


# -- provenance and settings ------------------------------------------------------------------


#: One provenance entry as the page lists it (a field not recorded says so).
PROVENANCE_LINE = (
    "- {what}: `{command}` — {date}{parts}; device {device}{gpu}, CPU {cpu_model}, "
    "torch {torch}, Python {python}, torch threads {torch_threads}, OS {os}, "
    "code {git_commit}{dirty}{note}"
)


def provenance_text(out: Path) -> str:
    """The folder's ``provenance.json`` as a list: each command that computed parts (date,
    parts, machine), then the command that last rebuilt the tables."""
    record = read_provenance(out)
    if not record:
        return f"- {NOT_RECORDED} (the folder has no readable `{PROVENANCE}`)"
    entries = [("runs", run) for run in record.get("runs", [])]
    entries += [("tables and figures", record["tables"])] if record.get("tables") else []
    lines = []
    for what, entry in entries:
        run = what == "runs"
        words = defaultdict(lambda: NOT_RECORDED)
        words |= {k: v for k, v in entry.items() if v is not None and v != ""}
        words |= {
            "what": what,
            "gpu": f" ({entry['gpu']})" if entry.get("gpu") else "",
            "dirty": " with uncommitted changes" if entry.get("git_dirty") is True else "",
            "parts": f", {entry['parts']} parts" if run and "parts" in entry else "",
            "note": f" ({entry['note']})" if run and entry.get("note") else "",
        }
        if run and isinstance(entry.get("git_at_end"), dict):  # committed or edited as it ran
            end = entry["git_at_end"]
            changed = " with uncommitted changes" if end.get("git_dirty") is True else ""
            words["note"] += (
                f" (the checkout was at {end.get('git_commit')}{changed} when it ended)"
            )
        lines.append(PROVENANCE_LINE.format_map(words))
    return "\n".join(lines) or f"- {NOT_RECORDED} (`{PROVENANCE}` lists no command)"


def run_dates(out: Path) -> str:
    """The dates of the runs that computed the folder's parts (``provenance.json``)."""
    runs = read_provenance(out).get("runs", [])
    return _and(sorted({str(r.get("date", NOT_RECORDED))[:10] for r in runs})) or NOT_RECORDED


def toy_seeds(sections: dict) -> str:
    """The toy rungs' paired seeds (the bandit and tf sections of ``config.json``)."""
    seeds = [sections[n]["seeds"] for n in ("bandit", "tf") if "seeds" in sections.get(n, {})]
    return " / ".join(str(n) for n in dict.fromkeys(seeds))


def rungs_design(config: dict, sections: dict) -> str:
    """The Rungs bullet: each toy rung's regime as the folder's ``config.json`` records it."""
    from envs import make_bandit_suite

    b = section_settings("bandit", sections.get("bandit"))
    t = section_settings("tf", sections.get("tf"))
    about = make_bandit_suite()[b.setting].description
    knobs = ", ".join(f"{k}={v}" for k, v in sorted(t.knobs.items()))
    said = [f"rung_{r}" for r in config.get("rungs", []) if f"rung_{r}" in sentences()]
    held = held_out_set(t.split)
    start = say("tf_scratch") if t.init is None else say("tf_warm", init=t.init)
    fields = dict(b=b, t=t, about=about, knobs=knobs, held=held, start=start)
    return " ".join(say(name, **fields) for name in said)


def held_out_set(split: bool) -> str:
    """Where a rung's held-out problems come from: its task's test partition (``split``), or
    every problem."""
    return say("held_out_split" if split else "held_out_any")


def llm_ran(summ: pd.DataFrame, bounds: pd.DataFrame, config: dict) -> str:
    """What the folder's llm rung ran: its settings (``config.json``), the calibrated point and
    dapo's clip share there, each rule's paired seeds, the rules not run yet, and dapo's final
    held-out pass against the answer floor; or that no llm run is here."""
    rows = summ[summ["rung"] == "llm"]
    if rows.empty:
        return say("llm_not_run")
    s, first = config["sections"]["llm"], rows.iloc[0]
    ref = rows[rows["rule"] == REFERENCE]
    text = say(
        "llm_ran",
        model=s["model"], task=s["task"], steps=s["steps"], prompts=s["prompts_per_step"],
        knobs=", ".join(f"{k}={knob_text(v)}" for k, v in sorted(s["task_knobs"].items())),
        group=s["group_size"], tokens=s["max_new_tokens"], mu=int(first.epochs),
        minibatches=config["minibatches"], lr=f"{first.lr:g}", eval_prompts=s["eval_prompts"],
        eval_k=s["eval_k"], every=s["eval_every"], held=held_out_set(s.get("split", False)), clip=_pct(ref["clip_frac"].iloc[0]) if len(ref) else "not run",
        ran=_and(f"{r.rule} {r.seeds}" for r in rows.itertuples()),
    )  # fmt: skip
    left = [r for r in config["rules"] if r not in set(rows["rule"])]
    text += " " + (say("llm_left", left=", ".join(left)) if left else say("llm_all"))
    floor = bounds.loc[bounds["rung"] == "llm", "floor"]
    if len(ref) and len(floor):
        reached, floor = float(ref["final_pass"].iloc[0]), float(floor.iloc[0])
        clears = f"{'clears' if reached >= floor + 0.10 else 'does not clear'} it by 0.10"
        text += " " + say(
            "llm_reference", reached=_num3(reached), floor=_num3(floor), clears=clears
        )
    return text


def llm_rung(floor: bool = False) -> str:
    """The llm rung's model and task at its default settings (``floor``: its answer baseline).
    ``llm.claims`` registers the rung; ``sandbox`` never imports ``llm``."""
    rung = RUNGS.get("llm")
    if rung is None or rung.bounds is None:
        raise ValueError("the llm rung is not registered (python -m llm.claims registers it)")
    if floor:
        return _num3(rung.bounds(StudyConfig()).floor)
    s = section_settings(rung.section)
    knobs = ", ".join(f"{k}={knob_text(v)}" for k, v in sorted(s.task_knobs.items()))
    return f"`{s.model}` on `{s.task}` ({knobs})"


def axis_text(axis: pd.DataFrame) -> str:
    """Per rung (``axis.csv``, :func:`.analysis.one_axis`): whether its rules' means move with
    the gradient mass they zero, metric by metric, with r and its interval."""
    if axis.empty:
        return say("no_axis")
    said = []
    for rung, g in axis.groupby("rung", sort=False):
        rules = int(g["rules"].iloc[0])
        if (g["reading"] == "too few rules").all():
            said.append(say("axis_few", rung=rung, rules=rules))
            continue
        rows = "; ".join(
            f"`{m}` r = {fmt_interval(r, lo, hi, '+.3f')} ({reading})"
            for m, r, lo, hi, reading in zip(g["metric"], g["r"], g["lo"], g["hi"], g["reading"], strict=True)
            if math.isfinite(r)
        )  # fmt: skip
        one = ", ".join(f"`{m}`" for m in g.loc[g["reading"] == "one axis", "metric"])
        if one:
            said.append(
                say("axis_one", rung=rung, rules=rules, rows=rows, metrics=one, bound=ONE_AXIS)
            )
        else:
            said.append(say("axis_not_shown", rung=rung, rules=rules, rows=rows))
    return " ".join(said)


# -- reading the tables -----------------------------------------------------------------------


def read_tables(out: Path) -> dict[str, pd.DataFrame]:
    """The study's tables in ``out``, rungs in ladder order and claims in ledger order, and the
    exact flow's calibration over mu beside it (``exact_mu``); an optional table a folder
    predates (``bounds``, ``grad_noise``, ``axis``, ``exact_mu``) is empty."""
    names = ("calibration", "summary", "ledger", "ledger_auc", "power", "entropy_law")
    read = {n: pd.read_csv(out / f"{n}.csv") for n in names}
    optional = {n: out / f"{n}.csv" for n in ("bounds", "grad_noise", "axis")}
    optional["exact_mu"] = out.parent / EXACT_MU / "calibration.csv"
    for name, path in optional.items():
        read[name] = pd.read_csv(path) if path.exists() else pd.DataFrame(columns=["rung"])
    read["summary"] = ladder_order(read["summary"], ["rung", "rule"])
    read["power"] = ladder_order(read["power"], ["rung", "metric"])
    claim = {c.name: i for i, c in enumerate(CLAIMS)}
    for name in ("ledger", "ledger_auc"):
        by_rung = ladder_order(read[name], ["rung"])
        read[name] = by_rung.sort_values("claim", key=lambda c: c.map(claim), kind="stable")
    return read


def _band(config: dict) -> tuple[float, float, str]:
    low, high = config["target_low"], config["target_high"]
    return low, high, f"{100 * low:g}–{100 * high:g}%"


def _tried(rung: str, cal: pd.DataFrame, exact_mu: pd.DataFrame) -> pd.Series:
    """The clip shares of every (step size, mu) a rung was calibrated at, here and beside."""
    return pd.concat([t[t["rung"] == rung] for t in (cal, exact_mu)])["clip_share"]


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
    whether it survives Holm's adjustment. "The same reading on every rung" lists a claim only
    where every rung that ran it decides it at the margin (:func:`.claims.decided_at_margin`:
    supported or reversed, surviving Holm, the interval beyond +-m) with one verdict; one verdict
    short of that on some rung is listed as such. With ``summary``: the rules that never bind and
    those whose realised effect lies within the margin of ``unclipped``'s."""
    holm = {"survives": " (survives Holm)", "does not survive": " (not after Holm)"}
    named = ledger["claim"] + (ledger["holm"].map(holm).fillna("") if "holm" in ledger else "")
    lines = []
    for rung, part in ledger.assign(named=named).groupby("rung", sort=False):
        found = {v: part.loc[part["verdict"] == v, "named"] for v in CLASSES}
        classes = [f"{v}: {', '.join(names)}" for v, names in found.items() if len(names)]
        lines.append(f"- **{rung}** — " + "; ".join(classes) + ".")
    at_margin = decided_at_margin(ledger)
    across = ledger.assign(at_margin=at_margin).groupby("claim")
    across = across.agg(
        nunique=("verdict", "nunique"),
        count=("verdict", "count"),
        first=("verdict", "first"),
        decided=("at_margin", "all"),
    )
    one = (across["nunique"] == 1) & (across["count"] > 1)

    def listed(rows: pd.DataFrame) -> str:
        return ", ".join(f"{c} ({v})" for c, v in rows["first"].items()) or "none"

    same, weak = listed(across[one & across["decided"]]), listed(across[one & ~across["decided"]])
    differ = ", ".join(across.index[across["nunique"] > 1]) or "none"
    said = ["\n".join(lines), say("same_reading", same=same, weak=weak, differ=differ)]
    if summary is not None:
        idle = summary[summary["never_binds"]]
        like = summary.get("like_unclipped", pd.Series(False, summary.index)).astype(bool)
        if len(idle):
            said.append(say("never_binds", share=NEVER_BINDS, rules=_on(idle)))
        if like.any():
            said.append(
                say("like_unclipped", margin=MARGINS["reward_auc"], rules=_on(summary[like]))
            )
    return "\n\n".join(said)


def baseline_text(summ: pd.DataFrame, bounds: pd.DataFrame) -> str:
    """Per rung with an answer baseline above 0: whether any rule's mean ``final_pass`` beats it."""
    if bounds.empty:
        return say("no_bounds")
    said = []
    for b in bounds[bounds["floor"] > 0].itertuples():
        part = summ[summ["rung"] == b.rung]
        above = part[part["final_pass"] > b.floor]
        base = {"rung": b.rung, "floor": b.floor, "source": b.source}
        if len(above):
            names = ", ".join(f"{r.rule} {r.final_pass:.3f}" for r in above.itertuples())
            said.append(say("baseline_beaten", n=len(above), rules=len(part), names=names, **base))
        elif len(part):
            best = part.loc[part["final_pass"].idxmax()]
            said.append(
                say("baseline_unbeaten", best=best["rule"], score=best["final_pass"], **base)
            )
    return " ".join(said) or say("no_baseline")


def headroom_text(ledger: pd.DataFrame, summ: pd.DataFrame, bounds: pd.DataFrame) -> str:
    """How many pass-rate rows have no headroom, per rung and why (the ledger's own words), the
    answer baselines against the rules' means, and which rungs cannot answer a pass-rate claim."""
    bounded = ledger[ledger["metric"].isin(BOUNDED)]
    said, closed = [], []
    for rung, part in bounded.groupby("rung", sort=False):
        none = part[part["verdict"] == evidence.NO_HEADROOM]
        if len(none):
            reason = none["reason"].iloc[0]
            said.append(say("no_headroom", rung=rung, n=len(none), rows=len(part), reason=reason))
            if part["verdict"].isin(evidence.NOT_VERDICTS).all():
                closed.append(rung)
    n = int((bounded["verdict"] == evidence.NO_HEADROOM).sum())
    if 0 < len(closed) == bounded["rung"].nunique():
        head = say("headroom_decides_all")
    else:
        head = say("headroom_decides", n=n, rows=len(bounded))
    text = " ".join([head, *said, baseline_text(summ, bounds)])
    return text + ("\n  " + say("cannot_answer", rungs=_and(closed)) if closed else "")


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
            mus, peaks = ", ".join(map(str, peaks.index)), ", ".join(map(_pct, peaks))
            words = {"folder": EXACT_MU, "command": EXACT_MU_COMMAND}
            said.append(say("exact_mu", mus=mus, peaks=peaks, **words))
        flow = RUNGS.get(rung) and RUNGS[rung].traits.deterministic
        if flow and _tried(rung, cal, exact_mu).max() < low:
            said.append(say("smooth_flow"))
        rungs.append(f"{rung} — " + "; ".join(said))
    text = say("calibration_mu", band=band, rungs="; ".join(rungs))
    return text + (" " + say("not_monotone", grids=_and(bumpy)) if bumpy else "")


def calibration_band(
    cal: pd.DataFrame, summ: pd.DataFrame, config: dict, exact_mu: pd.DataFrame
) -> str:
    """Which rungs' calibrated point is inside the band, and how close the others came."""
    low, high, band = _band(config)
    inside, outside = [], []
    for rung, (lr, mu) in calibrated_points(summ).items():
        row = cal[(cal["rung"] == rung) & (cal["lr"] == lr) & (cal["epochs"] == mu)]
        if row.empty:
            raise ValueError(
                f"calibration.csv has no row for {rung}'s point (lr {lr:g}, epochs {mu})"
            )
        share = row["clip_share"].iloc[0]
        point = f"{_pct(share)} at lr {lr:g}, {int(mu)} × {config['minibatches']} epochs"
        if low <= share <= high:
            inside.append(f"{rung} ({point})")
        else:
            best = _pct(_tried(rung, cal, exact_mu).max())
            outside.append(say("band_missed", rung=rung, point=point, best=best))
    said = [say("band_inside", rungs=_and(inside), band=band)] if inside else []
    said += [say("band_outside", rungs=_and(outside))] if outside else []
    return "; ".join(said) + "."


def where_read(led: pd.DataFrame, auc: pd.DataFrame) -> str:
    """Where the ledgers give a verdict (not no headroom, not identical by construction)."""

    def where(ledger: pd.DataFrame) -> str:
        has = ledger[ledger["verdict"].isin(evidence.VERDICTS)]
        on = [f"`{m}` on {_and(g['rung'].unique())}" for m, g in has.groupby("metric", sort=False)]
        return _and(on) or "nowhere"

    return say("where_read", primary=where(led), secondary=where(auc))


def power_text(power: pd.DataFrame) -> str:
    """Per rung: the metrics whose margin needs more paired seeds than the rung ran."""
    if power.empty:
        return say("no_power")
    said = []
    for rung, part in power.groupby("rung", sort=False):
        seeds = int(part["seeds"].max())
        short = part[part["seeds_needed"] > part["seeds"]]
        unknown = part[part["seeds_needed"].isna()]
        if len(short):
            need = [
                f"`{r.metric}` {int(r.seeds_needed)} (margin {r.margin:g})"
                for r in short.itertuples()
            ]
            said.append(say("under_powered", rung=rung, seeds=seeds, need=_and(need)))
        elif len(unknown) < len(part):
            said.append(say("powered", rung=rung, seeds=seeds))
        if len(unknown):
            metrics = _and(f"`{m}`" for m in unknown["metric"])
            said.append(say("no_power_line", metrics=metrics, rung=rung))
    return " ".join(said)


def mechanism_b(summ: pd.DataFrame) -> str:
    """Per rung: what share of the advantage-weighted mass the hard clips zero, and what the
    other rules zero and keep."""
    said = []
    for rung, s in _shares(summ).groupby("rung", sort=False):
        hard, soft = s[s["hard"] & (s["rule"] != STEP_SIZE_RULE)], s[~s["hard"]]
        step = s[s["hard"] & (s["rule"] == STEP_SIZE_RULE)]
        bits = []
        if len(hard):
            more = (hard["grad_mass_zero_hi"] > hard["grad_mass_zero_lo"]).all()
            side = f"Z_hi {_span(hard['grad_mass_zero_hi'], _pct)}" + (
                ", more than Z_lo" if more else ""
            )
            extra = f" ({STEP_SIZE_RULE} {_pct(step['zero'].iloc[0])})" if len(step) else ""
            rules, zero = ", ".join(hard["rule"]), _span(hard["zero"], _pct)
            bits.append(say("hard_clips_zero", rules=rules, zero=zero, step=extra, side=side))
        if len(none := soft[soft["zero"] < NEVER_BINDS]):
            kept = _span(none["grad_mass_rescued"], _pct)
            bits.append(say("zero_none", rules=", ".join(none["rule"]), kept=kept))
        bits += [
            say("zero_some", rule=r.rule, zero=_pct(r.zero), kept=_pct(r.grad_mass_rescued))
            for r in soft[soft["zero"] >= NEVER_BINDS].itertuples()
        ]
        said.append(f"on {rung}, " + "; ".join(bits))
    return "; ".join(said) or say("no_shares")


def mechanism_a(law: pd.DataFrame, summ: pd.DataFrame) -> str:
    """Where the entropy-covariance law predicts the measured entropy change, rule by rule."""
    if law.empty:
        return say("no_law")
    law = law.merge(_shares(summ)[["rung", "rule", "hard"]], on=["rung", "rule"], how="left")
    good = law[law.groupby("rule")["corr"].transform("min") >= LAW_HOLDS]  # on every rung
    hard_rest = law[(law["corr"] < LAW_HOLDS) & law["hard"].eq(True)]
    soft = law[law["hard"].eq(False) & law["corr"].notna()]  # NaN: too few steps to correlate
    soft = soft.assign(wrong=soft["predicted_mean"] * soft["observed_mean"] < 0)
    if len(good):
        rules, rungs = _and(good["rule"].unique()), _and(good["rung"].unique())
        corr, slope = _span(good["corr"]), _span(good["slope"])
        said = [say("law_holds", holds=LAW_HOLDS, rules=rules, rungs=rungs, corr=corr, slope=slope)]
    else:
        said = [say("law_holds_nowhere", holds=LAW_HOLDS)]
    if len(hard_rest):
        rows = "; ".join(
            f"{r.rule} on {r.rung} {r.corr:.2f} / {r.slope:.2f}" for r in hard_rest.itertuples()
        )
        said.append(say("law_hard_below", holds=LAW_HOLDS, rows=rows))
    if len(soft):
        per = "; ".join(
            say("law_soft_sign", corr=_span(g["corr"]), rung=k, n=len(g), wrong=g["wrong"].sum())
            for k, g in soft.groupby("rung", sort=False)
        )
        how = "poorly" if soft["corr"].max() < LAW_HOLDS else "less well"
        said.append(say("law_soft", how=how, rules=", ".join(soft["rule"].unique()), per=per))
    text = "; ".join(said) + "."
    # the reading below needs every hard clip under the law
    steps = len(soft) and len(good) and soft["corr"].median() < good["corr"].median()
    return text + (" " + say("law_small_steps") if steps and not len(hard_rest) else "")


def mechanism_c(noise: pd.DataFrame, led: pd.DataFrame, auc: pd.DataFrame) -> str:
    """The rescue noise's share and variance ratio, and what the ledgers say of the noisy rule
    against its deterministic counterpart (rungs where no seed had sampling variance: left out,
    their table row says n/a)."""
    if not noise.empty:
        noise = noise[noise["variance_ratio"].astype(float).map(math.isfinite)]
    if noise.empty:
        return say("no_noise")
    rule = noise["rule"].iloc[0]
    adds = _and(f"{100 * r.rescue_to_signal:.0f}% ({r.rung})" for r in noise.itertuples())
    ratio = _and(
        fmt_interval(r.variance_ratio, r.lo, r.hi, ".2f", alone=" (no interval)") + f" ({r.rung})"
        for r in noise.itertuples()
    )
    text = say("rescue_noise", rule=rule, adds=adds, ratio=ratio)
    rows = pd.concat([led, auc]).query("rule_a == @rule")
    twin = sorted(b for b in set(rows["rule_b"]) if same_on_exact_flow(rule, b))
    if not twin:
        return f"{text} {say('no_twin', rule=rule)}"
    rows = rows[rows["rule_b"] == twin[0]]
    found = "; ".join(
        f"{r.rung} `{r.metric}`{' (secondary)' if r.reading != 'primary' else ''}: {r.verdict}"
        for r in rows.itertuples()
    )
    read = say("twin_read", claim=rows["claim"].iloc[0], rule=rule, twin=twin[0], found=found)
    won = rows[rows["verdict"] == evidence.SUPPORTED]
    where = _and(f"{r.rung} `{r.metric}`" for r in won.itertuples())
    end = say("twin_wins", rule=rule, twin=twin[0], where=where) if len(won) else None
    return f"{text} {read} {end or say('twin_not_supported')}"


# -- the page -----------------------------------------------------------------------------------


def placeholders(template: str) -> set[str]:
    """The names of the template's ``$name`` / ``${name}`` placeholders."""
    if not Template(template).is_valid():
        bad = next(m for m in Template.pattern.finditer(template) if m.group("invalid") is not None)
        line = template[: bad.start()].count("\n") + 1
        raise ValueError(f"page.md line {line}: a '$' that is no placeholder (write $$)")
    return set(Template(template).get_identifiers())


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
    t = read_tables(out)
    config = json.loads((out / "config.json").read_text())
    summ, led, auc, law, cal = (
        t[n] for n in ("summary", "ledger", "ledger_auc", "entropy_law", "calibration")
    )
    claims = pd.DataFrame(CLAIMS).assign(source=[f"{c.source}, {c.where}" for c in CLAIMS])
    claims = claims.rename(columns={"name": "claim", "rule_a": "A", "rule_b": "B"})
    law_cols = ("observed_mean", "predicted_mean", "corr", "slope", "rms_error")
    power_cols = ["rung", "metric", "seeds", "rules", "residual_sd", "diff_sd", "margin"]
    power = {"residual_sd": _num, "diff_sd": _num, "seeds_needed": _count}
    sections = config["sections"]
    now = "now" if config.get("rng") == RNG else "before"
    return {
        "rel": lambda: os.path.relpath(out, path.parent),
        "provenance": lambda: provenance_text(out),
        "config": lambda: "\n".join(f"    {k}: {v}" for k, v in config.items()),
        "claims": lambda: _table(claims.rename(columns={"direction": "A is"}), CLAIM_COLUMNS),
        "calibration": lambda: calibration_table(cal, summ),
        "calib_seeds": lambda: str(config["calib_seeds"]),
        "calibration_mu": lambda: calibration_mu(cal, config, t["exact_mu"]),
        "calibration_band": lambda: calibration_band(cal, summ, config, t["exact_mu"]),
        "ledger": lambda: ledger_table(led),
        "ledger_auc": lambda: ledger_table(auc),
        "bounds": lambda: _table(t["bounds"], empty=say("not_computed"), floor=_num),
        "entropy_law": lambda: _table(
            law, empty=say("not_logged"), **dict.fromkeys(law_cols, _num)
        ),
        "grad_noise": lambda: grad_noise_table(t["grad_noise"]),
        "summary": lambda: summary_text(led, summ),
        "summary_auc": lambda: summary_text(auc),
        "run_dates": lambda: run_dates(out),
        "headroom": lambda: headroom_text(led, summ, t["bounds"]),
        "where_read": lambda: where_read(led, auc),
        "power_reading": lambda: power_text(t["power"]),
        "mechanism_a": lambda: mechanism_a(law, summ),
        "mechanism_b": lambda: mechanism_b(summ),
        "one_axis": lambda: axis_text(t["axis"]),
        "mechanism_c": lambda: mechanism_c(t["grad_noise"], led, auc),
        "rules": lambda: rules_table(summ),
        "power": lambda: _table(t["power"], [*power_cols, "seeds_needed"], **power),
        "band": lambda: _band(config)[2],
        "minibatches": lambda: str(config["minibatches"]),
        "seeds": lambda: toy_seeds(sections),
        "rungs_design": lambda: rungs_design(config, sections),
        "regimes": lambda: regimes_section(out),
        "margins": lambda: ", ".join(f"`{k}` {v:g}" for k, v in MARGINS.items()),
        "reference": lambda: REFERENCE,
        "gpu": lambda: GPU_COMMAND,
        "transfer": lambda: transfer_section(out),
        "llm_floor": lambda: llm_rung(floor=True),
        "llm_task": llm_rung,
        "llm_ran": lambda: llm_ran(summ, t["bounds"], config),
        "llm_pilot": lambda: llm_pilot(out),
        "pairing_note": lambda: say(f"pairing_{now}", rng=RNG),
        "held_out_note": lambda: say(f"held_out_{now}", rng=RNG),
    }


def write_doc(out: Path, path: Path) -> None:
    """Write the page ``path`` from the tables in ``out`` (rewritten only when it changes)."""
    out, path = Path(out), Path(path)
    if not (out / "config.json").exists():
        raise ValueError(f"--out: {out} has no config.json (not a claims-study folder)")
    if not (out / "ledger.csv").read_text().strip():
        raise ValueError("the study's rules make no claim (empty ledger.csv): no page")
    page = TEMPLATE.read_text().partition(SENTENCES)[0]
    write_text(render(page, page_values(out, path)), path)
