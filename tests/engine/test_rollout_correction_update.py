"""The actor update reads ``algorithm.rollout_correction``'s outputs: ``rollout_is_weights`` multiply the
per-token policy loss and ``rollout_rs_mask`` removes tokens from the loss and its token counts.

Reference: for positive weights, the clipped PPO loss of token t weighted by ``w_t`` equals the loss with
advantage ``w_t * A_t`` (every branch of ``max(-A r, -A clip(r))`` and the dual clip is linear in A), and
a rejected token is one outside the response mask. So an update fed (weights, mask) must equal, weight
for weight, the plain update of the batch with scaled advantages and the narrowed response mask.
"""

from __future__ import annotations

import pytest
import torch

from rlflow.parallel.distributed import spawn_workers
from tests.engine.test_batch_invariance import _batch, _build, _role

SETTINGS = {"micro": 2, "rmpad": True}


def _corrections(data):
    g = torch.Generator().manual_seed(3)
    mask = data.batch["response_mask"].float()
    weights = (0.25 + 2.0 * torch.rand(mask.shape, generator=g)) * mask
    keep = (torch.rand(mask.shape, generator=g) > 0.3).float() * mask
    keep[0] = mask[0]  # at least one full response kept
    keep[3] = 0.0  # one response rejected entirely
    return weights, keep


def _update(corrected: bool) -> dict:
    from rlflow.parallel.sharded import gather_full_params

    model, _dims, groups = _build("actor", SETTINGS, 1)
    before = {k: v.clone() for k, v in gather_full_params(model).items()}
    data = _batch()
    weights, keep = _corrections(data)
    if corrected:
        data.batch["rollout_is_weights"] = weights
        data.batch["rollout_rs_mask"] = keep.to(data.batch["response_mask"].dtype)
    else:
        data.batch["advantages"] = data.batch["advantages"] * weights
        data.batch["response_mask"] = data.batch["response_mask"] * keep.to(data.batch["response_mask"].dtype)
    optim = torch.optim.SGD(model.parameters(), lr=1.0)
    role = _role("actor", SETTINGS, model, optim, groups, len(data), "token-mean")
    metrics = role.update_policy(data)
    after = gather_full_params(model)
    return {"metrics": metrics, "delta": {k: before[k] - after[k] for k in before}}


def _worker(rank: int) -> dict:
    return {"corrected": _update(True), "reference": _update(False)}


@pytest.fixture(scope="module")
def results() -> dict:
    return spawn_workers(_worker, 1)[0]


def test_weights_and_rejection_equal_scaled_advantages_on_the_narrowed_mask(results):
    a, b = results["corrected"], results["reference"]
    assert a["metrics"]["actor/pg_loss"] == pytest.approx(b["metrics"]["actor/pg_loss"], rel=1e-5, abs=1e-7)
    assert a["metrics"]["actor/entropy_loss"] == pytest.approx(b["metrics"]["actor/entropy_loss"], rel=1e-5)
    moved = 0
    for name, delta in b["delta"].items():
        scale = float(delta.abs().max()) + 1e-8
        torch.testing.assert_close(a["delta"][name], delta, rtol=0, atol=1e-5 * scale, msg=name)
        moved += int(float(delta.abs().max()) > 0)
    assert moved > 0


def test_an_update_without_the_corrections_differs(results):
    """The reference is not trivially equal: the plain batch (no weights, full mask) moves differently."""

    plain = spawn_workers(_plain_worker, 1)[0]
    b = results["reference"]
    diff = max(float((plain["delta"][k] - b["delta"][k]).abs().max()) for k in b["delta"])
    scale = max(float(v.abs().max()) for v in b["delta"].values())
    assert diff > 1e-3 * scale


def _plain_worker(rank: int) -> dict:
    from rlflow.parallel.sharded import gather_full_params

    model, _dims, groups = _build("actor", SETTINGS, 1)
    before = {k: v.clone() for k, v in gather_full_params(model).items()}
    data = _batch()
    role = _role(
        "actor", SETTINGS, model, torch.optim.SGD(model.parameters(), lr=1.0), groups, len(data), "token-mean"
    )
    role.update_policy(data)
    after = gather_full_params(model)
    return {"delta": {k: before[k] - after[k] for k in before}}
