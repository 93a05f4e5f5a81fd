"""Regimes with headroom, chosen by a rule written down before the study runs (issue 27).

A regime is a rung's setting and horizon (bandit: the suite setting and the step count; tiny_tf:
the task, its knobs and the step count). Each candidate runs as a pilot: the claims study on that
rung alone (calibration included) at :data:`PILOT_SEEDS` paired seeds. The rule, fixed here before
any full study runs:

1. **Headroom** (every primary claim on the rung whose metric has a ceiling): the comparator's
   mean is at least ``ROOM`` = 2 margins below the ceiling (the optimum, or 1).
2. **Beats the answer baselines** (tiny_tf): the reference rule's held-out pass@1 is at least
   ``WIDE`` = 5 margins (0.10) above the larger of the constant-answer and answer-prior baselines
   (:func:`envs.reasoning.answer_baselines`), and above them on most seeds: it learned the task,
   not the answer distribution.
3. **Power**: among the candidates passing 1 and 2, the one whose primary claims need the fewest
   paired seeds for 80% power at the margin, from the pilot's SD of the paired differences, at the
   Bonferroni level 0.05 / (primary claims on the rung) (Holm is at least as powerful), the largest
   over the claims (ties: the longer horizon). That count is the study's seed count for the rung,
   capped at ``CAP_SECONDS`` of study time on the machine the pilot ran on (a projection, linear
   in the seeds, from the pilot's wall time with calibration included, which overstates the cost
   of a vectorised rung; the cap is printed whenever it binds).

``python -m sandbox.study.regimes --out results/regimes`` runs the pilots and writes
``pilot.csv`` (one row per candidate and claim), ``choice.csv`` (per rung: the choice, seeds and
why) and ``provenance.json``; a candidate's pilot folder under ``pilots/`` resumes like any study.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sandbox.experiments.evidence import seeds_needed
from sandbox.experiments.results import record_run, write_csv
from sandbox.experiments.study import MARGINS, REFERENCE, StudyConfig, run_study

#: Margins below the ceiling the comparator must stay (the headroom rule).
ROOM = 2
#: Margins above the answer baselines the reference rule must reach (tiny_tf).
WIDE = 5
POWER = 0.8
ALPHA = 0.05
#: Study time per rung the seed count may cost (2-core CPU), in seconds.
CAP_SECONDS = 3600
PILOT_SEEDS = {"bandit_sampled": 16, "tiny_tf": 8}

#: The candidates of each rung: StudyConfig fields.
CANDIDATES: dict[str, list[dict[str, Any]]] = {
    "bandit_sampled": [
        {"bandit_setting": s, "bandit_steps": n}
        for s in ("mixed", "easy", "gaussian", "needle")
        for n in (15, 30, 60)
    ],
    "tiny_tf": [  # mod_arith steps=2 (the earlier study's) fails rule 2: results/claims/bounds.csv
        {"tf_task": "bits", "tf_knobs": {"op": "reverse", "length": 2}, "tf_steps": 40},
        {"tf_task": "bits", "tf_knobs": {"op": "sort", "length": 3}, "tf_steps": 40},
        {"tf_task": "bits", "tf_knobs": {"op": "reverse", "length": 3}, "tf_steps": 80},
    ],
}


def label(candidate: dict[str, Any]) -> str:
    """A candidate's folder name: its settings as key=value, knobs flattened."""
    parts = []
    for key, value in candidate.items():
        if isinstance(value, dict):
            parts += [f"{k}={v}" for k, v in sorted(value.items())]
        else:
            parts.append(f"{key.split('_', 1)[-1]}={value}")
    return ",".join(parts)


def pilot(rung: str, candidate: dict[str, Any], out: Path, **settings: Any) -> dict[str, Any]:
    """Run (or resume) the pilot study of one candidate; its tables and its wall time
    (calibration included, one worker: an upper bound on the study phase's; recorded in the
    folder's ``pilot_seconds.json`` by the call that computed it, so a resumed pilot keeps it)."""
    config = StudyConfig(rungs=[rung], seeds=PILOT_SEEDS[rung], **candidate, **settings)
    timing = out / "pilot_seconds.json"
    start = time.perf_counter()
    run_study(config, out, progress=False, workers=1)
    if not timing.exists():
        timing.write_text(json.dumps({"seconds": round(time.perf_counter() - start, 1)}) + "\n")
    seconds = json.loads(timing.read_text())["seconds"]
    return {
        "ledger": pd.read_csv(out / "ledger.csv"),
        "bounds": pd.read_csv(out / "bounds.csv").set_index("rung"),
        "summary": pd.read_csv(out / "summary.csv"),
        "seconds": seconds,
    }


def assess(rung: str, found: dict[str, Any]) -> pd.DataFrame:
    """One row per primary claim on ``rung``: headroom, the baselines, the seeds it needs."""
    ledger = found["ledger"]
    ledger = ledger[ledger["rung"] == rung]
    bounds = found["bounds"].loc[rung]
    summary = found["summary"].set_index(["rung", "rule"])
    reference = summary.loc[(rung, REFERENCE)]
    family = len(ledger)
    rows = []
    for _, row in ledger.iterrows():
        margin = MARGINS[row["metric"]]
        sd = float(row["diff_sd"])
        has_ceiling = row["metric"] == "final_pass"
        room = (
            float(bounds["ceiling"]) - float(row["comparator_mean"]) >= ROOM * margin - 1e-12
            if has_ceiling
            else True
        )
        need = (
            seeds_needed(sd, margin, power=POWER, alpha=ALPHA / family)
            if np.isfinite(sd) and sd > 0
            else 2
        )
        rows.append(
            {
                "claim": row["claim"],
                "metric": row["metric"],
                "estimate": row.get("estimate", np.nan),
                "lo": row.get("lo", np.nan),
                "hi": row.get("hi", np.nan),
                "pilot_verdict": row.get("verdict", ""),
                "comparator_mean": row["comparator_mean"],
                "ceiling": bounds["ceiling"],
                "floor": bounds["floor"],
                "reference_pass": reference["final_pass"],
                "headroom": room,
                "diff_sd": sd,
                "seeds_needed": need,
            }
        )
    table = pd.DataFrame(rows)
    table["beats_baselines"] = bool(
        reference["final_pass"] >= float(bounds["floor"]) + WIDE * MARGINS["final_pass"] - 1e-12
    )
    return table


def choose(pilots: pd.DataFrame) -> pd.DataFrame:
    """Per rung, the candidate the rule picks (module docstring) and why."""
    out = []
    for rung, rows in pilots.groupby("rung", sort=False):
        per = rows.groupby("candidate", sort=False).agg(
            headroom=("headroom", "all"),
            beats=("beats_baselines", "all"),
            seeds=("seeds_needed", "max"),
            steps=("steps", "first"),
            seconds=("study_seconds_per_seed", "first"),
        )
        ok = per[per["headroom"] & per["beats"]]
        if not len(ok):
            out.append({"rung": rung, "candidate": None, "why": "no candidate passes the rule"})
            continue
        best = ok.sort_values(["seeds", "steps"], ascending=[True, False], kind="stable").iloc[0]
        cap = int(CAP_SECONDS // best["seconds"]) if best["seconds"] > 0 else math.inf
        seeds = int(min(best["seeds"], cap))
        why = (
            f"{len(ok)} of {len(per)} candidates keep headroom"
            + (" and beat the answer baselines" if rung == "tiny_tf" else "")
            + f"; this one needs the fewest seeds ({int(best['seeds'])}) for {POWER:.0%} power"
            + (f"; capped at {seeds} by {CAP_SECONDS} s" if seeds < best["seeds"] else "")
        )
        out.append({"rung": rung, "candidate": best.name, "seeds": seeds, "why": why})
    return pd.DataFrame(out)


def run(rungs: list[str], out: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    tables = []
    for rung in rungs:
        for candidate in CANDIDATES[rung]:
            name = label(candidate)
            found = pilot(rung, candidate, out / "pilots" / rung / name)
            table = assess(rung, found).assign(
                rung=rung,
                candidate=name,
                steps=candidate.get("bandit_steps", candidate.get("tf_steps")),
                pilot_seeds=PILOT_SEEDS[rung],
                study_seconds_per_seed=found["seconds"] / PILOT_SEEDS[rung],
            )
            tables.append(table)
            print(f"{rung} {name}: {table.to_dict('records')[0]['seeds_needed']}", file=sys.stderr)
    pilots = pd.concat(tables, ignore_index=True)
    choice = choose(pilots)
    write_csv(pilots, out / "pilot.csv")
    write_csv(choice, out / "choice.csv")
    return pilots, choice


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandbox.study.regimes", description=__doc__)
    parser.add_argument("--out", default="runs/regimes", help="output folder")
    parser.add_argument("--rungs", nargs="+", default=list(CANDIDATES), choices=list(CANDIDATES))
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    _, choice = run(args.rungs, out)
    record_run(out)
    print(choice.to_string(index=False))
    print(json.dumps({"out": str(out)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
