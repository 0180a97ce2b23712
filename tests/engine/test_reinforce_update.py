"""The actor's update with ``rollout_correction.use_policy_gradient`` (REINFORCE in bypass mode).

Reference: the REINFORCE gradient ``-A_t * w_t * grad log pi_t`` (weights and rejection detached) equals
the gradient of the PPO clipped loss *at ratio 1* with advantages ``A_t * w_t * keep_t``: on-policy (old
log-probs = the update's own, detached) every ratio is exactly 1, inside the clip range, and
``grad ratio = grad log pi``. The denominators are the response mask's in both. So an update with the
REINFORCE loss, fed the rollout's log-probs, must move the weights as the on-policy PPO update of the
batch whose advantages carry ``w * keep`` computed beforehand from the same policy. It must also move them
the same however the batch is cut into micro-batches.
"""

from __future__ import annotations

import pytest
import torch

from rlflow.parallel.distributed import spawn_workers
from tests.engine.test_batch_invariance import _batch, _build, _role

RC = {
    "rollout_is": "token",
    "rollout_is_threshold": 1.5,
    "rollout_rs": "token",
    "rollout_rs_threshold": 2.0,
    "rollout_rs_threshold_lower": 0.5,
    "rollout_token_veto_threshold": 1e-3,
}


def _rollout_log_probs(current: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The current log-probs moved by up to +-0.9 (ratios 0.4..2.5), and one catastrophic token in row 2."""
    g = torch.Generator().manual_seed(5)
    rollout = (current - 1.8 * (torch.rand(current.shape, generator=g) - 0.5)) * mask
    rollout[2, 0] = current[2, 0] + 10.0  # ratio exp(-10) < 1e-3: row 2 is vetoed
    return rollout


def _update(variant: str) -> dict:
    from rlflow.algos.rollout_correction import compute_rollout_correction
    from rlflow.config import config_section
    from rlflow.parallel.sharded import gather_full_params

    settings = {"micro": 3, "rmpad": True} if variant != "whole" else {"rmpad": True}
    model, _dims, groups = _build("actor", settings, 1)
    before = {k: v.clone() for k, v in gather_full_params(model).items()}
    data = _batch()
    optim = torch.optim.SGD(model.parameters(), lr=1.0)
    role = _role("actor", settings, model, optim, groups, len(data), "token-mean")
    mask = data.batch["response_mask"].float()
    current, _ = role.compute_log_prob(data)
    rollout = _rollout_log_probs(current, mask)
    out: dict = {}
    if variant == "reference":
        corr = compute_rollout_correction(current, rollout, mask, **RC)
        data.batch["advantages"] = data.batch["advantages"] * corr.weights * corr.keep_mask
        data.batch.pop("old_log_probs")  # on-policy: ratio 1 exactly
        keep = corr.keep_mask
        out["ppo_kl"] = float(((rollout - current) * keep).sum() / keep.sum())
        out["is_mean"] = corr.metrics["rollout_corr/rollout_is_mean"]
        out["kept"] = float(keep.sum()) / float(mask.sum())
    else:
        data.batch["rollout_log_probs"] = rollout
        data.batch["old_log_probs"] = rollout.clone()  # bypass mode
        role.reinforce = config_section("algorithm.rollout_correction", use_policy_gradient=True, **RC)
    metrics = role.update_policy(data)
    after = gather_full_params(model)
    return {**out, "metrics": metrics, "delta": {k: before[k] - after[k] for k in before}}


def _worker(rank: int) -> dict:
    return {v: _update(v) for v in ("reinforce", "whole", "reference")}


@pytest.fixture(scope="module")
def results() -> dict:
    return spawn_workers(_worker, 1)[0]


def _assert_same_step(a: dict, b: dict) -> None:
    moved = 0
    for name, delta in b.items():
        scale = float(delta.abs().max()) + 1e-8
        torch.testing.assert_close(a[name], delta, rtol=0, atol=2e-5 * scale, msg=name)
        moved += int(float(delta.abs().max()) > 0)
    assert moved > 0


def test_reinforce_update_equals_on_policy_ppo_with_weighted_advantages(results):
    ref, run = results["reference"], results["reinforce"]
    assert 0.0 < ref["kept"] < 0.9  # some tokens rejected, row 2 vetoed
    _assert_same_step(run["delta"], ref["delta"])
    m = run["metrics"]
    assert m["actor/ppo_kl"] == pytest.approx(ref["ppo_kl"], abs=1e-5)
    assert m["rollout_corr/rollout_is_mean"] == pytest.approx(ref["is_mean"], rel=1e-5)
    assert m["rollout_corr/rollout_is_veto_fraction"] == pytest.approx(1 / 8)
    assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(1 - ref["kept"], abs=1e-6)
    assert "actor/pg_clipfrac" not in m  # REINFORCE has no clipping
    assert m["actor/entropy_loss"] == pytest.approx(ref["metrics"]["actor/entropy_loss"], rel=1e-5)


def test_reinforce_update_is_the_same_in_one_micro_batch(results):
    _assert_same_step(results["whole"]["delta"], results["reinforce"]["delta"])
    a, b = results["whole"]["metrics"], results["reinforce"]["metrics"]
    for key in ("actor/pg_loss", "actor/ppo_kl", "rollout_corr/kl", "rollout_corr/rollout_is_mean"):
        assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), key
