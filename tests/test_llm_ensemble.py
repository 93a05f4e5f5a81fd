"""K runs in one process equal K separate runs (llm.ensemble, issue 20), with the tiny Llama in
float64 on CPU: the same completions, the same old log-probs, and the same parameters and AdamW
states after 2 steps of mu = 2 updates (so the second update of each step is off-policy and the
clipping is live), member by member."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

import sandbox.objectives as registry
from llm import rollout
from llm.ensemble import Ensemble, ensemble_step, stack_batches
from llm.logprobs import completion_logp
from llm.model import tiny_model, tiny_tokenizer
from sandbox.advantages import compute_advantages
from sandbox.loss import PolicyLoss

G = 4
# the members' prompts differ (a study's seeds draw their own), and so do their lengths
PROMPTS = [["12+3=", "7*8="], ["1+1=", "99-40="]]
LR, MAX_NORM = 1e-2, 0.05


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def rollout_of(model, tok, member, step):
    ids = rollout.encode_prompts(tok, PROMPTS[member], True, None)
    out = rollout.generate(
        model,
        tok,
        ids,
        group_size=G,
        max_new_tokens=6,
        temperature=1.0,
        prompts_per_call=2,
        seed_keys=(member, 0, step),
        first_index=0,
        device=torch.device("cpu"),
    )
    rewards = (out["completion"][:, 0] % 2).double()  # a reward the completions decide
    out["adv"] = compute_advantages(rewards, G, method="grpo")[:, None]
    return out


def separate_update(model, optimizer, batch, loss_fn, logp_old):
    logp, ent = completion_logp(
        model,
        *(batch[k] for k in ("prompt", "prompt_mask", "completion", "completion_mask")),
        1.0,
        entropy="metric",
    )
    out = loss_fn(logp, logp_old, batch["adv"], batch["completion_mask"], entropy=ent)
    out.loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(list(model.parameters()), MAX_NORM)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return out, norm


@pytest.mark.parametrize("objective", ["dapo", "gspo"])
def test_two_members_equal_two_separate_runs(tok, objective):
    loss_fn = PolicyLoss(registry.get_objective(objective), None)
    alone = [tiny_model(len(tok), s).double() for s in (0, 1)]
    members = [copy.deepcopy(m) for m in alone]
    ens = Ensemble(members)
    opt_alone = [torch.optim.AdamW(m.parameters(), lr=LR) for m in alone]
    opt_ens = torch.optim.AdamW(ens.parameters(), lr=LR)
    clipped = 0
    for step in range(2):
        b_alone = [rollout_of(m.eval(), tok, k, step) for k, m in enumerate(alone)]
        b_ens = [rollout_of(m.eval(), tok, k, step) for k, m in enumerate(members)]
        for a, e in zip(b_alone, b_ens, strict=True):
            assert torch.equal(a["completion"], e["completion"])
            assert torch.equal(a["adv"], e["adv"])
        stacked = stack_batches(b_ens, tok.pad_token_id)
        assert stacked["prompt"].shape[0] == 2 and stacked["adv"].shape == (2, 2 * G, 1)
        with torch.no_grad():
            old_alone = [
                completion_logp(
                    m, b["prompt"], b["prompt_mask"], b["completion"], b["completion_mask"], 1.0
                )[0]
                for m, b in zip(alone, b_alone, strict=True)
            ]
            stacked["logp_old"] = ens.completion_logp(stacked, 1.0)[0]
        for k, old in enumerate(old_alone):
            Tc = old.shape[1]
            torch.testing.assert_close(stacked["logp_old"][k, :, :Tc], old, atol=1e-12, rtol=0)
            assert (stacked["logp_old"][k, :, Tc:] == 0).all()  # padding beyond the member's own
        for _ in range(2):  # mu = 2: the second update sees ratios != 1
            outs = []
            for m, opt, b, old in zip(alone, opt_alone, b_alone, old_alone, strict=True):
                outs.append(separate_update(m.train(), opt, b, loss_fn, old))
            ens_outs, norms = ensemble_step(
                ens, stacked, [loss_fn, loss_fn], opt_ens, temperature=1.0, max_grad_norm=MAX_NORM
            )
            for (out, norm), e_out, e_norm in zip(outs, ens_outs, norms, strict=True):
                torch.testing.assert_close(e_out.loss, out.loss, atol=1e-12, rtol=0)
                torch.testing.assert_close(e_norm, norm, atol=1e-12, rtol=1e-10)
                clipped += int(norm > MAX_NORM)
    assert clipped > 0  # the per-member clipping was exercised
    for k, (m_alone, m_ens, opt) in enumerate(zip(alone, members, opt_alone, strict=True)):
        init = tiny_model(len(tok), 0).double().state_dict()
        moved = max((p - init[n]).abs().max().item() for n, p in m_alone.state_dict().items())
        assert moved > 1e-3  # the runs trained
        for (name, p), q in zip(m_alone.named_parameters(), m_ens.parameters(), strict=True):
            torch.testing.assert_close(q, p, atol=1e-10, rtol=0, msg=name)
            state = opt_ens.state[ens.leaves[name]]  # the optimizer steps the stacked leaves
            for key in ("exp_avg", "exp_avg_sq"):
                torch.testing.assert_close(state[key][k], opt.state[p][key], atol=1e-10, rtol=1e-8)


def test_stochastic_objective_gets_one_generator_per_member(tok):
    """NSR's band noise draws from the generator: a member's draws are its run's draws."""
    loss_fn = PolicyLoss(registry.get_objective("nsr", noise="band", sigma=0.1), None)
    assert loss_fn.objective.stochastic
    alone = [tiny_model(len(tok), s).double() for s in (0, 1)]
    ens = Ensemble([copy.deepcopy(m) for m in alone])
    batches = [rollout_of(m.eval(), tok, k, 0) for k, m in enumerate(alone)]
    stacked = stack_batches(batches, tok.pad_token_id)
    with torch.no_grad():
        stacked["logp_old"] = ens.completion_logp(stacked, 1.0)[0] + 0.3  # off-policy: r != 1
    opt = torch.optim.AdamW(ens.parameters(), lr=LR)
    gens = [torch.Generator().manual_seed(10 + k) for k in range(2)]
    outs, _ = ensemble_step(
        ens, stacked, [loss_fn] * 2, opt, temperature=1.0, max_grad_norm=MAX_NORM, generators=gens
    )
    for k, (m, b) in enumerate(zip(alone, batches, strict=True)):
        logp, ent = completion_logp(
            m,
            b["prompt"],
            b["prompt_mask"],
            b["completion"],
            b["completion_mask"],
            1.0,
            entropy="metric",
        )
        Tc = logp.shape[1]
        ref = loss_fn(
            logp,
            stacked["logp_old"][k, :, :Tc],
            b["adv"],
            b["completion_mask"],
            entropy=ent,
            generator=torch.Generator().manual_seed(10 + k),
        )
        torch.testing.assert_close(outs[k].loss, ref.loss, atol=1e-12, rtol=0)


def test_ensemble_checks(tok):
    with pytest.raises(ValueError, match="members must hold at least one"):
        Ensemble([])
    from transformers import LlamaConfig, LlamaForCausalLM

    wider = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tok),
            hidden_size=32,
            num_hidden_layers=3,
            num_attention_heads=2,
            intermediate_size=64,
        )
    )
    with pytest.raises(ValueError, match="share one architecture"):
        Ensemble([tiny_model(len(tok), 0), wider])
    same = tiny_model(len(tok), 0)
    with pytest.raises(ValueError, match="members must be distinct models"):
        Ensemble([same, same])
    ens = Ensemble([tiny_model(len(tok), 0), tiny_model(len(tok), 0)])
    batch = stack_batches([rollout_of(ens.members[0], tok, 0, 0)] * 3, tok.pad_token_id)
    with pytest.raises(ValueError, match="batch must hold 2 members"):
        ens.completion_logp(batch, 1.0)
    loss_fn = PolicyLoss(registry.get_objective("dapo"), None)
    opt = torch.optim.AdamW(ens.parameters())
    with pytest.raises(ValueError, match="loss_fns must hold one PolicyLoss per member"):
        ensemble_step(ens, batch, [loss_fn], opt, temperature=1.0, max_grad_norm=1.0)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_batched_logp_equals_each_member_alone(tok, attention):
    """The 4D masks built outside vmap, boolean for SDPA and additive for eager attention: each
    member's log-probs and entropies are its own forward's (padded prompts of unequal lengths).
    Eager in float32: transformers' own eager forward of a left-padded float64 batch is NaN."""
    dtype, tol = (torch.float64, 1e-12) if attention == "sdpa" else (torch.float32, 1e-5)
    alone = [tiny_model(len(tok), s).to(dtype) for s in (0, 1, 2)]
    batches = [rollout_of(m.eval(), tok, k % 2, 0) for k, m in enumerate(alone)]
    for m in alone:
        m.set_attn_implementation(attention)
    ens = Ensemble(alone)
    stacked = stack_batches(batches, tok.pad_token_id)
    logp, ent = ens.completion_logp(stacked, 0.7, entropy="metric")
    assert logp.shape[0] == 3
    for k, (m, b) in enumerate(zip(alone, batches, strict=True)):
        ref = completion_logp(
            m,
            b["prompt"],
            b["prompt_mask"],
            b["completion"],
            b["completion_mask"],
            0.7,
            entropy="metric",
        )
        Tc = ref[0].shape[1]
        torch.testing.assert_close(logp[k, :, :Tc], ref[0], atol=tol, rtol=0)
        torch.testing.assert_close(ent[k, :, :Tc], ref[1], atol=tol, rtol=0)


@pytest.mark.parametrize("head, chunk_size", [("chunked", 2), ("trl", 16)])
def test_batched_logp_head_kernels_and_chunks(tok, head, chunk_size):
    """The batched chunked head in chunks of 2 rows per member (and TRL's kernel, member by
    member, in 16-column tiles): each member's log-probs, entropies and the gradient of its head
    are its own forward's (float64 model; TRL's statistics are float32)."""
    tol = 1e-12 if head == "chunked" else 1e-5
    alone = [tiny_model(len(tok), s).double() for s in (0, 1, 2)]
    batches = [rollout_of(m.eval(), tok, k % 2, 0) for k, m in enumerate(alone)]
    ens = Ensemble(alone)
    kw = dict(entropy="grad", head=head, chunk_size=chunk_size)
    logp, ent = ens.completion_logp(stack_batches(batches, tok.pad_token_id), 0.7, **kw)
    (logp.sum() + ent.sum()).backward()
    name = ens.head_names[0]
    for k, (m, b) in enumerate(zip(alone, batches, strict=True)):
        data = (b[n] for n in ("prompt", "prompt_mask", "completion", "completion_mask"))
        ref, ref_ent = completion_logp(m, *data, 0.7, **kw)
        (ref.sum() + ref_ent.sum()).backward()
        Tc = ref.shape[1]
        torch.testing.assert_close(logp[k, :, :Tc], ref, atol=tol, rtol=0)
        torch.testing.assert_close(ent[k, :, :Tc], ref_ent, atol=tol, rtol=0)
        own = dict(m.named_parameters())[name].grad
        assert own.abs().max() > 0.1
        torch.testing.assert_close(ens.leaves[name].grad[k], own, atol=tol, rtol=0)


# --------------------------------------------------------------------------------------------------
# K runs of llm.train in one process (llm.ensemble.train_ensemble)
# --------------------------------------------------------------------------------------------------

TIMING = ("tokens_per_s", "step_time")
# a step's columns from its rollout (before the update): the same completions give the same values
ROLLOUT_COLUMNS = (
    "reward",
    "pass_rate",
    "reward_std",
    "completion_len",
    "truncated_frac",
    "zero_var_frac",
)
RUN = dict(
    model="tiny",
    task="parity",
    task_knobs={"length": 2},
    lr=1e-2,
    prompts_per_step=4,
    group_size=4,
    max_new_tokens=8,
    steps=2,
    epochs=2,
    progress=False,
    save_model=True,  # a finished run keeps its weights (read below) only with the model saved
    device="cpu",
)


@pytest.mark.parametrize(
    "members",
    [
        # two seeds of one rule; mu = 2 x 2 in 2 micro-batches each; evaluated before the first
        # step and after each, a checkpoint every step
        [
            dict(
                seed=s,
                minibatches=2,
                grad_accum=2,
                eval_every=1,
                eval_prompts=4,
                checkpoint_every=1,
            )
            for s in (0, 1)
        ],
        # three runs, two rules (one stochastic), dynamic sampling: the runs keep unequal numbers
        # of rows (stand-in rows pad them), and a run may keep none in a step (seed 0, step 2)
        [
            dict(seed=0, drop_zero_variance=True, minibatches=2, grad_accum=2),
            dict(
                seed=4,
                objective="nsr",
                objective_params={"noise": "band", "sigma": 0.1},
                drop_zero_variance=True,
                entropy_coef=0.01,
                minibatches=2,
                grad_accum=2,
            ),
            dict(seed=5, drop_zero_variance=True, entropy_coef=0.01, minibatches=2, grad_accum=2),
        ],
        # a calibration's step sizes: one seed, each member stepping with its own AdamW lr
        [dict(seed=0, lr=lr, minibatches=2, grad_accum=2) for lr in (1e-2, 3e-3)],
    ],
)
def test_train_ensemble_equals_separate_runs(tmp_path, monkeypatch, members):
    """K runs through the one loop (``llm.train.loop``: K = 1 for each run alone, K for the
    ensemble) give the same rows: the same columns in the same order, the rollout, evaluation
    and lr columns equal, the update's columns equal to the batched forward's rounding."""
    import llm.train
    from llm.checkpoint import model_state
    from llm.config import TrainConfig
    from llm.ensemble import train_ensemble
    from llm.train import train

    loops, real_loop = [], llm.train.loop

    def counted(runs, *args):
        loops.append(len(runs))
        return real_loop(runs, *args)

    monkeypatch.setattr(llm.train, "loop", counted)

    def cfgs(tag):
        return [
            TrainConfig(**{**RUN, **m}, out=str(tmp_path / f"{tag}{k}"))
            for k, m in enumerate(members)
        ]

    alone = [train(c) for c in cfgs("alone")]
    together = train_ensemble(cfgs("ens"))
    assert loops == [1] * len(members) + [len(members)]
    exact = (*ROLLOUT_COLUMNS, "step", "lr", "eval_pass@1", "eval_pass@4")
    for k, (rows_a, rows_e) in enumerate(zip(alone, together, strict=True)):
        evaluated = "eval_every" in members[k]
        assert [r["step"] for r in rows_e] == [0, 1, 2][not evaluated :]
        for ra, re_ in zip(rows_a, rows_e, strict=True):
            assert list(ra) == list(re_)
            assert ("eval_pass@1" in re_) == evaluated
            for key in ra:
                if key in TIMING:
                    continue
                if key in exact:
                    assert re_[key] == ra[key], (k, key)
                assert re_[key] == pytest.approx(ra[key], rel=1e-4, abs=1e-6), (k, key)
        for tag, rows in (("alone", rows_a), ("ens", rows_e)):  # what each run logged
            logged = (tmp_path / f"{tag}{k}" / "metrics.jsonl").read_text().splitlines()
            assert [json.loads(line) for line in logged] == rows
        state_a = model_state(str(tmp_path / f"alone{k}"))
        state_e = model_state(str(tmp_path / f"ens{k}"))
        init = tiny_model(len(tok_global()), members[k]["seed"]).state_dict()
        assert max((state_a[n] - init[n]).abs().max().item() for n in init) > 1e-3
        for name, p in state_a.items():
            # float32: Adam divides by sqrt(v), so an element with a tiny gradient carries the
            # batched forward's rounding into its step (3.6e-6 on one of 3,168 on an AVX-512
            # Xeon); training moved every state by > 1e-3 (above)
            torch.testing.assert_close(
                state_e[name], p, atol=1e-5, rtol=1e-5, msg=lambda m, name=name: f"{name}: {m}"
            )


def tok_global():
    return tiny_tokenizer()


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ([{}], "at least two runs"),
        ([{}, {"group_size": 2}], "must share --group-size"),
        ([{}, {"lora_r": 4}], "without --lora-r"),
        ([{"out": "same"}, {"out": "same"}], "one --out each"),
    ],
)
def test_train_ensemble_checks(tmp_path, changes, match):
    from llm.config import TrainConfig
    from llm.ensemble import check_members

    cfgs = [
        TrainConfig(**{**RUN, "out": str(tmp_path / str(k)), **c}) for k, c in enumerate(changes)
    ]
    with pytest.raises(ValueError, match=match):
        check_members(cfgs)


def test_cli_runs_one_ensemble_per_seed(tmp_path, capsys):
    from llm.ensemble import main

    argv = [
        "--model",
        "tiny",
        "--task",
        "parity",
        "--task-knobs",
        "length=2",
        "--steps",
        "1",
        "--prompts-per-step",
        "2",
        "--group-size",
        "2",
        "--max-new-tokens",
        "4",
        "--device",
        "cpu",
        "--no-progress",
        "--no-save-model",
        "--out",
        str(tmp_path),
    ]
    main(["--seeds", "3,4", *argv])
    for seed in (3, 4):
        config = json.loads((tmp_path / f"seed{seed}" / "config.json").read_text())
        assert config["seed"] == seed and config["steps"] == 1
        assert len((tmp_path / f"seed{seed}" / "metrics.jsonl").read_text().splitlines()) == 1
        assert (tmp_path / f"seed{seed}" / "checkpoint.pt").exists()
    for bad in ("3,3", "3,x"):
        with pytest.raises(SystemExit) as exc:
            main(["--seeds", bad, *argv])
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("error: --seeds must be distinct comma-separated integers")


#: The smallest ensemble command: the tiny Llama, one step of 2 prompts x 2 completions.
TINY_CLI = [
    *["--model", "tiny", "--task", "addition", "--task-knobs", "digits=1", "--steps", "1"],
    *["--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "3", "--no-progress"],
]


@pytest.mark.parametrize(
    ("argv", "message"),
    [  # issue 39: the trailing comma was dropped, -1 failed in numpy without naming the flag,
        # and argparse took --seed for an abbreviation of --seeds ("needs at least two runs")
        (["--seeds", "0,1,"], "--seeds must be distinct comma-separated integers >= 0, got '0,1,'"),
        (["--seeds=-1,2"], "--seeds must be distinct comma-separated integers >= 0, got '-1,2'"),
        (
            ["--seeds", "0,1", "--seed", "3"],
            "--seed does not apply to an ensemble: each member's seed is one of --seeds",
        ),
    ],
    ids=["trailing-comma", "negative", "seed-and-seeds"],
)
def test_bad_seeds_are_one_line_naming_the_flag(tmp_path, in_process, argv, message):
    from llm.ensemble import main

    proc = in_process(main, *argv, *TINY_CLI, "--out", str(tmp_path / "ens"))
    assert proc.returncode == 2
    assert proc.stderr == f"error: {message}\n"
    assert not (tmp_path / "ens").exists()


def test_a_tiny_ensemble_prints_no_warning(tmp_path, in_process):
    """Issue 39: torch's "performance drop ... batching rule for
    aten::_scaled_dot_product_flash_attention_for_cpu" came once per step (llm.train's
    ``catch_warnings`` around the scheduler step resets Python's once-per-place record).
    ``in_process`` fails on any warning the real command would print."""
    from llm.ensemble import main

    out = tmp_path / "ens"
    proc = in_process(main, "--seeds", "0,1", *TINY_CLI, "--steps", "2", "--out", str(out))
    assert not proc.returncode, proc.stderr
    assert "Warning" not in proc.stderr
    for seed in (0, 1):
        assert len((out / f"seed{seed}" / "metrics.jsonl").read_text().splitlines()) == 2


def test_ctrl_c_checkpoints_every_member_and_resume_continues(tmp_path):
    """The ensemble command under Ctrl-C (a real SIGINT to a real process): the one loop
    finishes the step, writes every member's checkpoint at that step, says so in one line and
    how to resume, and exits 130; ``--resume`` continues every member from there."""
    from llm.ensemble import main

    root = Path(__file__).resolve().parents[1]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    argv = [
        "--model",
        "tiny",
        "--task",
        "parity",
        "--task-knobs",
        "length=2",
        "--lr",
        "1e-2",
        "--prompts-per-step",
        "2",
        "--group-size",
        "2",
        "--max-new-tokens",
        "4",
        "--no-progress",
        "--no-save-model",
        "--device",
        "cpu",
        "--out",
        str(tmp_path),
    ]
    cmd = [sys.executable, "-m", "llm.ensemble", "--seeds", "0,1", *argv]
    proc = subprocess.Popen(
        [*cmd, "--steps", "10000"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    logs = [tmp_path / f"seed{s}" / "metrics.jsonl" for s in (0, 1)]
    deadline = time.monotonic() + 300
    while not all(p.exists() and p.read_text().count("\n") for p in logs):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"no step logged (exit {proc.returncode}): {proc.communicate()}")
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    steps = [len(p.read_text().splitlines()) for p in logs]
    done = steps[0]
    assert steps == [done, done] and done >= 1
    outs = f"{tmp_path / 'seed0'}, {tmp_path / 'seed1'}"
    assert f"SIGINT: checkpoints written at step {done} to {outs}" in err
    assert "run the same command again with --resume to resume" in err and "Traceback" not in err
    for s in (0, 1):
        state = torch.load(tmp_path / f"seed{s}" / "checkpoint.pt", weights_only=True)
        assert state["step"] == done and {"model", "optimizer"} <= set(state)
    main(["--seeds", "0,1", *argv, "--steps", str(done + 1), "--resume"])
    for p in logs:
        assert [json.loads(line)["step"] for line in p.read_text().splitlines()] == list(
            range(1, done + 2)
        )


def test_the_batched_forward_runs_under_bf16_autocast_near_float32(tok):
    """Under bf16 autocast the vmapped decoder body gets query and key float32 (the rotary
    embedding's float32 cos/sin) and value bf16; SDPA refuses that mix unless autocast casts it,
    which CUDA's does not inside vmap (the ensemble failed so on an H200) and the CPU's never
    does. The template's attention casts them itself: the forward and its backward run, within
    bf16 rounding of float32."""
    members = [tiny_model(len(tok), seed) for seed in (0, 1)]
    ens = Ensemble(members)
    batches = [rollout_of(m, tok, k, 0) for k, m in enumerate(members)]
    stacked = stack_batches(batches, tok.pad_token_id)
    ref = ens.completion_logp(stacked, 1.0)[0].detach()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logp, ent = ens.completion_logp(stacked, 1.0, entropy="grad")
    mask = stacked["completion_mask"].bool()
    torch.testing.assert_close(logp[mask].float(), ref[mask], rtol=2e-2, atol=2e-2)
    (logp[mask].sum() + ent[mask].sum()).backward()
    grads = [leaf.grad for leaf in ens.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
