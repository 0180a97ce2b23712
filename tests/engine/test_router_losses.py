"""A mixture-of-experts actor's router losses (``moe_aux_loss_coef`` / ``moe_z_loss_coef``, Megatron's
``moe_aux_loss_coeff`` / ``moe_z_loss_coeff``) in the FSDP2 update: the weight change equals the gradient
of the router losses computed independently on an unsharded copy, padded and packed alike."""

from __future__ import annotations

import pytest
import torch

from rlflow.parallel.distributed import spawn_workers
from tests.engine.test_batch_invariance import VOCAB, _batch
from tests.tiny_moe_model import tiny_moe_config

AUX, Z = 0.5, 0.05


def _moe_model():
    from transformers import Qwen3MoeForCausalLM

    torch.manual_seed(3)
    cfg = tiny_moe_config(VOCAB, 32, 64)
    cfg._attn_implementation = "sdpa"
    return Qwen3MoeForCausalLM(cfg).float()


def _reference(data) -> dict:
    """Router losses of the whole batch on the unsharded model, and their gradient (one micro-batch)."""
    from rlflow.algos.moe import router_losses

    model = _moe_model()
    mask = data.batch["attention_mask"]
    out = model(
        input_ids=data.batch["input_ids"],
        attention_mask=mask,
        position_ids=data.batch["position_ids"],
        use_cache=False,
        output_router_logits=True,
    )
    aux, z = router_losses(list(out.router_logits), 2, mask.reshape(-1).bool())
    (AUX * aux + Z * z).backward()
    return {
        "aux": aux.item(),
        "z": z.item(),
        "grad": {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
        "weights_max": {n: p.detach().abs().max().item() for n, p in model.named_parameters()},
    }


def _update(rmpad: bool, micro: int) -> dict:
    from rlflow.config import config_section
    from rlflow.engine.actor import DataParallelPPOActor
    from rlflow.engine.batching import MicroBatchSpec, UpdateSpec
    from rlflow.models.attention import set_packed_attention
    from rlflow.parallel.dims import ParallelDims
    from rlflow.parallel.fsdp import apply_fsdp
    from rlflow.parallel.sharded import gather_full_params

    model = _moe_model()
    if rmpad:
        set_packed_attention(model)
    dims = ParallelDims(world_size=1, num_attention_heads=4, num_key_value_heads=2)
    dims.build_meshes("cpu")
    model = apply_fsdp(model, dims, strategy="fsdp2")
    before = {k: v.clone() for k, v in gather_full_params(model).items()}
    spec = MicroBatchSpec(samples_per_micro_batch=micro)
    cfg = config_section(
        "actor_rollout_ref.actor",
        use_kl_loss=False,
        entropy_coeff=0.0,
        moe_aux_loss_coef=AUX,
        moe_z_loss_coef=Z,
    )
    actor = DataParallelPPOActor(
        cfg,
        model,
        torch.optim.SGD(model.parameters(), lr=1.0),
        update=UpdateSpec(samples_per_mini_batch=8, grad_clip=1.0e9, micro=spec),
        log_prob=spec,
        use_remove_padding=rmpad,
        dp_group=dims.ulysses_mesh["dp"].get_group(),
        sync_group=torch.distributed.group.WORLD,
        router_top_k=2,
    )
    data = _batch()
    data.batch["advantages"] = torch.zeros_like(data.batch["advantages"])  # only the router losses move it
    data.batch["old_log_probs"] = actor.compute_log_prob(data)[0]
    metrics = actor.update_policy(data)
    after = gather_full_params(model)
    return {"metrics": metrics, "delta": {k: before[k] - after[k] for k in before}}


def _worker(rank: int) -> dict:
    return {
        "reference": _reference(_batch()),
        "padded": _update(rmpad=False, micro=8),
        "packed": _update(rmpad=True, micro=8),
        "packed_micro4": _update(rmpad=True, micro=4),
    }


@pytest.fixture(scope="module")
def results() -> dict:
    return spawn_workers(_worker, 1)[0]


@pytest.mark.parametrize("variant", ["padded", "packed"])
def test_the_update_is_the_router_losses_gradient(results, variant):
    ref, got = results["reference"], results[variant]
    assert got["metrics"]["actor/moe_aux_loss"] == pytest.approx(ref["aux"], rel=1e-5)
    assert got["metrics"]["actor/moe_z_loss"] == pytest.approx(ref["z"], rel=1e-5)
    gates = [name for name in ref["grad"] if name.endswith("mlp.gate.weight")]
    assert len(gates) == 2 and all(ref["grad"][n].abs().max() > 1e-4 for n in gates)
    for name, grad in ref["grad"].items():  # SGD with lr 1: the weight change is the gradient
        # measured as before - after on fp32 weights: resolution is the weights' ulp (1.2e-7 at the norms' 1.0)
        ulp = torch.finfo(torch.float32).eps * max(1.0, ref["weights_max"][name])
        torch.testing.assert_close(got["delta"][name], grad, atol=2 * ulp, rtol=1e-4)


def test_micro_batches_weigh_their_router_losses_by_their_tokens(results):
    """Megatron's losses are per micro-batch: two micro-batches give the token-weighted mean of theirs,
    close to (not equal to) the whole batch's."""
    from rlflow.algos.moe import router_losses

    data, model = _batch(), _moe_model()
    mask = data.batch["attention_mask"]
    parts = []
    with torch.no_grad():
        for rows in (slice(0, 4), slice(4, 8)):
            out = model(
                input_ids=data.batch["input_ids"][rows],
                attention_mask=mask[rows],
                position_ids=data.batch["position_ids"][rows],
                use_cache=False,
                output_router_logits=True,
            )
            aux, _ = router_losses(list(out.router_logits), 2, mask[rows].reshape(-1).bool())
            parts.append((aux.item(), float(mask[rows].sum())))
    expected = sum(a * n for a, n in parts) / sum(n for _, n in parts)
    assert results["packed_micro4"]["metrics"]["actor/moe_aux_loss"] == pytest.approx(expected, rel=1e-5)
