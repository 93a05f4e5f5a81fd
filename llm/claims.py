"""The claims study CLI: the seed papers' claims (:mod:`sandbox.study.claims`) tested on
every rung, calibrated and paired by seed (:mod:`sandbox.study`), with the ``llm``
rung added here (``sandbox`` never imports ``llm``).

Profiles (:data:`PROFILES`; flags override them): ``quick`` (CI-sized smoke: 23 s on the
project's 2-core CPU, 2026-11-26; the tiny Llama on the llm rung), ``cpu`` (the toy rungs at
full power and the llm rung at 2-core CPU shapes, run in units with ``--time-budget``), ``gpu`` (the
llm rung on CUDA, 8 paired seeds per rule as one ensemble). Every profile runs every registered
rung (``--rungs`` picks fewer).

The llm rung trains one ``llm.train`` run per (rule, paired seed); ``--llm-ensemble K`` trains up
to K seeds of one rule, and its calibration's step sizes at one mu, as one
:func:`llm.ensemble.train_ensemble` (training batched over the K models; what that buys on a GPU
is unmeasured), each run still its own part with the rows its separate run gives while their
float rounding changes no sampled token: it can (a tiny member of two took another path at step
15 of 20 in float32 on CPU, docs/llm.md), so a study trained with ensembles is not bit for bit one
trained with separate runs. ``OUT/llm_scratch/`` holds the llm runs in progress
(checkpoints every ``checkpoint_every`` steps and on SIGTERM), so a command cut by a time limit
continues each cut run mid-way when run again (the outputs: README, "The claims ledger")::

    python -m llm.claims --quick                                   # smoke, ~25 s on 2 cores
    python -m llm.claims --profile cpu --out results/claims        # every rung, on 2 CPU cores
    python -m llm.claims --profile gpu --out results/claims        # the llm rung on CUDA
    python -m llm.claims --tables-only --out results/claims --doc docs/claims.md
    python -m llm.claims --quick --claim 'mine:grpo>gspo:reward_auc'   # a claim of your own
"""

from __future__ import annotations

from sandbox.experiments.pool import command_imports  # light: no torch

with command_imports(__name__):  # a Ctrl-C amid them: one line, exit 130
    import argparse
    import dataclasses
    import os
    from dataclasses import dataclass
    from pathlib import Path
    from typing import Any

    import llm.runs  # registers the llm run kind, in workers too
    from sandbox.configs import arg, check_number
    from sandbox.experiments.runs import RunSpec
    from sandbox.study import (
        Rung,
        StudyConfig,
        StudyJob,
        probe_settings,
        register_rung,
        task_bounds,
    )
    from sandbox.study.cli import main as study_main
    from sandbox.study.cli import parse_study_args
    from sandbox.study.rungs import (
        check_task,
        knobs,
        mu_grid,
        register_section,
        settle,
        step_sizes,
        task_setting,
        text,
    )

#: the samplers the llm rung can train with (llm.train's ``--rollout-backend``; vLLM is not
#: carried to the project's GPU machine)
SAMPLERS = ("hf", "compact")


@dataclass(frozen=True)
class LlmSettings:
    """The llm rung's settings (the section ``llm``: one flag each, ``--llm-<field>``)."""

    model: str = arg("smollm2-135m", "HF model id, local dir, or an alias (offline: cached)")
    # chosen by `python -m llm.pilot` (results/llm_pilot/pilot.csv) with the CPU part of the
    # regime rule (sandbox.study.regimes): two chained + / - mod 7 has balanced answers
    # (constant-answer baseline 0.156 on the pilot's 64 problems, 0.266 with * in the ops)
    task: str = arg("mod_arith", "task (envs.reasoning), through the chat template")
    task_knobs: dict[str, Any] = arg(
        {"steps": 2, "ops": ["+", "-"]}, "task knobs, key=value (the task checks them)"
    )
    steps: int = arg(100, "llm steps")
    lrs: list[float] = arg([2e-6, 5e-6, 1e-5, 2e-5], "llm step-size grid (llm.train's --lr)")
    epochs: list[int] | None = arg(None, "mu grid on the llm rung (default: the study's --epochs)")
    prompts_per_step: int = arg(32, "prompts per step")
    group_size: int = arg(8, "G on the llm rung")
    max_new_tokens: int = arg(16, "tokens per completion")
    eval_every: int = arg(50, "held-out evaluation at step 0 and every N steps (N divides steps)")
    eval_prompts: int = arg(512, "held-out problems (fixed by the seed)")
    eval_k: int = arg(1, "samples per held-out problem")
    split: bool = arg(
        False,
        "train on the task's train partition, score held-out problems from its test partition "
        "(llm.train's --split); off: held-out problems may repeat training ones",
    )
    seeds: int = arg(8, "paired seeds per rule (one llm.train run each)")
    rollout_backend: str = arg(
        "hf",
        "llm.train's sampler: hf (transformers' generate) or compact (llm.decode: the K members of "
        "an ensemble in one loop, noise fixed per seed, step, row and position, so rules that "
        "share a seed share their draws); another sampler is another study",
        choices=SAMPLERS,
    )
    ensemble: int = arg(
        1,
        "up to K runs of one rule per job (its paired seeds; in calibration, its step sizes), "
        "trained as one llm.ensemble (1: separate runs; the parts are the same either way)",
    )
    # None: a temporary folder, a cut run restarts (llm.runs)
    scratch: str | None = arg(None, "resumable runs' folder (default: OUT/llm_scratch)")
    checkpoint_every: int = arg(10, "checkpoint every N steps (and on SIGTERM; 0: never)")
    gradient_checkpointing: bool = arg(
        True, "llm.train's: recompute activations in backward (off: 0.87x the time on CPU)"
    )

    def __post_init__(self) -> None:
        low = {"group_size": 2, "checkpoint_every": 0}
        epochs = {} if self.epochs is None else {"epochs": mu_grid}
        checks = {"lrs": step_sizes, "task_knobs": knobs, **epochs, "model": text, "task": text}
        settle(self, "llm", low, **checks)
        if self.steps % self.eval_every:  # the claims read the held-out pass at the last step
            raise ValueError(
                f"llm_eval_every must divide llm_steps ({self.steps}), got {self.eval_every}: the "
                "study reads the held-out pass after the last step"
            )

    def check(self) -> None:
        """The task and the model, before anything runs (the model offline: a Hub id must be in
        the local cache)."""
        from llm.model import check_model

        check_task("llm_task, llm_task_knobs", self.task, self.task_knobs)
        try:
            check_model(self.model, offline=True)
        except ValueError as exc:  # its message names llm.train's flag
            raise ValueError(str(exc).replace("--model ", "--llm-model ", 1)) from None


register_section("llm", LlmSettings)


def llm_spec(config: StudyConfig, job: StudyJob, *, seeds: int, steps: int) -> RunSpec:
    """One llm.train run (one seed: the seed fixes prompts, eval set and first rollouts), with the
    aggregation and mechanism probes of the toy rungs (:func:`sandbox.study.probe_settings`; the
    entropy law on the step's first 8 completions)."""
    s = config.section("llm")
    train = {
        **probe_settings(config, job.rule),
        "model": s.model,
        "rollout_backend": s.rollout_backend,
        "max_new_tokens": s.max_new_tokens,
        "eval_every": s.eval_every,
        "eval_prompts": s.eval_prompts,
        "eval_k": s.eval_k,
        "offline": True,
        "gradient_checkpointing": s.gradient_checkpointing,
        "save_model": False,
        "progress": False,
    }
    if s.split:  # only when on: a spec without it names the same scratch folder as before
        train["split"] = True
    if s.scratch is not None:  # resumable (llm.runs); the spec's execution keys
        train["scratch"] = str(s.scratch)
        train["checkpoint_every"] = s.checkpoint_every
    return RunSpec.make(
        "llm",
        task_setting(s.task, s.task_knobs),
        job.rule,
        seed=job.seed,
        steps=steps,
        lr=job.lr,
        epochs=job.epochs,
        minibatches=config.minibatches,
        group_size=s.group_size,
        prompts_per_step=s.prompts_per_step,
        device=config.device,
        definition={"task": s.task, **s.task_knobs},
        train=train,
    )


def llm_bounds(config: StudyConfig) -> Any:
    """Ceiling 1 and the answer baseline of the held-out sets the paired seeds score
    (``llm.data.task_source``'s, one per seed)."""
    from envs.reasoning import make_task
    from llm.data import task_source

    s = config.section("llm")
    sets = [
        task_source(s.task, s.task_knobs, "auto", seed, s.eval_prompts, s.split).eval_answers
        for seed in range(s.seeds)
    ]
    return task_bounds(make_task(s.task, **s.task_knobs), sets)


#: Seconds per run-step a time budget expects of an llm unit before one has run (then the
#: longest seen): the upper end of one SmolLM2-135M run alone on an H100, today's path (1.0-2.3 s;
#: shared/gpu.md, 2026-11-23). A first guess only; the tiny model on CPU is faster.
LLM_STEP_SECONDS = 2.3
#: an environment variable that replaces :data:`LLM_STEP_SECONDS` (seconds per run-step measured
#: on the machine at hand, e.g. by ``benchmarks/llm_throughput.py``; benchmarks/gpu_lend.sh sets it)
STEP_SECONDS_ENV = "CLIP_SANDBOX_LLM_STEP_SECONDS"


def llm_step_seconds() -> float:
    """Seconds per run-step a time budget expects of an llm unit before one has run:
    :data:`STEP_SECONDS_ENV` where set (a ``ValueError`` naming it unless a number > 0), else
    :data:`LLM_STEP_SECONDS`."""
    text = os.environ.get(STEP_SECONDS_ENV)
    if text is None:
        return LLM_STEP_SECONDS
    return check_number(STEP_SECONDS_ENV, text, what="a number of seconds", text=True)


def llm_unit_seconds(config: StudyConfig, group: Any) -> float:
    """``--time-budget``'s first guess for one llm unit: its runs' steps x :data:`LLM_STEP_SECONDS`
    (a calibration run trains ``calib_steps`` steps if set)."""
    steps, seconds = config.section("llm").steps, llm_step_seconds()
    return sum(
        (config.calib_steps or steps if job.phase == "calib" else steps) * seconds for job in group
    )


register_rung(
    Rung(
        "llm",
        llm_spec,
        members=lambda config: config.section("llm").ensemble,
        written=llm.runs.remove_scratch,  # kept until the run's part is written
        bounds=llm_bounds,
        unit_seconds=llm_unit_seconds,
    )
)

#: Named settings (``--profile``); a section's values under its name. Flags override them. None
#: names the rungs: a profile runs every registered rung (the llm rung too), as ``--rungs`` says.
PROFILES: dict[str, dict[str, Any]] = {
    # the toy rungs at full power and the llm rung at 2-core CPU shapes (issue 40): the task and
    # horizon chosen by `python -m llm.cpu_pilot`'s rule (results/llm_cpu_pilot_digits1: 1-digit
    # sums at 2 steps; 2-digit sums, its first choice, did not learn at the calibrated step sizes:
    # results/llm_cpu_pilot/calibration_digits2), 8 x 4 completions of 16 tokens a step, float32
    # without gradient checkpointing, one 1-thread process per core (~43 s a step on the AMD
    # EPYC), the step-size grid at and below the pilot's 2e-5 (dapo clipped ~11% there, above the
    # 5-10% band)
    "cpu": {
        "control_seeds": 16,  # the step-size control on the toy rungs (README: 16 tuning seeds)
        "llm": {
            "task": "addition",
            "task_knobs": {"digits": 1},
            "steps": 2,
            "lrs": [1e-5, 1.5e-5, 2e-5],
            "prompts_per_step": 8,
            "group_size": 4,
            "max_new_tokens": 16,
            "eval_every": 2,
            "eval_prompts": 128,
            "eval_k": 2,
            "gradient_checkpointing": False,
        },
    },
    # the llm rung as one compact ensemble of its 8 paired seeds per rule (issue 28's fast path)
    "gpu": {
        "device": "cuda",
        "llm": {"rollout_backend": "compact", "ensemble": 8},
    },
    "quick": {
        "rules": ["dapo", "nsr_dapo", "grpo", "gspo"],
        "calib_seeds": 2,
        "calib_steps": 2,
        "group_size": 4,
        "bandit": {"seeds": 3, "steps": 4, "exact_steps": 4, "lrs": [1.0, 4.0]},
        "tf": {
            "seeds": 3,
            "task": "bits",
            "knobs": {"op": "reverse", "length": 3},
            "steps": 2,
            "prompts_per_step": 2,
            "lrs": [1e-2],
            "eval_prompts": 8,
            "eval_k": 1,
            "split": False,
            "init": None,
        },
        "llm": {
            "model": "tiny",
            "task": "addition",
            "task_knobs": {"digits": 1},
            "steps": 1,
            "lrs": [1e-3],
            "prompts_per_step": 2,
            "group_size": 2,
            "max_new_tokens": 3,
            "eval_every": 1,
            "eval_prompts": 2,
            "seeds": 3,
        },
    },
}
PROG, DESCRIPTION = "python -m llm.claims", __doc__.split("\n\n")[0]


def parse_args(argv: list[str] | None = None) -> tuple[StudyConfig, argparse.Namespace]:
    """The study of a ``python -m llm.claims`` command line."""
    return parse_study_args(argv, prog=PROG, description=DESCRIPTION, profiles=PROFILES)


def with_scratch(config: StudyConfig, out: Path) -> tuple[StudyConfig, Path | None]:
    """``config`` with the llm rung's ``scratch`` set (``out/llm_scratch`` unless given), so an
    llm run cut by a command's time limit resumes from its checkpoint when the command is run
    again; the folder (None without the llm rung)."""
    if "llm" not in config.rungs:
        return config, None
    settings = config.section("llm")
    if settings.scratch is None:
        settings = dataclasses.replace(settings, scratch=str(out / "llm_scratch"))
    sections = {**config.sections, "llm": settings}
    return dataclasses.replace(config, sections=sections), Path(settings.scratch)


def main(argv: list[str] | None = None) -> int:
    return study_main(
        argv, prog=PROG, description=DESCRIPTION, profiles=PROFILES, prepare=with_scratch
    )


if __name__ == "__main__":
    raise SystemExit(main())
