"""An on-policy actor update (one epoch, one mini-batch) without ``old_log_probs`` equals the update fed
the separate ``compute_log_prob`` pass, which the trainer then skips; off-policy it is refused."""

from __future__ import annotations

import pytest
import torch

from rlflow.parallel.distributed import spawn_workers
from tests.engine.test_batch_invariance import _batch, _build, _role

SETTINGS = {"micro": 2, "rmpad": True}  # 4 micro-batches in the one mini-batch of 8 samples


def _update(with_old: bool) -> dict:
    from rlflow.parallel.sharded import gather_full_params
    from rlflow.utils.torch_functional import masked_mean

    model, _dims, groups = _build("actor", SETTINGS, 1)
    before = {k: v.clone() for k, v in gather_full_params(model).items()}
    data = _batch()
    optim = torch.optim.SGD(model.parameters(), lr=1.0)
    role = _role("actor", SETTINGS, model, optim, groups, len(data), "token-mean")
    log_probs, entropy = role.compute_log_prob(data, calculate_entropy=True)
    mask = data.batch["response_mask"]
    if with_old:
        data.batch["old_log_probs"] = log_probs
    else:
        data.pop(batch_keys=["old_log_probs"])
    metrics = role.update_policy(data)
    after = gather_full_params(model)
    return {
        "metrics": metrics,
        "entropy": float(masked_mean(entropy, mask)),
        "delta": {k: before[k] - after[k] for k in before},
    }


def _worker(rank: int) -> dict:
    out = {"with_old": _update(True), "without_old": _update(False)}
    model, _dims, groups = _build("actor", SETTINGS, 1)
    data = _batch()
    data.pop(batch_keys=["old_log_probs"])
    two_mini_batches = _role(
        "actor", SETTINGS, model, torch.optim.SGD(model.parameters(), lr=1.0), groups, 4, "token-mean"
    )
    try:
        two_mini_batches.update_policy(data)
        out["error"] = None
    except ValueError as err:
        out["error"] = str(err)
    return out


@pytest.fixture(scope="module")
def results() -> dict:
    return spawn_workers(_worker, 1)[0]


def test_update_without_old_log_probs_equals_the_update_with_them(results):
    a, b = results["with_old"], results["without_old"]
    # same weights, same tokens: the ratio is 1 in both (exactly without the second pass)
    assert b["metrics"]["actor/ppo_kl"] == 0.0 and b["metrics"]["actor/pg_clipfrac"] == 0.0
    assert abs(a["metrics"]["actor/ppo_kl"]) < 1e-6
    assert b["metrics"]["actor/pg_loss"] == pytest.approx(a["metrics"]["actor/pg_loss"], rel=1e-5, abs=1e-7)
    for name, delta in a["delta"].items():
        scale = float(delta.abs().max()) + 1e-8
        torch.testing.assert_close(b["delta"][name], delta, rtol=0, atol=1e-5 * scale, msg=name)
    # the entropy the skipped pass would have reported comes from the update's forward
    assert b["metrics"]["actor/entropy"] == pytest.approx(a["entropy"], rel=1e-5)
    assert "actor/entropy" not in a["metrics"]


def test_off_policy_update_without_old_log_probs_is_refused(results):
    assert results["error"] is not None
    assert "needs an on-policy update" in results["error"] and "4 of 8 samples" in results["error"]
