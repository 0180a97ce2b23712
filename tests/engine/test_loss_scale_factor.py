"""``actor.loss_scale_factor`` (verl's key): ``seq-mean-token-sum-norm`` divides each sequence's loss sum
by it instead of the response length, so the update scales by response length / factor."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rlflow.parallel.distributed import spawn_workers
from tests.engine.test_batch_invariance import RESPONSE, _batch, _build, _role


def _update(scale_factor: float | None) -> dict:
    from rlflow.parallel.sharded import gather_full_params

    settings = {"micro": 4, "rmpad": True}
    model, _dims, groups = _build("actor", settings, 1)
    before = {k: v.clone() for k, v in gather_full_params(model).items()}
    data = _batch()
    optim = torch.optim.SGD(model.parameters(), lr=1.0)
    role = _role("actor", settings, model, optim, groups, 8, "seq-mean-token-sum-norm")
    role.config.use_kl_loss = False
    role.config.entropy_coeff = 0.0
    role.config.loss_scale_factor = scale_factor
    role.update = dataclasses.replace(role.update, grad_clip=0.0)  # no clipping: the step follows the loss
    data.batch["old_log_probs"] = role.compute_log_prob(data)[0]
    metrics = role.update_policy(data)
    return {"metrics": metrics, "delta": {k: before[k] - v for k, v in gather_full_params(model).items()}}


def _worker(rank: int) -> dict:
    return {"length": _update(None), "four": _update(4.0)}


@pytest.fixture(scope="module")
def results() -> dict:
    return spawn_workers(_worker, 1)[0]


def test_the_factor_replaces_the_response_length(results):
    ratio = RESPONSE / 4.0  # null divides by the response length
    ref, got = results["length"], results["four"]
    assert abs(ref["metrics"]["actor/pg_loss"]) > 1e-6
    assert got["metrics"]["actor/pg_loss"] == pytest.approx(ratio * ref["metrics"]["actor/pg_loss"], rel=1e-5)
    assert got["metrics"]["actor/grad_norm"] == pytest.approx(
        ratio * ref["metrics"]["actor/grad_norm"], rel=1e-5
    )
    for name, delta in ref["delta"].items():
        # deltas are differences of fp32 weights of order 1 (norm weights start at 1): their rounding, 2^-23
        scale = float(delta.abs().max()) * ratio
        atol = 1e-5 * scale + 4 * torch.finfo(torch.float32).eps
        torch.testing.assert_close(got["delta"][name], ratio * delta, rtol=0, atol=atol, msg=name)
