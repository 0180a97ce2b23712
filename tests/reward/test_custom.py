"""Custom reward functions: loading, signature check at load time, pickling, config lookup."""

from __future__ import annotations

import pickle

import pytest

from rlflow.reward.custom import get_custom_reward_fn, load_custom_reward_fn

GOOD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    return float(solution_str == ground_truth) + bonus

def kwargs_only(**kwargs):
    return len(kwargs)

def too_few(solution_str, ground_truth):
    return 1.0

def extra_required(data_source, solution_str, ground_truth, extra_info, scale):
    return scale

NOT_CALLABLE = 3
"""


@pytest.fixture
def reward_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(GOOD)
    return str(path)


def test_load_and_call(reward_file):
    fn = load_custom_reward_fn(reward_file, "compute_score")
    assert fn(data_source="d", solution_str="a", ground_truth="a", extra_info=None) == 1.0
    with_kwargs = load_custom_reward_fn(reward_file, "compute_score", reward_kwargs={"bonus": 0.5})
    assert with_kwargs(data_source="d", solution_str="a", ground_truth="b", extra_info={}) == 0.5
    assert (
        load_custom_reward_fn(reward_file, "kwargs_only")(
            data_source="d", solution_str="a", ground_truth="b", extra_info={}
        )
        == 4
    )


def test_pickles_by_path(reward_file):
    fn = load_custom_reward_fn(reward_file, "compute_score", reward_kwargs={"bonus": 2.0})
    clone = pickle.loads(pickle.dumps(fn))
    assert clone.path == fn.path and clone.reward_kwargs == {"bonus": 2.0}
    assert clone(data_source="d", solution_str="a", ground_truth="a", extra_info=None) == 3.0


def test_signature_errors(reward_file):
    with pytest.raises(ValueError) as err:
        load_custom_reward_fn(reward_file, "too_few")
    msg = str(err.value)
    assert "'too_few'" in msg and reward_file in msg and "(solution_str, ground_truth)" in msg
    assert "data_source, solution_str, ground_truth, extra_info" in msg
    with pytest.raises(ValueError, match=r"'extra_required'.*other parameters need defaults"):
        load_custom_reward_fn(reward_file, "extra_required")
    assert (
        load_custom_reward_fn(reward_file, "extra_required", reward_kwargs={"scale": 2})(
            data_source="d", solution_str="a", ground_truth="b", extra_info=None
        )
        == 2
    )
    with pytest.raises(ValueError, match=r"must accept the keyword arguments .*, bogus"):
        load_custom_reward_fn(reward_file, "compute_score", reward_kwargs={"bogus": 1})


def test_load_errors(reward_file, tmp_path):
    with pytest.raises(ValueError, match=r"custom_reward_function\.name='missing' is not defined in"):
        load_custom_reward_fn(reward_file, "missing")
    with pytest.raises(ValueError, match=r"custom_reward_function\.name='NOT_CALLABLE' .* not callable"):
        load_custom_reward_fn(reward_file, "NOT_CALLABLE")
    missing = str(tmp_path / "nope.py")
    with pytest.raises(ValueError, match=f"custom_reward_function.path='{missing}': no such file"):
        load_custom_reward_fn(missing)
    broken = tmp_path / "broken.py"
    broken.write_text("import not_a_module_anywhere\n")
    with pytest.raises(ValueError, match="importing it failed: ModuleNotFoundError"):
        load_custom_reward_fn(str(broken))


def test_get_custom_reward_fn_from_config(reward_file):
    from rlflow.config import config_section

    assert get_custom_reward_fn(config_section("custom_reward_function")) is None
    fn = get_custom_reward_fn(
        config_section("custom_reward_function", path=reward_file, reward_kwargs={"bonus": 1.0})
    )
    assert fn(data_source="d", solution_str="x", ground_truth="y", extra_info=None) == 1.0
