"""docs/claims.md from a claims-study folder (``python -m llm.claims --tables-only --out
results/claims --doc docs/claims.md``).

The prose is ``page.md`` beside this module, a :class:`string.Template` (``$name`` /
``${name}``). Method prose (how the study works) is fixed text there; every number and every
sentence that states a result (which rule wins, what is supported, headroom, baselines, power,
rank agreement, the mechanism checks) is a placeholder filled here from the folder's tables
(``ledger.csv``, ``ledger_auc.csv``, ``summary.csv``, ``power.csv``, ``agreement.csv``,
``bounds.csv``, ``calibration.csv``, ``entropy_law.csv``, ``grad_noise.csv``, ``transfer.csv``,
``config.json``, ``provenance.json``, ``results.parquet``). A placeholder without a value, or a
value a table lacks, is a ``ValueError`` naming the placeholder, never a blank. Every path is
resolved from the study folder, never the working directory.
"""

from __future__ import annotations

import json
import math
import os
import re
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
from .rungs import RUNGS
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


# -- formatting -------------------------------------------------------------------------------


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


def _p(x: float) -> str:
    return "—" if not math.isfinite(x) else "<0.0001" if x < 1e-4 else f"{x:.4f}"


def _span(values: Iterable[float], fmt: Callable[[float], str] = lambda x: f"{x:.2f}") -> str:
    """``0.91–0.95`` (one value where they agree at the printed precision)."""
    xs = sorted(values)
    lo, hi = fmt(xs[0]), fmt(xs[-1])
    return lo if lo == hi else f"{lo}–{hi}"


def _and(words: Iterable[str]) -> str:
    words = list(words)
    return ", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 else "".join(words)


def _need(value: str, what: str) -> str:
    """``value``; a ``ValueError`` where the tables gave nothing to say about ``what``."""
    if not value or "nan" in value.split():
        raise ValueError(f"no value for {what}")
    return value


# -- the tables as printed --------------------------------------------------------------------


def ledger_section(ledger: pd.DataFrame) -> str:
    finite = [math.isfinite(x) for x in ledger["seeds_needed"]]
    rows = pd.DataFrame(
        {
            "claim": ledger["claim"],
            "rung": ledger["rung"],
            "metric": ledger["metric"],
            "A − B [95% CI]": list(
                map(fmt_interval, ledger["estimate"], ledger["lo"], ledger["hi"])
            ),
            "verdict": [
                f"{v} †" if small and v in (evidence.SUPPORTED, evidence.REVERSED) else v
                for v, small in zip(ledger["verdict"], ledger["below_margin"], strict=True)
            ],
            "p": ledger["p"].map(_p),
            "p (Holm)": ledger["p_holm"].map(_p),
            "seeds": ledger["seeds"],
            "clip share A / B": [
                f"{_pct(a)} / {_pct(b)}"
                for a, b in zip(ledger["clip_frac_a"], ledger["clip_frac_b"], strict=True)
            ],
            "SD of diffs": ledger["diff_sd"].map(_num),
            "seeds for the margin": [
                str(int(x)) if f else "n/a"
                for x, f in zip(ledger["seeds_needed"], finite, strict=True)
            ],
            "why": ledger["reason"],
        }
    )
    return _table(rows)


def calibration_rows(cal: pd.DataFrame, summ: pd.DataFrame) -> pd.DataFrame:
    """The calibration curve as printed, the chosen (step size, epochs) of each rung marked."""
    chosen = _chosen(summ)
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
    three = {
        c: summ[c].map(lambda x: _num(x, 3)) for c in ("final_pass", "reward_auc", "final_entropy")
    }
    shares = {
        "grad_mass_zero_lo": "zero_lo",
        "grad_mass_zero_hi": "zero_hi",
        "grad_mass_rescued": "rescued",
    }
    return summ.assign(
        **three,
        clip_frac=summ["clip_frac"].map(_pct),
        **{name: summ[c].map(_pct) for c, name in shares.items()},
        binds=[
            "**never**" if n else "no bounds" if not math.isfinite(c) else ""
            for n, c in zip(summ["never_binds"], summ["clip_frac"], strict=True)
        ],
    )[["rung", "rule", "seeds", "lr", "epochs", *three, "clip_frac", *shares.values(), "binds"]]


def grad_noise_section(noise: pd.DataFrame) -> str:
    """Mechanism check (c) as printed: per rung and rule, the noise shares and the variance
    ratio with its interval over seeds; "(not logged)" without rows."""
    if noise.empty:
        return "(not logged)"
    ratio = [
        f"{e:.4f} [{lo:.4f}, {hi:.4f}]" if math.isfinite(lo) and math.isfinite(hi) else _num(e)
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
            else "undefined (a rung resolves no pair)"
            + (f"; bootstrap [{lo:+.2f}, {hi:+.2f}]" if math.isfinite(lo) else "")
            for t, lo, hi in zip(agree["tau_b"], agree["lo"], agree["hi"], strict=True)
        ],
    )[["metric", "rung_a", "rung_b", "without", "rules", "tau"]]


def transfer_section(out: Path) -> str:
    """The folder's ``transfer.csv`` (per claim, the paired effect on each rung side by side),
    or a line saying the folder has none."""
    path = out / "transfer.csv"
    if not path.exists():
        return "The transfer table (`transfer.csv`) is not in this folder."
    t = pd.read_csv(path)
    missing = [c for c in TRANSFER_COLUMNS if c not in t.columns]
    if missing:
        raise ValueError(f"{path} lacks the columns {missing}")
    shown = t.assign(effect=list(map(fmt_interval, t["estimate"], t["lo"], t["hi"])))
    table = shown.pivot_table(
        index=["claim", "metric"], columns="rung", values="effect", aggfunc="first", sort=False
    )
    verdicts = shown.pivot_table(
        index=["claim", "metric"], columns="rung", values="verdict", aggfunc="first", sort=False
    )
    cells = table.fillna("—") + verdicts.reindex_like(table).map(
        lambda v: f" ({v})" if isinstance(v, str) else ""
    )
    agree = out / "transfer_agreement.csv"
    if not agree.exists():
        return _table(cells.reset_index())
    a = pd.read_csv(agree)
    a = a[a["counted"] == "verdicts"].assign(
        interval=lambda d: [
            "—" if pd.isna(lo) else f"[{lo:.2f}, {hi:.2f}]"
            for lo, hi in zip(d["lo"], d["hi"], strict=True)
        ]
    )
    shown_a = a[["metric", "rung_a", "rung_b", "claims", "resolved", "result", "interval"]]
    return (
        _table(cells.reset_index()) + "\n\nAgreement of signs between rungs:\n\n" + _table(shown_a)
    )


# -- provenance ---------------------------------------------------------------------------------


def _machine(entry: dict) -> str:
    """One provenance entry's machine and software, in words."""

    def get(key: str) -> str:
        value = entry.get(key)
        return NOT_RECORDED if value is None or value == "" else str(value)

    device = get("device") + (f" ({entry['gpu']})" if entry.get("gpu") else "")
    commit = get("git_commit") + (
        " with uncommitted changes" if entry.get("git_dirty") is True else ""
    )
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


def run_dates(out: Path) -> str:
    """The dates of the runs that computed the folder's parts (``provenance.json``)."""
    dates = sorted(
        {str(r.get("date", NOT_RECORDED))[:10] for r in read_provenance(out).get("runs", [])}
    )
    return _and(dates) or NOT_RECORDED


def scheme_notes(rng: str | None) -> dict[str, str]:
    """What the page says of the run's random-number scheme (its ``config.json``'s ``rng``)
    against this code's (:data:`sandbox.streams.RNG`)."""
    if rng == RNG:
        return {
            "pairing_note": f" The run used these streams (`rng` {RNG} in `config.json`).",
            "held_out_note": f" (as this run did: `rng` {RNG})",
        }
    return {
        "pairing_note": " The committed run predates these streams (one generator per run, so a "
        "rule that draws extra numbers, NSR or Clip-Cov, fell out of step with the others after "
        "the first update).",
        "held_out_note": " (the committed run predates per-replicate held-out sets: there every "
        "replicate and every rule scored one set of 512)",
    }


# -- reading the tables -----------------------------------------------------------------------


def read_tables(out: Path) -> dict[str, pd.DataFrame]:
    """The study's tables in ``out``, rungs in ladder order and claims in ledger order; an
    optional table a folder predates (``bounds``, ``grad_noise``) is empty."""
    names = ("calibration", "summary", "ledger", "ledger_auc", "power", "agreement", "entropy_law")
    read = {n: pd.read_csv(out / f"{n}.csv") for n in names}
    for name in ("bounds", "grad_noise"):
        path = out / f"{name}.csv"
        read[name] = pd.read_csv(path) if path.exists() else pd.DataFrame()
    order = {rung: i for i, rung in enumerate(RUNGS)}
    claim_order = {c.name: i for i, c in enumerate(CLAIMS)}
    rank = {"rung": order, "claim": claim_order}
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


def summary_text(ledger: pd.DataFrame, summary: pd.DataFrame | None, title: str) -> str:
    """What a ledger says, rung by rung and class by class (:data:`CLASSES`: a reversal and a
    margin-only result are never listed under one word); a supported or reversed row says
    whether it survives Holm's adjustment. With ``summary``: the rules that never bind and
    those whose realised effect cannot be told from ``unclipped``."""

    def named(row: pd.Series) -> str:
        holm = {"survives": " (survives Holm)", "does not survive": " (not after Holm)"}
        return row["claim"] + holm.get(row.get("holm"), "")

    lines = [title]
    for rung, part in ledger.groupby("rung", sort=False):
        said = []
        for verdict in CLASSES:
            names = [named(row) for _, row in part[part["verdict"] == verdict].iterrows()]
            if names:
                said.append(f"{verdict}: {', '.join(names)}")
        lines.append(f"- **{rung}** — " + "; ".join(said) + ".")
    across = ledger.pivot_table(index="claim", columns="rung", values="verdict", aggfunc="first")
    same = [
        f"{c} ({row.dropna().iloc[0]})"
        for c, row in across.iterrows()
        if row.dropna().nunique() == 1 and len(row.dropna()) > 1
    ]
    differ = [c for c, row in across.iterrows() if row.dropna().nunique() > 1]
    lines += [
        "",
        f"The same reading on every rung that ran it: {', '.join(same) or 'none'}. "
        f"Readings that change between rungs: {', '.join(differ) or 'none'}.",
    ]
    if summary is None:
        return "\n".join(lines)
    idle = summary[summary["never_binds"]]
    if len(idle):
        pairs = ", ".join(f"{r} on {g}" for g, r in zip(idle["rung"], idle["rule"], strict=True))
        lines += [
            "",
            f"Rules whose bounds never bind (clip share below {NEVER_BINDS:.1%}): {pairs}. "
            "`unclipped` has no bounds by design; any other rule listed is the unclipped rule "
            "in disguise at this step size, and its claims test nothing about clipping there.",
        ]
    inert = summary[summary.get("like_unclipped", pd.Series(False, summary.index)).astype(bool)]
    if len(inert):
        pairs = ", ".join(f"{r} on {g}" for g, r in zip(inert["rung"], inert["rule"], strict=True))
        lines += [
            "",
            f"Rules whose realised effect cannot be told from `unclipped` (paired `reward_auc` "
            f"interval within ±{MARGINS['reward_auc']:g}): {pairs}. Their claims there measure "
            "the absence of a clip, not their own mechanism.",
        ]
    return "\n".join(lines)


# -- result sentences, generated from the tables ----------------------------------------------


def baseline_text(summ: pd.DataFrame, bounds: pd.DataFrame) -> str:
    """Per rung with an answer baseline above 0: whether any rule's mean ``final_pass`` beats it."""
    if bounds.empty:
        return "(No `bounds.csv` in this folder: the answer baselines were not computed.)"
    said = []
    for b in bounds[bounds["floor"] > 0].itertuples():
        part = summ[summ["rung"] == b.rung]
        if part.empty:
            continue
        best = part.loc[part["final_pass"].idxmax()]
        above = part[part["final_pass"] > b.floor]
        base = f"its answer baseline {b.floor:.3f} ({b.source})"
        if above.empty:
            said.append(
                f"No rule's mean `final_pass` on {b.rung} beats {base}; the best is "
                f"{best['rule']}'s {best['final_pass']:.3f}."
            )
        else:
            names = ", ".join(
                f"{r} {x:.3f}" for r, x in zip(above["rule"], above["final_pass"], strict=True)
            )
            said.append(
                f"On {b.rung}, {len(above)} of {len(part)} rules' mean `final_pass` beat {base}: {names}."
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
    if closed and len(closed) == bounded["rung"].nunique():
        head = "**Headroom, not the rules, decides the pass-rate rows.**"
    else:
        head = f"**Headroom decides {n} of {len(bounded)} pass-rate rows.**"
    tail = (
        f"\n  {_and(closed)}, as run, cannot answer the pass-rate claims (at this horizon the "
        "comparators end within two margins of the ceiling); the secondary `reward_auc` reading "
        "there still compares how fast the rules get there."
        if closed
        else ""
    )
    return " ".join([head, *said, baseline_text(summ, bounds)]) + tail


def _band(config: dict) -> tuple[float, float, str]:
    low, high = config["target_low"], config["target_high"]
    return low, high, f"{100 * low:g}–{100 * high:g}%"


def _exact_mu(out: Path) -> pd.DataFrame:
    """The exact flow's calibration over mu, from the folder beside ``out`` (empty if absent)."""
    path = out.parent / EXACT_MU / "calibration.csv"
    return pd.read_csv(path) if path.exists() else pd.DataFrame(columns=["rung"])


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
            where = "in the band" if low <= best["clip_share"] <= high else "below the band"
            where = "above the band" if best["clip_share"] > high else where
            said.append(f"{mu} × {mb}: {_pct(best['clip_share'])} at lr {best['lr']:g} ({where})")
            shares = g.sort_values("lr")["clip_share"].diff().dropna()
            if (shares > 0).any() and (shares < 0).any():
                bumpy.append(f"{rung} at {mu} × {mb}")
        more = exact_mu[exact_mu["rung"] == rung]
        if len(more):
            peaks = more.groupby("epochs")["clip_share"].max()
            said.append(
                f"over μ = {', '.join(str(m) for m in peaks.index)} (`results/{EXACT_MU}/`, "
                f"`{EXACT_MU_COMMAND}`): at most {', '.join(map(_pct, peaks))}"
            )
            part = pd.concat([part, more])
        if RUNGS.get(rung) and RUNGS[rung].traits.deterministic and part["clip_share"].max() < low:
            said.append(
                "the expected-gradient flow moves smoothly to the optimum, so few expected tokens "
                "ever leave the trust region"
            )
        rungs.append(f"{rung} — " + "; ".join(said))
    text = (
        f"Per rung and μ, the best clip share over the step sizes (band {band}): "
        + "; ".join(rungs)
        + "."
    )
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
        else:
            tried = pd.concat([cal[cal["rung"] == rung], exact_mu[exact_mu["rung"] == rung]])
            outside.append(
                f"{rung} ({point}; at most {_pct(tried['clip_share'].max())} at any step size and μ tried)"
            )
    said = [f"{_and(inside)} run inside the {band} band"] if inside else []
    said += [f"{_and(outside)} cannot reach it"] if outside else []
    return "; ".join(said) + "."


def where_read(led: pd.DataFrame, auc: pd.DataFrame) -> str:
    """Where the ledgers give a verdict (not no headroom, not identical by construction)."""

    def where(ledger: pd.DataFrame) -> str:
        has = ledger[ledger["verdict"].isin(evidence.VERDICTS)]
        said = [
            f"`{m}` on {_and(g['rung'].unique())}" for m, g in has.groupby("metric", sort=False)
        ]
        return _and(said) or "nowhere"

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
            need = [
                f"`{r.metric}` {int(r.seeds_needed)} (margin {r.margin:g})"
                for r in short.itertuples()
            ]
            said.append(
                f"**{rung} is under-powered at {seeds} seeds**: paired seeds needed for {_and(need)}."
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
            return "undefined (a rung resolves no pair)"
        said = "agree" if lo > 0 else "disagree" if hi < 0 else "not resolved"
        return f"{said}, {t:+.2f} [{lo:+.2f}, {hi:+.2f}]"

    said = []
    agree = agree.assign(without=agree["without"].fillna(""))
    for metric, part in agree.groupby("metric", sort=False):
        pairs = []
        for (a, b), g in part.groupby(["rung_a", "rung_b"], sort=False):
            bits = [
                f"{f'without {w}' if w else 'all rules'}: {word(t, lo, hi)}"
                for w, t, lo, hi in zip(g["without"], g["tau_b"], g["lo"], g["hi"], strict=True)
            ]
            pairs.append(f"{a} ~ {b} ({'; '.join(bits)})")
        said.append(f"By `{metric}`: " + "; ".join(pairs) + ".")
    return " ".join(said) or "(fewer than two rungs with 3 rules in common)"


def _shares(summ: pd.DataFrame) -> pd.DataFrame:
    """The rows with gradient-mass shares, each marked a hard clip (zeroes more of the mass than
    it keeps where a hard clip binds) or not."""
    s = summ.dropna(subset=["grad_mass_zero_hi"])
    zero = s["grad_mass_zero_lo"] + s["grad_mass_zero_hi"]
    return s.assign(zero=zero, hard=zero > s["grad_mass_rescued"])


def mechanism_b(summ: pd.DataFrame) -> str:
    """Per rung: what share of the advantage-weighted mass the hard clips zero, and what the
    other rules zero and keep."""
    said = []
    for rung, s in _shares(summ).groupby("rung", sort=False):
        hard, soft = s[s["hard"] & (s["rule"] != STEP_SIZE_RULE)], s[~s["hard"]]
        bits = []
        if len(hard):
            hi = (hard["grad_mass_zero_hi"] > hard["grad_mass_zero_lo"]).all()
            side = f"Z_hi {_span(hard['grad_mass_zero_hi'], _pct)}" + (
                ", more than Z_lo" if hi else ""
            )
            step = s[s["hard"] & (s["rule"] == STEP_SIZE_RULE)]
            extra = f" ({STEP_SIZE_RULE} {_pct(step['zero'].iloc[0])})" if len(step) else ""
            bits.append(
                f"the hard clips ({', '.join(hard['rule'])}) zero {_span(hard['zero'], _pct)} of the "
                f"advantage-weighted gradient mass{extra} ({side})"
            )
        none = soft[soft["zero"] < NEVER_BINDS]
        if len(none):
            bits.append(
                f"{', '.join(none['rule'])} zero none of it and keep {_span(none['grad_mass_rescued'], _pct)} "
                "of the mass a hard clip would drop"
            )
        part = soft[soft["zero"] >= NEVER_BINDS]
        for r in part.itertuples():
            bits.append(
                f"{r.rule} zeroes {_pct(r.zero)} and keeps {_pct(r.grad_mass_rescued)} (it rescues some tokens and drops others)"
            )
        said.append(f"on {rung}, " + "; ".join(bits))
    return "; ".join(said) or "(no gradient-mass shares in this folder)"


def mechanism_a(law: pd.DataFrame, summ: pd.DataFrame) -> str:
    """Where the entropy-covariance law predicts the measured entropy change, rule by rule."""
    if law.empty:
        return "(the entropy law was not logged in this folder)"
    kind = _shares(summ)[["rung", "rule", "hard"]]
    law = law.merge(kind, on=["rung", "rule"], how="left")
    holds = law.groupby("rule")["corr"].min() >= LAW_HOLDS
    good = law[law["rule"].isin(holds[holds].index)]
    hard_rest = law[(law["corr"] < LAW_HOLDS) & (law["hard"] == True)]  # noqa: E712
    soft = law[law["hard"] == False]  # noqa: E712
    said = []
    if len(good):
        said.append(
            f"the entropy–covariance law predicts the measured per-step entropy change well "
            f"(correlation ≥ {LAW_HOLDS:g} on every rung) for {_and(good['rule'].unique())} on "
            f"{_and(good['rung'].unique())} (correlation {_span(good['corr'])}, slope {_span(good['slope'])})"
        )
    else:
        said.append(
            f"the entropy–covariance law predicts no rule's steps with correlation ≥ {LAW_HOLDS:g} "
            "on every rung"
        )
    if len(hard_rest):
        less = [
            f"{r.rule} on {r.rung} {r.corr:.2f} / {r.slope:.2f}" for r in hard_rest.itertuples()
        ]
        said.append(f"hard clips below {LAW_HOLDS:g} (correlation / slope): {'; '.join(less)}")
    if len(soft):
        worse = soft["corr"].max() < LAW_HOLDS
        per = []
        for rung, g in soft.groupby("rung", sort=False):
            wrong = int((g["predicted_mean"] * g["observed_mean"] < 0).sum())
            per.append(
                f"{_span(g['corr'])} on {rung}, {wrong} of {len(g)} mean predictions of the wrong sign"
            )
        said.append(
            f"{'poorly' if worse else 'less well'} for the rules that keep more of the mass than they "
            f"zero — {', '.join(soft['rule'].unique())} (correlation {'; '.join(per)})"
        )
    text = "; ".join(said) + "."
    hard_hold = not len(hard_rest)  # the reading below needs every hard clip under the law
    if hard_hold and len(soft) and len(good) and soft["corr"].median() < good["corr"].median():
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
        f"{r.variance_ratio:.2f}"
        + (f" [{r.lo:.2f}, {r.hi:.2f}]" if math.isfinite(r.lo) else " (no interval)")
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


def regimes_section(out: Path) -> str:
    """How the regimes were chosen: the regime pilot beside the folder (``../regimes``), its rule
    and per candidate whether it passes and the seeds its claims need; else a line saying so."""
    folder = out.parent / "regimes"
    if not (folder / "choice.csv").exists():
        return (
            "No regime pilot beside this folder (`../regimes`: `python -m sandbox.study.regimes`)."
        )
    choice, per = pd.read_csv(folder / "choice.csv"), pd.read_csv(folder / "candidates.csv")
    pilot = pd.read_csv(folder / "pilot.csv")
    first = pilot.groupby(["rung", "candidate"], sort=False).first().reset_index()
    per = per.merge(
        first[["rung", "candidate", "reference_pass", "floor"]], on=["rung", "candidate"]
    )
    per = per.assign(
        reference_pass=per["reference_pass"].map(_num),
        floor=per["floor"].map(_num),
        power=per["power"].map(lambda x: f"{x:.2f}"),
    )[["rung", "candidate", "ok", "reference_pass", "floor", "needed", "seeds", "power"]]
    picked = "; ".join(
        f"`{r.rung}`: {r.candidate} at {int(r.seeds)} seeds ({r.why})"
        if isinstance(r.candidate, str)
        else f"`{r.rung}`: {r.why}"
        for r in choice.itertuples()
    )
    return f"Chosen: {picked}.\n\n" + _table(per)


def llm_task() -> str:
    """The llm rung's model and task at its default settings (the registered rung's)."""
    rung = RUNGS.get("llm")
    if rung is None:
        raise ValueError("the llm rung is not registered (python -m llm.claims registers it)")
    s = section_settings(rung.section)
    knobs = ", ".join(f"{k}={knob_text(v)}" for k, v in sorted(s.task_knobs.items()))
    return f"`{s.model}` on `{s.task}` ({knobs})"


def llm_pilot(out: Path) -> str:
    """The llm task pilot's table (``../llm_pilot/pilot.csv`` beside the folder), or a line."""
    path = out.parent / "llm_pilot" / "pilot.csv"
    if not path.exists():
        return "  (no llm task pilot beside this folder: `../llm_pilot/pilot.csv`)"
    p = pd.read_csv(path)
    cols = ["task", "knobs", "pass_at_1", "group_signal", "constant", "prior", "target"]
    if not set(cols) <= set(p.columns):
        return "  (the llm task pilot beside this folder predates its baseline columns)"
    shown = p[cols].assign(**{c: p[c].map(lambda x: f"{x:.3f}") for c in cols[2:]})
    return "\n".join("  " + line for line in _table(shown).splitlines())


def llm_floor() -> str:
    """The llm rung's answer baseline at its default settings, from the rung registry
    (``llm.claims`` registers the rung; ``sandbox`` never imports ``llm``)."""
    rung = RUNGS.get("llm")
    if rung is None or rung.bounds is None:
        raise ValueError("the llm rung is not registered (python -m llm.claims registers it)")
    return _num(rung.bounds(StudyConfig()).floor, 3)


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
    cal, bounds, exact_mu = read["calibration"], read["bounds"], _exact_mu(out)
    claims = pd.DataFrame(
        [
            (c.name, c.rule_a, c.rule_b, c.metric, c.direction, f"{c.source}, {c.where}")
            for c in CLAIMS
        ],
        columns=["claim", "A", "B", "metric", "A is", "source"],
    )
    law_cols = ("observed_mean", "predicted_mean", "corr", "slope", "rms_error")
    notes = scheme_notes(config.get("rng"))
    return {
        "rel": lambda: os.path.relpath(out, path.parent),
        "provenance": lambda: provenance_text(out),
        "config": lambda: "\n".join(f"    {k}: {v}" for k, v in config.items()),
        "claims": lambda: _table(claims),
        "calibration": lambda: _table(calibration_rows(cal, summ)),
        "calib_seeds": lambda: str(config["calib_seeds"]),
        "calibration_mu": lambda: calibration_mu(cal, config, exact_mu),
        "calibration_band": lambda: calibration_band(cal, summ, config, exact_mu),
        "ledger": lambda: ledger_section(led),
        "ledger_auc": lambda: ledger_section(auc),
        "bounds": lambda: (
            _table(bounds.assign(floor=bounds["floor"].map(_num)))
            if len(bounds)
            else "(not computed)"
        ),
        "entropy_law": lambda: (
            _table(law.assign(**{c: law[c].map(_num) for c in law_cols}))
            if len(law)
            else "(not logged)"
        ),
        "grad_noise": lambda: grad_noise_section(read["grad_noise"]),
        "summary": lambda: (
            summary_text(led, summ, "On each claim's own (primary, pre-registered) metric:")
            + "\n\n"
            + summary_text(auc, None, "Secondary reading, `reward_auc` (the pass-rate claims):")
        ),
        "run_dates": lambda: run_dates(out),
        "headroom": lambda: headroom_text(led, summ, bounds),
        "where_read": lambda: where_read(led, auc),
        "power_reading": lambda: power_text(read["power"]),
        "agreement_reading": lambda: agreement_text(read["agreement"]),
        "mechanism_a": lambda: mechanism_a(law, summ),
        "mechanism_b": lambda: mechanism_b(summ),
        "mechanism_c": lambda: mechanism_c(read["grad_noise"], led, auc),
        "rules": lambda: _table(rule_rows(summ)),
        "power": lambda: _table(power_rows(read["power"])),
        "agreement": lambda: (
            _table(agreement_rows(read["agreement"]))
            if len(read["agreement"])
            else "(fewer than two rungs with 3 rules in common)"
        ),
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
        "pairing_note": lambda: notes["pairing_note"],
        "held_out_note": lambda: notes["held_out_note"],
    }


def write_doc(out: Path, path: Path) -> None:
    """Write the page ``path`` from the tables in ``out`` (rewritten only when it changes)."""
    out, path = Path(out), Path(path)
    if not (out / "config.json").exists():
        raise ValueError(f"--out: {out} has no config.json (not a claims-study folder)")
    if not (out / "ledger.csv").read_text().strip():
        raise ValueError("the study's rules make no claim (empty ledger.csv): no page")
    write_text(render(TEMPLATE.read_text(), page_values(out, path)), path)
