"""A policy loss registered the way verl >= 0.9 writes them (local aggregate, ``(pg_loss, metrics)``)
trains the actor like the built-in loss, whatever the micro-batch split."""

from __future__ import annotations

import pytest
import torch

from rlflow.parallel.distributed import spawn_workers
from tests.engine.test_batch_invariance import _batch, _build, _role

NAME = "test_verl09_surrogate"


def _verl09_surrogate(
    old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights=None
):
    """The unclipped surrogate ``-A * ratio`` as a token mean over this call's tokens only."""
    ratio = torch.exp(log_prob - old_log_prob)
    mask = response_mask.to(ratio.dtype)
    loss = (-advantages * ratio * mask).sum() / mask.sum().clamp(min=1)
    return loss, {"actor/ppo_kl": ((old_log_prob - log_prob) * mask).sum() / mask.sum(), "ratio_max": 1.0}


def _update(loss_mode: str, micro: int) -> dict:
    from rlflow.algos.losses import POLICY_LOSS_REGISTRY, register_policy_loss
    from rlflow.parallel.sharded import gather_full_params

    if NAME not in POLICY_LOSS_REGISTRY:
        register_policy_loss(NAME)(_verl09_surrogate)
    settings = {"micro": micro, "rmpad": True}
    model, _dims, groups = _build("actor", settings, 1)
    before = {k: v.clone() for k, v in gather_full_params(model).items()}
    data = _batch()
    role = _role(
        "actor", settings, model, torch.optim.SGD(model.parameters(), lr=1.0), groups, 8, "token-mean"
    )
    role.config.policy_loss.loss_mode = loss_mode
    role.config.use_kl_loss = False
    role.config.entropy_coeff = 0.0
    data.batch["old_log_probs"] = role.compute_log_prob(data)[0]  # ratio 1: the built-in loss never clips
    metrics = role.update_policy(data)
    after = gather_full_params(model)
    return {"metrics": metrics, "delta": {k: before[k] - after[k] for k in before}}


def _worker(rank: int) -> dict:
    return {
        "builtin": _update("vanilla", 8),
        "custom_micro8": _update(NAME, 8),
        "custom_micro1": _update(NAME, 1),
    }


@pytest.fixture(scope="module")
def results() -> dict:
    return spawn_workers(_worker, 1)[0]


@pytest.mark.parametrize("variant", ["custom_micro8", "custom_micro1"])
def test_registered_local_mean_loss_equals_the_builtin_under_any_micro_batch_split(results, variant):
    ref, got = results["builtin"], results[variant]
    assert got["metrics"]["actor/pg_loss"] == pytest.approx(
        ref["metrics"]["actor/pg_loss"], rel=1e-5, abs=1e-7
    )
    for name, delta in ref["delta"].items():
        scale = float(delta.abs().max()) + 1e-8
        torch.testing.assert_close(got["delta"][name], delta, rtol=0, atol=1e-5 * scale, msg=name)
    # the function's own metrics are logged under actor/
    assert got["metrics"]["actor/ratio_max"] == 1.0 and abs(got["metrics"]["actor/ppo_kl"]) < 1e-6
