"""The hf engine's quantized rollouts. FP8 (``rollout.quantization=fp8``): its log-probs are those of the
trainer's FP8 forward (``fsdp_config.fp8`` recipe=blockwise) over the same tokens, not the plain model's,
and the actor's own weights and layers are left as they were; an FP8 actor with ``quantization=null``
decodes in its dtype. QAT (``actor.qat``): the rollout decodes with the quantized weights the trainer's
forward sees."""

from __future__ import annotations

import copy

import torch

from rlflow.models.fp8 import Fp8Linear, Fp8Recipe, install_fp8
from rlflow.models.qat import QATSpec, install_qat
from rlflow.rollout.hf import HFRollout

from ._tiny import full_forward_logits, make_prompts, random_token_lists, rollout_config, tiny_model

RESPONSE_LENGTH = 8


def _generate(model: torch.nn.Module, **cfg):
    config = rollout_config(
        response_length=RESPONSE_LENGTH, prompt_length=32, calculate_log_probs=True, **cfg
    )
    prompts = make_prompts(random_token_lists([5, 9, 12, 3], seed=1), 12, meta_info={"eos_token_id": 2})
    return HFRollout(model, config).generate_sequences(prompts)


def _response_log_probs(model: torch.nn.Module, out) -> torch.Tensor:
    """log p(response token) from one full forward of ``model`` over the rollout's sequences."""
    logp = torch.log_softmax(full_forward_logits(model, out), -1)
    return logp.gather(-1, out.batch["responses"][..., None]).squeeze(-1)


def test_fp8_rollout_log_probs_are_the_fp8_trainers_not_the_plain_models() -> None:
    model = tiny_model(seed=0)
    before = copy.deepcopy(model.state_dict())
    out = _generate(model, quantization="fp8")
    mask = out.batch["response_mask"].bool()
    rollout_lp = out.batch["rollout_log_probs"][mask]

    trainer = copy.deepcopy(model)
    install_fp8(trainer, Fp8Recipe("hybrid", "blockwise"))  # the gradients' format does not touch the forward
    fp8_lp = _response_log_probs(trainer, out)[mask]
    plain_lp = _response_log_probs(model, out)[mask]
    # same numerics: FP32 summation order apart (log-probs of order 1..6)
    torch.testing.assert_close(rollout_lp, fp8_lp, rtol=0, atol=1e-4)
    # and FP8's rounding is visible against the plain model (E4M3: 2^-4 relative steps)
    assert float((rollout_lp - plain_lp).abs().max()) > 1e-3

    # the actor is untouched: its layers and weights are what they were
    assert not any(isinstance(m, Fp8Linear) for m in model.modules())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_an_fp8_actor_without_quantization_decodes_in_its_dtype() -> None:
    actor = tiny_model(seed=0)
    plain = copy.deepcopy(actor)
    install_fp8(actor, Fp8Recipe("e4m3", "blockwise"))
    out = _generate(actor)  # quantization=null: the rollout computes in the plain dtype
    mask = out.batch["response_mask"].bool()
    torch.testing.assert_close(
        out.batch["rollout_log_probs"][mask], _response_log_probs(plain, out)[mask], rtol=0, atol=1e-4
    )
    assert (
        float((out.batch["rollout_log_probs"][mask] - _response_log_probs(actor, out)[mask]).abs().max())
        > 1e-3
    )


def test_a_qat_actor_decodes_with_its_quantized_weights() -> None:
    actor = tiny_model(seed=0)
    plain = copy.deepcopy(actor)
    before = copy.deepcopy(actor.state_dict())
    install_qat(actor, QATSpec("w4a16"))
    out = _generate(actor)
    mask = out.batch["response_mask"].bool()
    rollout_lp = out.batch["rollout_log_probs"][mask]
    torch.testing.assert_close(rollout_lp, _response_log_probs(actor, out)[mask], rtol=0, atol=1e-4)
    assert float((rollout_lp - _response_log_probs(plain, out)[mask]).abs().max()) > 1e-3
    assert all(torch.equal(before[k], v) for k, v in actor.state_dict().items())  # full precision kept
