"""Remove-padding helpers: exact round trips, packed layout of left/right-padded batches, response alignment."""

from __future__ import annotations

import pytest
import torch

from rlflow.models.padding import (
    gather_response_outputs,
    index_first_axis,
    pad_input,
    unpad_input,
    unpad_micro_batch,
)

# 3 rows of 8 columns: prompt part (4 columns, left-padded) + response part (4 columns, right-padded)
MASK = torch.tensor(
    [
        [1, 1, 1, 1, 1, 1, 1, 1],  # full row
        [0, 0, 1, 1, 1, 0, 0, 0],  # prompt 2, response 1
        [0, 1, 1, 1, 1, 1, 1, 0],  # prompt 3, response 3
    ]
)
IDS = torch.arange(1, 25).reshape(3, 8) * MASK
POS = (MASK.cumsum(-1) - 1).clamp(min=0)


def test_unpad_input_hand_computed() -> None:
    packed, indices, cu_seqlens, max_seqlen = unpad_input(IDS, MASK)
    assert packed.tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 13, 18, 19, 20, 21, 22, 23]
    assert indices.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12, 17, 18, 19, 20, 21, 22]
    assert cu_seqlens.tolist() == [0, 8, 11, 17] and cu_seqlens.dtype == torch.int32
    assert max_seqlen == 8


def test_pad_unpad_round_trip_is_exact() -> None:
    torch.manual_seed(0)
    hidden = torch.randn(3, 8, 5)
    packed, indices, _, _ = unpad_input(hidden, MASK)
    back = pad_input(packed, indices, 3, 8)
    assert torch.equal(back, hidden * MASK[..., None])
    assert torch.equal(index_first_axis(hidden.reshape(24, 5), indices), packed)


def test_pad_input_backward_routes_gradients_to_valid_tokens() -> None:
    hidden = torch.randn(3, 8, requires_grad=True)
    packed, indices, _, _ = unpad_input(hidden, MASK)
    weights = torch.arange(24, dtype=torch.float32).reshape(3, 8)
    (pad_input(packed * 2.0, indices, 3, 8) * weights).sum().backward()
    assert torch.equal(hidden.grad, 2.0 * weights * MASK)


def test_unpad_micro_batch_positions_restart_per_sequence() -> None:
    packed = unpad_micro_batch(IDS, MASK, POS)
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 0, 1, 2, 3, 4, 5]]
    assert packed.input_ids.shape == (1, 17)
    assert packed.labels[0].tolist() == [*packed.input_ids[0, 1:].tolist(), 1]
    assert (packed.batch_size, packed.seqlen, packed.max_seqlen) == (3, 8, 8)


def test_unpad_micro_batch_rejects_bad_positions() -> None:
    bad = POS.clone()
    bad[2, 3] = 7
    with pytest.raises(ValueError, match="row 2"):
        unpad_micro_batch(IDS, MASK, bad)
    with pytest.raises(ValueError, match="position_ids must have shape"):
        unpad_micro_batch(IDS, MASK, POS[:, :4])
    with pytest.raises(ValueError, match="attention_mask must have shape"):
        unpad_input(IDS, MASK[:2])


def test_gather_response_outputs_uses_position_before_each_response_token() -> None:
    # per-token output = the token id itself, so column k of the response slice holds the token before it
    packed = unpad_micro_batch(IDS, MASK, POS)
    out = gather_response_outputs(packed.input_ids[0].float(), packed.indices, 3, 8, response_length=4)
    assert out.tolist() == [[4, 5, 6, 7], [12, 13, 0, 0], [20, 21, 22, 23]]
    with pytest.raises(ValueError, match="response_length"):
        gather_response_outputs(packed.input_ids[0].float(), packed.indices, 3, 8, response_length=8)
