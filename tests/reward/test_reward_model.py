"""Sequence-classification reward model: score on the last valid response token."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlflow.models import loader, tiny
from rlflow.reward.reward_model import compute_rm_score, last_valid_index, place_on_last_token


def test_place_on_last_token():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]])
    assert last_valid_index(mask).tolist() == [1, 2, 0]
    out = place_on_last_token(torch.tensor([0.5, -1.0, 2.0]), mask)
    assert torch.equal(out, torch.tensor([[0.0, 0.5, 0.0], [0.0, 0.0, -1.0], [2.0, 0.0, 0.0]]))


def test_compute_rm_score_matches_transformers_pooling(tmp_path):
    config = tiny.TinyModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2)
    path = tiny.save_tiny_model(tmp_path, config, seed=0)
    rm = loader.load_reward_model(path, allow_random_head=True, seed=0, attn_implementation="eager")
    prompts = torch.tensor([[0, 0, 1, 100], [1, 101, 102, 103]])
    responses = torch.tensor([[104, 105, 2, 0], [106, 2, 0, 0]])
    ids = torch.cat([prompts, responses], dim=-1)
    mask = (ids != 0).long()
    pos = torch.clamp(mask.cumsum(-1) - 1, min=0)
    got = compute_rm_score(rm, ids, mask, pos, response_length=4)
    with torch.no_grad():
        # transformers pools at the rightmost non-pad token (pad id 0 here): the same token
        ref = rm(input_ids=ids, attention_mask=mask, position_ids=pos).logits.squeeze(-1)
    assert got.shape == (2, 4)
    torch.testing.assert_close(got[0, 2], ref[0], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(got[1, 1], ref[1], rtol=1e-6, atol=1e-7)
    assert got[0, [0, 1, 3]].abs().sum() == 0 and got[1, [0, 2, 3]].abs().sum() == 0


def test_packed_scoring_equals_the_padded_forward(tmp_path):
    """Remove-padding (the valid tokens of the micro-batch in one row, ``rlflow_packed`` attention) gives
    the padded forward's scores: the head reads each sequence's last packed token."""
    from rlflow.models.attention import set_packed_attention

    config = tiny.TinyModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2)
    path = tiny.save_tiny_model(tmp_path, config, seed=0)
    padded_rm = loader.load_reward_model(path, allow_random_head=True, seed=0, attn_implementation="sdpa")
    packed_rm = set_packed_attention(loader.load_reward_model(path, allow_random_head=True, seed=0))
    g = torch.Generator().manual_seed(0)
    prompt_lens, response_lens = [3, 6, 1], [4, 1, 6]
    ids = torch.zeros(3, 12, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_lens, response_lens)):
        ids[i, 6 - p : 6 + r] = torch.randint(3, 250, (p + r,), generator=g)
    mask = (ids != 0).long()
    pos = torch.clamp(mask.cumsum(-1) - 1, min=0)
    padded = compute_rm_score(padded_rm, ids, mask, pos, response_length=6)
    packed = compute_rm_score(packed_rm, ids, mask, pos, response_length=6, use_remove_padding=True)
    assert (packed != 0).sum() == 3
    torch.testing.assert_close(packed, padded, rtol=1e-5, atol=1e-6)


def test_the_worker_scores_in_token_budget_micro_batches_in_input_order(tmp_path):
    """``reward_model.use_dynamic_bsz``: micro-batches under ``forward_max_token_len_per_gpu`` valid tokens
    (balanced, so the rows are regrouped out of order) give each row the score it gets alone."""
    from rlflow.config import load_config, to_typed
    from rlflow.engine.batching import log_prob_spec
    from rlflow.engine.ppo_loop import split_micro_batches
    from rlflow.protocol import DataProto
    from rlflow.workers import RewardModelWorker

    config = tiny.TinyModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2)
    path = tiny.save_tiny_model(tmp_path, config, seed=0)
    g = torch.Generator().manual_seed(1)
    prompt_lens, response_lens = [3, 6, 1, 5, 2, 6], [4, 1, 6, 6, 2, 5]
    ids = torch.zeros(6, 12, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_lens, response_lens)):
        ids[i, 6 - p : 6 + r] = torch.randint(3, 250, (p + r,), generator=g)
    mask = (ids != 0).long()
    tensors = {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": torch.clamp(mask.cumsum(-1) - 1, min=0),
        "responses": ids[:, 6:],
    }
    overrides = [
        "reward_model.enable=true",
        f"reward_model.model.path={path}",
        "reward_model.use_dynamic_bsz=true",
        "reward_model.forward_max_token_len_per_gpu=14",  # rows of 3 to 12 valid tokens
        "data.max_prompt_length=6",
        "data.max_response_length=6",
    ]
    worker = RewardModelWorker(to_typed(load_config(overrides, config_name="demo_two_ranks")))
    worker.device = torch.device("cpu")
    worker.module = loader.load_reward_model(path, allow_random_head=True, seed=0, attn_implementation="sdpa")
    worker.use_remove_padding = False
    data = DataProto.from_dict(tensors=tensors)
    split = split_micro_batches(data.batch, log_prob_spec(True, None, 14, 1))
    order = [i for mb in split.indices for i in mb]
    assert len(split.batches) >= 4 and order != list(range(6))  # rows regrouped out of input order
    scores = worker.compute_rm_score(data).batch["rm_scores"]
    alone = torch.cat(
        [
            compute_rm_score(
                worker.module, ids[i : i + 1], mask[i : i + 1], tensors["position_ids"][i : i + 1], 6
            )
            for i in range(6)
        ]
    )
    torch.testing.assert_close(scores, alone, rtol=1e-5, atol=1e-6)


def _object_array(items: list) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


RM_TEMPLATE = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"


def test_a_reward_model_with_its_own_chat_template_scores_the_re_tokenized_conversation(tmp_path):
    """``reward_model.model.input_tokenizer``: each response is decoded with the policy's tokenizer, the
    conversation re-encoded with the reward model's chat template, and its score placed on the last valid
    token of the policy's response."""
    from rlflow.config import load_config, to_typed
    from rlflow.models.loader import load_tokenizer
    from rlflow.protocol import DataProto
    from rlflow.reward.reward_model import sequence_scores
    from rlflow.workers import RewardModelWorker

    config = tiny.TinyModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2)
    policy_dir = tiny.save_tiny_model(tmp_path / "policy", config, seed=0)
    policy_tok = load_tokenizer(policy_dir)
    rm_tok = load_tokenizer(policy_dir)
    rm_tok.chat_template = RM_TEMPLATE  # the reward model's own conversation format
    rm_dir = tmp_path / "rm"
    rm_tok.save_pretrained(rm_dir)
    messages = [[{"role": "user", "content": "add 2 and 3"}], [{"role": "user", "content": "say hi"}]]
    texts = ["5", "hi there"]
    responses = torch.full((2, 10), 0, dtype=torch.long)  # byte-level tokens: one per character
    for i, text in enumerate(texts):
        ids = policy_tok.encode(text, add_special_tokens=False)
        responses[i, : len(ids)] = torch.tensor(ids)
    response_mask = (responses != 0).long()
    prompt = torch.tensor([[0, 7, 8], [9, 10, 11]])  # the policy's prompt tokens: not what the RM reads
    ids = torch.cat([prompt, responses], dim=-1)
    mask = torch.cat([(prompt != 0).long(), response_mask], dim=-1)
    data = DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": torch.clamp(mask.cumsum(-1) - 1, min=0),
            "responses": responses,
        },
        non_tensors={"raw_prompt": _object_array(messages)},
    )
    overrides = [
        "reward_model.enable=true",
        f"reward_model.model.path={rm_dir}",
        f"reward_model.model.input_tokenizer={policy_dir}",
        "data.return_raw_chat=true",
        "data.max_response_length=10",
        "reward_model.model.use_remove_padding=false",
    ]
    worker = RewardModelWorker(to_typed(load_config(overrides, config_name="demo_two_ranks")))
    worker.device = torch.device("cpu")
    worker.module = loader.load_reward_model(policy_dir, allow_random_head=True, seed=0)
    worker.use_remove_padding, worker.offload = False, False
    worker.tokenizers = (policy_tok, load_tokenizer(str(rm_dir)))
    scores = worker.compute_rm_score(data).batch["rm_scores"]
    # by hand: the RM template's text, the RM tokenizer's ids, one sequence at a time
    for i, (chat, text) in enumerate(zip(messages, texts)):
        rendered = f"[user] {chat[0]['content']}\n[assistant] {text}\n"
        rm_ids = torch.tensor([rm_tok.encode(rendered, add_special_tokens=False)])
        one = torch.ones_like(rm_ids)
        want = sequence_scores(worker.module, rm_ids, one, torch.arange(rm_ids.shape[1])[None])
        last = int(response_mask[i].sum()) - 1
        torch.testing.assert_close(scores[i, last], want[0].float(), rtol=1e-5, atol=1e-6)
        assert scores[i].abs().sum() == scores[i, last].abs()
    without_chat = DataProto.from_dict(tensors=dict(data.batch.items()))
    with pytest.raises(ValueError, match=r"data\.return_raw_chat=true"):
        worker.compute_rm_score(without_chat)


def test_re_tokenized_conversations_keep_their_last_tokens_when_too_long(tmp_path):
    from rlflow.models.loader import load_tokenizer
    from rlflow.reward.retokenize import retokenize_conversations

    tok = load_tokenizer(tiny.save_tiny_model(tmp_path, tiny.TinyModelConfig(), seed=0))
    tok.chat_template = RM_TEMPLATE
    responses = torch.tensor([tok.encode("abcdef", add_special_tokens=False), [100, 101, 0, 0, 0, 0]])
    mask = (responses != 0).long()
    chats = [[{"role": "user", "content": "x"}], [{"role": "user", "content": "y"}]]
    out, truncated = retokenize_conversations(responses, mask, chats, tok, tok, max_length=26)
    full = tok.encode("[user] x\n[assistant] abcdef\n", add_special_tokens=False)
    assert len(full) == 28 and truncated == 1  # the other conversation has 24 tokens
    assert out["input_ids"][0].tolist() == full[-26:] and bool(out["attention_mask"][0].all())
    second = tok.encode("[user] y\n[assistant] " + tok.decode([100, 101]) + "\n", add_special_tokens=False)
    assert out["input_ids"][1, -len(second) :].tolist() == second
    assert int(out["attention_mask"][1].sum()) == len(second)  # left-padded
