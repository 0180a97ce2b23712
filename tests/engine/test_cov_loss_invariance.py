"""KL-Cov and Clip-Cov in the actor's update: the tokens they act on are chosen over the whole mini-batch,
so the loss and the reduced gradient do not depend on micro-batch size, dynamic batching, remove-padding,
FSDP world size, FSDP1 vs FSDP2 or Ulysses size (DESIGN invariant 1; the harness of `test_batch_invariance`: fp32, gloo,
SGD(lr=1) so the parameter change is the gradient)."""

from __future__ import annotations

import pytest
import torch

from rlflow.parallel.distributed import spawn_workers
from tests.engine.test_batch_invariance import _assert_grads_close, _batch, _build, _shard

VARIANTS_W1 = [("ref", dict(micro=8)), ("micro1", dict(micro=1)), ("rmpad_dyn", dict(dynamic=24, rmpad=True))]
VARIANTS_W2 = [
    ("fsdp2_w2", dict(micro=2)),
    ("fsdp1_w2", dict(micro=4, strategy="fsdp")),
    ("sp2_dyn", dict(dynamic=32, rmpad=True, sp=2)),
]
# ratios large enough that the 23 valid tokens of the batch give several selected tokens
LOSSES = {
    "vanilla": {},
    "kl_cov": dict(kl_cov_ratio=0.2, ppo_kl_coef=1.0),
    "clip_cov": dict(clip_cov_ratio=0.2, clip_cov_lb=-10.0, clip_cov_ub=10.0),
}


def _run(loss_mode: str, settings: dict, world: int) -> dict:
    from rlflow.config import config_section
    from rlflow.engine.actor import DataParallelPPOActor
    from rlflow.engine.batching import MicroBatchSpec, UpdateSpec
    from rlflow.parallel.sharded import gather_full_params

    model, dims, groups = _build("actor", settings, world)
    before = {k: v.clone() for k, v in gather_full_params(model).items()}
    data = _shard(_batch(), dims.dp_rank, dims.dp_size)
    dynamic, sp = settings.get("dynamic"), settings.get("sp", 1)
    micro = MicroBatchSpec(
        use_dynamic_bsz=dynamic is not None,
        samples_per_micro_batch=settings.get("micro"),
        max_tokens_per_rank=None if dynamic is None else dynamic * sp,
    )
    cfg = config_section(
        "actor_rollout_ref.actor",
        clip_ratio=0.2,
        policy_loss__loss_mode=loss_mode,
        **{f"policy_loss__{k}": v for k, v in LOSSES[loss_mode].items()},
    )
    actor = DataParallelPPOActor(
        cfg,
        model,
        torch.optim.SGD(model.parameters(), lr=1.0),
        update=UpdateSpec(samples_per_mini_batch=len(data), grad_clip=1.0e9, micro=micro),
        log_prob=micro,
        temperature=0.9,
        use_remove_padding=bool(settings.get("rmpad")),
        **groups,
    )
    metrics = actor.update_policy(data, step=3)
    after = gather_full_params(model)
    return {"metrics": metrics, "grad": {k: before[k] - after[k] for k in before}}


def _worker(rank: int, world: int, variants: list) -> dict:
    torch.set_num_threads(1)
    out = {}
    for loss_mode in LOSSES:
        for name, settings in variants:
            if loss_mode == "vanilla" and name != "ref":
                continue
            out[(loss_mode, name)] = _run(loss_mode, dict(settings), world)
    return out


@pytest.fixture(scope="module")
def results():
    w1 = spawn_workers(_worker, 1, args=(1, VARIANTS_W1))[0]
    w2 = spawn_workers(_worker, 2, args=(2, [(n, s) for n, s in VARIANTS_W2]))
    return w1, w2


@pytest.mark.slow
@pytest.mark.parametrize("loss_mode", ["kl_cov", "clip_cov"])
def test_selection_is_made_over_the_mini_batch(results, loss_mode):
    w1, w2 = results
    ref = w1[(loss_mode, "ref")]
    frac = ref["metrics"]["actor/pg_clipfrac"]
    assert 1 / 23 < frac < 0.5, frac  # several tokens selected, not all
    vanilla = w1[("vanilla", "ref")]["grad"]
    assert any(not torch.allclose(ref["grad"][k], vanilla[k], rtol=1e-3, atol=0) for k in vanilla)
    runs = [(name, w1[(loss_mode, name)]) for name, _ in VARIANTS_W1[1:]]
    runs += [(name, w[(loss_mode, name)]) for name, _ in VARIANTS_W2 for w in w2]
    for name, got in runs:
        assert got["metrics"]["actor/pg_clipfrac"] == pytest.approx(frac, rel=1e-6), name
        assert got["metrics"]["actor/pg_loss"] == pytest.approx(ref["metrics"]["actor/pg_loss"], rel=1e-5), (
            name
        )
        _assert_grads_close(got["grad"], ref["grad"], f"{loss_mode} {name}")
