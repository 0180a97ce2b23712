"""End-to-end runs of the CPU schedule and kernels: the critic's values beside the reference and the two
updates together (``trainer.overlap_updates``), the updates' forwards run ahead of the advantages
(``trainer.forward_ahead``), and the linear layers through oneDNN
(``trainer.cpu_linear_kernel``), each against the plain run at the golden run's tolerances.

Slow-marked (still run by default and in CI), on a real local Ray with the embedded tiny model.
"""

from __future__ import annotations

import pytest
import torch

from rlflow.config import load_config
from rlflow.models.cpu_linear import OneDNNLinear
from rlflow.single_controller.futures import DataProtoFuture, FutureSlice
from rlflow.trainer.main_ppo import build_trainer, run_ppo
from rlflow.utils.onednn import onednn_linear_available
from tests.trainer.test_e2e import _comparable, _golden_tolerance, _overrides

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_session")]


def test_overlapped_updates_and_forwards_ahead_train_as_the_sequential_ones(tmp_path, monkeypatch):
    """The default CPU layout (one rank per role, 2 threads) with a reference (KL in the reward), a reward
    model and single-pass updates (one mini-batch per step). ``overlap``: the critic's values beside the
    reference's log-probs, then the critic's and the actor's updates of a step together, one thread each
    (``trainer.overlap_updates``, ``trainer.forward_ahead=false``). ``ahead``: the reference beside the
    reward model, the critic's values through its update's forwards beside the actor's update forwards,
    then the two backwards together (``trainer.forward_ahead``, null: on). Two steps of each give the
    metrics of the same run with every call one after the other, to the golden run's tolerances (the
    thread count changes the summation order of some reductions, not the math), the timing says which
    phase ran how, and the values never reach the driver."""
    from tests.tiny_reward_model import save_tiny_reward_model

    def forbidden(self, *a, **k):
        raise AssertionError("the driver materialised a values future")

    monkeypatch.setattr(FutureSlice, "resolve", forbidden)
    monkeypatch.setattr(DataProtoFuture, "get", forbidden)
    reward_model = save_tiny_reward_model(tmp_path / "rm")
    variants = {
        "ahead": ("trainer.overlap_updates=null",),
        "overlap": ("trainer.overlap_updates=null", "trainer.forward_ahead=false"),
        "sequential": ("trainer.overlap_updates=false",),
    }
    runs = {}
    for name, settings in variants.items():
        cfg = load_config(
            _overrides(
                tmp_path / name,
                *settings,
                "trainer.cpus_per_worker=2",
                "actor_rollout_ref.model.path=rlflow://tiny",
                "critic.model.path=rlflow://tiny",
                "algorithm.use_kl_in_reward=true",
                "reward_model.enable=true",
                f"reward_model.model.path={reward_model}",
                "actor_rollout_ref.actor.ppo_mini_batch_size=8",  # single pass: the whole step
                "critic.ppo_mini_batch_size=8",
            ),
            config_name="demo",
        )
        runs[name] = run_ppo(cfg)["history"]
    for ahead, together, apart in zip(runs["ahead"], runs["overlap"], runs["sequential"], strict=True):
        for run in (ahead, together):
            assert "timing_s/update" in run and "timing_s/values" in run
            for role in ("update_critic", "update_actor"):  # each role's own time, inside the phase
                assert 0 < run[f"timing_s/{role}"] <= run["timing_s/update"] + 1e-6
        assert "timing_s/update" not in apart and "timing_s/values" not in apart
        # overlap: the values beside the reference, the phase lasts until both are done
        assert 0 < together["timing_s/ref"] <= together["timing_s/values"] + 1e-6
        assert "timing_s/forward_ahead" not in together
        # ahead: the reference inside the reward phase, the actor's forwards beside the critic's values
        assert 0 < ahead["timing_s/ref"] <= ahead["timing_s/reward"] + 1e-6
        assert ahead["perf/actor/forward_ahead/time_s"] > 0 and ahead["timing_s/forward_ahead"] > 0
        assert "actor/reward_kl_penalty" in ahead and "actor/reward_kl_penalty" in together
        want = _comparable(apart)
        for got in (_comparable(ahead), _comparable(together)):
            assert sorted(k for k in got if "forward_ahead" not in k) == sorted(want)
            for key, value in want.items():
                assert got[key] == pytest.approx(value, **_golden_tolerance(key, want)), key


@pytest.mark.skipif(not onednn_linear_available(), reason="this torch build has no oneDNN")
def test_onednn_linear_layers_train_as_f_linear(tmp_path):
    """``trainer.cpu_linear_kernel=onednn`` (every role's linear layers through oneDNN: actor, rollout's
    fallback modules, reference, critic, reward model) gives the metrics of ``aten`` over two steps of the
    default layout with a reward model, to the golden run's tolerances: another kernel's summation order,
    the same math."""
    from tests.tiny_reward_model import save_tiny_reward_model

    def kernels(worker) -> set[str]:  # the classes computing the role's linear layers
        return {type(m).__name__ for m in worker.module.modules() if isinstance(m, torch.nn.Linear)}

    reward_model = save_tiny_reward_model(tmp_path / "rm")
    runs, classes = {}, {}
    for kernel in ("onednn", "aten"):
        cfg = load_config(
            _overrides(
                tmp_path / kernel,
                f"trainer.cpu_linear_kernel={kernel}",
                "actor_rollout_ref.model.path=rlflow://tiny",
                "critic.model.path=rlflow://tiny",
                "reward_model.enable=true",
                f"reward_model.model.path={reward_model}",
                "algorithm.use_kl_in_reward=true",  # a reference role
            ),
            config_name="demo",
        )
        trainer = build_trainer(cfg)
        try:
            trainer.fit()
            classes[kernel] = {g.name: set().union(*g.execute_fn(kernels)) for g in trainer.groups.all()}
        finally:
            trainer.shutdown()
        runs[kernel] = trainer.history
    assert len(classes["onednn"]) == 4  # actor, reference, critic, reward model
    assert all(found == {OneDNNLinear.__name__} for found in classes["onednn"].values()), classes
    assert all(found == {"Linear"} for found in classes["aten"].values()), classes
    for fast, plain in zip(runs["onednn"], runs["aten"], strict=True):
        got, want = _comparable(fast), _comparable(plain)
        assert sorted(got) == sorted(want)
        for key, value in want.items():
            assert got[key] == pytest.approx(value, **_golden_tolerance(key, want)), key
