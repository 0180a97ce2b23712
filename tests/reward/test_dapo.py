"""DAPORewardManager: the soft overlong penalty on top of the naive scores, its config, and its errors."""

from __future__ import annotations

import pytest
import torch

from rlflow.config import load_config, validate_config
from rlflow.models.tiny import build_tiny_tokenizer
from rlflow.reward.dapo import DAPORewardManager, OverlongBuffer, overlong_penalty
from rlflow.reward.naive import NaiveRewardManager

from .test_naive import make_batch


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


def test_penalty_is_zero_before_the_buffer_then_linear_to_minus_the_factor():
    # budget 10, buffer 4: free up to 6 tokens, then -(L - 6) / 4 * 0.5
    lengths = torch.tensor([1, 6, 7, 8, 10])
    got = overlong_penalty(lengths, max_resp_len=10, buffer_len=4, penalty_factor=0.5)
    assert torch.allclose(got, torch.tensor([0.0, 0.0, -0.125, -0.25, -0.5]), atol=1e-7)


def test_manager_adds_the_penalty_at_the_last_token_and_logs_it(tok):
    # make_batch: valid response lengths 5, 3, 1, 5; naive scores 1, 2/3, 0, 0 (tests/reward/test_naive.py)
    buf = OverlongBuffer(enable=True, len=3, penalty_factor=1.0, log=True, max_resp_len=5)
    out = DAPORewardManager(tok, num_examine=0, overlong=buf)(make_batch(), return_dict=True)
    naive = NaiveRewardManager(tok, num_examine=0)(make_batch())
    # free up to 2 tokens: lengths 5, 3, 1, 5 -> penalties -1, -1/3, 0, -1
    penalty = [-1.0, -1.0 / 3.0, 0.0, -1.0]
    last = [4, 2, 0, 4]
    expected = naive.clone()
    for i, (p, t) in enumerate(zip(penalty, last)):
        expected[i, t] += p
    assert torch.allclose(out["reward_tensor"], expected, atol=1e-6)
    extra = out["reward_extra_info"]
    assert extra["score"] == pytest.approx([1.0, 2.0 / 3.0, 0.0, 0.0])  # before the penalty, as verl logs it
    assert extra["overlong_reward"] == pytest.approx(penalty)
    assert extra["overlong"] == [1.0, 1.0, 0.0, 1.0]


def test_disabled_buffer_scores_like_the_naive_manager(tok):
    out = DAPORewardManager(tok, num_examine=0, overlong=OverlongBuffer())(make_batch())
    assert torch.equal(out, NaiveRewardManager(tok, num_examine=0)(make_batch()))


def _dapo(*kwargs: str) -> list[str]:
    return ["reward_model.reward_manager=dapo", *[f"+reward_model.reward_kwargs.{k}" for k in kwargs]]


def test_config_reaches_the_manager_with_verl_spelling():
    cfg = load_config(
        _dapo(
            "overlong_buffer_cfg.enable=True",
            "overlong_buffer_cfg.len=4",
            "overlong_buffer_cfg.penalty_factor=0.5",
            "overlong_buffer_cfg.log=False",
            "max_resp_len=8",
        ),
        config_name="demo_two_ranks",
    )
    validate_config(cfg)
    buf = OverlongBuffer.from_reward_kwargs(dict(cfg.reward_model.reward_kwargs), 8)
    assert buf == OverlongBuffer(enable=True, len=4, penalty_factor=0.5, log=False, max_resp_len=8)
    # max_resp_len defaults to data.max_response_length
    assert (
        OverlongBuffer.from_reward_kwargs({"overlong_buffer_cfg": {"enable": True, "len": 2}}, 8).max_resp_len
        == 8
    )


@pytest.mark.parametrize(
    "overrides, message",
    [
        (_dapo("overlong_buffer_cfg.enable=True", "overlong_buffer_cfg.len=0"), "overlong_buffer_cfg.len=0"),
        (
            _dapo("overlong_buffer_cfg.enable=True", "overlong_buffer_cfg.len=4", "max_resp_len=64"),
            "max_resp_len=64",
        ),
        (_dapo("overlong_buffer_cfg.lenght=4"), "lenght"),
        (_dapo("max_len=4"), "max_len"),
        (["+reward_model.reward_kwargs.max_resp_len=8"], "naive reward manager takes no keyword"),
        (["reward_model.reward_manager=batch"], "reward_model.reward_manager='batch': verl's batch manager"),
        (
            ["reward_model.reward_manager=prime", "+reward_model.reward_kwargs.x=1"],
            "prime reward manager takes no",
        ),
        (["reward_model.sandbox_fusion.url=localhost:8080"], "must be an http:// or https:// URL"),
        (["reward_model.reward_manager=generative"], "rlflow has no judge client"),
        (["reward_model.reward_manager=nope"], "'nope': not a registered reward manager"),
    ],
)
def test_bad_reward_manager_settings_are_refused_naming_the_key(overrides, message):
    with pytest.raises(ValueError, match="reward_model") as err:
        validate_config(load_config(overrides, config_name="demo_two_ranks"))
    assert message in str(err.value)


def test_a_number_returned_by_the_score_function_is_also_logged_as_acc(tok):
    def half(data_source, solution_str, ground_truth, extra_info=None):
        return 0.5

    out = DAPORewardManager(tok, num_examine=0, overlong=OverlongBuffer(), compute_score=half)(
        make_batch(), return_dict=True
    )
    assert out["reward_extra_info"]["acc"] == [0.5] * 4
