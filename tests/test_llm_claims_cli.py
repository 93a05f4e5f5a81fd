"""``python -m llm.claims`` as a new user meets it (issue 29): each test runs the real command
(the toy rungs at ``--quick`` sizes; the tiny Llama where the llm rung is the point) and checks
the exit status, stderr and what is left on disk. Where the finding is the command's output or
files, ``llm.claims.main`` runs in the test process (``in_process``: the ~3 s of a fresh
interpreter's imports saved); each kind of error keeps a real subprocess case, and signals are
sent to real subprocesses.

- a changed step-size or mu grid is refused like any other setting, and ``--tables-only`` builds
  only from the calibrated point ``config.json`` records (never two step sizes per seed);
- bad settings (toy and llm rung) are one line, exit 2, before anything runs or is written;
- claims of your own (``--claim``, ``--claims FILE``) join the study's rules and its ledger, and a
  folder's rule set grows, never shrinks;
- a real SIGINT between the end of an llm run's training and its part's write loses nothing.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import run_main

from llm.claims import main
from sandbox.study.claims import parse_claim, read_claims

ROOT = Path(__file__).resolve().parents[1]
#: ``--workers 1``: the runs in the study's own process. A pool's start-up (a forkserver that
#: imports torch, then its workers) cost more CPU than these seconds-long runs (a quick study:
#: 21 s of CPU in the pool, 14 s without); the pool path is tested where it is the point
#: (tests/test_claims_time_budget.py, tests/test_llm_resume_study.py).
FAST = ["--quick", "--rungs", "bandit_exact", "bandit_sampled", "--no-progress", "--workers", "1"]
LLM = [
    *["--quick", "--rungs", "bandit_exact", "llm", "--rules", "dapo", "nsr_dapo", "--no-progress"],
    *["--workers", "1"],
]


def _env() -> dict[str, str]:
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")


def claims(*argv: str, script: list[str] | None = None, **env: str) -> subprocess.CompletedProcess:
    command = script or ["-m", "llm.claims"]
    return subprocess.run(
        [sys.executable, *command, *argv],
        cwd=ROOT,
        env={**_env(), **env},
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture
def run(in_process, monkeypatch):
    """``run(*argv)``: ``llm.claims.main`` in this process, as :func:`claims` runs the command
    (offline, as its environment says)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return lambda *argv: in_process(main, *argv)


def one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    """The quick toy study (dapo, nsr_dapo, grpo, gspo on both bandit rungs; step sizes 1, 4),
    run once by ``llm.claims.main`` in this process (``run_main``)."""
    out = tmp_path_factory.mktemp("claims") / "study"
    done = run_main(main, *FAST, "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def copy_of(study: Path, tmp_path: Path) -> Path:
    out = tmp_path / "copy"
    shutil.copytree(study, out)
    return out


# -- finding 2: grids are settings; tables from the recorded calibrated point only -------------


@pytest.mark.parametrize(
    ("flags", "grid", "in_a_subprocess"),
    [  # once from the real command, once from main in this process
        (["--bandit-lrs", "1.0", "8.0"], {"lr": [1.0, 8.0], "epochs": [2]}, True),
        (["--epochs", "2", "4"], {"lr": [1.0, 4.0], "epochs": [2, 4]}, False),
    ],
)
def test_a_changed_grid_calibrates_on_its_own_parts_and_keeps_the_old_ones(
    study, tmp_path, run, flags, grid, in_a_subprocess
):
    """A grid is a setting of the calibration's runs: another grid names its own parts beside
    the folder's (kept as they were), and the calibration table is the new grid's alone."""
    out = copy_of(study, tmp_path)
    before = {p.name: p.stat().st_mtime_ns for p in (out / "parts").iterdir()}
    command = claims if in_a_subprocess else run
    proc = command(*FAST, *flags, "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    after = {p.name: p.stat().st_mtime_ns for p in (out / "parts").iterdir()}
    assert all(after[name] == stamp for name, stamp in before.items())
    cal = pd.read_csv(out / "calibration.csv")
    assert sorted(cal["lr"].unique()) == grid["lr"]
    assert sorted(cal["epochs"].unique()) == grid["epochs"]
    recorded = json.loads((out / "config.json").read_text())
    assert recorded["epochs"] == grid["epochs"]


def test_tables_only_never_mixes_two_calibrations(study, tmp_path, run):
    out = copy_of(study, tmp_path)
    recorded = json.loads((out / "config.json").read_text())["calibrated"]
    assert set(recorded) == {"bandit_exact", "bandit_sampled"}
    other = tmp_path / "other"  # the same study on another grid: other calibrated points
    proc = run(*FAST, "--bandit-lrs", "1.0", "8.0", "--out", str(other))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((other / "config.json").read_text())["calibrated"] != recorded
    for part in (other / "parts").iterdir():  # an old folder that holds both (as before the fix)
        if not (out / "parts" / part.name).exists():
            shutil.copy(part, out / "parts" / part.name)
    tables = ("summary.csv", "scores.csv", "ledger.csv", "calibration.csv")
    before = {name: (out / name).read_bytes() for name in tables}
    proc = run("--tables-only", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {name: (out / name).read_bytes() for name in tables} == before
    summary = pd.read_csv(out / "summary.csv")
    for rung, (lr, mu) in recorded.items():
        rows = summary[summary["rung"] == rung]
        assert len(rows) == 4 and (rows["lr"] == lr).all() and (rows["epochs"] == mu).all()
    scores = pd.read_csv(out / "scores.csv")
    assert not scores.duplicated(["rung", "rule", "seed"]).any()


# -- finding 3: every setting checked before anything runs or is written -----------------------

BAD = [
    (["--llm-lrs", "abc"], "--llm-lrs: invalid float value: 'abc'"),
    (["--llm-lrs", "0"], "llm_lrs must be finite numbers > 0"),
    (["--llm-steps", "many"], "--llm-steps: invalid int value: 'many'"),
    (["--llm-steps", "0"], "llm_steps must be an integer >= 1, got 0"),
    (["--llm-seeds", "1.5"], "--llm-seeds: invalid int value: '1.5'"),
    (["--llm-epochs", "0"], "llm_epochs must be integers >= 1"),
    (["--llm-bogus", "1"], "unrecognized arguments: --llm-bogus 1"),
    (["--llm-task", "nope"], "llm_task, llm_task_knobs: unknown task 'nope'"),
    (["--llm-model", "no-such/model"], "--llm-model 'no-such/model' is not in the local"),
    (["--llm-ensemble", "0"], "llm_ensemble must be an integer >= 1, got 0"),
    (["--bandit-steps", "0"], "bandit_steps must be an integer >= 1, got 0"),
    (["--group-size", "1"], "group_size must be an integer >= 2, got 1"),
    (["--bandit-setting", "nope"], "bandit_setting: unknown setting 'nope'"),
    (["--rungs", "tiny_tf", "--tf-task", "nope"], "tf_task, tf_knobs: unknown task 'nope'"),
    (["--bandit-lrs", "abc"], "--bandit-lrs: invalid float value: 'abc'"),
    (["--rules", "dapo", "nope"], "nope"),
    # issue 39: 0 and -3 were taken as the default pool size; a negative number in scientific
    # notation was taken for a flag (argparse: "expected at least one argument")
    (["--workers", "0"], "argument --workers: must be an integer >= 1, got '0'"),
    (["--workers", "-3"], "argument --workers: must be an integer >= 1, got '-3'"),
    (["--llm-lrs", "-1e-3"], "llm_lrs must be finite numbers > 0"),
    # the claims read the held-out pass after the last step: an evaluation must fall on it
    (["--llm-steps", "3", "--llm-eval-every", "2"], "llm_eval_every must divide llm_steps (3)"),
    (["--llm-eval-every", "0"], "llm_eval_every must be an integer >= 1, got 0"),
]


#: The command's own checks, each kind once in a real subprocess (argparse's type check, a
#: setting's range, the offline model lookup); every case runs in-process below (``main``).
BAD_IN_A_SUBPROCESS = [BAD[0], BAD[3], BAD[8]]


@pytest.mark.parametrize(
    ("flags", "needle"), BAD_IN_A_SUBPROCESS, ids=[" ".join(f) for f, _ in BAD_IN_A_SUBPROCESS]
)
def test_a_bad_setting_is_one_line_before_anything_runs(tmp_path, flags, needle):
    out = tmp_path / "never"
    one_line_error(claims(*LLM, *flags, "--out", str(out)), needle)
    assert not out.exists()  # no config.json, no parts: the corrected command is not refused


@pytest.mark.parametrize(("flags", "needle"), BAD, ids=[" ".join(f) for f, _ in BAD])
def test_every_bad_setting_is_one_line_from_main(tmp_path, run, flags, needle):
    """``llm.claims.main`` as the command calls it: exit status 2, one stderr line naming the
    setting, nothing written (in-process: the subprocess above pays ~3 s of imports per case)."""
    out = tmp_path / "never"
    one_line_error(run(*LLM, *flags, "--out", str(out)), needle)
    assert not out.exists()


def test_an_llm_setting_without_the_llm_rung_does_not_apply(tmp_path):
    out = tmp_path / "never"
    one_line_error(claims(*FAST, "--llm-steps", "2", "--out", str(out)), "--llm-steps: does not")
    assert not out.exists()


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="checks the message on a machine without CUDA"
)
def test_cuda_without_cuda_is_one_line_before_anything_runs(tmp_path):
    out = tmp_path / "never"
    one_line_error(claims(*FAST, "--device", "cuda", "--out", str(out)), "CUDA is not available")
    assert not out.exists()


def test_the_corrected_command_runs_in_the_folder_of_a_bad_one(tmp_path, run):
    out = tmp_path / "study"
    small = [*LLM, "--out", str(out), "--llm-seeds", "1", "--llm-steps"]
    one_line_error(run(*small, "many"), "--llm-steps")
    proc = run(*small, "1")  # and no warning (entropy_law of one llm seed printed numpy's)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "done:" not in proc.stderr  # --no-progress: no closing line of each llm run either
    config = json.loads((out / "config.json").read_text())
    assert config["sections"]["llm"]["steps"] == 1 and config["sections"]["llm"]["seeds"] == 1
    assert sorted(pd.read_csv(out / "summary.csv").query("rung == 'llm'")["rule"]) == [
        "dapo",
        "nsr_dapo",
    ]
    assert not (out / "llm_scratch").exists()


# -- finding 4: claims of your own; a folder's rule set never shrinks --------------------------


def test_a_claim_of_your_own_gets_a_verdict_on_every_rung(tmp_path, run):
    out = tmp_path / "mine"
    proc = run(
        *FAST, "--rules", "dapo", "--claim", "mine:grpo>gspo:reward_auc:0.01", "--out", str(out)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "empty ledger" not in proc.stdout and "mine" in proc.stdout
    ledger = pd.read_csv(out / "ledger.csv").set_index(["claim", "rung"])
    row = ledger.loc[("mine", "bandit_sampled")]
    assert (row["rule_a"], row["rule_b"], row["metric"], row["margin"]) == (
        "grpo",
        "gspo",
        "reward_auc",
        0.01,
    )
    scores = pd.read_csv(out / "scores.csv").query("rung == 'bandit_sampled'")
    table = scores.pivot_table(index="seed", columns="rule", values="reward_auc")
    assert row["estimate"] == pytest.approx((table["grpo"] - table["gspo"]).mean(), abs=1e-9)
    config = json.loads((out / "config.json").read_text())
    assert config["rules"] == ["dapo", "grpo", "gspo"] and config["claims"][0]["name"] == "mine"
    # the recorded claim survives a rebuild of the tables
    (out / "ledger.csv").unlink()
    assert run("--tables-only", "--out", str(out)).returncode == 0
    assert "mine" in set(pd.read_csv(out / "ledger.csv")["claim"])


def test_a_claims_file_is_read_and_checked(tmp_path, run):
    good = tmp_path / "claims.toml"
    good.write_text(
        '[[claims]]\nname = "grpo_keeps_entropy"\nrule_a = "grpo"\nrule_b = "dapo"\n'
        'direction = "greater"\nmetric = "final_entropy"\nsource = "my notes"\n'
    )
    out = tmp_path / "filed"
    proc = run(*FAST, "--rules", "dapo", "--claims", str(good), "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    ledger = pd.read_csv(out / "ledger.csv")
    mine = ledger[ledger["claim"] == "grpo_keeps_entropy"]
    assert len(mine) == 2 and set(mine["metric"]) == {"final_entropy"}
    assert set(mine["margin"]) == {0.05}  # the study's margin for the metric
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "claims:\n  - {name: x, rule_a: grpo, rule_b: dapo, direction: up, metric: final_pass}\n"
    )
    one_line_error(run(*FAST, "--claims", str(bad), "--out", str(tmp_path / "n")), "direction")


BAD_CLAIMS = [
    ("x:grpo>nope", "claim x: unknown"),
    ("x:grpo>dapo:pass", "metric must be one of"),
    ("x:grpo>dapo:final_pass:-1", "margin must be a number > 0"),
    ("x:grpo", "expected A>B or A<B"),
    ("nsr_beats_dapo:grpo>dapo", "used twice"),
]


def test_a_bad_claim_is_one_line_from_the_command(tmp_path):
    out = tmp_path / "never"
    one_line_error(claims(*FAST, "--claim", BAD_CLAIMS[0][0], "--out", str(out)), BAD_CLAIMS[0][1])
    assert not out.exists()


@pytest.mark.parametrize(("claim", "needle"), BAD_CLAIMS)
def test_a_bad_claim_is_one_line(tmp_path, run, claim, needle):
    out = tmp_path / "never"
    one_line_error(run(*FAST, "--claim", claim, "--out", str(out)), needle)
    assert not out.exists()


def test_a_subset_of_rules_in_a_study_folder_adds_to_it_instead_of_shrinking_it(
    study, tmp_path, run
):
    out = copy_of(study, tmp_path)
    before = pd.read_csv(out / "ledger.csv")
    proc = run(*FAST, "--rules", "dapo", "--claim", "mine:grpo>gspo", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "this run adds to it" in proc.stderr and "runs already done" in proc.stderr
    config = json.loads((out / "config.json").read_text())
    assert config["rules"] == ["dapo", "nsr_dapo", "grpo", "gspo"]  # the folder's, not 1 rule
    after = pd.read_csv(out / "ledger.csv")
    kept = after[after["claim"] != "mine"].reset_index(drop=True)
    # the folder's claims keep their rows; Holm's adjustment alone may grow, where the new
    # claim joins their family with a decision of its own (a larger family, a larger p_holm),
    # and the power at the Holm level falls with it (0.05 / k over a larger k)
    holm = ["p_holm", "holm", "power_holm", "seeds_needed_holm"]
    pd.testing.assert_frame_equal(kept.drop(columns=holm), before.drop(columns=holm))
    assert (kept["p_holm"].fillna(0) >= before["p_holm"].fillna(0)).all()
    assert (kept["power_holm"].fillna(0) <= before["power_holm"].fillna(0)).all()
    assert len(after[after["claim"] == "mine"]) == 2
    assert set(pd.read_csv(out / "summary.csv")["rule"]) == {"dapo", "nsr_dapo", "grpo", "gspo"}


# -- finding 5: a signal between an llm run's end and its part's write ------------------------

#: ``python -m llm.claims`` with two instruments: it counts the llm steps trained in the process
#: (to stderr at exit) and, with CUT_AT set, sends itself a real SIGINT as the first part whose
#: name starts with CUT_AT is about to be written (after its run finished training); with
#: CUT_BEFORE, as that part's job finished its runs, before its writes begin (the job writes its
#: parts itself, planner.compute_parts).
DRIVER = """
import atexit, os, signal, sys
import llm.train as t
import sandbox.experiments.planner as planner
steps, real_rollout, real_write = [], t.rollout_phase, planner.write_parquet_atomic
real_compute = planner.compute_parts
t.rollout_phase = lambda run, step: steps.append(step) or real_rollout(run, step)
def cut(name, key):
    if os.environ.get(key) and name.startswith(os.environ[key]):
        del os.environ[key]
        os.kill(os.getpid(), signal.SIGINT)
def write(frame, path):
    cut(path.name, "CUT_AT")
    return real_write(frame, path)
def compute(fns, folder, parts, *args):
    def runs(*given):
        frames = fns[0](*given)
        cut(parts[0], "CUT_BEFORE")
        return frames
    return real_compute((runs, fns[1]), folder, parts, *args)
planner.write_parquet_atomic, planner.compute_parts = write, compute
atexit.register(lambda: print(f"trained steps {steps}", file=sys.stderr))
from llm.claims import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("where", ["CUT_BEFORE", "CUT_AT"])
def test_sigint_after_an_llm_run_finished_loses_nothing(tmp_path, where):
    """A SIGINT after dapo's llm run finished: before its part's write begins, the part is not
    written and the run's scratch (its checkpoint at its last step) stays for the resume to read;
    amid the write, the signal waits until the job's parts are on disk (its scratch then goes).
    Either way the command stops with the resume line and the rerun trains only nsr_dapo."""
    out = tmp_path / "study"
    argv = [
        "--quick",
        "--rungs",
        "llm",
        "--rules",
        "dapo",
        "nsr_dapo",
        "--no-progress",
        "--workers",
        "1",
        "--llm-seeds",
        "1",
        "--llm-steps",
        "2",
        "--out",
        str(out),
    ]
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    cut = claims(*argv, script=[str(script)], **{where: "study__llm__dapo__"})
    assert cut.returncode == 128 + signal.SIGINT, cut.stderr[-3000:]
    assert "run the same command again to resume" in cut.stderr
    assert "continue with --resume" not in cut.stderr  # llm.train's own hint is not this command's
    assert "Traceback" not in cut.stderr
    written = list((out / "parts").glob("study__llm__dapo__*"))
    scratch = out / "llm_scratch"
    kept = [p for p in scratch.iterdir() if p.name.startswith("addition-digits1__dapo")]
    assert not list((out / "parts").glob("*.tmp"))  # nothing half-written
    if where == "CUT_AT":
        assert len(written) == 1 and kept == []  # the part whole, its run's scratch gone
    else:
        assert written == [] and len(kept) == 1  # the finished run's checkpoint at its last step
        assert __import__("torch").load(kept[0] / "checkpoint.pt", weights_only=True)["step"] == 2
    again = claims(*argv, script=[str(script)])
    assert again.returncode == 0, again.stderr[-3000:]
    assert "trained steps [0, 1]" in again.stderr  # nsr_dapo's 2 steps; dapo's run is read back
    assert len(list((out / "parts").glob("study__llm__*"))) == 2
    assert not (out / "llm_scratch").exists()


#: The smallest study with a claim: one toy rung, the claim's two rules (calibration 2 runs).
SMALL = [
    *["--quick", "--rungs", "bandit_exact", "--rules", "dapo", "nsr_dapo", "--no-progress"],
    *["--workers", "1"],
]


def test_sigterm_between_runs_prints_the_resume_line(tmp_path):
    out = tmp_path / "study"
    script = tmp_path / "driver.py"
    script.write_text(DRIVER.replace("signal.SIGINT", "signal.SIGTERM"))
    cut = claims(*SMALL, "--out", str(out), script=[str(script)], CUT_AT="study__bandit_exact__")
    assert cut.returncode == 128 + signal.SIGTERM, cut.stderr[-3000:]
    assert "interrupted (SIGTERM)" in cut.stderr and "run the same command again" in cut.stderr
    parts = sorted(p.name.split("__")[0] for p in (out / "parts").iterdir())
    assert parts == ["calib", "calib", "study"], (
        parts
    )  # calibration, and the part cut amid its write
    again = claims(*SMALL, "--out", str(out))
    assert again.returncode == 0 and "runs already done" in again.stderr, again.stderr[-3000:]


# -- issue 39: the README's worked example of a claim of your own ------------------------------

NUMBER = r"[-+]?(?:\d+\.?\d*(?:e[-+]?\d+)?|NaN|nan)"


def readme_claim_example() -> tuple[list[str], list[str], str]:
    """README § "A claim of your own, worked through": the command's argv (after
    ``python -m llm.claims``), the stdout lines shown under it and the claims file shown."""
    text = (ROOT / "README.md").read_text()
    section = text.split("### A claim of your own, worked through", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(\w*)\n(.*?)```", section, flags=re.S)
    command = next(body for lang, body in blocks if lang == "bash")
    shown = next(body for lang, body in blocks if lang == "")
    toml = next(body for lang, body in blocks if lang == "toml")
    joined = re.sub(r"\\\n\s*", " ", command).strip()
    assert joined.startswith("python -m llm.claims "), joined
    return shlex.split(joined)[3:], shown.strip().splitlines(), toml


def test_the_readmes_claim_example_runs_as_shown(tmp_path, run):
    """The README's worked ``--claim`` example (issue 39: there was none) cannot rot: its command,
    taken from the README's text, runs (into tmp_path), prints the lines the README shows (each
    number a number, the other words the same), and the README's claims file holds the same
    claim."""
    argv, shown, toml = readme_claim_example()
    claim = argv[argv.index("--claim") + 1]
    out = argv.index("--out") + 1
    assert argv[out] == "runs/my-claim"
    argv[out] = str(tmp_path / "my-claim")
    proc = run(*argv, "--no-progress")
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = proc.stdout.strip().splitlines()
    assert len(printed) == len(shown), proc.stdout
    for line, expected in zip(printed, shown, strict=True):  # column widths may differ
        words, wanted = line.split(), expected.split()
        assert len(words) == len(wanted), (line, expected)
        for word, want in zip(words, wanted, strict=True):
            number = re.fullmatch(NUMBER, want)
            assert re.fullmatch(NUMBER, word) if number else word == want, (line, expected)
    assert proc.stderr.strip().endswith(f"wrote {tmp_path / 'my-claim'}")
    path = tmp_path / "my_claims.toml"
    path.write_text(toml)
    (filed,) = read_claims(path)
    given = parse_claim(claim)
    fields = ("name", "rule_a", "rule_b", "direction", "metric", "margin")
    assert [getattr(filed, f) for f in fields] == [getattr(given, f) for f in fields]


def test_the_cpu_profile_runs_the_llm_rung_rule_by_rule_at_its_cpu_shapes():
    """``--profile cpu`` (issue 40): the toy rungs and the llm rung at the CPU pilot's shapes,
    float32 without gradient checkpointing; a rule's 8 paired seeds are planned before the next
    rule's, the rules in the order that completes claims soonest (dapo, then nsr_dapo), so a study
    cut by ``--time-budget`` holds whole rules and claims."""
    from llm.claims import llm_spec, parse_args
    from sandbox.study.plan import study_jobs

    config, _ = parse_args(["--profile", "cpu"])
    assert config.rungs[-1] == "llm" and config.device == "cpu"
    s = config.section("llm")
    assert (s.task, s.task_knobs, s.steps, s.seeds) == ("addition", {"digits": 1}, 2, 8)
    jobs = [j for j in study_jobs(config, {r: (1.0, 2) for r in config.rungs}) if j.rung == "llm"]
    assert [(j.rule, j.seed) for j in jobs[:9]] == [
        *[("dapo", seed) for seed in range(8)],
        ("nsr_dapo", 0),
    ]
    train = dict(llm_spec(config, jobs[0], seeds=1, steps=s.steps).train)
    assert train["gradient_checkpointing"] is False and train["eval_every"] == s.steps
