"""vLLM rollout against the HF rollout on a GPU (marked ``gpu``; skipped without CUDA or without vLLM).

Never executed on the machines rlflow is developed on (no GPU, no vLLM); see docs/rollout.md.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu


def test_vllm_greedy_matches_hf_and_has_the_same_format(tmp_path):
    pytest.importorskip("vllm")
    from rlflow.models.tiny import save_tiny_model
    from rlflow.parallel.distributed import init_distributed
    from rlflow.rollout.hf import HFRollout
    from rlflow.rollout.vllm import VLLMRollout
    from tests.rollout._tiny import TINY, make_prompts, rollout_config, tiny_model

    init_distributed()
    path = save_tiny_model(tmp_path / "tiny", TINY, seed=0)
    model = tiny_model(seed=0).cuda()
    cfg = rollout_config(
        response_length=8, prompt_length=8, do_sample=False, calculate_log_probs=True, seed=0
    )
    prompts = make_prompts(
        [[5, 6, 7], [8, 9, 10, 11, 12]], width=8, meta_info={"eos_token_id": 2, "pad_token_id": 0}
    )
    hf_out = HFRollout(model, cfg).generate_sequences(prompts.to("cuda"))
    vllm_out = VLLMRollout(model, cfg, model_path=str(path)).generate_sequences(prompts.to("cuda"))
    assert set(vllm_out.batch.keys()) == set(hf_out.batch.keys())
    assert torch.equal(vllm_out.batch["responses"].cpu(), hf_out.batch["responses"].cpu())
    assert torch.equal(vllm_out.batch["response_mask"].cpu(), hf_out.batch["response_mask"].cpu())
    torch.testing.assert_close(
        vllm_out.batch["rollout_log_probs"].cpu(), hf_out.batch["rollout_log_probs"].cpu(), atol=1e-3, rtol=0
    )
