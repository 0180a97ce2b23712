"""HFRollout from FSDP2- and FSDP1-sharded actors on 2 gloo ranks.

Each rank gets different prompts, a different response length and a different number of micro-batches,
so a rollout that ran per-layer collectives while decoding would hang. Every rank's output must equal
single-process generation of the same prompts with the same seed and dp rank.
"""

from __future__ import annotations

import torch

from rlflow.parallel.dims import ParallelDims
from rlflow.parallel.distributed import spawn_workers
from rlflow.parallel.fsdp import apply_fsdp
from rlflow.parallel.sharded import gather_full_params
from rlflow.rollout.hf import HFRollout

from ._tiny import make_prompts, random_token_lists, rollout_config, tiny_model

WORLD = 2
CONFIG = dict(
    prompt_length=16,
    response_length=12,
    temperature=0.8,
    top_k=40,
    seed=5,
    calculate_log_probs=True,
    micro_batch_size=2,
    n=2,
)
RANK_LENGTHS = {0: [6, 3, 9], 1: [4, 10, 7, 2, 5]}
RANK_META = {0: {"eos_token_id": [2, 7, 11], "response_length": 4}, 1: {"eos_token_id": 2}}


def _prompts(rank: int):
    return make_prompts(random_token_lists(RANK_LENGTHS[rank], seed=10 + rank), 12, meta_info=RANK_META[rank])


def _count_forwards(module: torch.nn.Module) -> list[int]:
    calls = [0]
    module.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def _worker(rank: int) -> dict:
    dims = ParallelDims(world_size=WORLD).build_meshes("cpu")
    result = {}
    for strategy in ("fsdp2", "fsdp"):
        sharded = apply_fsdp(tiny_model(seed=0), dims, strategy=strategy)
        calls = _count_forwards(sharded)
        rollout = HFRollout(sharded, rollout_config(**CONFIG), dp_rank=rank)
        out = rollout.generate_sequences(_prompts(rank))
        result[strategy] = {
            k: out.batch[k].clone() for k in ("responses", "response_mask", "rollout_log_probs")
        }
        result[f"{strategy}_forwards"] = calls[0]
        result[f"{strategy}_freed"] = rollout.replica is None
    # keep the replica between calls; a weight change on the shards must reach it on the next call
    sharded = apply_fsdp(tiny_model(seed=0), dims, strategy="fsdp2")
    rollout = HFRollout(sharded, rollout_config(**CONFIG, free_cache_engine=False), dp_rank=rank)
    rollout.generate_sequences(_prompts(rank))
    replica = rollout.replica
    with torch.no_grad():
        for p in sharded.parameters():
            p.to_local().mul_(0.5)
    rollout.generate_sequences(_prompts(rank))
    full = gather_full_params(sharded)
    result["kept_same_object"] = rollout.replica is replica
    result["replica_max_diff"] = max(
        float((dict(replica.named_parameters())[name] - t).abs().max()) for name, t in full.items()
    )
    return result


def test_fsdp_generation_no_hang_and_matches_single_process():
    results = spawn_workers(_worker, WORLD)
    reference_model = tiny_model(seed=0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the ranks ran with one thread: same kernels, same rounding
    try:
        for rank, res in enumerate(results):
            ref = HFRollout(reference_model, rollout_config(**CONFIG), dp_rank=rank)
            ref = ref.generate_sequences(_prompts(rank)).batch
            for strategy in ("fsdp2", "fsdp"):
                got = res[strategy]
                assert torch.equal(got["responses"], ref["responses"]), (rank, strategy)
                assert torch.equal(got["response_mask"], ref["response_mask"]), (rank, strategy)
                assert (got["rollout_log_probs"] - ref["rollout_log_probs"]).abs().max() <= 1e-5
                assert res[f"{strategy}_forwards"] == 0  # decoding never ran the sharded module
                assert res[f"{strategy}_freed"]
            assert res["kept_same_object"] and res["replica_max_diff"] == 0.0
    finally:
        torch.set_num_threads(threads)
    # the ranks really did different amounts of work
    assert results[0]["fsdp2"]["responses"].shape == (6, 4)
    assert results[1]["fsdp2"]["responses"].shape == (10, 12)
