"""Smoke tests of benchmarks/llm_throughput.py in its ``--smoke`` mode (CPU, the tiny Llama).

``main`` runs each path in this process instead of a fresh subprocess, which keeps the test to
seconds; the script as a user runs it (subprocesses) is a ``slow`` test. No timing is asserted:
the figures are the benchmark's output. What is checked: every path runs its warm-up and measured
steps, the table and the ratio lines are printed, and the ratios are the table's.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("transformers")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "llm_throughput.py")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import llm_throughput  # noqa: E402


def test_smoke_in_process(monkeypatch, capsys):
    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    launched = []

    def in_process(args, argv, path, model_dir, runs):
        launched.append((path, runs))
        child = llm_throughput.parse_args([*argv, "--child", f"{path}:{model_dir}"])
        return [llm_throughput.child(child) for _ in range(runs)]

    monkeypatch.setattr(llm_throughput, "launch", in_process)
    results = llm_throughput.main(["--smoke", "--threads", "1"])
    out = capsys.readouterr().out
    assert launched == [("today", 1), ("fast", 1), ("ensemble", 1), ("trl", 1)]
    for path in llm_throughput.PATHS:
        r = results[path]
        runs = 2 if path == "ensemble" else 1  # --smoke: an ensemble of 2 runs in one process
        assert r["runs"] == runs and r["s_per_step"] > 0
        assert r["run_steps_per_s"] == pytest.approx(runs / r["s_per_step"])
    assert results["ratio_ensemble_today"] == pytest.approx(
        results["ensemble"]["run_steps_per_s"] / results["today"]["run_steps_per_s"]
    )
    assert results["ratio_fast_today"] == pytest.approx(
        results["fast"]["run_steps_per_s"] / results["today"]["run_steps_per_s"]
    )
    assert results["ratio_fast_trl"] == pytest.approx(
        results["fast"]["s_per_step"] / results["trl"]["s_per_step"]
    )
    assert "ratio fast / today, run-steps per second:" in out
    assert "ratio fast / TRL, seconds per step:" in out
    assert "peak memory per run: n/a (CUDA only)" in out
    assert "ratio ensemble / today, run-steps per second:" in out
    assert results["ratio_ensemble_trl"] == pytest.approx(
        results["trl"]["run_steps_per_s"] / results["ensemble"]["run_steps_per_s"]
    )
    for label in ("today (llm.train)", "fast (llm.train)", "fast, one ensemble", "TRL GRPOTrainer"):
        assert label in out


def test_a_failed_path_spares_the_others_and_the_record(monkeypatch, capsys, tmp_path):
    """A path whose processes fail prints its error's end on its row; the paths after it still
    run, ``--json`` records the figures and the failure, and the command ends with exit 1."""
    launched = []

    def fake(args, argv, path, model_dir, runs):
        launched.append(path)
        if path == "ensemble":
            raise RuntimeError("ensemble failed:\nRuntimeError: a CUDA-only defect")
        return [{"times": [3.0, 1.0, 1.0], "runs": 1, "peak_mb": None}]

    monkeypatch.setattr(llm_throughput, "launch", fake)
    record = tmp_path / "figures.json"
    argv = ["--smoke", "--paths", "ensemble,today", "--fast-head", "chunked", "--json", str(record)]
    with pytest.raises(SystemExit, match=r"path\(s\) failed: ensemble"):
        llm_throughput.main(argv)
    out = capsys.readouterr().out
    assert launched == ["ensemble", "today"]
    assert "fast, one ensemble  failed: ensemble failed:" in out and "a CUDA-only defect" in out
    assert any(line.startswith("today (llm.train)") for line in out.splitlines())
    figures = json.loads(record.read_text())
    assert figures["failed"] == ["ensemble"] and set(figures["results"]) == {"today"}
    assert figures["device"] == "cpu" and figures["command"].endswith(str(record))


def test_summary_of_runs_side_by_side():
    """Two processes of 1 warm-up + 2 measured steps, the second an ensemble of 3 runs: steady
    means 2 s and 4 s, so 3 s per step on average, 1/2 + 3/4 = 1.25 run-steps per second
    together, first-step excess (5-2 + 6-4)/2."""
    args = argparse.Namespace(warmup=1)
    results = [
        {"times": [5.0, 2.0, 2.0], "runs": 1, "peak_mb": 100.0},
        {"times": [6.0, 3.0, 5.0], "runs": 3, "peak_mb": 120.0},
    ]
    s = llm_throughput.summarise(args, results)
    assert s == {
        "runs": 4,
        "s_per_step": 3.0,
        "run_steps_per_s": 1.25,
        "first_excess_s": 2.5,
        "peak_mb": 120.0,
    }


def test_cpu_rows_follow_the_fast_path_with_their_flags_and_threads(monkeypatch):
    """``--cpu-bf16`` and ``--threads-check`` add rows after ``fast``: the fast path's flags plus
    ``--cpu-bf16``, and the fast path in a process of 1 thread (none where --threads is 1)."""
    import llm.model

    monkeypatch.setattr(llm.model, "cpu_native_bf16", lambda cpuinfo=None: True)
    args = llm_throughput.parse_args(["--device", "cpu", "--cpu-bf16", "--threads-check"])
    assert llm_throughput.measured_paths(args) == [
        "today",
        "fast",
        "fast_bf16",
        "fast_1thread",
        "ensemble",
        "trl",
    ]
    fast = llm_throughput.path_flags(args, "fast")
    assert llm_throughput.path_flags(args, "fast_bf16") == [*fast, "--cpu-bf16"]
    assert llm_throughput.path_flags(args, "fast_1thread") == fast
    assert [llm_throughput.threads_of(args, p) for p in ("fast", "fast_1thread")] == [2, 1]
    one = llm_throughput.parse_args(["--device", "cpu", "--threads-check", "--threads", "1"])
    assert "fast_1thread" not in llm_throughput.measured_paths(one)


def test_cpu_bf16_is_refused_without_native_bf16(monkeypatch):
    import llm.model

    monkeypatch.setattr(llm.model, "cpu_native_bf16", lambda cpuinfo=None: False)
    with pytest.raises(ValueError, match=r"^--cpu-bf16 needs a CPU with native bf16"):
        llm_throughput.parse_args(["--device", "cpu", "--cpu-bf16"])


def test_phase_clock_times_the_phases_and_restores_the_functions():
    """Two runs in step (an ensemble of 2), two steps: each step's phases are the sums over its
    two log_step calls; the rollout is the step's time less the old log-probs and the update
    (step 1: 10 - 1 - 4 = 5); the wrapped functions are restored on exit."""
    import llm.ensemble
    import llm.train

    originals = [getattr(m, n) for m, n in ((llm.train, "logprobs"), (llm.train, "log_step"))]
    with llm_throughput.PhaseClock("cpu", runs=2) as clock:
        assert llm.train.logprobs is not originals[0]
    assert [llm.train.logprobs, llm.train.log_step] == originals
    clock.steps = [
        {"old_logp": 1.0, "update": 4.0},
        {"old_logp": 0.0, "update": 0.0},
        {"old_logp": 0.5, "update": 2.0},
        {"old_logp": 0.0, "update": 0.0},
    ]
    assert clock.split([10.0, 3.0]) == {
        "rollout": [5.0, 0.5],
        "old_logp": [1.0, 0.5],
        "update": [4.0, 2.0],
    }


def test_phase_clock_reads_a_tiny_step(tmp_path):
    """One tiny llm.train step under the clock: every phase is timed (> 0) and the three add up
    to the step's logged time."""
    from llm.config import TrainConfig
    from llm.train import train

    cfg = TrainConfig(
        model="tiny",
        task="parity",
        task_knobs={"length": 2},
        prompts_per_step=2,
        group_size=2,
        max_new_tokens=4,
        steps=1,
        epochs=2,
        minibatches=2,
        progress=False,
        save_model=False,
        device="cpu",
        out=str(tmp_path),
    )
    with llm_throughput.PhaseClock("cpu", runs=1) as clock:
        times = [r["step_time"] for r in train(cfg)]
    phases = clock.split(times)
    assert all(phases[p][0] > 0 for p in llm_throughput.PHASES), phases
    assert sum(phases[p][0] for p in llm_throughput.PHASES) == pytest.approx(times[0], rel=1e-12)


def test_path_flags_select_the_paths():
    args = llm_throughput.parse_args(["--device", "cuda"])
    today = llm_throughput.path_flags(args, "today")
    assert today == [
        "--generate-cache",
        "dynamic",
        "--generate-compile",
        "off",
        "--lm-head",
        "chunked",
    ]
    compact = ["--rollout-backend", "compact", "--generate-compile", "off", "--lm-head", "trl"]
    assert llm_throughput.path_flags(args, "fast") == compact
    assert llm_throughput.path_flags(args, "ensemble") == compact
    compiled = llm_throughput.parse_args(["--decode-compile", "on", "--fast-head", "chunked"])
    assert llm_throughput.path_flags(compiled, "ensemble") == [
        "--rollout-backend",
        "compact",
        "--generate-compile",
        "on",
        "--lm-head",
        "chunked",
    ]
    assert (args.prompts, args.group_size, args.max_new_tokens) == (32, 8, 32)
    assert (args.epochs * args.minibatches, args.runs_today) == (4, 7)


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--paths", "today,vllm"], "--paths must be a subset"),
        (["--steps", "0"], "--steps must be >= 1"),
        (["--runs-today", "0"], "--runs-today must be >= 1"),
        (["--ensemble", "1"], "--ensemble must be >= 2"),
        (["--warmup", "-1"], "--warmup must be >= 0"),
        (["--prompts", "3", "--group-size", "1", "--minibatches", "2"], "--minibatches must"),
        (["--threads", "0"], "--threads must be >= 1"),
        (["--device", "cuda", "--cpu-bf16"], "--cpu-bf16 measures CPU runs"),
        (["--device", "cuda", "--threads-check"], "--threads-check measures CPU runs"),
    ],
)
def test_bad_arguments(argv, match):
    with pytest.raises(ValueError, match=match):
        llm_throughput.parse_args(argv)


def without_trl(tmp_path) -> dict[str, str]:
    """The environment of a run in which ``import trl`` fails as it does where TRL is not
    installed: a ``trl`` package first on PYTHONPATH that raises ``ModuleNotFoundError``."""
    fake = tmp_path / "no_trl" / "trl"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'trl'\", name='trl')\n"
    )
    path = os.pathsep.join([str(fake.parent), ROOT, *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1"}


TRL_NEEDS = [
    (["--paths", "trl"], "--paths trl needs TRL"),
    (["--paths", "today,fast"], "--fast-head trl (the fast path's default) needs TRL"),
    (
        ["--paths", "ensemble,trl"],
        "--paths trl and --fast-head trl (the fast path's default) need TRL",
    ),
]


@pytest.mark.parametrize(("argv", "needs"), TRL_NEEDS)
def test_trl_paths_without_trl_stop_with_one_line(monkeypatch, argv, needs):
    """``main`` in this process, ``import trl`` failing as where TRL is not installed (None in
    ``sys.modules``): the ValueError that the script prints as its one line."""
    monkeypatch.setitem(sys.modules, "trl", None)
    with pytest.raises(ValueError) as stop:
        llm_throughput.main(["--smoke", *argv])
    message = str(stop.value)
    assert "\n" not in message and needs in message
    assert "pip install 'clip-sandbox[trl]'" in message


def test_trl_paths_without_trl_stop_the_script_with_one_line(tmp_path):
    """The script as a user runs it, where TRL is not installed: exit 2, one ``error:`` line."""
    argv, needs = TRL_NEEDS[-1]
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--smoke", *argv],
        env=without_trl(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(proc.stderr.strip().splitlines()) == 1
    assert proc.stderr.startswith("error: ") and needs in proc.stderr
    assert "pip install 'clip-sandbox[trl]'" in proc.stderr


@pytest.mark.slow
def test_script_runs_smoke_for_llm_train(tmp_path):
    """The llm.train paths as a user runs the script, where TRL is not installed."""
    env = without_trl(tmp_path)
    proc = subprocess.run(
        [
            sys.executable,
            SCRIPT,
            "--smoke",
            "--paths",
            "today,fast",
            "--fast-head",
            "chunked",
            "--threads",
            "1",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "trl not used" in proc.stdout.splitlines()[0]
    assert "ratio fast / today, run-steps per second:" in proc.stdout
    bad = subprocess.run(
        [sys.executable, SCRIPT, "--steps", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and bad.stderr.strip() == "error: --steps must be >= 1"


@pytest.fixture(scope="module")
def smoke_proxy(tmp_path_factory):
    """``--proxy --smoke --proxy-k 1,2`` run once (the real command; four short trainings under
    a dispatch-mode counter, ~40 s on 2 idle cores): its process, its folder and its argv."""
    out = tmp_path_factory.mktemp("smoke_proxy") / "proxy"
    argv = ["--proxy", "--smoke", "--proxy-k", "1,2", "--proxy-compile", "off", "--out", str(out)]
    proc = subprocess.run(
        [sys.executable, SCRIPT, *argv],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc, out, argv


def proxy_rows(out, name: str = "proxy.csv") -> list[dict[str, str]]:
    return list(csv.DictReader((out / name).open()))


@pytest.mark.slow
def test_proxy_counts_operators_host_reads_and_flops(smoke_proxy):
    """``--proxy --smoke`` (the real command): one CSV row per path and K, the counts positive,
    and the batched decoder's ensemble of 2 dispatches fewer operators per run-step than its run
    alone (the members share every launch of the rollout)."""
    proc, out, argv = smoke_proxy
    rows = proxy_rows(out)
    assert [(r["path"], r["K"]) for r in rows] == [
        ("today", "1"),
        ("ensemble", "2"),
        ("batched", "1"),
        ("batched", "2"),
    ]
    for r in rows:
        assert float(r["ops_per_run_step"]) > 100 and float(r["gflop_per_run_step"]) > 0
        assert float(r["host_reads_per_run_step"]) >= 1  # llm.train logs each step's values
    alone, pair = (float(r["ops_per_run_step"]) for r in rows[2:])
    assert pair < alone and float(rows[3]["ops_ratio_to_K1"]) == pytest.approx(pair / alone)
    assert "ratio batched K=2 / today, operators per run-step:" in proc.stdout
    # the run alone on CUDA's multi-tensor AdamW and clipping: fewer operators than its CPU loops
    foreach = re.search(r"\(cuda_foreach\): (\d+) operators per run-step", proc.stdout)
    assert foreach and 0 < int(foreach.group(1)) < float(rows[0]["ops_per_run_step"])
    # the last column: the prefill's share of the FLOPs, counted on the compact decoder only
    table = [
        line.split()
        for line in proc.stdout.partition("operators per run-step by phase")[0].splitlines()
        if line.startswith(("today ", "ensemble ", "batched "))
    ]
    assert len(table) == 4 and [cells[-1] for cells in table[:2]] == ["-", "-"]
    assert all(0 < float(cells[-1].rstrip("%")) < 100 for cells in table[2:])
    # the phases partition the operators: each row's phases add up to its total
    phases = proxy_rows(out, "proxy_phases.csv")
    assert [(r["path"], r["K"]) for r in phases] == [(r["path"], r["K"]) for r in rows]
    for r, p in zip(rows, phases, strict=True):
        counts = [float(v) for k, v in p.items() if k not in ("path", "K")]
        assert min(counts) >= 0 and counts[0] > 0  # decoding dispatches operators
        assert sum(counts) == pytest.approx(float(r["ops_per_run_step"]), rel=1e-12)
    # the ensemble's AdamW (batched over the stacked leaves) dispatches fewer operators per run
    # than one run's (CPU AdamW: a loop over the parameters)
    assert float(phases[3]["optimizer"]) < float(phases[2]["optimizer"]) / 4
    report = (out / "proxy.txt").read_text()
    assert report.startswith(f"command: python benchmarks/llm_throughput.py {' '.join(argv)}\n")
    assert proc.stdout.rstrip().endswith(report.rstrip().splitlines()[-1])


@pytest.mark.parametrize("value", ["0,8", "8,16", "1,x"])
def test_proxy_k_must_start_at_one(value):
    with pytest.raises(ValueError, match=f"^--proxy-k must be .*got '{value}'$"):
        llm_throughput.parse_args(["--proxy", "--proxy-k", value])


def test_proxy_k_must_start_at_one_from_the_script():
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--proxy", "--proxy-k", "8,16"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert proc.returncode == 2 and proc.stderr.startswith("error: --proxy-k must be")


@pytest.mark.slow  # three short trainings in this process, beside the module's --smoke run
def test_proxy_counts_the_step_of_the_flags_given(tmp_path, smoke_proxy, in_process):
    """``--proxy --smoke --group-size 3`` (``main`` in this process; the module's fixture runs
    the script): the report states 2 prompts x 3 completions and the FLOPs per run-step are 1.5x
    those of --smoke's 2 x 2 (the rows of the step; decoding may stop earlier or later), where a
    flag the proxy ignored would leave them equal."""
    import torch

    out = smoke_proxy[1]
    pairs = [r for r in proxy_rows(out) if r["K"] == "1"]
    pairs_line = (out / "proxy.txt").read_text().splitlines()[2]
    g3 = tmp_path / "g3"
    argv = ["--proxy", "--smoke", "--proxy-k", "1", "--proxy-compile", "off", "--group-size", "3"]
    threads = torch.get_num_threads()
    try:  # the proxy sets its own thread count
        in_process(llm_throughput.main, *argv, "--out", str(g3))
    finally:
        torch.set_num_threads(threads)
    report = (g3 / "proxy.txt").read_text().splitlines()
    assert report[0] == f"command: python benchmarks/llm_throughput.py {' '.join(argv)} --out {g3}"
    triples, triples_line = proxy_rows(g3), report[2]
    assert "prompts_per_step=2, group_size=2, max_new_tokens=4, epochs=1" in pairs_line
    assert "prompts_per_step=2, group_size=3, max_new_tokens=4, epochs=1" in triples_line
    assert [r["path"] for r in triples] == [r["path"] for r in pairs] == ["today", "batched"]
    for two, three in zip(pairs, triples, strict=True):
        ratio = float(three["gflop_per_run_step"]) / float(two["gflop_per_run_step"])
        assert 1.3 < ratio < 1.7, (two["path"], ratio)


PROXY_REFUSED = [
    (["--steps", "3"], "--steps"),
    (["--device", "cuda"], "--device"),  # --device cpu (the proxy's) would be honoured
    (["--paths", "today", "--model", "smollm2-135m"], "--model, --paths"),
]


@pytest.mark.parametrize(("flags", "named"), PROXY_REFUSED)
def test_proxy_refuses_flags_it_cannot_honour_in_one_line(flags, named):
    with pytest.raises(ValueError) as stop:
        llm_throughput.parse_args(["--proxy", "--smoke", *flags])
    message = str(stop.value)
    assert message.startswith(f"{named}: not honoured by --proxy") and "\n" not in message


def test_proxy_refuses_flags_from_the_script_in_one_line():
    """The script as a user runs it: exit 2 before any output, one ``error:`` line."""
    flags, named = PROXY_REFUSED[-1]
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--proxy", "--smoke", *flags],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(f"error: {named}: not honoured by --proxy")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_proxy_step_is_the_committed_one_unless_a_shape_flag_is_given():
    """No shape flag: no override (llm_proxy.SETTINGS, the committed results/proxy's step); each
    shape flag given replaces its setting, also under --smoke; --smoke's own values otherwise."""
    assert llm_throughput.parse_args(["--proxy"]).proxy_shape == {}
    args = llm_throughput.parse_args(
        ["--proxy", "--group-size", "8", "--prompts", "3", "--digits", "2", "--lr", "0.01"]
    )
    assert args.proxy_shape == {
        "prompts_per_step": 3,
        "group_size": 8,
        "lr": 0.01,
        "task_knobs": {"digits": 2},
    }
    smoke = llm_throughput.parse_args(["--proxy", "--smoke", "--max-new-tokens", "6"])
    assert smoke.proxy_shape == {"max_new_tokens": 6} and smoke.group_size == 2
    honoured = llm_throughput.parse_args(["--proxy", "--device", "cpu", "--model", "tiny"])
    assert honoured.proxy_shape == {}
    with pytest.raises(ValueError, match=r"--minibatches 4 must divide the proxy's --prompts x"):
        llm_throughput.parse_args(["--proxy", "--smoke", "--group-size", "3", "--minibatches", "4"])
    with pytest.raises(ValueError, match="--group-size must be >= 2 for --proxy's advantage"):
        llm_throughput.parse_args(["--proxy", "--group-size", "1"])
    # --smoke no longer overrides a step flag given (the timing paths too)
    assert llm_throughput.parse_args(["--smoke", "--group-size", "4"]).group_size == 4
