"""The claims study engine: the seed papers' claims tested on every rung, calibrated and paired by
seed (``python -m llm.claims``).

What is where:

- :mod:`.claims`: claims as records, the ledger, Holm, headroom;
- :mod:`.evidence`: paired intervals, power, the verdict classes;
- :mod:`.rungs`: :class:`StudyConfig` and the study's constants, each rung's typed settings
  section and their value checks, :class:`Rung`, :data:`RUNGS`, the toy rungs and their bounds,
  :class:`StudyJob`, a folder's record (``config.json``);
- :mod:`.plan`: the jobs (calibration, study), their parts and specs, :func:`run_study`, calibration;
- :mod:`.analysis`: per-run scores, the study's ledger, summaries, mechanism checks, and transfer
  (each claim's effect on every rung side by side, and their sign agreement);
- :mod:`.tables` (+ ``page.md``): :func:`write_tables` and the figures (:func:`rebuild_tables` is
  in :mod:`.plan`), and the page (docs/claims.md) from a Markdown template and the tables;
- :mod:`.cli`: the command line (``python -m llm.claims`` with the llm rung registered).

Imports flow one way: ``llm`` -> ``sandbox.study`` -> ``sandbox.experiments`` (the run kinds,
the planner, result storage), never back.
"""

from __future__ import annotations

from .analysis import calibration_curve, run_scores, study_ledger
from .claims import CLAIMS, Bounds, Claim, ledger
from .plan import (
    BudgetSpent,
    calibrate,
    calibration_jobs,
    rebuild_tables,
    run_study,
    study_jobs,
)
from .rungs import (
    MARGINS,
    REFERENCE,
    RUNGS,
    Rung,
    StudyConfig,
    StudyJob,
    probe_settings,
    read_record,
    register_rung,
    task_bounds,
    with_folder,
)
from .tables import write_tables

__all__ = [
    "CLAIMS",
    "MARGINS",
    "REFERENCE",
    "RUNGS",
    "Bounds",
    "BudgetSpent",
    "Claim",
    "Rung",
    "StudyConfig",
    "StudyJob",
    "calibrate",
    "calibration_curve",
    "calibration_jobs",
    "ledger",
    "probe_settings",
    "read_record",
    "rebuild_tables",
    "register_rung",
    "run_scores",
    "run_study",
    "study_jobs",
    "study_ledger",
    "task_bounds",
    "with_folder",
    "write_tables",
]
