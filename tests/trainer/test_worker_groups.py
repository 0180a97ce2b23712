"""Creating the roles' groups together (`create_together`), the order in which they build their models
(`init_batches`) and the threads of overlapped updates (`overlap_threads`), `rlflow.trainer.worker_groups`."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from rlflow.config import load_config, to_typed, validate_config
from rlflow.single_controller import (
    Dispatch,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    Worker,
    register,
)
from rlflow.trainer import worker_groups
from rlflow.trainer.worker_groups import WorkerGroups, create_together, init_batches, overlap_threads


def test_a_vllm_actor_builds_alone_first_everything_else_together():
    roles = ["actor", "ref", "critic"]  # init_batches only orders the groups
    assert init_batches(roles, "vllm") == [["actor"], ["ref", "critic"]]
    assert init_batches(roles, "hf") == [roles]
    assert init_batches(["actor"], "vllm") == [["actor"]]


def _typed(*overrides: str):
    return to_typed(load_config(["trainer.device=cpu", *overrides], config_name="demo"))


def _groups(cpus: float, actor_ranks: int = 1, critic_ranks: int | None = 1):
    pool = RayResourcePool([actor_ranks], cpus_per_bundle=cpus, max_colocate_count=2)  # no Ray call here
    critic = None if critic_ranks is None else SimpleNamespace(world_size=critic_ranks)
    return WorkerGroups(pool=pool, actor=SimpleNamespace(world_size=actor_ranks), critic=critic)


def test_overlapped_updates_split_the_threads_of_a_bundle_where_that_helps(monkeypatch):
    """``trainer.overlap_updates``: null = on for CPU runs with a critic on the actor's ranks and at least
    2 threads per rank (the default CPU layout), the threads split ceil / floor; true = on for every CPU run
    with a critic; false = off; never on a GPU."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(worker_groups, "machine_cores", lambda: 64)  # more cores than any bundle here
    auto, on, off = _typed(), _typed("trainer.overlap_updates=true"), _typed("trainer.overlap_updates=false")
    assert overlap_threads(auto, _groups(2.0)) == (1, 1)
    assert overlap_threads(auto, _groups(3.0)) == (2, 1)
    assert overlap_threads(auto, _groups(1.0)) is None  # single-thread ranks: nothing to split
    assert overlap_threads(on, _groups(1.0)) == (1, 1)
    assert (
        overlap_threads(auto, _groups(2.0, actor_ranks=2, critic_ranks=1)) is None
    )  # a bundle without critic
    assert overlap_threads(on, _groups(2.0, actor_ranks=2, critic_ranks=1)) == (1, 1)
    assert overlap_threads(off, _groups(2.0)) is None
    assert overlap_threads(auto, _groups(2.0, critic_ranks=None)) is None  # GRPO: one update
    monkeypatch.setenv("OMP_NUM_THREADS", "4")  # the driver's explicit thread count wins (cpu_threads)
    assert overlap_threads(auto, _groups(2.0)) == (2, 2)
    gpu = _typed("trainer.device=cuda")
    assert overlap_threads(gpu, _groups(2.0)) is None
    gpu.trainer.overlap_updates = True  # trainer.device=auto that found a GPU: refused at start
    with pytest.raises(ValueError, match=r"trainer.overlap_updates=true .* computes on the GPU"):
        overlap_threads(gpu, _groups(2.0))
    with pytest.raises(ValueError, match=r"trainer.overlap_updates=true .* trainer.device=cuda"):
        validate_config(
            load_config(["trainer.device=cuda", "trainer.overlap_updates=true"], config_name="demo")
        )


def _pool_groups(config):
    """The run's own pool (`resource_pool`, no Ray call) with a critic on every rank of the actor."""
    pool = worker_groups.resource_pool(config, 2)
    ranks = SimpleNamespace(world_size=pool.world_size)
    return WorkerGroups(pool=pool, actor=ranks, critic=ranks)


def test_overlapped_updates_split_only_the_cores_a_local_rank_has(monkeypatch):
    """A local Ray that counts more CPUs than the machine has cores (``ray_init.num_cpus=4`` on 2 cores, as
    the test suite starts it): the bundle's 4 CPUs would become two processes of 2 threads on 2 cores, whose
    spinning OpenMP waits made the demo's update phase 5x slower (2.44 s instead of 0.34 with one thread
    each). The split is of the cores each rank of the machine has; a remote cluster's bundles are trusted."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(worker_groups, "machine_cores", lambda: 2)
    local = ("ray_init.num_cpus=4",)
    auto = _typed(*local)
    assert overlap_threads(auto, _pool_groups(auto)) == (1, 1)
    two = _typed(*local, "trainer.n_gpus_per_node=2")
    assert overlap_threads(two, _pool_groups(two)) is None  # one core per rank
    two_on = _typed(*local, "trainer.n_gpus_per_node=2", "trainer.overlap_updates=true")
    assert overlap_threads(two_on, _pool_groups(two_on)) == (1, 1)
    remote = _typed(
        "ray_init.address=ray://head:10001", "ray_init.num_cpus=null", "trainer.cpus_per_worker=4"
    )
    assert overlap_threads(remote, _pool_groups(remote)) == (2, 2)
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")  # joined as init_ray joins it
    joined = _typed("trainer.cpus_per_worker=4")
    assert overlap_threads(joined, _pool_groups(joined)) == (2, 2)


def test_a_local_rank_computes_with_at_most_the_cores_it_has(monkeypatch):
    """Every call, not only the overlapped updates: on a local Ray that counts more CPUs than the machine has
    cores (``ray_init.num_cpus=4`` on 2 cores, as the test suite starts it), the demo's one rank per role got
    4 OpenMP threads on 2 cores for its generation, forwards and sequential updates, whose waiting threads
    take turns on the cores (a 13M forward: 0.63 s with 4 threads, 0.50-0.59 s with 2). A rank's threads
    are the cores of the machine shared by the pool's ranks; a remote cluster's bundles are trusted, and an
    explicit ``OMP_NUM_THREADS`` wins."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(worker_groups, "machine_cores", lambda: 2)

    def threads(*overrides: str) -> int:
        return worker_groups.resource_pool(_typed("ray_init.num_cpus=4", *overrides), 4).cpu_threads()

    assert threads() == 2  # one rank, a 4-CPU bundle
    assert threads("trainer.n_gpus_per_node=2") == 1  # two ranks, 2 CPUs each
    assert threads("trainer.cpus_per_worker=1") == 1  # fewer CPUs than cores: the bundle's
    remote = ("ray_init.address=ray://head:10001", "ray_init.num_cpus=null", "trainer.cpus_per_worker=4")
    assert threads(*remote) == 4
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads() == 3


START_S = 3.0


class SlowStartWorker(Worker):
    """Takes ``START_S`` to construct and remembers when (a rank 0 that imports a large library)."""

    def __init__(self) -> None:
        super().__init__()
        self.started = time.time()
        time.sleep(START_S)
        self.ready = time.time()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def construction(self) -> tuple[float, float]:
        return self.started, self.ready


@pytest.mark.usefixtures("ray_session")
def test_groups_are_created_together_and_none_is_left_when_one_fails():
    """`create_together`: the groups' rank-0 actors start at the same time (one after the other their
    constructions could not overlap); when one creation fails, the groups already created are shut down
    and its error is raised."""
    import ray

    pool = RayResourcePool([1], cpus_per_bundle=1.0, name_prefix="together", max_colocate_count=2)
    made: list[RayWorkerGroup] = []
    actors = []  # the rank-0 actor of each group made

    def maker(name: str):
        def make() -> RayWorkerGroup:
            made.append(RayWorkerGroup(pool, RayClassWithInitArgs(SlowStartWorker), name_prefix=name))
            actors.append(made[-1].workers[0])
            return made[-1]

        return make

    try:
        groups = create_together(pool, {"a": maker("a"), "b": maker("b")})
        assert list(groups) == ["a", "b"] and [g.name for g in groups.values()] == ["a", "b"]
        (a0, a1), (b0, b1) = (g.construction()[0] for g in groups.values())
        assert a0 < b1 and b0 < a1
        for g in groups.values():
            g.shutdown()
        made.clear()

        def broken() -> RayWorkerGroup:
            raise ValueError("no such model")

        with pytest.raises(ValueError, match="no such model"):
            create_together(pool, {"a": maker("a"), "b": broken})
        assert len(made) == 1 and made[0].world_size == 0  # "a" was created, then shut down
        deadline = time.monotonic() + 60  # ray.kill is asynchronous: a call right after it may still run
        with pytest.raises(ray.exceptions.RayActorError):
            while time.monotonic() < deadline:
                ray.get(actors[-1].construction.remote(), timeout=60)
                time.sleep(0.2)
    finally:
        for g in made:
            g.shutdown()
        pool.remove()


class ScoringWorker(Worker):
    """A stand-in for the reference (``compute_ref_log_prob``) and the critic (``compute_values``,
    non-blocking): each records its threads and wall-clock interval; ``mode`` makes the values fail or
    hang."""

    def __init__(self, mode: str = "ok") -> None:
        super().__init__()
        self.mode = mode

    def _timed(self, data, key: str):
        import torch

        from rlflow.protocol import DataProto

        start = time.time()
        if self.mode == "raise":
            raise RuntimeError("critic forward failed")
        time.sleep(600.0 if self.mode == "hang" else 1.0)
        n = len(data)
        return DataProto.from_dict(
            tensors={
                key: data.batch["x"] * 2.0,
                "threads": torch.full((n,), torch.get_num_threads()),
                "interval": torch.tensor([[start, time.time()]], dtype=torch.float64).expand(n, 2),
            }
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_ref_log_prob(self, data):
        return self._timed(data, "ref_log_prob")

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def compute_values(self, data):
        return self._timed(data, "values")


@pytest.mark.usefixtures("ray_session")
def test_values_are_computed_beside_the_reference_and_never_block_for_ever(monkeypatch):
    """`values_beside_reference`: the critic's values and the reference's log-probs run at the same time
    with the threads given; the values stay a future (the driver fetches nothing); a failing critic
    surfaces where the values are read, and a hanging one stops the driver's wait after the critic
    group's ``call_timeout_s``."""
    import torch

    from rlflow.protocol import DataProto
    from rlflow.single_controller.futures import DataProtoFuture, FutureSlice

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    pool = RayResourcePool([1], cpus_per_bundle=2.0, name_prefix="beside", max_colocate_count=4)
    made: list[RayWorkerGroup] = []

    def group(name: str, mode: str = "ok", timeout: float | None = None) -> RayWorkerGroup:
        made.append(
            RayWorkerGroup(
                pool, RayClassWithInitArgs(ScoringWorker, mode), name_prefix=name, call_timeout_s=timeout
            )
        )
        return made[-1]

    batch = DataProto.from_dict(tensors={"x": torch.arange(3.0)})
    try:
        ref = group("ref")
        groups = WorkerGroups(pool=pool, actor=None, ref=ref, critic=group("critic"))
        timing: dict[str, float] = {}
        with monkeypatch.context() as m:  # the driver never materialises the values
            m.setattr(FutureSlice, "resolve", lambda *a: pytest.fail("the driver fetched the values"))
            out, values = worker_groups.values_beside_reference(groups, batch, (1, 1), timing)
        assert isinstance(values, DataProtoFuture)
        assert 0 < timing["ref"] <= timing["values"]
        got = values.get()
        assert torch.equal(got.batch["values"], torch.arange(3.0) * 2) and out.batch[
            "ref_log_prob"
        ].shape == (3,)
        assert out.batch["threads"].tolist() == [1, 1, 1] and got.batch["threads"].tolist() == [1, 1, 1]
        (a0, a1), (b0, b1) = out.batch["interval"][0].tolist(), got.batch["interval"][0].tolist()
        assert a0 < b1 and b0 < a1  # at the same time

        failing = WorkerGroups(pool=pool, actor=None, ref=ref, critic=group("critic_raise", "raise"))
        _, values = worker_groups.values_beside_reference(failing, batch, (1, 1), {})
        with pytest.raises(RuntimeError, match="critic forward failed"):
            values.get()

        hanging = WorkerGroups(pool=pool, actor=None, ref=ref, critic=group("critic_hang", "hang", 2.0))
        start = time.monotonic()
        worker_groups.values_beside_reference(hanging, batch, (1, 1), {})
        assert time.monotonic() - start < 30  # the reference's second, then at most call_timeout_s
    finally:
        for g in made:
            g.shutdown()
        pool.remove()


SINGLE_PASS = ("actor_rollout_ref.actor.ppo_mini_batch_size=16", "critic.ppo_mini_batch_size=16")


def test_forward_ahead_runs_where_it_applies_and_true_is_refused_where_it_cannot():
    """``trainer.forward_ahead``: null = on for single-pass updates with a critic when the updates overlap;
    true = wherever it applies, refused before Ray naming the key that stops it; false = off."""
    from rlflow.config.trainer_checks import forward_ahead_blocker
    from rlflow.trainer.worker_groups import resolve_forward_ahead

    auto = _typed(*SINGLE_PASS)
    assert forward_ahead_blocker(auto) is None
    assert resolve_forward_ahead(auto, (1, 1)) and not resolve_forward_ahead(auto, None)
    assert resolve_forward_ahead(_typed(*SINGLE_PASS, "trainer.forward_ahead=true"), None)
    assert not resolve_forward_ahead(_typed(*SINGLE_PASS, "trainer.forward_ahead=false"), (1, 1))
    demo = _typed()  # the demo: 4 mini-batches per step
    assert "ppo_mini_batch_size=4 of data.train_batch_size=16" in forward_ahead_blocker(demo)
    assert not resolve_forward_ahead(demo, (1, 1))
    blocked = {
        "algorithm.adv_estimator=grpo": "trains no critic",
        "critic.ppo_epochs=2": "critic's update is not a single pass",
        "critic.model.enable_activation_offload=true": "critic.model.enable_activation_offload is set",
        "actor_rollout_ref.actor.moe_aux_loss_coef=0.01": "moe_aux_loss_coef is set",
        "algorithm.use_pf_ppo=true": "algorithm.use_pf_ppo is set",
        "actor_rollout_ref.actor.policy_loss.loss_mode=clip_cov": "loss_mode=clip_cov",
    }
    for override, reason in blocked.items():
        cfg = load_config(["trainer.device=cpu", *SINGLE_PASS, override], config_name="demo")
        assert reason in forward_ahead_blocker(cfg), override
        cfg.trainer.forward_ahead = True
        with pytest.raises(ValueError, match=r"trainer.forward_ahead=true, but .*" + reason.split()[0]):
            validate_config(cfg)
