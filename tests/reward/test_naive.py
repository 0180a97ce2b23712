"""NaiveRewardManager: decoding, score placement at the last valid response token, extra info, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rlflow.models.tiny import build_tiny_tokenizer
from rlflow.protocol import DataProto
from rlflow.reward.naive import NaiveRewardManager, check_score


def b(text: str) -> list[int]:
    return [3 + c for c in text.encode()]


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


def make_batch(ground_truths=("cccc", "ccc", "ee", "42"), sources=None):
    # prompts (bs=4, prompt_len=4), left-padded; responses (response_len=5), right-padded, eos = 2
    prompts = torch.tensor([[0, 0, *b("ab")], [1, *b("abc")], [0, 0, 0, *b("e")], [0, *b("q?"), 1]])
    responses = torch.tensor(
        [
            [*b("cccc"), 2],  # "cccc" + eos: 5 valid tokens
            [*b("cc"), 2, 0, 0],  # "cc" + eos: 3 valid
            [*b("x"), 0, 0, 0, 0],  # "x" cut by the length limit: 1 valid
            [*b("####42")[:5]],  # "####4": 5 valid
        ]
    )
    response_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]])
    attention_mask = torch.cat([(prompts != 0).long(), response_mask], dim=-1)
    sources = sources or ["rlflow/repeat"] * 3 + ["openai/gsm8k"]
    return DataProto.from_single_dict(
        {
            "prompts": prompts,
            "responses": responses,
            "attention_mask": attention_mask,
            "data_source": np.array(sources, dtype=object),
            "reward_model": np.array(
                [{"style": "rule", "ground_truth": g} for g in ground_truths], dtype=object
            ),
            "extra_info": np.array([{"index": i} for i in range(4)], dtype=object),
        }
    )


def test_scores_at_last_valid_token(tok):
    manager = NaiveRewardManager(tok, num_examine=0)
    out = manager(make_batch(), return_dict=True)
    expected = torch.zeros(4, 5)
    expected[0, 4] = 1.0  # "cccc" vs "cccc"
    expected[1, 2] = 2.0 / 3.0  # "cc" vs "ccc"
    expected[2, 0] = 0.0  # "x" vs "ee"
    expected[3, 4] = 0.0  # "####4" vs "42"
    torch.testing.assert_close(out["reward_tensor"], expected, rtol=0, atol=1e-7)
    assert out["reward_tensor"].dtype == torch.float32
    info = out["reward_extra_info"]
    assert info["score"] == pytest.approx([1.0, 2.0 / 3.0, 0.0, 0.0], abs=1e-12)
    assert info["acc"] == [1.0, 0.0, 0.0, 0.0]
    assert torch.equal(manager(make_batch()), out["reward_tensor"])  # return_dict=False -> the tensor


def test_decoded_strings_reach_the_score_function(tok):
    calls = []

    def record(data_source, solution_str, ground_truth, extra_info=None):
        calls.append((data_source, solution_str, ground_truth, extra_info))
        return len(solution_str)

    out = NaiveRewardManager(tok, 0, compute_score=record)(make_batch(), return_dict=True)
    assert calls == [
        ("rlflow/repeat", "cccc", "cccc", {"index": 0}),
        ("rlflow/repeat", "cc", "ccc", {"index": 1}),
        ("rlflow/repeat", "x", "ee", {"index": 2}),
        ("openai/gsm8k", "####4", "42", {"index": 3}),
    ]
    assert out["reward_tensor"][:, -1].tolist() == [4.0, 0.0, 0.0, 5.0]
    assert out["reward_extra_info"] == {"score": [4.0, 2.0, 1.0, 5.0]}


def test_rm_scores_pass_through(tok):
    data = make_batch()
    data.batch["rm_scores"] = torch.full((4, 5), 0.5)
    assert torch.equal(NaiveRewardManager(tok, 0)(data), torch.full((4, 5), 0.5))


def test_num_examine_prints(tok, capsys):
    NaiveRewardManager(tok, num_examine=1)(make_batch())
    out = capsys.readouterr().out
    assert out.count("[rlflow/repeat]") == 1 and out.count("[openai/gsm8k]") == 1
    assert "[response] 'cccc'" in out and "[prompt] 'ab'" in out


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (float("nan"), "returned a non-finite score nan for sample 1"),
        (float("inf"), "returned a non-finite score inf for sample 1"),
        ("1.0", "returned a non-numeric score '1.0' (str) for sample 1"),
        (None, "returned a non-numeric score None (NoneType) for sample 1"),
        ({"acc": 1.0}, "returned a dict without 'score' for sample 1"),
    ],
)
def test_bad_score_values_name_sample_and_function(tok, value, message):
    def bad_score(data_source, solution_str, ground_truth, extra_info=None):
        return value if extra_info["index"] == 1 else 0.0

    with pytest.raises(ValueError) as err:
        NaiveRewardManager(tok, 0, compute_score=bad_score)(make_batch())
    assert "bad_score" in str(err.value) and message in str(err.value)


def test_inconsistent_dict_keys_and_exceptions(tok):
    def keys_vary(data_source, solution_str, ground_truth, extra_info=None):
        return {"score": 1.0, "acc": 1.0} if extra_info["index"] == 0 else {"score": 0.0}

    with pytest.raises(ValueError, match=r"returned keys \[\] for sample 1 but \['acc'\] for sample 0"):
        NaiveRewardManager(tok, 0, compute_score=keys_vary)(make_batch())

    def raises(data_source, solution_str, ground_truth, extra_info=None):
        raise KeyError("oops")

    with pytest.raises(RuntimeError, match=r"raises failed on sample 0 \(data_source='rlflow/repeat'\)"):
        NaiveRewardManager(tok, 0, compute_score=raises)(make_batch())


def test_missing_fields_and_empty_response(tok):
    data = make_batch()
    data.non_tensor_batch["reward_model"][2] = {"style": "rule"}
    with pytest.raises(ValueError, match=r"sample 2 has no reward_model\['ground_truth'\]"):
        NaiveRewardManager(tok, 0)(data)
    data = make_batch()
    data.non_tensor_batch.pop("data_source")
    with pytest.raises(ValueError, match="the batch has no non-tensor key 'data_source'"):
        NaiveRewardManager(tok, 0)(data)
    data = make_batch()
    data.batch["attention_mask"][2, 4:] = 0
    with pytest.raises(ValueError, match="sample 2 has no valid response token"):
        NaiveRewardManager(tok, 0)(data)
    with pytest.raises(ValueError, match="timeout_s needs num_workers >= 1"):
        NaiveRewardManager(tok, 0, timeout_s=1.0)


def test_check_score_accepts_numbers():
    assert check_score(np.float32(0.5), 0, "f") == (0.5, {})
    assert check_score(True, 0, "f") == (1.0, {})
    assert check_score(torch.tensor(2.0), 0, "f") == (2.0, {})
    assert check_score({"score": 3, "pred": "x"}, 0, "f") == (3.0, {"pred": "x"})
    assert math.isnan(float("nan"))
