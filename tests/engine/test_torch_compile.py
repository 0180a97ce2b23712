"""``use_torch_compile``: the actor with the compiled log-prob / entropy kernels computes the same log-probs
and entropies, and moves the weights the same, as the eager actor, padded and packed (remove-padding),
with the entropy bonus and the KL loss in the update (so both kernels' backward run)."""

from __future__ import annotations

import pytest
import torch

from rlflow.parallel.distributed import spawn_workers
from tests.engine.test_batch_invariance import _batch, _build, _role


def _pass(settings: dict, compiled: bool) -> dict:
    import rlflow.utils.torch_functional as tf
    from rlflow.parallel.sharded import gather_full_params

    asked, kernels = [], tf.kernels

    def recording(flag: bool = False):
        asked.append(flag)
        return kernels(flag)

    tf.kernels = recording  # which kernels the log-prob / entropy functions ran

    model, _dims, groups = _build("actor", settings, 1)
    before = {k: v.clone() for k, v in gather_full_params(model).items()}
    data = _batch()
    optim = torch.optim.SGD(model.parameters(), lr=1.0)
    role = _role("actor", settings, model, optim, groups, len(data), "token-mean")
    role.torch_compile = compiled
    log_probs, entropy = role.compute_log_prob(data, calculate_entropy=True)
    metrics = role.update_policy(data)
    after = gather_full_params(model)
    tf.kernels = kernels
    return {
        "kernels_asked": set(asked),
        "log_probs": log_probs,
        "entropy": entropy,
        "metrics": metrics,
        "delta": {k: before[k] - after[k] for k in before},
    }


def _worker(rank: int) -> dict:
    out = {}
    for name, settings in (("padded", {"micro": 3}), ("packed", {"micro": 3, "rmpad": True})):
        out[name] = {c: _pass(settings, c) for c in (False, True)}
    return out


@pytest.fixture(scope="module")
def results() -> dict:
    return spawn_workers(_worker, 1)[0]


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_compiled_actor_matches_eager(results, layout):
    eager, compiled = results[layout][False], results[layout][True]
    assert eager["kernels_asked"] == {False} and compiled["kernels_asked"] == {True}
    # log-probs of ~ -5.6 nats (a 272-token vocabulary), entropies ~5.6: float32 rounding of the fused sums
    torch.testing.assert_close(compiled["log_probs"], eager["log_probs"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(compiled["entropy"], eager["entropy"], rtol=1e-5, atol=1e-5)
    for key in ("actor/pg_loss", "actor/entropy_loss", "actor/kl_loss", "actor/grad_norm"):
        assert compiled["metrics"][key] == pytest.approx(eager["metrics"][key], rel=1e-4, abs=1e-6), key
    moved = 0
    for name, d in eager["delta"].items():
        scale = float(d.abs().max())
        torch.testing.assert_close(compiled["delta"][name], d, rtol=0, atol=1e-4 * scale + 1e-9, msg=name)
        moved += scale > 0
    assert moved > 0
