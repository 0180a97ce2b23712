"""HFRollout on a plain tiny Qwen2 (fp32): output format, masks, n-interleaving, seeding, numerics."""

from __future__ import annotations

import pytest
import torch

from rlflow.protocol import DataProto
from rlflow.rollout import fast_decode, hf
from rlflow.rollout.hf import HFRollout

from ._tiny import PAD_ID, full_forward_logits, make_prompts, random_token_lists, rollout_config, tiny_model

LENGTHS = [5, 9, 3, 12]
WIDTH = 12
RESPONSE_LENGTH = 8


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return tiny_model(seed=0)


@pytest.fixture(scope="module")
def tokens() -> list[list[int]]:
    return random_token_lists(LENGTHS, seed=1)


def _generate(model, token_lists, width=WIDTH, meta=None, non_tensors=None, **cfg) -> DataProto:
    config = rollout_config(**{"response_length": RESPONSE_LENGTH, "prompt_length": 32, **cfg})
    prompts = make_prompts(token_lists, width, meta_info=meta, non_tensors=non_tensors)
    return HFRollout(model, config).generate_sequences(prompts)


def _greedy(model, token_lists, eos, **kw) -> DataProto:
    return _generate(
        model, token_lists, meta={"eos_token_id": eos}, do_sample=False, calculate_log_probs=True, **kw
    )


def _first_eos_truncation(base: torch.Tensor, eos: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference: cut each greedy row after its first ``eos``, pad the rest; mask 1 up to it."""
    responses, mask = base.clone(), torch.ones_like(base)
    for r in range(base.shape[0]):
        hits = (base[r] == eos).nonzero()
        if len(hits):
            k = int(hits[0])
            responses[r, k + 1 :] = PAD_ID
            mask[r, k + 1 :] = 0
    return responses, mask


def test_output_format(model, tokens):
    out = _generate(model, tokens, meta={"eos_token_id": 2}, calculate_log_probs=True)
    b = out.batch
    bs, total = len(LENGTHS), WIDTH + RESPONSE_LENGTH
    assert tuple(b["prompts"].shape) == (bs, WIDTH) and tuple(b["responses"].shape) == (bs, RESPONSE_LENGTH)
    for key in ("input_ids", "attention_mask", "position_ids"):
        assert tuple(b[key].shape) == (bs, total), key
    assert tuple(b["rollout_log_probs"].shape) == (bs, RESPONSE_LENGTH)
    assert torch.equal(b["input_ids"], torch.cat([b["prompts"], b["responses"]], dim=1))
    prompt_in = make_prompts(tokens, WIDTH).batch
    assert torch.equal(b["prompts"], prompt_in["input_ids"])
    assert torch.equal(b["attention_mask"][:, :WIDTH], prompt_in["attention_mask"])
    assert torch.equal(b["attention_mask"][:, WIDTH:], b["response_mask"])
    # positions continue after the last prompt position: prompt of length L ends at L - 1
    expected = torch.tensor(LENGTHS)[:, None] - 1 + torch.arange(1, RESPONSE_LENGTH + 1)
    assert torch.equal(b["position_ids"][:, WIDTH:], expected)
    assert "rollout_log_probs" not in _generate(model, tokens, meta={"eos_token_id": 2}).batch.keys()


def test_masks_eos_middle_none_and_first(model, tokens):
    # no EOS: pick an id the greedy responses never produce
    probe = _greedy(model, tokens, eos=2).batch["responses"]
    unused = next(i for i in range(3, 272) if not bool((probe == i).any()))
    none = _greedy(model, tokens, eos=unused).batch
    base = none["responses"]
    assert torch.equal(none["response_mask"], torch.ones(len(LENGTHS), RESPONSE_LENGTH, dtype=torch.int64))
    assert bool((none["rollout_log_probs"] < 0).all())

    # EOS in the middle of row r: the token at position 3 (absent from positions 0..2)
    r = next(i for i in range(len(LENGTHS)) if int(base[i, 3]) not in base[i, :3].tolist())
    eos_mid = int(base[r, 3])
    mid = _greedy(model, tokens, eos=eos_mid).batch
    assert mid["response_mask"][r].tolist() == [1, 1, 1, 1, 0, 0, 0, 0]
    assert mid["responses"][r].tolist() == [*base[r, :4].tolist(), PAD_ID, PAD_ID, PAD_ID, PAD_ID]
    assert mid["rollout_log_probs"][r, 4:].tolist() == [0.0] * 4
    assert torch.equal(mid["rollout_log_probs"][r, :4], none["rollout_log_probs"][r, :4])
    ref_resp, ref_mask = _first_eos_truncation(base, eos_mid)
    assert torch.equal(mid["responses"], ref_resp) and torch.equal(mid["response_mask"], ref_mask)

    # EOS as the very first token of row 0
    eos_first = int(base[0, 0])
    first = _greedy(model, tokens, eos=eos_first).batch
    assert first["response_mask"][0].tolist() == [1, 0, 0, 0, 0, 0, 0, 0]
    assert first["responses"][0].tolist() == [eos_first] + [PAD_ID] * 7
    ref_resp, ref_mask = _first_eos_truncation(base, eos_first)
    assert torch.equal(first["responses"], ref_resp) and torch.equal(first["response_mask"], ref_mask)

    # every row stops at its first token (list of EOS ids): decoding ends early, width stays the same
    all_first = _greedy(model, tokens, eos=base[:, 0].tolist()).batch
    assert all_first["response_mask"].tolist() == [[1] + [0] * 7] * len(LENGTHS)
    assert torch.equal(all_first["responses"][:, 0], base[:, 0])
    assert bool((all_first["responses"][:, 1:] == PAD_ID).all())


def test_n_interleaves_and_matches_manual_repeat(model, tokens):
    uids = ["a", "b", "c", "d"]
    kw = {"temperature": 1.0, "top_k": 50, "seed": 3, "calculate_log_probs": True}
    out = _generate(model, tokens, meta={"eos_token_id": 2}, non_tensors={"uid": uids}, n=3, **kw)
    assert list(out.non_tensor_batch["uid"]) == [u for u in uids for _ in range(3)]
    prompts_in = make_prompts(tokens, WIDTH).batch["input_ids"]
    assert torch.equal(out.batch["prompts"], prompts_in.repeat_interleave(3, dim=0))
    # the same as n=1 on prompts repeated by hand (row i gets row i's sampling stream)
    manual = _generate(model, [t for t in tokens for _ in range(3)], meta={"eos_token_id": 2}, n=1, **kw)
    assert torch.equal(out.batch["responses"], manual.batch["responses"])
    assert torch.equal(out.batch["rollout_log_probs"], manual.batch["rollout_log_probs"])
    # the three samples of a prompt are different draws
    groups = out.batch["responses"].reshape(len(uids), 3, RESPONSE_LENGTH)
    assert all(not torch.equal(g[0], g[1]) and not torch.equal(g[1], g[2]) for g in groups)


@pytest.mark.parametrize(("micro_batch_size", "prefill_rows"), [(None, [4]), (6, [2, 2]), (4, [4, 4, 4])])
def test_n_samples_share_one_prefill(model, tokens, micro_batch_size, prefill_rows):
    """The n samples of a prompt are prefilled once (the KV cache and first logits are repeated) when a
    micro-batch holds whole groups; otherwise (4 rows for n=3) each repeated row is prefilled. Either
    way the samples are those of prompts repeated by hand."""
    seen: list[int] = []

    def record_prefill(_module, _args, kwargs):
        if kwargs["input_ids"].shape[1] > 1:
            seen.append(kwargs["input_ids"].shape[0])

    kw = {"temperature": 1.0, "seed": 5, "calculate_log_probs": True, "micro_batch_size": micro_batch_size}
    # an EOS id that some of these samples draw early, so rows leave the repeated cache mid-way
    probe = _generate(model, tokens, meta={"eos_token_id": 2}, n=3, **kw).batch["responses"]
    meta = {"eos_token_id": int(probe[:, 1:4].flatten().mode().values)}
    handle = model.register_forward_pre_hook(record_prefill, with_kwargs=True)
    try:
        out = _generate(model, tokens, meta=meta, n=3, **kw).batch
    finally:
        handle.remove()
    assert seen == prefill_rows
    manual = _generate(model, [t for t in tokens for _ in range(3)], meta=meta, **kw).batch
    assert torch.equal(out["responses"], manual["responses"])
    assert torch.equal(out["response_mask"], manual["response_mask"])
    assert (out["response_mask"] == 0).any()  # some rows finished early: the repeated cache drops rows too
    assert (out["rollout_log_probs"] - manual["rollout_log_probs"]).abs().max() <= 1e-6


def test_seeded_determinism_and_micro_batch_invariance(model, tokens):
    kw = {"temperature": 0.9, "top_p": 0.95, "calculate_log_probs": True, "seed": 11}
    meta = {"eos_token_id": 2, "global_steps": 4}
    a = _generate(model, tokens, meta=meta, **kw).batch
    b = _generate(model, tokens, meta=meta, **kw).batch
    assert torch.equal(a["responses"], b["responses"])
    assert torch.equal(a["rollout_log_probs"], b["rollout_log_probs"])
    micro = _generate(model, tokens, meta=meta, micro_batch_size=3, **kw).batch
    assert torch.equal(a["responses"], micro["responses"])
    assert (a["rollout_log_probs"] - micro["rollout_log_probs"]).abs().max() <= 1e-5
    other_seed = _generate(model, tokens, meta=meta, **{**kw, "seed": 12}).batch
    other_step = _generate(model, tokens, meta={**meta, "global_steps": 5}, **kw).batch
    assert not torch.equal(a["responses"], other_seed["responses"])
    assert not torch.equal(a["responses"], other_step["responses"])
    # without global_steps, successive calls of one engine draw fresh samples; a new engine restarts
    rollout = HFRollout(model, rollout_config(response_length=RESPONSE_LENGTH, prompt_length=32, **kw))
    prompts = make_prompts(tokens, WIDTH, meta_info={"eos_token_id": 2})
    first, second = rollout.generate_sequences(prompts), rollout.generate_sequences(prompts)
    assert not torch.equal(first.batch["responses"], second.batch["responses"])
    again = HFRollout(
        model, rollout_config(response_length=RESPONSE_LENGTH, prompt_length=32, **kw)
    ).generate_sequences(prompts)
    assert torch.equal(first.batch["responses"], again.batch["responses"])


def test_greedy_equals_argmax_of_full_forward(model, tokens):
    out = _greedy(model, tokens, eos=2)
    logits = full_forward_logits(model, out)
    mask = out.batch["response_mask"].bool()
    assert torch.equal(logits.argmax(-1)[mask], out.batch["responses"][mask])
    ref = torch.log_softmax(logits, -1).gather(-1, out.batch["responses"].unsqueeze(-1)).squeeze(-1)
    assert (ref[mask] - out.batch["rollout_log_probs"][mask]).abs().max() <= 1e-5


def test_rollout_log_probs_match_fresh_forward(model, tokens):
    temperature = 0.7
    out = _generate(
        model,
        tokens,
        meta={"eos_token_id": [2, 5, 9]},
        temperature=temperature,
        top_k=20,
        top_p=0.9,
        n=2,
        calculate_log_probs=True,
    )
    logits = full_forward_logits(model, out)
    ref = (
        torch.log_softmax(logits / temperature, -1)
        .gather(-1, out.batch["responses"].unsqueeze(-1))
        .squeeze(-1)
    )
    mask = out.batch["response_mask"].bool()
    lp = out.batch["rollout_log_probs"]
    assert (ref[mask] - lp[mask]).abs().max() <= 1e-5
    assert bool((lp[~mask] == 0).all())


@pytest.mark.parametrize("packed", [False, True], ids=["mkl", "onednn"])
def test_entropy_and_log_probs_on_request_match_fresh_forward(model, tokens, packed, monkeypatch):
    """``meta_info`` ``calculate_log_probs`` / ``calculate_entropy`` (what the trainer asks for when the
    rollout's log-probs stand for the old policy's): the full distribution's entropy at the log-prob
    temperature, by hand from one fresh forward, with top-k / top-p on for the pick only. ``onednn``:
    every projection of the decoding steps through oneDNN's packed kernel (the tiny model's weights are
    below the size that is packed by default)."""
    if packed:
        if not fast_decode.packed_projections_available():
            pytest.skip("this torch build has no oneDNN")
        monkeypatch.setattr(fast_decode, "PACK_MIN_BYTES", 0)
    decoders = []
    build = hf.fast_decoder_for
    monkeypatch.setattr(hf, "fast_decoder_for", lambda m: decoders.append(build(m)) or decoders[-1])
    temperature = 0.7
    plain = _generate(model, tokens, meta={"eos_token_id": [2, 5, 9]}, temperature=temperature, top_k=20)
    assert "rollout_log_probs" not in plain.batch.keys() and "rollout_entropy" not in plain.batch.keys()
    meta = {"eos_token_id": [2, 5, 9], "calculate_log_probs": True, "calculate_entropy": True}
    out = _generate(model, tokens, meta=meta, temperature=temperature, top_k=20, top_p=0.9, n=2)
    logp = torch.log_softmax(full_forward_logits(model, out) / temperature, -1)
    ref = -(logp.exp() * logp).sum(-1)
    mask = out.batch["response_mask"].bool()
    ent = out.batch["rollout_entropy"]
    assert float(ref[mask].min()) > 0.5  # a spread distribution: the check is not of zeros
    assert (ref[mask] - ent[mask]).abs().max() <= 1e-5
    assert bool((ent[~mask] == 0).all())
    lp = logp.gather(-1, out.batch["responses"].unsqueeze(-1)).squeeze(-1)
    assert (lp[mask] - out.batch["rollout_log_probs"][mask]).abs().max() <= 1e-5
    assert decoders and all(d.lm_head.packed == packed for d in decoders)


def test_left_padding_invariance(model, tokens):
    target = tokens[0]
    others = random_token_lists([4, 7], seed=5)
    kw = {"calculate_log_probs": True, "meta": {"eos_token_id": 2}}
    narrow = _generate(model, [target, *others], width=8, do_sample=False, **kw).batch
    wide = _generate(model, [target, *others], width=30, do_sample=False, **kw).batch
    assert torch.equal(narrow["responses"], wide["responses"])
    assert (narrow["rollout_log_probs"] - wide["rollout_log_probs"]).abs().max() <= 1e-5
    # sampled rows do not depend on the padding either (same row index -> same stream)
    s_narrow = _generate(model, [target, *others], width=8, seed=2, **kw).batch
    s_wide = _generate(model, [target, *others], width=30, seed=2, **kw).batch
    assert torch.equal(s_narrow["responses"], s_wide["responses"])


def test_validate_uses_val_kwargs(model, tokens):
    kw = {"n": 4, "temperature": 1.0, "calculate_log_probs": True}
    val = _generate(model, tokens, meta={"eos_token_id": 2, "validate": True}, **kw)
    greedy = _greedy(model, tokens, eos=2)
    assert len(val) == len(LENGTHS)  # val_kwargs.n = 1
    assert torch.equal(val.batch["responses"], greedy.batch["responses"])
    short = _generate(model, tokens, meta={"eos_token_id": 2, "response_length": 3, "n": 2}, **kw)
    assert tuple(short.batch["responses"].shape) == (2 * len(LENGTHS), 3)


def test_training_mode_is_restored(model, tokens):
    model.train()
    try:
        _generate(model, tokens[:1], meta={"eos_token_id": 2}, response_length=2)
        assert model.training
    finally:
        model.eval()


@pytest.mark.parametrize("use_remove_padding", [False, True])
def test_rollout_trainer_agreement(model, tokens, use_remove_padding):
    """The actor's compute_log_prob on the generated sequences equals the rollout's own log-probs."""
    from rlflow.engine.actor import DataParallelPPOActor

    temperature = 0.7
    out = _generate(
        model,
        tokens,
        meta={"eos_token_id": 2},
        temperature=temperature,
        top_p=0.9,
        n=2,
        calculate_log_probs=True,
    )
    from rlflow.config import config_section
    from rlflow.engine.batching import MicroBatchSpec

    actor = DataParallelPPOActor(
        config_section("actor_rollout_ref.actor"),
        model,
        log_prob=MicroBatchSpec(samples_per_micro_batch=4),
        temperature=temperature,
        use_remove_padding=use_remove_padding,
    )
    log_probs, _ = actor.compute_log_prob(out)
    mask = out.batch["response_mask"].bool()
    assert (log_probs[mask] - out.batch["rollout_log_probs"][mask]).abs().max() <= 1e-5


def test_generation_replica_leaves_the_training_model_config_alone():
    """The replica decodes with SDPA (``rlflow_generate``), but the training module keeps its own attention
    implementation: a Ulysses actor (``rlflow_packed``) must still pass its SP check after the first
    rollout."""
    from rlflow.models.attention import GENERATION_ATTENTION, PACKED_ATTENTION, set_packed_attention
    from rlflow.rollout.hf import build_generation_replica

    model = set_packed_attention(tiny_model(seed=0))
    replica = build_generation_replica(model)
    assert replica.config._attn_implementation == GENERATION_ATTENTION
    assert model.config._attn_implementation == PACKED_ATTENTION
    assert replica.config is not model.config


def test_samples_do_not_depend_on_the_data_parallel_split(model):
    """A row's sampling stream is keyed by its index in the whole batch: the same prompts split over 1, 2
    or 3 data-parallel ranks (equal chunks, as the dispatcher makes them) give the same responses — so a
    run resumed on another world size, or a layout with another DP size, samples the same tokens."""
    prompts = random_token_lists([5, 9, 3, 12, 7, 4], seed=3)
    cfg = rollout_config(response_length=RESPONSE_LENGTH, prompt_length=32, n=2, temperature=1.0, seed=11)
    meta = {"eos_token_id": 2, "global_steps": 4}

    def split(dp: int) -> torch.Tensor:
        step = len(prompts) // dp
        parts = [
            HFRollout(model, cfg, dp_rank=r).generate_sequences(
                make_prompts(prompts[r * step : (r + 1) * step], WIDTH, meta_info=meta)
            )
            for r in range(dp)
        ]
        return torch.cat([p.batch["responses"] for p in parts])

    whole = split(1)
    assert torch.equal(split(2), whole)
    assert torch.equal(split(3), whole)
    assert not torch.equal(whole[0::2], whole[1::2])  # the n samples of a prompt still differ


def test_ignore_eos_and_min_tokens(model, tokens):
    """``rollout.ignore_eos``: the full-length greedy response, EOS included in the mask. ``min_tokens``:
    the EOS is not picked before that many tokens, and the reported log-probs are still those of the full
    softmax (the trainer's quantity)."""
    base = _greedy(model, tokens, eos=[2], ignore_eos=True).batch["responses"]  # the unconstrained path
    eos = int(base[0, 0])  # the first token row 0 picks: with it as EOS, row 0 ends at once
    plain = _greedy(model, tokens, eos=[eos]).batch
    assert int(plain["response_mask"][0].sum()) == 1
    ignoring = _greedy(model, tokens, eos=[eos], ignore_eos=True).batch
    assert torch.equal(ignoring["responses"], base)
    assert bool(ignoring["response_mask"].all())
    out = _greedy(model, tokens, eos=[eos], min_tokens=3)
    b = out.batch
    assert not bool((b["responses"][:, :3] == eos).any())
    assert int(b["response_mask"][0].sum()) >= 3
    logp = torch.log_softmax(full_forward_logits(model, out), dim=-1)
    want = logp.gather(-1, b["responses"].unsqueeze(-1)).squeeze(-1) * b["response_mask"]
    torch.testing.assert_close(b["rollout_log_probs"], want, rtol=1e-5, atol=1e-5)
    # the masked step picks the best non-EOS token: the greedy argmax is EOS there, so its log-prob is lower
    assert float(b["rollout_log_probs"][0, 0]) < float(plain["rollout_log_probs"][0, 0])
