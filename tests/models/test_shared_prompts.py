"""Shared-prompt packing: the layout `unpad_shared_prompts` builds and the attention rule that reads it."""

from __future__ import annotations

import pytest
import torch

from rlflow.models.attention import packed_sequences, set_packed_attention
from rlflow.models.padding import unpad_shared_prompts

A, B, C, D, E, X, Y, Z, W = range(11, 20)


def _rows() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """r0: prompt a b c, response x y; r1: prompt d e (left-padded), response z; r2: r0's prompt, response w."""
    ids = torch.tensor([[A, B, C, X, Y], [0, D, E, Z, 0], [A, B, C, W, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 1, 1, 1, 0], [1, 1, 1, 1, 0]])
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def test_layout_of_a_hand_built_micro_batch():
    packed = unpad_shared_prompts(*_rows(), response_length=2)
    # root r0 whole; branch r2: its last prompt token (c, position 2) and its response; then root r1
    assert packed.indices.tolist() == [0, 1, 2, 3, 4, 12, 13, 6, 7, 8]
    assert packed.input_ids.tolist() == [[A, B, C, X, Y, C, W, D, E, Z]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4, 2, 3, 0, 1, 2]]
    # the branch's copy of c predicts w; its last token's label is meaningless (lands on a padded slot)
    assert packed.labels.tolist() == [[B, C, X, Y, C, W, D, E, Z, A]]
    assert packed.cu_seqlens.tolist() == [0, 5, 7, 10]
    assert packed_sequences(packed.position_ids) == [[(5, 0), (2, 2), (3, 0)]]


@pytest.mark.parametrize(
    "case", ["no shared prompt", "one-token prompt", "padding in the last prompt column"]
)
def test_nothing_to_share_falls_back(case):
    ids, mask, _ = _rows()
    if case == "no shared prompt":
        ids, mask = ids[:2], mask[:2]
    elif case == "one-token prompt":
        ids = torch.cat([ids, torch.tensor([[0, 0, D, Z, 0]] * 2)])
        mask = torch.cat([mask, torch.tensor([[0, 0, 1, 1, 0]] * 2)])
    else:
        ids = torch.cat([ids, torch.tensor([[D, E, 0, Z, 0]])])
        mask = torch.cat([mask, torch.tensor([[1, 1, 0, 1, 0]])])
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    assert unpad_shared_prompts(ids, mask, pos, response_length=2) is None


@pytest.mark.parametrize("case", ["a jump in a response", "a branch row shifted as a whole"])
def test_positions_that_do_not_count_up_from_0_are_refused(case):
    ids, mask, pos = _rows()
    pos = pos.clone()
    if case == "a jump in a response":
        pos[2, 3] = 7
    else:
        pos[2] += 1  # consecutive, but its prompt token would claim a 4-token shared prefix
    with pytest.raises(ValueError, match="position_ids are not 0, 1, 2"):
        unpad_shared_prompts(ids, mask, pos, response_length=2)


def _attention_model():
    from rlflow.models.tiny import TinyModelConfig, build_tiny_model

    model = build_tiny_model(TinyModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1))
    return set_packed_attention(model).eval()


def test_a_branch_sees_its_roots_prefix_and_itself():
    """The logits of a packed root + branch equal those of the branch's whole sequence run on its own."""
    model = _attention_model()
    prompt, first, second = [5, 6, 7, 8], [9, 10], [11, 12, 13]
    packed_ids = torch.tensor([prompt + first + [prompt[-1]] + second])
    packed_pos = torch.tensor([[0, 1, 2, 3, 4, 5, 3, 4, 5, 6]])
    with torch.no_grad():
        shared = model(input_ids=packed_ids, position_ids=packed_pos, use_cache=False).logits[0]
        alone = model(input_ids=torch.tensor([prompt + second]), use_cache=False).logits[0]
        root = model(input_ids=torch.tensor([prompt + first]), use_cache=False).logits[0]
    torch.testing.assert_close(shared[6:], alone[3:], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(shared[:6], root, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("positions", "message"),
    [([[2, 3, 0, 1]], "follows no sequence that starts at 0"), ([[0, 1, 5, 6]], "shares 5 prompt tokens")],
)
def test_malformed_branches_are_refused(positions, message):
    model = _attention_model()
    with pytest.raises(ValueError, match=message), torch.no_grad():
        model(input_ids=torch.tensor([[5, 6, 7, 8]]), position_ids=torch.tensor(positions), use_cache=False)


def test_items_for_token_budget_micro_batches():
    """Groups of rows sharing a prompt, sized as the shared packing feeds them, cut to fit the budget."""
    from rlflow.engine.seqlen_balancing import rearrange_micro_batches
    from rlflow.models.padding import shared_prompt_items

    ids, mask, _ = _rows()
    ids, mask = torch.cat([ids, ids[2:]]), torch.cat([mask, mask[2:]])  # r3: a third sample of r0's prompt
    # r0 is packed whole (5 tokens), r2 and r3 as c + their response (2 each); r1 alone (3)
    assert shared_prompt_items(ids, mask, 2, max_tokens=9) == ([[0, 2, 3], [1]], [9, 3])
    assert shared_prompt_items(ids, mask, 2, max_tokens=8) == ([[0, 2], [3], [1]], [7, 4, 3])
    items = shared_prompt_items(ids, mask, 2, max_tokens=9)
    _, parts = rearrange_micro_batches({"attention_mask": mask}, max_token_len=9, items=items)
    assert parts == [[0, 2, 3], [1]]
    one_row = torch.tensor([[0, 0, D, Z, 0]])
    assert (
        shared_prompt_items(torch.cat([ids, one_row]), torch.cat([mask, one_row.clamp(max=1)]), 2, 9) is None
    )


@pytest.mark.parametrize("fused_head", [False, True])
def test_forward_with_shared_prompts_equals_plain_packing(fused_head):
    """Log-probs, entropy and gradients of the shared packing equal the plain packing's, also through the
    chunked fused LM head (which reads one label per packed token)."""
    import copy

    from rlflow.models.forward import forward_micro_batch
    from rlflow.models.fused_head import install_fused_head

    plain = _attention_model().train()
    shared = copy.deepcopy(plain)
    if fused_head:
        install_fused_head(shared, chunk_size=5)
    ids, mask, pos = _rows()
    ids, mask, pos = torch.cat([ids, ids[:1]]), torch.cat([mask, mask[:1]]), torch.cat([pos, pos[:1]])
    mb = {"input_ids": ids, "attention_mask": mask, "position_ids": pos, "responses": ids[:, -2:]}
    outs = []
    for model, share in ((plain, False), (shared, True)):
        out = forward_micro_batch(
            model, mb, output="log_probs", use_remove_padding=True, temperature=0.8, calculate_entropy=True,
            share_prompts=share,
        )  # fmt: skip
        valid = mask[:, -2:].bool()
        (out["log_probs"][valid].sum() + 0.3 * out["entropy"][valid].sum()).backward()
        outs.append((out, {n: p.grad for n, p in model.named_parameters()}))
    (a, grads_a), (b, grads_b) = outs
    valid = mask[:, -2:].bool()
    for key in ("log_probs", "entropy"):
        torch.testing.assert_close(b[key][valid], a[key][valid], rtol=1e-5, atol=1e-6)
    for name, grad in grads_a.items():
        other = grads_b.get(name, grads_b.get(name.replace("lm_head.", "lm_head.linear.")))
        torch.testing.assert_close(other, grad, rtol=1e-4, atol=1e-6, msg=name)
