"""Which worker groups a run needs, and creating them colocated on one resource pool.

Every role (actor+rollout, reference, critic, reward model) is its own worker group — its own Ray
actor processes — on the bundles of one placement group per node. Each role's actor takes
``1 / number_of_roles`` of a bundle, so all of them fit on the same CPUs/GPUs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import ray

from rlflow.config import needed_roles
from rlflow.config.resource_checks import cpus_per_rank, ray_address
from rlflow.config.schema import PPOTrainerConfig
from rlflow.config.trainer_checks import forward_ahead_blocker, runtime_env_vars
from rlflow.logging.tracking import run_log_dir
from rlflow.models.cpu_linear import resolve_cpu_linear_kernel
from rlflow.protocol import DataProto
from rlflow.single_controller import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from rlflow.single_controller.worker_group import as_completed, wait_all

if TYPE_CHECKING:
    from rlflow.single_controller.futures import DataProtoFuture

__all__ = [
    "WorkerGroups",
    "build_worker_groups",
    "create_together",
    "forwards_ahead",
    "init_batches",
    "machine_cores",
    "overlap_threads",
    "overlapped_updates",
    "profiled_step",
    "rank_threads",
    "rank_threads_cap",
    "ref_beside_reward",
    "resolve_forward_ahead",
    "resource_pool",
    "score_beside_reference",
    "sync_reference",
    "values_beside_reference",
    "worker_metrics",
]

logger = logging.getLogger(__name__)


@dataclass
class WorkerGroups:
    pool: RayResourcePool
    actor: RayWorkerGroup | None
    ref: RayWorkerGroup | None = None
    critic: RayWorkerGroup | None = None
    reward_model: RayWorkerGroup | None = None
    actor_dp_size: int = 1

    def all(self) -> list[RayWorkerGroup]:
        return [g for g in (self.actor, self.ref, self.critic, self.reward_model) if g is not None]

    def shutdown(self) -> None:
        for g in self.all():
            g.shutdown()
        self.pool.remove()


def _device(config: PPOTrainerConfig) -> str:
    device = str(config.trainer.device)
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def init_batches(groups: list[RayWorkerGroup], rollout_name: str) -> list[list[RayWorkerGroup]]:
    """The order in which the roles build their models: all together, except that a vLLM rollout engine
    starts alone first (its free-memory check and KV-cache profiling must not race the other roles on the
    same GPU). ``groups[0]`` is the actor."""
    if rollout_name == "vllm" and len(groups) > 1:
        return [groups[:1], groups[1:]]
    return [groups]


def cpus_per_worker(config: PPOTrainerConfig) -> float:
    """The CPUs of one rank's bundle (`rlflow.config.resource_checks.cpus_per_rank`: with
    ``trainer.cpus_per_worker: null`` an even share of the Ray cluster's CPUs)."""
    trainer = config.trainer
    ranks = int(trainer.nnodes) * int(trainer.n_gpus_per_node)
    return cpus_per_rank(trainer.cpus_per_worker, ranks, config.ray_init.num_cpus)


def rank_threads_cap(config: PPOTrainerConfig) -> int | None:
    """The most intra-op threads one rank computes with: on a local Ray, this machine's cores
    (`machine_cores`) shared by the pool's ranks; None when the run joins a cluster (its bundles' CPUs are
    trusted).

    A local Ray may count more CPUs than the machine has cores (``ray_init.num_cpus=4`` on 2 cores, as the
    test suite starts it). Each rank would then run a bundle's worth of OpenMP threads on fewer cores, where
    their spinning waits take turns on the cores: a forward of the 13M bench model took 0.63 s with 4
    threads on 2 cores and 0.50-0.59 s with 2, and two processes splitting 4 threads made the demo's
    overlapped updates 5x slower.
    """
    if ray_address(config.ray_init.address) is not None:
        return None
    ranks = int(config.trainer.nnodes) * int(config.trainer.n_gpus_per_node)
    return max(1, machine_cores() // max(1, ranks))


def rank_threads(config: PPOTrainerConfig) -> int:
    """Intra-op threads of one rank without an ``OMP_NUM_THREADS`` of the driver's: its bundle's CPUs
    (`cpus_per_worker`), at most `rank_threads_cap`."""
    threads = max(1, int(cpus_per_worker(config)))
    cap = rank_threads_cap(config)
    return threads if cap is None else min(threads, cap)


def resource_pool(config: PPOTrainerConfig, roles: int) -> RayResourcePool:
    """The pool every role's group is placed on: one bundle of ``cpus_per_worker`` CPUs per rank
    (``trainer.nnodes × trainer.n_gpus_per_node``), ``roles`` roles colocated on each bundle, each rank
    computing with at most `rank_threads_cap` threads."""
    trainer = config.trainer
    return RayResourcePool(
        [int(trainer.n_gpus_per_node)] * int(trainer.nnodes),
        use_gpu=_device(config) == "cuda",
        max_colocate_count=roles,
        cpus_per_bundle=cpus_per_worker(config),
        name_prefix=f"rlflow_{trainer.experiment_name}",
        placement_timeout_s=float(trainer.placement_timeout_s),
        max_threads=rank_threads_cap(config),
    )


def build_worker_groups(config: PPOTrainerConfig, total_training_steps: int) -> WorkerGroups:
    """Create the resource pool and every needed role's group, then build all models (in parallel).

    Every worker receives the typed config and the run's number of training steps. On a local Ray,
    ``trainer.cpu_linear_kernel: auto`` is resolved here first (`resolve_cpu_linear_kernel`, measured on this
    machine, where the ranks run), so that every role computes with the same kernel; on a cluster joined by
    address each rank resolves it where it runs.
    """
    from rlflow.workers import ActorRolloutWorker, CriticWorker, RefWorker, RewardModelWorker

    if ray_address(config.ray_init.address) is None:
        config.trainer.cpu_linear_kernel = resolve_cpu_linear_kernel(
            str(config.trainer.cpu_linear_kernel), _device(config), rank_threads(config)
        )
    roles = needed_roles(config)
    pool = resource_pool(config, len(roles))
    timeout = float(config.trainer.worker_start_timeout_s)
    env_vars = runtime_env_vars(config.ray_init.runtime_env)  # also when Ray ran before (a notebook, a test)

    def group(cls: type, name: str, num_workers: int | None = None) -> RayWorkerGroup:
        return RayWorkerGroup(
            pool,
            RayClassWithInitArgs(cls, config=config, total_training_steps=int(total_training_steps)),
            name_prefix=name,
            env_vars=env_vars,
            num_workers=num_workers,
            start_timeout_s=timeout,
        )

    makers: dict[str, Callable[[], RayWorkerGroup]] = {
        "actor": lambda: group(ActorRolloutWorker, "actor_rollout")
    }
    if "ref" in roles:
        makers["ref"] = lambda: group(RefWorker, "ref")
    if "critic" in roles:
        critic_world = None if config.critic.world_size is None else int(config.critic.world_size)
        makers["critic"] = lambda: group(CriticWorker, "critic", critic_world)
    if "reward_model" in roles:
        makers["reward_model"] = lambda: group(RewardModelWorker, "reward_model")
    try:
        groups = WorkerGroups(pool=pool, **create_together(pool, makers))
    except BaseException:
        pool.remove()
        raise
    try:
        for batch in init_batches(groups.all(), str(config.actor_rollout_ref.rollout.name)):
            logger.info("building the models of %s", ", ".join(g.name for g in batch))
            wait_all([(g.init_model(), "init_model") for g in batch], timeout)
    except BaseException:
        groups.shutdown()  # no half-started run left holding the placement group
        raise
    sp = int(config.actor_rollout_ref.actor.ulysses_sequence_parallel_size)
    groups.actor_dp_size = groups.actor.world_size // sp
    return groups


def create_together(
    pool: RayResourcePool, makers: dict[str, Callable[[], RayWorkerGroup]]
) -> dict[str, RayWorkerGroup]:
    """Create several roles' worker groups on ``pool`` at the same time.

    A group's creation waits for its rank 0 to start (a Python process that imports torch and
    transformers, seconds of one core each), so creating the groups one after the other costs the sum of
    those starts; created together, the processes start side by side on the pool's cores. The placement
    groups are made first, once. If any creation fails, the groups that were created are shut down and the
    first error is raised.

    Args:
        pool: the shared resource pool.
        makers: role name -> a function that creates its group.

    Returns:
        role name -> its group, in the order of ``makers``.
    """
    pool.get_placement_groups()
    executor = ThreadPoolExecutor(max_workers=max(1, len(makers)), thread_name_prefix="create_group")
    started = {role: executor.submit(make) for role, make in makers.items()}
    try:
        wait(started.values())
    except BaseException:
        # an interrupt: let the creations end (bounded by their start timeout), then stop them
        executor.shutdown(wait=True)
        for group in _created(started).values():
            group.shutdown()
        raise
    executor.shutdown(wait=True)
    created = _created(started)
    failed = [f.exception() for f in started.values() if f.exception() is not None]
    if failed:
        for group in created.values():
            group.shutdown()
        raise failed[0]
    return created


def _created(started: dict[str, Future]) -> dict[str, RayWorkerGroup]:
    return {role: f.result() for role, f in started.items() if f.exception() is None}


def overlap_threads(config: PPOTrainerConfig, groups: WorkerGroups) -> tuple[int, int] | None:
    """``trainer.overlap_updates``: the intra-op threads ``(actor, critic)`` of every rank while the two
    updates of a step run at the same time, or None when they run one after the other.

    On where it helps (null): a CPU run whose critic has the actor's ranks (every bundle holds one rank of
    each) and at least 2 threads per rank. True: on every CPU run with a critic. The bundle's threads ``t``
    are split ``ceil(t / 2)`` for the actor, ``floor(t / 2)`` (at least 1) for the critic; ``t`` is the
    pool's `RayResourcePool.cpu_threads`, on a local Ray at most the machine's cores shared by the pool's
    ranks (`rank_threads_cap`): two processes' OpenMP teams on the same cores took the demo's update phase
    from 0.34 to 2.44 s.
    """
    setting = config.trainer.overlap_updates
    if setting is False or groups.critic is None:
        return None
    if _device(config) != "cpu":
        if setting:
            raise ValueError(
                "trainer.overlap_updates=true runs the critic's and the actor's updates at the same time on "
                "shared CPU cores, but this run computes on the GPU (trainer.device=auto found one), where "
                "the colocated roles of a bundle share one device. Set trainer.overlap_updates to null or false"
            )
        return None
    threads = groups.pool.cpu_threads()
    if setting is None and (threads < 2 or groups.critic.world_size != groups.actor.world_size):
        return None
    return threads - threads // 2, max(1, threads // 2)


def machine_cores() -> int:
    """The logical CPUs this process may run on (its affinity mask where the OS has one): what OpenMP
    threads of the machine's processes share."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def overlapped_updates(
    groups: WorkerGroups,
    batch: DataProto,
    adv: DataProtoFuture,
    threads: tuple[int, int],
    timing: dict[str, float],
) -> list[DataProto]:
    """``update_critic`` and ``update_actor`` of one step at the same time (`overlap_threads`); returns
    their outputs.

    ``timing`` gets ``update`` (the phase) and ``update_critic`` / ``update_actor``, each role's time from
    the phase's start until its call returned (both include the wait for the critic's values and
    advantages, which the actor's update needs too).
    """
    actor_threads, critic_threads = threads
    start = time.perf_counter()
    calls = {
        "update_critic": groups.critic.submit("update_critic", batch, adv=adv, threads=critic_threads),
        "update_actor": groups.actor.submit("update_actor", batch, adv=adv, threads=actor_threads),
    }
    outputs = []
    for name, out in as_completed(calls):
        timing[name] = time.perf_counter() - start
        outputs.append(out)
    timing["update"] = time.perf_counter() - start
    return outputs


def values_beside_reference(
    groups: WorkerGroups, batch: DataProto, threads: tuple[int, int], timing: dict[str, float]
) -> tuple[DataProto, DataProtoFuture]:
    """The reference's log-probs and the critic's values of one step at the same time (`overlap_threads`:
    the reference with the actor's part of the threads, the critic with its own). Both only read the
    step's responses. Returns ``(the reference's output, the future of the values)``; the values stay in
    the critic's object store: the driver waits for them without fetching, at most the critic group's
    ``call_timeout_s``. A critic rank's error or death surfaces in the call that reads the values.

    ``timing`` gets ``ref`` (the reference's call) and ``values`` (from the same start until the values
    are ready); the two overlap.
    """
    actor_threads, critic_threads = threads
    start = time.perf_counter()
    values = groups.critic.submit("compute_values", batch, threads=critic_threads)
    out = groups.ref.submit("compute_ref_log_prob", batch, threads=actor_threads).result()
    timing["ref"] = time.perf_counter() - start
    refs = [*values.refs, *(ref for ref, _, _ in values.watch)]
    ray.wait(refs, num_returns=len(refs), timeout=groups.critic.call_timeout_s, fetch_local=False)
    timing["values"] = time.perf_counter() - start
    return out, values


def worker_metrics(out: DataProto) -> dict[str, float]:
    """Metrics a data-parallel call returned in ``meta_info["metrics"]`` (one value per rank, already
    reduced over ranks inside the workers; the mean guards against a rank that differs)."""
    metrics = out.meta_info.get("metrics", {})
    return {k: float(np.mean(v)) if isinstance(v, list) else float(v) for k, v in metrics.items()}


def resolve_forward_ahead(config: PPOTrainerConfig, overlap: tuple[int, int] | None) -> bool:
    """``trainer.forward_ahead``: True where it applies (`forward_ahead_blocker`) and is set, or is null
    and the updates overlap (`overlap_threads`). A true setting that does not apply was refused before
    Ray."""
    setting = config.trainer.forward_ahead
    if setting is False or forward_ahead_blocker(config) is not None:
        return False
    return bool(setting) or overlap is not None


def ref_beside_reward(
    config: PPOTrainerConfig, groups: WorkerGroups, forward_ahead: bool, overlap: tuple[int, int] | None
) -> bool:
    """With ``trainer.forward_ahead`` on overlapped CPU roles, a reward model and a reference: the
    reference's log-probs are computed beside the reward model's scores (`score_beside_reference`), so
    that the actor's and the critic's forwards ahead can then run beside each other. Not with
    ``algorithm.filter_groups`` (its rounds may be dropped)."""
    return (
        forward_ahead
        and overlap is not None
        and groups.reward_model is not None
        and groups.ref is not None
        and not config.algorithm.filter_groups.enable
    )


def score_beside_reference(
    groups: WorkerGroups, batch: DataProto, threads: tuple[int, int], timing: dict[str, float]
) -> DataProto:
    """The reward model's scores and the reference's log-probs of ``batch`` at the same time (the reference
    with the actor's part of ``threads``, the reward model with the critic's; `ref_beside_reward`): the
    reward model's output with ``ref_log_prob`` joined. ``timing`` gets ``ref`` (the reference's call)."""
    actor_threads, critic_threads = threads
    start = time.perf_counter()
    ref = groups.ref.submit("compute_ref_log_prob", batch, threads=actor_threads)
    scores = groups.reward_model.submit("compute_rm_score", batch, threads=critic_threads)
    out = ref.result()
    timing["ref"] = time.perf_counter() - start
    scored = scores.result().select(meta_info_keys=[])
    return scored.union(out.select(batch_keys=["ref_log_prob"], meta_info_keys=[]))


def forwards_ahead(
    groups: WorkerGroups,
    batch: DataProto,
    threads: tuple[int, int] | None,
    timing: dict[str, float],
    actor_due: bool,
) -> tuple[DataProto | None, DataProtoFuture, dict[str, float]]:
    """``trainer.forward_ahead`` (`rlflow.engine.forward_ahead`): the critic's values through its update's
    forwards, the reference's log-probs beside them (``threads``: the reference with the actor's part, as
    `values_beside_reference`), then, when the actor's update is due, the actor's update forwards with
    every thread of the bundle. Without a reference, or when the batch already has its log-probs
    (`score_beside_reference`), the actor's forwards run beside the critic's.

    Returns:
        ``(the reference's output or None, the future of the values, the actor call's metrics)``. The
        values stay in the critic's object store (the driver waits without fetching).

    ``timing`` gets ``ref`` and ``values`` (from the phase's start) and ``forward_ahead`` (the actor's call).
    """
    actor_threads, critic_threads = threads if threads is not None else (None, None)
    start = time.perf_counter()
    ahead = DataProto(
        batch=batch.batch, non_tensor_batch=batch.non_tensor_batch, meta_info=dict(batch.meta_info)
    )
    ahead.meta_info["forward_ahead"] = True
    values = groups.critic.submit("compute_values", ahead, threads=critic_threads)
    out, metrics = None, {}
    actor, actor_start = None, start
    if groups.ref is not None and "ref_log_prob" not in batch.batch.keys():
        out = groups.ref.submit("compute_ref_log_prob", batch, threads=actor_threads).result()
        timing["ref"] = time.perf_counter() - start
    elif actor_due:
        actor = groups.actor.submit("forward_ahead", batch, threads=actor_threads)
    refs = [*values.refs, *(ref for ref, _, _ in values.watch)]
    ray.wait(refs, num_returns=len(refs), timeout=groups.critic.call_timeout_s, fetch_local=False)
    timing["values"] = time.perf_counter() - start
    if actor_due:
        if actor is None:
            both = None if threads is None else actor_threads + critic_threads
            actor, actor_start = (
                groups.actor.submit("forward_ahead", batch, threads=both),
                time.perf_counter(),
            )
        metrics = worker_metrics(actor.result())
        timing["forward_ahead"] = time.perf_counter() - actor_start
    return out, values, metrics


def sync_reference(groups: WorkerGroups, alpha: float) -> None:
    """``ref.sync_ref_model``: ``ref <- alpha * actor + (1 - alpha) * ref``, rank by rank. Each actor
    rank's local shards go to the same reference rank as a Ray object (the driver holds only refs)."""
    actor, ref = groups.actor, groups.ref
    shards = [w.weight_shards.remote() for w in actor.workers]
    done = [w.mix_in_weights.remote(s, alpha) for w, s in zip(ref.workers, shards)]
    watch = [(s, actor.name, rank) for rank, s in enumerate(shards)]
    ref.wait(done, list(range(ref.world_size)), watch, what="the reference sync")


@contextlib.contextmanager
def profiled_step(groups: WorkerGroups, trainer: Any, step: int) -> Iterator[None]:
    """``trainer.profile_steps``: on those steps the ranks each role's ``profile_ranks`` selects trace the
    step (`rlflow.single_controller.profiling`) under ``trainer.profile_dir`` (null: ``<log_dir>/profile``);
    the files are logged.

    Args:
        groups: the run's worker groups.
        trainer: the ``trainer`` config section.
        step: the training step about to run.
    """
    steps = trainer.profile_steps
    if not steps or step not in [int(s) for s in steps]:
        yield
        return
    out_dir = trainer.profile_dir or os.path.join(
        run_log_dir(trainer.log_dir, trainer.project_name, trainer.experiment_name), "profile"
    )
    for group in groups.all():
        group.start_profile(step, out_dir, group.name)
    try:
        yield
    finally:
        files = [f for group in groups.all() for rank_files in group.stop_profile() for f in rank_files]
        logger.info("step %d profiled: %d trace file(s) under %s", step, len(files), out_dir)
