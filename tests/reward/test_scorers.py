"""Rule scorers on hand-written cases: GSM8K strict/flexible, repeat, arithmetic, dispatch."""

from __future__ import annotations

import pytest

from rlflow.reward import gsm8k
from rlflow.reward.default import default_compute_score
from rlflow.reward.synthetic import arithmetic_score, repeat_score


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("3 + 4 = 7 apples.\n#### 7", "7", 1.0),
        ("so the total is #### 1,000", "1000", 1.0),  # commas stripped in the response
        ("#### 1000", "1,000", 1.0),  # ... and in the ground truth
        ("#### 72.", "72", 1.0),  # trailing period ignored
        ("####72", "72", 1.0),
        ("#### -5", "-5", 1.0),
        ("#### 5 then #### 6", "6", 1.0),  # the last #### counts
        ("#### 5 then #### 6", "5", 0.0),
        ("#### 71", "72", 0.0),
        ("#### 72.5", "72", 0.0),
        ("#### 72.0", "72", 0.0),  # strict string comparison
        ("the answer is 72", "72", 0.0),  # strict: no ####, no answer
        ("#### seventy-two", "72", 0.0),
        ("", "72", 0.0),
    ],
)
def test_gsm8k_strict(response, truth, expected):
    assert gsm8k.compute_score(response, truth) == expected


def test_gsm8k_flexible_and_format_score():
    assert gsm8k.compute_score("the answer is 72", "72", method="flexible") == 1.0
    assert gsm8k.compute_score("first 3, then 1,234 done", "1234", method="flexible") == 1.0
    assert gsm8k.compute_score("#### 71", "72", format_score=0.1) == 0.1
    assert gsm8k.compute_score("no answer", "72", format_score=0.1) == 0.0
    assert gsm8k.extract_solution("a #### 1,234.") == "1234"
    assert gsm8k.extract_solution("nothing") is None
    with pytest.raises(ValueError, match="method='loose'"):
        gsm8k.extract_solution("x", method="loose")


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("cccc", "cccc", 1.0),
        ("ccca", "cccc", 0.75),
        ("cc", "cccc", 0.5),
        ("", "cccc", 0.0),
        ("aaaa", "cccc", 0.0),
        ("cccccc", "cccc", 1.0 * (1 - 0.25 * 2)),
        (" cccc\n", "cccc", 1.0),  # surrounding whitespace stripped
        ("acacacac", "cc", 0.0),  # 6 extra characters: the factor floors at 0
        ("acac", "cc", 0.5 * (1 - 0.25 * 2)),
        ("bbbbbbbb", "bbbbb", 1.0 * (1 - 0.25 * 3)),
        ("eeeee", "eeeee", 1.0),
    ],
)
def test_repeat_score(response, truth, expected):
    assert repeat_score(response, truth) == pytest.approx(expected, abs=1e-12)


def test_repeat_score_penalty_floor_and_empty_truth():
    assert repeat_score("c" * 40, "cc", extra_penalty=0.05) == 0.0
    with pytest.raises(ValueError, match="empty ground_truth"):
        repeat_score("c", "")


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("#### 405", "405", 1.0),
        ("347 + 58 = 405", "405", 1.0),  # no ####: last integer
        ("405 #### 7", "405", 0.0),  # after ####, the first integer there
        ("#### 1,234", "1234", 1.0),
        ("#### -12", "-12", 1.0),
        ("the result is -12.", "-12", 1.0),
        ("#### ", "5", 0.0),
        ("", "5", 0.0),
        ("#### 6", "5", 0.0),
    ],
)
def test_arithmetic_score(response, truth, expected):
    assert arithmetic_score(response, truth) == expected


def test_default_compute_score_dispatch():
    assert default_compute_score("openai/gsm8k", "#### 7", "7") == {"score": 1.0, "acc": 1.0}
    assert default_compute_score("rlflow/repeat", "ccca", "cccc") == {"score": 0.75, "acc": 0.0}
    assert default_compute_score("rlflow/arithmetic", "12", "12", extra_info={"a": 1}) == {
        "score": 1.0,
        "acc": 1.0,
    }
    with pytest.raises(NotImplementedError, match="no default reward scorer for data_source='my/task'"):
        default_compute_score("my/task", "x", "y")
