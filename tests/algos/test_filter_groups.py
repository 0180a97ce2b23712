"""DAPO's group filter (`rlflow.algos.filter_groups`) and the trainer's generation rounds
(`rlflow.trainer.dynamic_sampling`), on hand-made batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlflow.algos.filter_groups import informative_groups
from rlflow.config import load_config, to_typed, validate_config
from rlflow.protocol import DataProto
from rlflow.trainer.dynamic_sampling import OutOfData, filter_metric, sample_informative_groups


def test_groups_with_equal_metrics_are_dropped_and_singletons_kept():
    uids = ["a", "a", "b", "b", "c", "d", "d"]
    values = [1.0, 1.0, 0.0, 1.0, 5.0, 0.5, 0.5]
    assert informative_groups(uids, values) == ([2, 3, 4], 2)
    assert informative_groups(["a", "a"], [0.0, 0.0]) == ([], 0)
    with pytest.raises(ValueError, match="non-finite"):
        informative_groups(["a", "a"], [0.0, float("nan")])


N = 2  # responses per prompt


def _round(step: int, first_prompt: int, accs: list[float]) -> tuple[DataProto, dict, dict]:
    """A scored round of len(accs) // N prompts: uids and a ``row`` tensor numbered from first_prompt."""
    rows = len(accs)
    uids = [f"{step}-{first_prompt + i // N}" for i in range(rows)]
    scores = torch.zeros(rows, 3)
    scores[:, -1] = torch.tensor(accs)
    batch = DataProto.from_single_dict(
        {
            "row": torch.arange(first_prompt * N, first_prompt * N + rows),
            "token_level_scores": scores,
            "uid": np.array(uids, dtype=object),
        }
    )
    return batch, {"gen/x": float(first_prompt)}, {"acc": accs, "score": accs}


def _config(*extra: str):
    cfg = load_config(
        [
            "algorithm.adv_estimator=grpo",
            f"actor_rollout_ref.rollout.n={N}",
            "data.train_batch_size=2",
            "data.gen_batch_size=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "algorithm.filter_groups.enable=true",
            "algorithm.filter_groups.metric=acc",
            *extra,
        ],
        config_name="demo_two_ranks",
    )
    validate_config(cfg)
    return to_typed(cfg)


def test_rounds_continue_until_enough_groups_and_keep_the_first_ones():
    # round 1: prompt 0 all-correct (dropped), prompt 1 mixed (kept); round 2: prompts 2 and 3 mixed.
    plan = {2: [1.0, 0.0, 0.0, 1.0]}
    calls = []

    def rollout(prompts, first):
        calls.append(first)
        return _round(7, first, plan[first])

    rounds = [_round(7, 0, [1.0, 1.0, 0.0, 1.0])]
    batch, metrics = sample_informative_groups(_config(), rounds, rollout, iter([(0, None)]), 7)
    assert calls == [2]  # the second round numbers its prompts after the first round's two
    assert batch.batch["row"].tolist() == [2, 3, 4, 5]  # prompt 1's rows, then prompt 2's; prompt 3 cut
    assert list(batch.non_tensor_batch["uid"]) == ["7-1", "7-1", "7-2", "7-2"]
    assert batch.meta_info == {"global_steps": 7, "global_batch_size": 4}
    assert metrics == {"train/num_gen_batches": 2.0, "train/informative_prompt_fraction": 3 / 4}


def test_round_limit_and_exhausted_data_are_reported():
    flat = [1.0, 1.0, 0.0, 0.0]

    def rollout(prompts, first):
        return _round(1, first, flat)

    with pytest.raises(RuntimeError, match="max_num_gen_batches=2"):
        sample_informative_groups(
            _config("algorithm.filter_groups.max_num_gen_batches=2"),
            [_round(1, 0, flat)],
            rollout,
            iter([(0, None)] * 5),
            1,
        )
    with pytest.raises(OutOfData, match="ran out"):
        sample_informative_groups(_config(), [_round(1, 0, flat)], rollout, iter([(0, None)]), 1)


def test_metric_values():
    batch, _, extra = _round(1, 0, [1.0, 0.0])
    assert filter_metric("acc", batch, extra).tolist() == [1.0, 0.0]
    assert filter_metric("seq_reward", batch, extra).tolist() == [1.0, 0.0]
    with pytest.raises(ValueError, match=r"'accuracy' is not a numeric key.*'acc', 'score'"):
        filter_metric("accuracy", batch, extra)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["algorithm.filter_groups.metric=null"], "algorithm.filter_groups.metric must be set"),
        (["actor_rollout_ref.rollout.n=1"], "rollout.n=1"),
        (
            ["algorithm.filter_groups.metric=seq_final_reward", "algorithm.use_kl_in_reward=true"],
            "seq_final_reward",
        ),
        (["algorithm.filter_groups.enable=false", "data.gen_batch_size=4"], "data.gen_batch_size=4"),
    ],
)
def test_dynamic_sampling_settings_are_checked(overrides, message):
    with pytest.raises(ValueError, match=r"algorithm\.filter_groups|data\.gen_batch_size") as err:
        _config(*overrides)
    assert message in str(err.value)


def test_gen_batch_size_without_filtering_is_the_steps_size_as_verl_reads_it(caplog):
    """verl's loader yields rounds of data.gen_batch_size prompts and, without filter_groups, trains on all
    of them: the trainer's prepare_config makes that the step's size, with a warning; with dynamic sampling
    on, the two sizes keep their meanings."""
    from rlflow.trainer.main_ppo import prepare_config

    sizes = [
        "data.train_batch_size=4",
        "data.gen_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    ]
    with caplog.at_level("WARNING", logger="rlflow.config.global_sizes"):
        cfg = prepare_config(load_config(sizes, config_name="demo_two_ranks"), build_warm_start=False)
    assert (cfg.data.train_batch_size, cfg.data.gen_batch_size) == (8, 8)
    assert "data.train_batch_size=4 becomes 8" in caplog.text
    assert to_typed(cfg).data.train_batch_size == 8  # two mini-batches of 4 prompts per step
    caplog.clear()
    filtering = [*sizes, "algorithm.adv_estimator=grpo", "algorithm.filter_groups.enable=true"]
    filtering += ["algorithm.filter_groups.metric=acc", "actor_rollout_ref.rollout.n=2"]
    cfg = prepare_config(load_config(filtering, config_name="demo_two_ranks"), build_warm_start=False)
    assert (cfg.data.train_batch_size, cfg.data.gen_batch_size) == (4, 8)
    assert "becomes" not in caplog.text
