"""verl's own gpg and dro against sandbox_gpg / sandbox_dro under the same verl config: loss and
gradient in float64, every aggregation mode verl honours, with and without rollout IS weights."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("verl")

from test_adapter_verl import actor_config, assert_same, make_data, run
from verl.workers.config import PolicyLossConfig

from sandbox.objectives import get_objective

MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
PEERS = [("gpg", {}), ("dro", {"dro_beta": 0.3})]


@pytest.mark.parametrize("weights", [False, True], ids=["plain", "rollout-is"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("name", "policy_loss"), PEERS, ids=[p[0] for p in PEERS])
def test_sandbox_peer_rule_equals_verls_own(name, policy_loss, mode, weights):
    cfg = actor_config(policy_loss=PolicyLossConfig(**policy_loss), clip_ratio=0.2)
    data = make_data(noise=0.5)
    assert_same(
        run(f"sandbox_{name}", cfg, data, mode, weights), run(name, cfg, data, mode, weights)
    )


def test_dro_beta_comes_from_verls_policy_loss_config():
    from llm.adapters.verl import resolve_params

    cfg = actor_config(policy_loss=PolicyLossConfig(dro_beta=0.7))
    assert resolve_params("dro", cfg) == {"beta": 0.7}
    assert resolve_params("gpg", cfg) == {}


def test_gpg_and_dro_by_hand():
    # one token: logp_old = log 0.5, logp = log 0.6, A = 2.
    logp = torch.tensor([[0.6]], dtype=torch.float64).log().requires_grad_()
    old = torch.tensor([[0.5]], dtype=torch.float64).log()
    adv = torch.tensor([[2.0]], dtype=torch.float64)
    gpg = get_objective("gpg")(logp, old, adv)
    # GPG: loss = -A log p = -2 log 0.6 = 1.021651; coef = A = 2 whatever the ratio
    assert gpg.loss.item() == pytest.approx(-2 * torch.log(torch.tensor(0.6)).item(), abs=1e-6)
    assert gpg.coef.item() == pytest.approx(2.0, abs=1e-12)
    dro = get_objective("dro", beta=0.5)(logp, old, adv)
    # DRO: log r = log 1.2 = 0.182322; loss = -(2 log 0.6 - 0.25 * 0.182322^2) = 1.029961;
    # coef = A - beta log r = 2 - 0.5 * 0.182322 = 1.908839
    lr = torch.log(torch.tensor(1.2, dtype=torch.float64)).item()
    assert dro.loss.item() == pytest.approx(
        -(2 * torch.log(torch.tensor(0.6)).item() - 0.25 * lr**2), abs=1e-6
    )
    assert dro.coef.item() == pytest.approx(2.0 - 0.5 * lr, abs=1e-12)
    (grad,) = torch.autograd.grad(dro.loss.sum(), logp)
    assert grad.item() == pytest.approx(-(2.0 - 0.5 * lr), abs=1e-12)
    # A = 0 still moves the token back toward the old policy (the penalty acts alone)
    zero = get_objective("dro", beta=0.5)(logp, old, torch.zeros_like(adv))
    assert zero.coef.item() == pytest.approx(-0.5 * lr, abs=1e-12)


@pytest.mark.parametrize(("name", "bad"), [("dro", {"beta": 0.0}), ("dro", {"beta": -1.0})])
def test_bad_peer_parameters_name_themselves(name, bad):
    with pytest.raises(ValueError, match="beta must lie in"):
        get_objective(name, **bad)
