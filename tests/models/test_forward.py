"""forward_micro_batch: padded == remove-padding == Ulysses SP 2 == per-sequence reference, outputs and gradients.

Tiny fp32 Qwen2 (hidden 32, 2 layers, 4 heads, 2 kv heads) built in code; a micro-batch of 4 sequences with
left-padded prompts and right-padded responses of different lengths.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from tensordict import TensorDict
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2ForTokenClassification

from rlflow.models.attention import (
    PACKED_ATTENTION,
    check_ulysses_heads,
    cu_seqlens_from_position_ids,
    packed_sequence_lengths,
)
from rlflow.models.forward import forward_micro_batch, last_valid_index
from rlflow.parallel.distributed import spawn_workers

PROMPT_LENS = [6, 3, 4, 1]
RESPONSE_LENS = [5, 2, 4, 2]  # 27 valid tokens: odd, so Ulysses SP 2 pads the packed row by 1
PROMPT_LEN, RESPONSE_LEN = 6, 5
RTOL, ATOL = 1e-5, 1e-6


def _config(num_key_value_heads: int = 2, attn: str = PACKED_ATTENTION) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=300,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=64,
        num_labels=1,
        classifier_dropout=0.0,
        pad_token_id=0,
        attn_implementation=attn,
    )


def _models(
    num_key_value_heads: int = 2, attn: str = PACKED_ATTENTION
) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    actor = Qwen2ForCausalLM(_config(num_key_value_heads, attn)).eval()
    torch.manual_seed(1)
    critic = Qwen2ForTokenClassification(_config(num_key_value_heads, attn)).eval()
    with torch.no_grad():  # a larger value head than the 0.02-std init, so values are O(1)
        critic.score.weight.mul_(20.0)
    return actor, critic


def _batch() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    bs, seqlen = len(PROMPT_LENS), PROMPT_LEN + RESPONSE_LEN
    input_ids = torch.zeros(bs, seqlen, dtype=torch.long)
    mask = torch.zeros(bs, seqlen, dtype=torch.long)
    for i, (p, r) in enumerate(zip(PROMPT_LENS, RESPONSE_LENS)):
        mask[i, PROMPT_LEN - p : PROMPT_LEN + r] = 1
    input_ids[mask.bool()] = torch.randint(3, 300, (int(mask.sum()),), generator=gen)
    return {
        "input_ids": input_ids,
        "attention_mask": mask,
        "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        "responses": input_ids[:, PROMPT_LEN:],
        "response_mask": mask[:, PROMPT_LEN:],
    }


def _reference_log_probs(actor: torch.nn.Module, batch: dict, temperature: float) -> dict[str, torch.Tensor]:
    """Independent reference: each sequence alone (no padding), log_softmax at the position before each token."""
    out = {
        "log_probs": torch.zeros(len(PROMPT_LENS), RESPONSE_LEN),
        "entropy": torch.zeros(len(PROMPT_LENS), RESPONSE_LEN),
    }
    for i, (p, r) in enumerate(zip(PROMPT_LENS, RESPONSE_LENS)):
        ids = batch["input_ids"][i][batch["attention_mask"][i].bool()][None]
        logp = torch.log_softmax(actor(ids, use_cache=False).logits[0] / temperature, dim=-1)[
            p - 1 : p + r - 1
        ]
        out["log_probs"][i, :r] = logp.gather(-1, ids[0, p : p + r, None])[:, 0]
        out["entropy"][i, :r] = -(logp.exp() * logp).sum(-1)
    return out


def _loss(outputs: dict[str, torch.Tensor], response_mask: torch.Tensor) -> torch.Tensor:
    weights = torch.linspace(0.5, 1.5, response_mask.numel()).reshape(response_mask.shape) * response_mask
    loss = sum((v * weights).sum() for k, v in outputs.items() if k != "scores")
    return loss + outputs.get("scores", torch.zeros(())).sum()


def _outputs_and_grads(module, batch, **kwargs) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    module.zero_grad(set_to_none=True)
    out = forward_micro_batch(module, batch, **kwargs)
    _loss(out, batch["response_mask"]).backward()
    grads = {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}
    return {k: v.detach() for k, v in out.items()}, grads


def _masked(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return x * mask


def _assert_grads_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    """rtol 1e-5 per element, with atol 1e-5 of the tensor's largest entry for entries near cancellation."""
    assert a.keys() == b.keys() and len(a) > 10
    for name in a:
        atol = RTOL * float(b[name].abs().max())
        torch.testing.assert_close(a[name], b[name], rtol=RTOL, atol=atol, msg=lambda m, n=name: f"{n}: {m}")


def test_packed_sequence_layout() -> None:
    pos = torch.tensor([[0, 1, 2, 0, 0, 1, 0, 1, 2, 3]])
    assert packed_sequence_lengths(pos) == [[3, 1, 2, 4]]
    cu, max_len = cu_seqlens_from_position_ids(pos)
    assert cu.tolist() == [0, 3, 4, 6, 10] and max_len == 4
    assert last_valid_index(torch.tensor([[0, 1, 1, 0], [1, 1, 1, 1]])).tolist() == [2, 3]


def test_check_ulysses_heads_names_the_key() -> None:
    check_ulysses_heads(4, 2, 2)
    check_ulysses_heads(4, 1, 2)  # kv heads repeated
    with pytest.raises(
        ValueError, match="ulysses_sequence_parallel_size=3 must divide num_attention_heads=4"
    ):
        check_ulysses_heads(4, 2, 3)
    with pytest.raises(
        ValueError, match="ulysses_sequence_parallel_size=4 must divide num_key_value_heads=6"
    ):
        check_ulysses_heads(8, 6, 4)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_log_probs_match_per_sequence_reference(temperature: float) -> None:
    actor, _ = _models()
    batch = _batch()
    with torch.no_grad():
        ref = _reference_log_probs(actor, batch, temperature)
        for rmpad in (False, True):
            out = forward_micro_batch(
                actor,
                batch,
                output="log_probs",
                use_remove_padding=rmpad,
                temperature=temperature,
                calculate_entropy=True,
            )
            for key in ("log_probs", "entropy"):
                torch.testing.assert_close(
                    _masked(out[key], batch["response_mask"]), ref[key], rtol=RTOL, atol=ATOL
                )


def test_remove_padding_equals_padded_log_probs_entropy_and_grads() -> None:
    actor, _ = _models()
    batch = _batch()
    kw = {"output": "log_probs", "temperature": 0.8, "calculate_entropy": True}
    out_pad, grads_pad = _outputs_and_grads(actor, batch, use_remove_padding=False, **kw)
    out_rm, grads_rm = _outputs_and_grads(actor, batch, use_remove_padding=True, **kw)
    mask = batch["response_mask"]
    assert out_rm["entropy"].shape == (4, RESPONSE_LEN)
    for key in ("log_probs", "entropy"):
        torch.testing.assert_close(
            _masked(out_rm[key], mask), _masked(out_pad[key], mask), rtol=RTOL, atol=ATOL
        )
    _assert_grads_close(grads_rm, grads_pad)


def test_remove_padding_equals_padded_values_and_scores() -> None:
    _, critic = _models()
    batch = _batch()
    out_pad, grads_pad = _outputs_and_grads(critic, batch, output="values", use_remove_padding=False)
    out_rm, grads_rm = _outputs_and_grads(critic, batch, output="values", use_remove_padding=True)
    mask = batch["response_mask"]
    torch.testing.assert_close(
        _masked(out_rm["values"], mask), _masked(out_pad["values"], mask), rtol=RTOL, atol=ATOL
    )
    _assert_grads_close(grads_rm, grads_pad)
    with torch.no_grad():  # per-sequence reference: value at the position before each response token
        for i, (p, r) in enumerate(zip(PROMPT_LENS, RESPONSE_LENS)):
            ids = batch["input_ids"][i][batch["attention_mask"][i].bool()][None]
            ref = critic(ids, use_cache=False).logits[0, :, 0]
            torch.testing.assert_close(out_rm["values"][i, :r], ref[p - 1 : p + r - 1], rtol=RTOL, atol=ATOL)
            scores = [
                forward_micro_batch(critic, batch, output="scores", use_remove_padding=rm)["scores"][i]
                for rm in (False, True)
            ]
            torch.testing.assert_close(scores[0], ref[-1], rtol=RTOL, atol=ATOL)
            torch.testing.assert_close(scores[1], ref[-1], rtol=RTOL, atol=ATOL)


def test_sdpa_model_also_packs_with_use_cache_false() -> None:
    actor, _ = _models(attn="sdpa")
    batch = _batch()
    with torch.no_grad():
        out = forward_micro_batch(actor, batch, output="log_probs", use_remove_padding=True)
        ref = _reference_log_probs(actor, batch, 1.0)["log_probs"]
    torch.testing.assert_close(_masked(out["log_probs"], batch["response_mask"]), ref, rtol=RTOL, atol=ATOL)


def test_a_packed_attention_model_called_on_a_batch_without_positions_computes_the_sdpa_model() -> None:
    """A user calling the trained module on a (b, s) batch directly (no ``position_ids``; transformers then
    gives one shared (1, s) row of positions) gets every row attended, as with ``sdpa``: it used to attend
    the first row only and fail on the output's shape."""
    packed, _ = _models()
    sdpa, _ = _models(attn="sdpa")
    ids = torch.randint(3, 300, (3, 7), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = sdpa(input_ids=ids, use_cache=False).logits
        for kwargs in ({}, {"attention_mask": torch.ones_like(ids)}):
            got = packed(input_ids=ids, use_cache=False, **kwargs).logits
            torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)


def test_tensordict_micro_batch() -> None:
    actor, _ = _models()
    batch = _batch()
    with torch.no_grad():
        ref = forward_micro_batch(actor, batch, output="log_probs", use_remove_padding=True)["log_probs"]
        td = TensorDict(batch, batch_size=[len(PROMPT_LENS)])
        out = forward_micro_batch(actor, td, output="log_probs", use_remove_padding=True)["log_probs"]
    assert torch.equal(out, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_remove_padding_on_cuda(dtype: torch.dtype) -> None:
    """fp32: per-sequence SDPA on CUDA; bf16: flash-attn varlen when installed (looser tolerance)."""
    actor, _ = _models()
    actor = actor.to("cuda", dtype)
    batch = {k: v.cuda() for k, v in _batch().items()}
    with torch.no_grad():
        pad = forward_micro_batch(actor, batch, output="log_probs", use_remove_padding=False)["log_probs"]
        rm = forward_micro_batch(actor, batch, output="log_probs", use_remove_padding=True)["log_probs"]
    tol = {"rtol": RTOL, "atol": ATOL} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    mask = batch["response_mask"]
    torch.testing.assert_close(_masked(rm, mask), _masked(pad, mask), **tol)


def test_invalid_arguments() -> None:
    actor, _ = _models()
    batch = _batch()
    with pytest.raises(ValueError, match="output must be one of"):
        forward_micro_batch(actor, batch, output="logits")
    with pytest.raises(ValueError, match="missing"):
        forward_micro_batch(actor, {k: v for k, v in batch.items() if k != "responses"}, output="log_probs")
    with pytest.raises(ValueError, match="temperature"):
        forward_micro_batch(actor, batch, output="log_probs", temperature=0.0)


def _sp_worker(rank: int) -> dict:
    """Ulysses SP 2 over the whole (2-rank) world: both ranks run the same micro-batch."""
    group = dist.group.WORLD
    actor, critic = _models()
    batch = _batch()
    kw = {"use_remove_padding": True, "sp_group": group}
    lp = _outputs_and_grads(actor, batch, output="log_probs", temperature=0.8, calculate_entropy=True, **kw)
    values = _outputs_and_grads(critic, batch, output="values", **kw)
    with torch.no_grad():
        scores = forward_micro_batch(critic, batch, output="scores", **kw)["scores"]
        actor_kv1, _ = _models(num_key_value_heads=1)  # 1 kv head: repeated to 2 before the all-to-all
        lp_kv1 = forward_micro_batch(actor_kv1, batch, output="log_probs", **kw)["log_probs"]
    errors = []
    sdpa_actor, _ = _models(attn="sdpa")
    for module, extra in ((sdpa_actor, {}), (actor, {"use_remove_padding": False})):
        try:
            forward_micro_batch(module, batch, output="log_probs", **{**kw, **extra})
        except ValueError as exc:
            errors.append(str(exc))
    return {"log_probs": lp, "values": values, "scores": scores, "lp_kv1": lp_kv1, "errors": errors}


def _mean_over_ranks(per_rank: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """What FSDP's gradient averaging over the SP ranks computes."""
    return {name: sum(g[name] for g in per_rank) / len(per_rank) for name in per_rank[0]}


def test_ulysses_sp2_matches_sp1_outputs_and_averaged_grads() -> None:
    results = spawn_workers(_sp_worker, 2)
    actor, critic = _models()
    batch = _batch()
    mask = batch["response_mask"]
    ref_lp = _outputs_and_grads(
        actor, batch, output="log_probs", temperature=0.8, calculate_entropy=True, use_remove_padding=True
    )
    ref_values = _outputs_and_grads(critic, batch, output="values", use_remove_padding=True)
    with torch.no_grad():
        ref_scores = forward_micro_batch(critic, batch, output="scores", use_remove_padding=True)["scores"]
        ref_kv1 = forward_micro_batch(_models(1)[0], batch, output="log_probs", use_remove_padding=True)[
            "log_probs"
        ]
    for key, ref in (("log_probs", ref_lp), ("values", ref_values)):
        for res in results:  # every SP rank holds the full outputs
            for name, value in ref[0].items():
                torch.testing.assert_close(
                    _masked(res[key][0][name], mask), _masked(value, mask), rtol=RTOL, atol=ATOL
                )
        _assert_grads_close(_mean_over_ranks([res[key][1] for res in results]), ref[1])
        name = "model.layers.0.self_attn.q_proj.weight"  # each rank alone holds only its slice's share
        assert not torch.allclose(results[0][key][1][name], ref[1][name], rtol=1e-2)
    for res in results:
        torch.testing.assert_close(res["scores"], ref_scores, rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(_masked(res["lp_kv1"], mask), _masked(ref_kv1, mask), rtol=RTOL, atol=ATOL)
        assert "needs attn_implementation='rlflow_packed'" in res["errors"][0]
        assert "needs use_remove_padding=True" in res["errors"][1]


def _sp_checkpointing_worker(rank: int) -> dict:
    """FSDP2 over 2 ranks, Ulysses SP 2, gradient checkpointing on: the production wrapping path."""
    from rlflow.parallel.dims import ParallelDims
    from rlflow.parallel.fsdp import apply_fsdp
    from rlflow.parallel.sharded import gather_full_grads

    dims = ParallelDims(world_size=2, ulysses_sequence_parallel_size=2).build_meshes("cpu")
    group = dims.ulysses_mesh["sp"].get_group()
    out = {}
    for name, module, output in zip(("actor", "critic"), _models(), ("log_probs", "values")):
        wrapped = apply_fsdp(module.train(), dims, enable_gradient_checkpointing=True)
        batch = _batch()
        result = forward_micro_batch(wrapped, batch, output=output, use_remove_padding=True, sp_group=group)
        _loss(result, batch["response_mask"]).backward()
        out[name] = ({k: v.detach() for k, v in result.items()}, gather_full_grads(wrapped))
    return out


def test_ulysses_sp2_with_gradient_checkpointing_matches_the_plain_forward() -> None:
    """Recomputation in backward runs inside the SP group of the forward (verl's sp2 example enables both)."""
    results = spawn_workers(_sp_checkpointing_worker, 2)
    actor, critic = _models()
    batch = _batch()
    mask = batch["response_mask"]
    for name, module, output in (("actor", actor, "log_probs"), ("critic", critic, "values")):
        ref_out, ref_grads = _outputs_and_grads(module, batch, output=output, use_remove_padding=True)
        for res in results:
            got_out, got_grads = res[name]
            torch.testing.assert_close(
                _masked(got_out[output], mask), _masked(ref_out[output], mask), rtol=RTOL, atol=ATOL
            )
            _assert_grads_close(got_grads, ref_grads)
