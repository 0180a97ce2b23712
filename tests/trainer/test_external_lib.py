"""``actor_rollout_ref.model.external_lib``: a user module registering an advantage estimator, a policy loss
and a reward manager is imported by the driver (before validation) and by every worker."""

from __future__ import annotations

import textwrap

import pytest

from rlflow.config import load_config
from rlflow.trainer.main_ppo import prepare_config, run_ppo

EXTENSION = """
    import torch

    from rlflow.reward import NaiveRewardManager, register_reward_manager
    from rlflow.trainer.ppo import core_algos


    @core_algos.register_adv_est("ext_offset")
    def offset_advantage(token_level_rewards, response_mask, index, config=None, **kwargs):
        scores = (token_level_rewards * response_mask).sum(-1, keepdim=True)
        return (scores - 0.25) * response_mask, scores * response_mask


    @core_algos.register_policy_loss("ext_vanilla")
    def counted_vanilla(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, **kwargs):
        loss, clipfrac, ppo_kl, _ = core_algos.get_policy_loss_fn("vanilla")(
            old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, **kwargs
        )
        return loss, {"actor/pg_clipfrac": clipfrac, "actor/ppo_kl": ppo_kl, "actor/ext_loss_used": 1.0}


    @register_reward_manager("ext_constant")
    class ConstantReward(NaiveRewardManager):
        def __init__(self, tokenizer, num_examine, compute_score=None, reward_fn_key="data_source", value=0.0):
            super().__init__(tokenizer, num_examine, compute_score, reward_fn_key)
            self.value = value

        def __call__(self, data, return_dict=False):
            out = super().__call__(data, return_dict=True)
            reward = torch.zeros_like(out["reward_tensor"])
            lengths = data.batch["attention_mask"][:, data.batch["prompts"].shape[-1]:].sum(-1)
            reward[torch.arange(len(lengths)), lengths - 1] = self.value
            extra = {"score": [self.value] * len(lengths)}
            return {"reward_tensor": reward, "reward_extra_info": extra} if return_dict else reward
"""


@pytest.fixture(scope="module")
def extension(tmp_path_factory):
    # one file for the module: registering a name again from another file is refused, as it should be
    path = tmp_path_factory.mktemp("ext") / "my_rl_ext.py"
    path.write_text(textwrap.dedent(EXTENSION))
    return str(path)


def _overrides(extension: str, tmp_path) -> list[str]:
    return [
        f"actor_rollout_ref.model.external_lib={extension}",
        "algorithm.adv_estimator=ext_offset",
        "actor_rollout_ref.actor.policy_loss.loss_mode=ext_vanilla",
        "reward_model.reward_manager=ext_constant",
        "+reward_model.reward_kwargs.value=0.5",
        "actor_rollout_ref.rollout.n=2",
        "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "trainer.total_training_steps=2",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        "trainer.logger=[console]",
        f"trainer.default_local_dir={tmp_path / 'ckpt'}",
    ]


def test_registered_names_pass_validation_only_with_the_module(extension, tmp_path):
    prepare_config(
        load_config(_overrides(extension, tmp_path), config_name="demo_two_ranks"), build_warm_start=False
    )
    without = [o for o in _overrides(extension, tmp_path) if "external_lib" not in o]
    without = [o.replace("ext_offset", "ext_offset_unregistered") for o in without]
    with pytest.raises(ValueError, match=r"algorithm\.adv_estimator='ext_offset_unregistered'"):
        prepare_config(load_config(without, config_name="demo_two_ranks"), build_warm_start=False)
    with pytest.raises(ValueError, match=r"external_lib: cannot import 'no_such_module_xyz'"):
        prepare_config(
            load_config(
                ["actor_rollout_ref.model.external_lib=no_such_module_xyz"], config_name="demo_two_ranks"
            ),
            build_warm_start=False,
        )
    bad_kwargs = [*_overrides(extension, tmp_path), "+reward_model.reward_kwargs.scale=2"]
    with pytest.raises(ValueError, match=r"takes no argument\(s\) \['scale'\]"):
        prepare_config(load_config(bad_kwargs, config_name="demo_two_ranks"), build_warm_start=False)


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_a_registering_module_trains_in_the_driver_and_the_workers(extension, tmp_path):
    history = run_ppo(load_config(_overrides(extension, tmp_path), config_name="demo_two_ranks"))["history"]
    for h in [h for h in history if h["step"] > 0]:
        assert h["critic/score/mean"] == pytest.approx(0.5)  # the registered manager (driver)
        assert h["critic/advantages/mean"] == pytest.approx(0.25, abs=1e-6)  # the registered estimator
        assert h["actor/ext_loss_used"] == 1.0  # the registered loss ran in the actor workers
