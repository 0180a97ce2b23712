"""``SFTEngine``: the NLL of the response tokens only, by hand, and its gradient."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from tensordict import TensorDict

from rlflow.data.sft_dataset import collate_sft
from rlflow.engine.batching import MicroBatchSpec
from rlflow.engine.sft import SFTEngine

# next-token probabilities of a bigram model over 4 tokens: row i = p(. | i), powers of two so the
# log-probs are exact multiples of ln 2
P = torch.tensor(
    [
        [1 / 4, 1 / 4, 1 / 4, 1 / 4],
        [1 / 8, 1 / 8, 1 / 2, 1 / 4],
        [1 / 4, 1 / 8, 1 / 8, 1 / 2],
        [1 / 2, 1 / 4, 1 / 8, 1 / 8],
    ],
    dtype=torch.float64,
)


class Bigram(torch.nn.Module):
    """logits[t] = table[input_ids[t]]: the next token depends on the current one only."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(P.log().float().clone())

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False):
        return SimpleNamespace(logits=self.table[input_ids])


def _batch() -> TensorDict:
    # A: prompt [0, 1], response [2, 3]; B: prompt [3], response [1]. Response transitions: 1→2 (p 1/2),
    # 2→3 (p 1/2), 3→1 (p 1/4). The prompt transition 0→1 is not in the loss.
    items = [{"prompt_ids": [0, 1], "response_ids": [2, 3]}, {"prompt_ids": [3], "response_ids": [1]}]
    return TensorDict(collate_sft(items, pad_token_id=0), batch_size=[2])


def _engine(module: torch.nn.Module, micro: MicroBatchSpec, lr: float = 0.0) -> SFTEngine:
    opt = torch.optim.SGD(module.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    return SFTEngine(module, opt, sched, micro=micro, grad_clip=0.0, use_remove_padding=False)


@pytest.mark.parametrize("micro", [MicroBatchSpec(samples_per_micro_batch=1), MicroBatchSpec()])
def test_loss_is_the_token_mean_nll_of_the_responses(micro: MicroBatchSpec):
    # -[ln(1/2) + ln(1/2) + ln(1/4)] / 3 = (1 + 1 + 2) ln 2 / 3
    metrics = _engine(Bigram(), micro).train_step(_batch())
    assert metrics["train/loss"] == pytest.approx(4 * math.log(2) / 3, rel=1e-6)
    assert metrics["train/tokens"] == 3.0 and metrics["train/skipped"] == 0.0


def test_gradient_step_moves_only_the_rows_of_response_predictions():
    module = Bigram()
    before = module.table.detach().clone()
    _engine(module, MicroBatchSpec(samples_per_micro_batch=1), lr=1.0).train_step(_batch())
    # d loss / d logits(row r) = sum over response transitions from r of (softmax - onehot) / 3
    expected = torch.zeros(4, 4, dtype=torch.float64)
    for prev, nxt in ((1, 2), (2, 3), (3, 1)):
        expected[prev] += (P[prev] - torch.nn.functional.one_hot(torch.tensor(nxt), 4)) / 3
    torch.testing.assert_close((before - module.table.detach()).double(), expected, atol=1e-6, rtol=0)
    assert torch.equal(module.table.detach()[0], before[0])  # 0→1 sits in the prompt: no gradient


def test_nll_sums_for_validation():
    nll, tokens = _engine(Bigram(), MicroBatchSpec(samples_per_micro_batch=1)).nll_sums(_batch())
    assert tokens == 3.0 and nll == pytest.approx(4 * math.log(2), rel=1e-6)
