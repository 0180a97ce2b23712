"""``trainer.forward_ahead`` in the engine: an update that takes the forwards run ahead (the actor's
`forward_ahead`, the critic's `values_ahead`) makes the weights and metrics of the update that runs them
itself, without running them again; the critic's values ahead are `compute_values`'s; shuffled and
dynamic micro-batches; a batch that is not the one that ran ahead gets its own forwards; a multi-pass
update is refused."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rlflow.parallel.distributed import spawn_workers
from tests.engine.test_batch_invariance import _batch, _build, _role

FIXED = {"micro": 3, "rmpad": True}  # 3 micro-batches (3, 3, 2) in the one mini-batch of 8 samples
DYNAMIC = {"dynamic": 24, "rmpad": True}  # token-budget micro-batches


def _counting(role) -> list[int]:
    """Counts the role's micro-batch forwards."""
    calls = [0]
    forward = role._forward_micro_batch

    def counted(*args, **kwargs):
        calls[0] += 1
        return forward(*args, **kwargs)

    role._forward_micro_batch = counted
    return calls


def _update(kind: str, settings: dict, ahead: bool, shuffle: bool, other_batch: bool = False) -> dict:
    from rlflow.parallel.sharded import gather_full_params

    model, _dims, groups = _build(kind, settings, 1)
    before = {k: v.clone() for k, v in gather_full_params(model).items()}
    data = _batch()
    optim = torch.optim.SGD(model.parameters(), lr=1.0)
    role = _role(kind, settings, model, optim, groups, len(data), "token-mean")
    role.update = dataclasses.replace(role.update, shuffle=shuffle, seed=5)
    out: dict = {}
    if kind == "critic":
        out["values"] = role.compute_values(data)
        data.batch["values"] = out["values"]
        if ahead:
            out["values_ahead"] = role.values_ahead(_reversed(data) if other_batch else data, step=1)
            if not other_batch:
                data.batch["values"] = out["values_ahead"]
    elif ahead:
        data.pop(batch_keys=["old_log_probs"])
        role.forward_ahead(_reversed(data) if other_batch else data, step=1)
    else:
        data.pop(batch_keys=["old_log_probs"])
    calls = _counting(role)
    update = role.update_critic if kind == "critic" else role.update_policy
    out["metrics"] = update(data, step=1)
    out["forwards"] = calls[0]
    after = gather_full_params(model)
    out["delta"] = {k: before[k] - after[k] for k in before}
    return out


def _reversed(data):
    return data.select_idxs(torch.arange(len(data) - 1, -1, -1))


def _worker(rank: int) -> dict:
    out = {}
    for kind in ("actor", "critic"):
        for name, settings in (("fixed", FIXED), ("dynamic", DYNAMIC)):
            for shuffle in (False, True):
                key = f"{kind}-{name}-{'shuffled' if shuffle else 'ordered'}"
                out[key] = {
                    "own": _update(kind, settings, False, shuffle),
                    "ahead": _update(kind, settings, True, shuffle),
                }
        out[f"{kind}-other-batch"] = _update(kind, FIXED, True, True, other_batch=True)
    model, _dims, groups = _build("actor", FIXED, 1)
    data = _batch()
    two = _role("actor", FIXED, model, torch.optim.SGD(model.parameters(), lr=1.0), groups, 4, "token-mean")
    try:
        two.forward_ahead(data, step=1)
        out["error"] = None
    except ValueError as err:
        out["error"] = str(err)
    return out


@pytest.fixture(scope="module")
def results() -> dict:
    return spawn_workers(_worker, 1)[0]


@pytest.mark.parametrize("kind", ["actor", "critic"])
@pytest.mark.parametrize("micro", ["fixed", "dynamic"])
@pytest.mark.parametrize("order", ["ordered", "shuffled"])
def test_the_update_takes_the_forwards_run_ahead(results, kind, micro, order):
    own, ahead = results[f"{kind}-{micro}-{order}"]["own"], results[f"{kind}-{micro}-{order}"]["ahead"]
    assert own["forwards"] > 1 and ahead["forwards"] == 0  # the update ran none of its own
    for key, value in own["metrics"].items():
        assert ahead["metrics"][key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    for name, delta in own["delta"].items():
        scale = float(delta.abs().max()) + 1e-8
        torch.testing.assert_close(ahead["delta"][name], delta, rtol=0, atol=1e-5 * scale, msg=name)
    if kind == "critic":  # the values ahead are compute_values's (train mode, the update's micro-batches)
        values = own["values"]
        torch.testing.assert_close(
            ahead["values_ahead"], values, rtol=0, atol=1e-5 * float(values.abs().max())
        )
        assert ahead["metrics"]["critic/vf_clipfrac"] == 0.0


@pytest.mark.parametrize("kind", ["actor", "critic"])
def test_another_batch_runs_its_own_forwards(results, kind):
    other = results[f"{kind}-other-batch"]
    own = results[f"{kind}-fixed-shuffled"]["own"]
    assert other["forwards"] == own["forwards"] > 0
    for name, delta in own["delta"].items():
        scale = float(delta.abs().max()) + 1e-8
        torch.testing.assert_close(other["delta"][name], delta, rtol=0, atol=1e-5 * scale, msg=name)


def test_a_multi_pass_update_is_refused(results):
    assert results["error"] is not None and "single pass" in results["error"]
