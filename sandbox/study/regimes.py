"""Regimes with headroom, chosen by a rule written down before the study runs (issue 27).

A regime is a rung's setting and horizon (bandit: suite setting and steps; tiny_tf: task, knobs
and steps). Each candidate runs as a pilot, the claims study on that rung alone (calibration
included) at :data:`PILOT_SEEDS` paired seeds, and the rule (docs/claims.md, "How the regimes
were chosen", states it for readers, with its one revision before the study ran) reads it:

1. headroom: every primary claim's comparator at least :data:`.claims.ROOM` margins below the ceiling;
2. (tiny_tf) the reference rule's held-out pass@1 at least ``WIDE`` margins above the larger
   answer baseline (:func:`envs.reasoning.answer_baselines`): it learned the task, not the prior;
   and every replicate's held-out set holds at least :data:`MIN_PROBLEMS` distinct problems
   (issue 38: a task of 4 problems scores how many of its 4 a run learned);
3. among the candidates passing 1 and 2, the highest mean power over the primary claims
   (:func:`mean_power`) at the seeds they need for ``POWER`` at :func:`claim_level` (the largest
   over the claims, from the pilot's SD of paired differences), capped at ``CAP_SECONDS`` of
   study time projected linearly from the pilot's wall time (ties: fewer seeds, then the longer
   horizon); the cap is printed whenever it binds. On a deterministic rung (``bandit_exact``)
   a difference is exact: power 1 at its one seed, so the rule picks the longest horizon that
   keeps headroom.

``python -m sandbox.study.regimes --out results/regimes`` runs the pilots (each a resumable study
folder under ``pilots/``) and writes ``pilot.csv`` (per candidate and claim), ``candidates.csv``
(per candidate: the rule's figures), ``choice.csv`` (per rung: the choice, seeds and why) and
``provenance.json``. ``--tables-only`` runs nothing: it rebuilds ``candidates.csv`` and
``choice.csv`` from the folder's ``pilot.csv`` (:func:`rebuild`).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sandbox.configs import CommandParser
from sandbox.experiments.results import record_run, recording_tables, write_csv

from .claims import claim_level, near_ceiling, seeds_for
from .evidence import paired_power
from .plan import run_study
from .rungs import MARGINS, REFERENCE, RUNGS, StudyConfig

#: Margins above the answer baselines the reference rule must reach (tiny_tf).
WIDE = 5
POWER = 0.8
#: Study time per rung the seed count may cost (2-core CPU), in seconds.
CAP_SECONDS = 3600
PILOT_SEEDS = {"bandit_exact": 1, "bandit_sampled": 16, "tiny_tf": 8}
#: The fewest distinct problems a replicate's held-out set may hold (rule 2).
MIN_PROBLEMS = 256

#: A warm-started candidate's warm start: to partial competence (held-out pass 0.3 on the test
#: partition), at most 400 supervised steps (:class:`~sandbox.train.warm_start.WarmStartConfig`).
WARM = {"target": 0.3, "steps": 400}
#: A warm-started candidate's step-size grid (Adam).
WARM_LRS = [1e-5, 3e-5, 1e-4]
#: The candidates of each rung: its section's settings (``warm_start``: a tiny_tf candidate's
#: warm start, :func:`resolved` to the file its ``init`` names).
CANDIDATES: dict[str, list[dict[str, Any]]] = {
    # the sampled rung's bandit in expectation (the two share their setting): only its horizon
    "bandit_exact": [{"exact_steps": n} for n in (2, 3, 5, 8, 10, 15)],
    "bandit_sampled": [
        {"setting": s, "steps": n}
        for s in ("mixed", "easy", "gaussian", "needle")
        for n in (15, 30, 60)
    ],
    "tiny_tf": [  # mod_arith steps=2 (the earlier study's) fails rule 2: results/claims/bounds.csv
        {"task": "bits", "knobs": {"op": "reverse", "length": 2}, "steps": 40},
        {"task": "bits", "knobs": {"op": "sort", "length": 3}, "steps": 40},
        {"task": "bits", "knobs": {"op": "reverse", "length": 3}, "steps": 80},
        # issue 38: thousands of problems, held-out ones from the test partition, every replicate
        # from one warm start (made once into OUT/warm_start by sandbox.train.warm_start), on the
        # step-size grid a warm start survives (results/warm_start_pilot: from 1e-3 up, Adam
        # destroyed the warm model)
        *(
            {"task": task, "knobs": knobs, "steps": 40, "split": True, "lrs": WARM_LRS}
            | {"warm_start": WARM}
            for task, knobs in (
                ("bits", {"op": "reverse", "length": 10}),
                ("addition", {"digits": 2}),
                ("sequence", {"op": "reverse", "length": 4, "alphabet": "digits"}),
            )
        ),
    ],
}


def label(candidate: dict[str, Any]) -> str:
    """A candidate's folder name: its settings as key=value, knobs flattened (another mapping's
    keys prefixed with its name: ``warm_start.target=0.3``; a list's items joined by ``_``:
    ``lrs=1e-05_3e-05``)."""

    def pairs(key: str, value: Any) -> list[tuple[str, Any]]:
        if isinstance(value, list | tuple):
            return [(key, "_".join(map(str, value)))]
        if not isinstance(value, dict):
            return [(key, value)]
        prefix = "" if key == "knobs" else f"{key}."
        return [(prefix + k, v) for k, v in sorted(value.items())]

    return ",".join(f"{k}={v}" for key, value in candidate.items() for k, v in pairs(key, value))


def resolved(candidate: dict[str, Any], cache: Path) -> dict[str, Any]:
    """A candidate's section settings: its ``warm_start``, if any, made (or found) in ``cache``
    (:func:`~sandbox.train.warm_start.ensure_warm_start`) and named by ``init``."""
    if "warm_start" not in candidate:
        return candidate
    from sandbox.train.warm_start import WarmStartConfig, ensure_warm_start

    rest = {k: v for k, v in candidate.items() if k != "warm_start"}
    warm = WarmStartConfig(task=rest["task"], task_knobs=rest["knobs"], **candidate["warm_start"])
    return {**rest, "init": str(ensure_warm_start(warm, cache))}


#: What every candidate of a section starts from before its own settings: the study's defaults
#: when the pilots first ran, pinned, so a choice that moves the study's defaults (the tiny_tf
#: rung's warm start, split and grid) leaves every pilot's runs, and so its parts, as they were.
BASE: dict[str, dict[str, Any]] = {
    "tf": {"lrs": [3e-4, 1e-3, 3e-3, 1e-2], "split": False, "init": None},
}


def pilot(rung: str, candidate: dict[str, Any], out: Path, **settings: Any) -> dict[str, Any]:
    """Run (or resume) the pilot study of one candidate; its tables and its wall time
    (calibration included, one worker: an upper bound on the study phase's; recorded in the
    folder's ``pilot_seconds.json`` by the call that computed it, so a resumed pilot keeps it)."""
    n = PILOT_SEEDS[rung]  # every section's seeds (only this rung runs; a record holds them all)
    names = sorted({RUNGS[r].section for r in CANDIDATES})
    sections = {name: {**BASE.get(name, {}), "seeds": n} for name in names}
    sections[RUNGS[rung].section].update(candidate)
    config = StudyConfig(rungs=[rung], sections=sections, **settings)
    timing = out / "pilot_seconds.json"
    start = time.perf_counter()
    tables = run_study(config, out, progress=False, workers=1)
    if not timing.exists():
        timing.write_text(json.dumps({"seconds": round(time.perf_counter() - start, 1)}) + "\n")
    return {
        "ledger": tables["ledger"],
        "bounds": tables["bounds"].set_index("rung"),
        "summary": tables["summary"],
        "seconds": json.loads(timing.read_text())["seconds"],
        "steps": RUNGS[rung].steps(config),
        "problems": held_out_size(config.section(RUNGS[rung].section)),
    }


def held_out_size(section: Any) -> float:
    """The fewest distinct problems in a replicate's held-out set, over the section's paired
    seeds (rule 2); NaN for a section without a task (a bandit)."""
    if not hasattr(section, "task"):
        return np.nan
    from envs.reasoning import make_task
    from sandbox.train.sequence import held_out_problems

    task, n = make_task(section.task, **section.knobs), section.eval_prompts
    sets = [held_out_problems(task, 0, n, s, section.split)[0] for s in range(section.seeds)]
    return float(min(len(set(prompts)) for prompts in sets))


def assess(rung: str, found: dict[str, Any]) -> pd.DataFrame:
    """One row per primary claim on ``rung``: headroom, the baselines, the seeds it needs."""
    ledger = found["ledger"]
    ledger = ledger[ledger["rung"] == rung]
    bounds = found["bounds"].loc[rung]
    reference = found["summary"].set_index(["rung", "rule"]).loc[(rung, REFERENCE)]
    level = claim_level(len(ledger))
    exact = RUNGS[rung].traits.deterministic
    rows = []
    for _, row in ledger.iterrows():
        margin, sd = MARGINS[row["metric"]], float(row["diff_sd"])
        ceiling = float(bounds["ceiling"])  # has a ceiling: final_pass
        room = row["metric"] != "final_pass" or not near_ceiling(
            float(row["comparator_mean"]), ceiling, margin
        )
        needed = 1 if exact else seeds_for(sd, margin, power=POWER, alpha=level)
        rows.append(
            {
                "claim": row["claim"],
                "metric": row["metric"],
                **{k: row.get(k, np.nan) for k in ("estimate", "lo", "hi")},
                "pilot_verdict": row.get("verdict", ""),
                "comparator_mean": row["comparator_mean"],
                "ceiling": bounds["ceiling"],
                "floor": bounds["floor"],
                "reference_pass": reference["final_pass"],
                "headroom": room,
                "diff_sd": sd,
                "seeds_needed": 2 if np.isnan(needed) else needed,
            }
        )
    table = pd.DataFrame(rows)
    table["beats_baselines"] = bool(
        reference["final_pass"] >= float(bounds["floor"]) + WIDE * MARGINS["final_pass"] - 1e-12
    )
    table["problems"] = found["problems"]
    table["exact"] = exact
    return table


def mean_power(rows: pd.DataFrame, seeds: int) -> float:
    """Mean power over a candidate's primary claims at ``seeds`` paired seeds, at
    :func:`claim_level` as in :func:`assess` (1 on a deterministic rung: exact differences)."""
    if rows["exact"].any():
        return 1.0
    level = claim_level(len(rows))
    powers = [
        paired_power(seeds, sd, MARGINS[metric], alpha=level) if np.isfinite(sd) else np.nan
        for sd, metric in zip(rows["diff_sd"], rows["metric"], strict=True)
    ]
    return float(np.nanmean(powers))


def candidates(pilots: pd.DataFrame) -> pd.DataFrame:
    """Per rung and candidate: whether it passes rules 1 and 2 (``ok``), the seeds its primary
    claims need, its seed count (capped), the mean power there and its horizon."""
    per = []
    for (rung, name), one in pilots.groupby(["rung", "candidate"], sort=False):
        cost = float(one["study_seconds_per_seed"].iloc[0])
        cap = int(CAP_SECONDS // cost) if cost > 0 else 10**9
        needed = int(one["seeds_needed"].max())
        seeds = max(1 if needed == 1 else 2, min(needed, cap))
        few = bool((one["problems"] < MIN_PROBLEMS).any())  # NaN (no task): never too few
        ok = bool(one["headroom"].all() and one["beats_baselines"].all() and not few)
        steps = int(one["steps"].iloc[0])
        per.append((rung, name, ok, needed, seeds, mean_power(one, seeds), steps))
    columns = ["rung", "candidate", "ok", "needed", "seeds", "power", "steps"]
    return pd.DataFrame(per, columns=columns)


def choose(pilots: pd.DataFrame) -> pd.DataFrame:
    """Per rung, the candidate the rule picks (module docstring) and why."""
    out = []
    floors = pilots.groupby("rung")["floor"].max()  # > 0: the rung has answer baselines (rule 2)
    by_rung = pilots.groupby("rung")
    tasks, exact = by_rung["problems"].count() > 0, by_rung["exact"].any()
    for rung, table in candidates(pilots).groupby("rung", sort=False):
        ok = table[table["ok"]]
        if not len(ok):
            out.append({"rung": rung, "candidate": None, "why": "no candidate passes the rule"})
            continue
        best = ok.sort_values(
            ["power", "seeds", "steps"], ascending=[False, True, False], kind="stable"
        ).iloc[0]
        seeds, needed = int(best["seeds"]), int(best["needed"])
        why = f"{len(ok)} of {len(table)} candidates keep headroom"
        why += " and beat the answer baselines" if floors[rung] > 0 else ""
        if tasks[rung]:
            why += f" with at least {MIN_PROBLEMS} held-out problems"
        if exact[rung]:
            why += "; exact differences (power 1 at one seed): the longest horizon"
        else:
            why += f"; the highest mean power over its primary claims, {best['power']:.2f} at "
            why += f"{seeds} seeds"
        if seeds < needed:
            why += f" (needs {needed}: capped by {CAP_SECONDS} s)"
        out.append({"rung": rung, "candidate": best["candidate"], "seeds": seeds, "why": why})
    return pd.DataFrame(out)


#: The llm task rule's least group signal: a group of 8 has a success at least 1 time in 5.
LLM_SIGNAL = 0.2


def llm_task_choice(pilot: pd.DataFrame) -> pd.Series:
    """The CPU part of the rule for the llm rung, on ``python -m llm.pilot``'s table (step-0
    pass@1 of the base model and the answer baselines of the same problems): among the tasks
    whose ``group_signal`` is at least :data:`LLM_SIGNAL`, the lowest ``target`` (the larger
    baseline + 5 margins, what the trained reference rule must reach). Whether it is reached is
    the study's headroom rule once the rung runs. ``ValueError`` when no task qualifies."""
    able = pilot[pilot["group_signal"] >= LLM_SIGNAL]
    if not len(able):
        raise ValueError(f"no task has a group signal >= {LLM_SIGNAL}")
    return able.sort_values(["target", "task", "knobs"], kind="stable").iloc[0]


def run(rungs: list[str], out: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    tables = []
    for rung in rungs:
        for candidate in CANDIDATES[rung]:
            name = label(candidate)
            found = pilot(
                rung, resolved(candidate, out / "warm_start"), out / "pilots" / rung / name
            )
            table = assess(rung, found).assign(
                rung=rung,
                candidate=name,
                steps=found["steps"],
                pilot_seeds=PILOT_SEEDS[rung],
                study_seconds_per_seed=found["seconds"] / PILOT_SEEDS[rung],
            )
            tables.append(table)
            print(f"{rung} {name}: {table['seeds_needed'].iloc[0]}", file=sys.stderr)
    pilots = pd.concat(tables, ignore_index=True)
    write_csv(pilots, out / "pilot.csv")
    # the rule reads the table as written, so --tables-only gives the same bytes (a CSV keeps
    # 10 significant digits: the power's last digit would differ otherwise)
    return pilots, rebuild(out)


def rebuild(out: Path) -> pd.DataFrame:
    """``candidates.csv`` and ``choice.csv`` of the folder ``out`` again from its ``pilot.csv``,
    without running a pilot (each file written only when its bytes change; the folder's
    ``tables`` provenance then names this command); returns the choice."""
    pilots = pd.read_csv(out / "pilot.csv")
    with recording_tables(out):
        write_csv(candidates(pilots), out / "candidates.csv")
        choice = choose(pilots)
        write_csv(choice, out / "choice.csv")
    return choice


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog="python -m sandbox.study.regimes", description=__doc__)
    parser.add_argument("--out", default="runs/regimes", help="output folder")
    parser.add_argument("--rungs", nargs="+", default=list(CANDIDATES), choices=list(CANDIDATES))
    parser.add_argument(
        "--tables-only",
        action="store_true",
        help="run no pilot: rebuild candidates.csv and choice.csv from OUT/pilot.csv",
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.tables_only:
        if not (out / "pilot.csv").exists():
            parser.error(f"--tables-only: no pilot.csv in {out}")
        print(rebuild(out).to_string(index=False))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    _, choice = run(args.rungs, out)
    record_run(out)
    print(choice.to_string(index=False))
    print(json.dumps({"out": str(out)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
