"""Custom advantage function: a working function end to end, and every load-time and call-time error."""

from __future__ import annotations

import pickle
import textwrap

import numpy as np
import pytest
import torch

from rlflow.algos.custom import CustomAdvantageFn, load_custom_advantage_fn
from rlflow.trainer.ppo.core_algos import compute_grpo_outcome_advantage

PATH_KEY = r"algorithm\.custom_advantage_function\.path"
NAME_KEY = r"algorithm\.custom_advantage_function\.name"

REWARDS = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 3.0], [2.0, 0.0, 0.0]])
MASK = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]])
INDEX = np.array(["a", "a", "b"], dtype=object)


def _write(tmp_path, body: str, filename: str = "my_adv.py") -> str:
    path = tmp_path / filename
    path.write_text(textwrap.dedent(body))
    return str(path)


GOOD = """
    import torch

    def scaled_reward_to_go(token_level_rewards, response_mask, values, index, config):
        m = response_mask.to(token_level_rewards.dtype)
        returns = (token_level_rewards * m).flip(-1).cumsum(-1).flip(-1) * m
        baseline = 0.0 if values is None else values
        return (returns - baseline) * config["scale"] * m, returns

    def grpo_like(token_level_rewards, response_mask, index, **kwargs):
        from rlflow.trainer.ppo.core_algos import compute_grpo_outcome_advantage
        return compute_grpo_outcome_advantage(token_level_rewards, response_mask, index)

    def returns_one(**kwargs):
        return kwargs["token_level_rewards"]

    def returns_none_returns(token_level_rewards, response_mask, **kwargs):
        return token_level_rewards, None

    def returns_wrong_shape(token_level_rewards, response_mask, **kwargs):
        return token_level_rewards[:, :2], token_level_rewards

    def returns_int(token_level_rewards, response_mask, **kwargs):
        return response_mask, token_level_rewards

    def returns_numpy(token_level_rewards, response_mask, **kwargs):
        return token_level_rewards.numpy(), token_level_rewards

    def returns_nan_on_valid(token_level_rewards, response_mask, **kwargs):
        out = token_level_rewards.clone()
        out[1, 2] = float("nan")
        return token_level_rewards, out

    def returns_nan_on_masked(token_level_rewards, response_mask, **kwargs):
        out = token_level_rewards.clone()
        out[0, 2] = float("inf")
        out[2, 1] = float("nan")
        return out, out

    def too_few_params(token_level_rewards, response_mask):
        return token_level_rewards, token_level_rewards

    def extra_required(token_level_rewards, response_mask, values, index, config, temperature):
        return token_level_rewards, token_level_rewards

    def positional_only(token_level_rewards, response_mask, values, index, config, /):
        return token_level_rewards, token_level_rewards

    async def coroutine(**kwargs):
        return None

    NOT_CALLABLE = 3
"""


@pytest.fixture
def adv_file(tmp_path):
    return _write(tmp_path, GOOD)


def _call(fn, values=None, scale=1.0):
    return fn(
        token_level_rewards=REWARDS, response_mask=MASK, values=values, index=INDEX, config={"scale": scale}
    )


def test_good_function_is_called_with_the_documented_keywords(adv_file):
    fn = load_custom_advantage_fn(adv_file, "scaled_reward_to_go")
    assert isinstance(fn, CustomAdvantageFn)
    adv, ret = _call(fn, scale=2.0)
    # reward-to-go on valid tokens: row0 [1, 1, 0], row1 [3, 3, 3], row2 [2, 0, 0]
    expected_ret = torch.tensor([[1.0, 1.0, 0.0], [3.0, 3.0, 3.0], [2.0, 0.0, 0.0]])
    torch.testing.assert_close(ret, expected_ret, rtol=0, atol=0)
    torch.testing.assert_close(adv, 2.0 * expected_ret, rtol=0, atol=0)
    adv, _ = _call(fn, values=torch.full((3, 3), 0.5))  # with a critic, values arrive
    torch.testing.assert_close(adv, (expected_ret - 0.5) * MASK, rtol=0, atol=0)


def test_function_with_kwargs_matches_builtin(adv_file):
    fn = load_custom_advantage_fn(adv_file, "grpo_like")
    adv, ret = _call(fn)
    ref, _ = compute_grpo_outcome_advantage(REWARDS, MASK, INDEX)
    torch.testing.assert_close(adv, ref, rtol=0, atol=0)
    torch.testing.assert_close(ret, ref, rtol=0, atol=0)


def test_pickle_round_trip_reloads_from_path(adv_file):
    fn = pickle.loads(pickle.dumps(load_custom_advantage_fn(adv_file, "scaled_reward_to_go")))
    assert (fn.path, fn.name) == (adv_file, "scaled_reward_to_go")
    torch.testing.assert_close(
        _call(fn)[1], torch.tensor([[1.0, 1.0, 0.0], [3.0, 3.0, 3.0], [2.0, 0.0, 0.0]])
    )


def test_non_finite_values_on_masked_tokens_are_accepted(adv_file):
    adv, _ = _call(load_custom_advantage_fn(adv_file, "returns_nan_on_masked"))
    assert torch.isinf(adv[0, 2]) and torch.isnan(adv[2, 1])


# ------------------------------------------------------------------------------------------- load time


def test_load_missing_file(tmp_path):
    missing = str(tmp_path / "nope.py")
    with pytest.raises(ValueError, match=PATH_KEY + r"=.*nope\.py.: no such file"):
        load_custom_advantage_fn(missing, "f")


def test_load_empty_path_and_name(adv_file):
    with pytest.raises(ValueError, match=PATH_KEY + " is empty"):
        load_custom_advantage_fn("", "f")
    with pytest.raises(ValueError, match=NAME_KEY + " is empty"):
        load_custom_advantage_fn(adv_file, "")


def test_load_import_error(tmp_path):
    broken = _write(tmp_path, "def f(:\n    pass\n", "broken.py")
    with pytest.raises(ValueError, match=PATH_KEY + r"=.*broken\.py.: importing it failed: SyntaxError"):
        load_custom_advantage_fn(broken, "f")
    raising = _write(tmp_path, "raise RuntimeError('boom at import')\n", "raising.py")
    with pytest.raises(ValueError, match="RuntimeError: boom at import"):
        load_custom_advantage_fn(raising, "f")


def test_load_missing_name_lists_callables(adv_file):
    with pytest.raises(
        ValueError, match=NAME_KEY + r": .*defines no 'nope' \(callables defined there: .*'grpo_like'"
    ):
        load_custom_advantage_fn(adv_file, "nope")


def test_load_not_callable(adv_file):
    with pytest.raises(ValueError, match=NAME_KEY + r": 'NOT_CALLABLE' in .* is a int, not callable"):
        load_custom_advantage_fn(adv_file, "NOT_CALLABLE")


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("too_few_params", "unexpected keyword argument 'values'"),
        ("extra_required", "missing a required argument: 'temperature'"),
        ("positional_only", "positional only"),
    ],
)
def test_load_signature_that_does_not_fit(adv_file, name, why):
    with pytest.raises(
        ValueError, match=NAME_KEY + f": '{name}' in .*cannot be called with the keyword.*{why}"
    ):
        load_custom_advantage_fn(adv_file, name)


def test_load_async_function(adv_file):
    with pytest.raises(ValueError, match=NAME_KEY + ": 'coroutine' .* is an async function"):
        load_custom_advantage_fn(adv_file, "coroutine")


# ------------------------------------------------------------------------------------------- call time


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("returns_one", r"must return a pair \(advantages, returns\); it returned Tensor"),
        ("returns_none_returns", "returned None for returns"),
        ("returns_wrong_shape", r"advantages has shape \(3, 2\), expected \(bs, response_len\)=\(3, 3\)"),
        ("returns_int", "advantages must have a floating dtype, got torch.int64"),
        ("returns_numpy", "advantages must be a torch.Tensor, got ndarray"),
        (
            "returns_nan_on_valid",
            r"returns has 1 non-finite value\(s\) on valid tokens, first at \[1, 2\] = nan",
        ),
    ],
)
def test_call_time_errors_name_the_function_and_the_problem(adv_file, name, message):
    fn = load_custom_advantage_fn(adv_file, name)
    with pytest.raises(ValueError, match=rf"custom advantage function '{name}' \(.*my_adv\.py\).*{message}"):
        _call(fn)


def test_call_needs_a_2d_response_mask(adv_file):
    fn = load_custom_advantage_fn(adv_file, "grpo_like")
    with pytest.raises(ValueError, match=r"response_mask as a \(bs, response_len\) tensor"):
        fn(token_level_rewards=REWARDS, response_mask=MASK[0], values=None, index=INDEX, config=None)


def test_registered_estimator_that_needs_a_critic_gets_the_values():
    """``register_adv_est(name, needs_critic=True)``: the config asks for a critic, refuses
    ``critic.enable=false``, and compute_advantage hands the estimator the critic's values."""
    import numpy as np

    from rlflow.algos import advantages as adv_module
    from rlflow.algos.advantages import compute_advantage
    from rlflow.config import load_config, need_critic, validate_config
    from rlflow.protocol import DataProto
    from rlflow.trainer.ppo.core_algos import register_adv_est

    seen = {}

    def td0(token_level_rewards, response_mask, values=None, **kwargs):
        """One-step TD error with gamma 1: r_t + V_{t+1} - V_t (V = 0 after the response)."""
        seen["values"] = values
        next_values = torch.cat([values[:, 1:], torch.zeros_like(values[:, :1])], dim=-1) * response_mask
        advantages = (token_level_rewards + next_values - values) * response_mask
        return advantages, (advantages + values) * response_mask

    register_adv_est("test_td0", needs_critic=True)(td0)
    try:
        cfg = load_config(["algorithm.adv_estimator=test_td0"], config_name="demo_two_ranks")
        assert need_critic(cfg)
        with pytest.raises(ValueError, match=r"critic\.enable=false.*test_td0 needs a critic"):
            validate_config(
                load_config(
                    ["algorithm.adv_estimator=test_td0", "critic.enable=false"], config_name="demo_two_ranks"
                )
            )
        data = DataProto.from_dict(
            tensors={
                "token_level_rewards": torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]]),
                "response_mask": torch.tensor([[1, 1, 1], [1, 1, 0]]),
                "values": torch.tensor([[0.5, 0.25, 0.75], [1.0, 1.5, 0.0]]),
            },
            non_tensors={"uid": np.array(["a", "b"], dtype=object)},
        )
        advantages, returns = compute_advantage(data, cfg.algorithm)
        assert seen["values"] is not None
        # row 0: [0 + .25 - .5, 0 + .75 - .25, 1 + 0 - .75]; row 1: [0 + 1.5 - 1, 2 + 0 - 1.5, masked]
        expected = torch.tensor([[-0.25, 0.5, 0.25], [0.5, 0.5, 0.0]])
        torch.testing.assert_close(advantages, expected)
        torch.testing.assert_close(returns, (expected + data.batch["values"]) * data.batch["response_mask"])
    finally:
        adv_module.ADV_ESTIMATOR_REGISTRY.pop("test_td0", None)
        getattr(adv_module, "ADV_ESTIMATOR_INFO", {}).pop("test_td0", None)
