"""Worker groups: one Ray actor per bundle, and the group-level methods ``@register`` describes."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rlflow.single_controller.decorator import (
    DROP_OUTPUT_KWARG,
    THREADS_KWARG,
    MeshDispatch,
    MeshInfo,
    MethodSpec,
    collect_dp_proto,
    dispatch_for,
    future_from_refs,
    is_data_parallel,
    registered_methods,
)
from rlflow.single_controller.futures import DataProtoFuture
from rlflow.single_controller.resource_pool import RayResourcePool

logger = logging.getLogger(__name__)


class WorkerGroupError(RuntimeError):
    """A rank of a worker group died, or its call failed, or did not finish in time."""


@dataclass
class RayClassWithInitArgs:
    """A worker class and the arguments its actors are constructed with."""

    cls: type
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    options: dict = field(default_factory=dict)

    def __init__(self, cls: type, *args: Any, **kwargs: Any) -> None:
        self.cls, self.args, self.kwargs, self.options = cls, args, kwargs, {}

    def update_options(self, options: dict) -> None:
        """Extra ``.options(...)`` for every actor (e.g. ``max_concurrency``)."""
        self.options.update(options)


@dataclass
class GroupFuture:
    """Result of a non-blocking call whose results are not a ``DataProto``; ``get()`` waits for it."""

    group: RayWorkerGroup
    refs: list[Any]
    ranks: list[int]
    collect: Callable[[list[Any]], Any]

    def get(self, timeout_s: float | None = None, what: str | None = None) -> Any:
        """Wait for the call (at most ``timeout_s``, logging a heartbeat; see `RayWorkerGroup.wait`)."""
        return self.collect(self.group.wait(self.refs, self.ranks, timeout_s=timeout_s, what=what))


@dataclass
class PendingCall:
    """A blocking group method started without waiting (`RayWorkerGroup.submit`)."""

    group: RayWorkerGroup
    refs: list[Any]
    ranks: list[int]
    watch: list[tuple[Any, str, int]]
    collect: Callable[[list[Any]], Any]

    def result(self) -> Any:
        """Wait for every rank (failing fast on a dead or failing one, `RayWorkerGroup.wait`) and return
        what the plain blocking call returns."""
        return self.collect(self.group.wait(self.refs, self.ranks, self.watch))


def as_completed(calls: Mapping[str, PendingCall]) -> Iterator[tuple[str, Any]]:
    """``(name, result)`` of each call, in the order they finish.

    A call counts as finished when one of its ranks has (a call's ranks finish together: they end in the
    same collectives); its `PendingCall.result` then waits for the rest, and raises its error.

    Args:
        calls: name -> a started call (`RayWorkerGroup.submit`).
    """
    pending = dict(calls)
    while pending:
        refs = [ref for call in pending.values() for ref in call.refs]
        ready, _ = ray.wait(refs, num_returns=1, timeout=None, fetch_local=False)
        for name, call in list(pending.items()):
            if any(ref in call.refs for ref in ready):
                del pending[name]
                yield name, call.result()


def wait_all(
    futures: list[tuple[GroupFuture, str]], timeout_s: float | None, heartbeat_s: float = 30.0
) -> None:
    """Wait for several groups' calls together, e.g. every role's ``init_model``.

    Every ``heartbeat_s`` a line names each group still pending, its ranks and the time waited; after
    ``timeout_s`` a `WorkerGroupError` names them. An error or a dead rank in any group is raised at once.

    Args:
        futures: ``(future, what)`` pairs; ``what`` describes the call (``"init_model"``).
        timeout_s: bound on the whole wait; None = no bound (dead ranks are still detected).
        heartbeat_s: seconds between progress lines.
    """
    owner: dict[Any, tuple[GroupFuture, int, str]] = {}
    for future, what in futures:
        for ref, rank in zip(future.refs, future.ranks):
            owner[ref] = (future, rank, what)
    pending = list(owner)
    start = last_beat = time.monotonic()
    while pending:
        ready, _ = ray.wait(pending, num_returns=1, timeout=1.0, fetch_local=False)
        for ref in ready:
            pending.remove(ref)
            future, rank, _ = owner[ref]
            _get_one(ref, future.group.name, rank)
        waited = time.monotonic() - start
        if pending and timeout_s is not None and waited > timeout_s:
            raise WorkerGroupError(
                f"{_pending_summary(pending, owner)} did not finish within {timeout_s:g} s "
                "(trainer.worker_start_timeout_s); a rank that never starts usually waits for a Ray worker "
                "process or for the resources of its placement-group bundle"
            )
        if pending and time.monotonic() - last_beat >= heartbeat_s:
            last_beat = time.monotonic()
            limit = "" if timeout_s is None else f" of {timeout_s:g} s"
            logger.info("still waiting after %.0f s%s: %s", waited, limit, _pending_summary(pending, owner))


def _pending_summary(pending: list[Any], owner: dict[Any, tuple[GroupFuture, int, str]]) -> str:
    by_call: dict[tuple[str, str], list[int]] = {}
    for ref in pending:
        future, rank, what = owner[ref]
        by_call.setdefault((future.group.name, what), []).append(rank)
    return "; ".join(
        f"worker group {group!r}: {what} on ranks {sorted(ranks)}" for (group, what), ranks in by_call.items()
    )


class RayWorkerGroup:
    """``world_size`` actors of one role, placed on the bundles of ``resource_pool``.

    Args:
        resource_pool: where the actors go (colocated roles share one pool).
        ray_cls_with_init: the worker class (a :class:`~rlflow.single_controller.worker.Worker`
            subclass) and its constructor arguments.
        name_prefix: names the group in errors and logs.
        call_timeout_s: optional bound on every blocking call (``None``: no bound beyond dead-worker
            detection, which is always on).
        env_vars: extra environment variables for every actor (the driver's ``RLFLOW_*`` variables, such
            as ``RLFLOW_CACHE_DIR``, are passed on too).
        num_workers: use only the first ``num_workers`` bundles of the pool (a role with a smaller
            world size than the others it is colocated with); ``None``: every bundle.
        start_timeout_s: bound on the start of rank 0's actor, which the group waits for while it is
            created (the other ranks need its rendezvous address); ``None``: no bound. A heartbeat line
            is logged every ``heartbeat_s`` while waiting.
        heartbeat_s: seconds between progress lines of bounded waits.
    """

    def __init__(
        self,
        resource_pool: RayResourcePool,
        ray_cls_with_init: RayClassWithInitArgs,
        name_prefix: str = "worker",
        call_timeout_s: float | None = None,
        env_vars: dict[str, str] | None = None,
        num_workers: int | None = None,
        start_timeout_s: float | None = None,
        heartbeat_s: float = 30.0,
    ) -> None:
        self.num_workers = num_workers
        self.resource_pool = resource_pool
        self.name = name_prefix
        self.call_timeout_s = call_timeout_s
        self.start_timeout_s = start_timeout_s
        self.heartbeat_s = heartbeat_s
        self._cls = ray_cls_with_init
        self._workers: list[Any] = []
        self._mesh_info: dict[str, MeshInfo] = {}
        try:
            self._create_workers(env_vars or {})
        except BaseException:
            self.shutdown()  # kill the actors already created
            raise
        self._bind_methods()

    # ---- creation --------------------------------------------------------------------------------------

    def _create_workers(self, env_vars: dict[str, str]) -> None:
        slots = self.resource_pool.bundle_slots()
        if self.num_workers is not None:
            if not 1 <= self.num_workers <= len(slots):
                raise ValueError(
                    f"worker group {self.name!r}: num_workers={self.num_workers} must be between 1 and the "
                    f"pool's {len(slots)} bundles"
                )
            slots = slots[: self.num_workers]
        world = len(slots)
        remote_cls = ray.remote(self._cls.cls)
        master: dict[str, str] = {}
        inherited = {k: v for k, v in os.environ.items() if k.startswith("RLFLOW_")}  # e.g. RLFLOW_CACHE_DIR
        for rank, (pg, bundle, local_rank) in enumerate(slots):
            env = {
                **inherited,
                "OMP_NUM_THREADS": str(self.resource_pool.cpu_threads()),
                **self.resource_pool.allocator_env(),
                **env_vars,
                "RANK": str(rank),
                "WORLD_SIZE": str(world),
                "LOCAL_RANK": str(local_rank),
            }
            env["RLFLOW_WORKER_GROUP"] = self.name
            # rank 0 binds a new rendezvous store (Worker.__init__): a MASTER_ADDR/PORT the Ray processes
            # inherited (e.g. from a driver that ran a process group itself) must not reach it
            env.update(master or {"MASTER_ADDR": "", "MASTER_PORT": ""})
            options = {
                **self.resource_pool.actor_resources(),
                "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    pg, placement_group_bundle_index=bundle
                ),
                "runtime_env": {"env_vars": env},
                **self._cls.options,
            }
            actor = remote_cls.options(**options).remote(*self._cls.args, **self._cls.kwargs)
            self._workers.append(actor)
            if rank == 0:
                what = "start of the rank-0 actor (rendezvous address)"
                ref = actor.get_master_addr_port.remote()
                addr, port = self.wait([ref], [0], timeout_s=self.start_timeout_s, what=what)[0]
                master = {"MASTER_ADDR": addr, "MASTER_PORT": str(port)}

    def _bind_methods(self) -> None:
        self._specs = registered_methods(self._cls.cls)
        for name, spec in self._specs.items():
            if hasattr(type(self), name):
                raise ValueError(f"worker method {name!r} clashes with a RayWorkerGroup attribute")
            setattr(self, name, self._make_group_method(name, spec))

    def _make_group_method(self, name: str, spec: MethodSpec) -> Callable:
        def group_method(*args: Any, **kwargs: Any) -> Any:
            return self._call(name, spec, args, kwargs)

        group_method.__name__ = name
        return group_method

    # ---- calls ----------------------------------------------------------------------------------------

    @property
    def world_size(self) -> int:
        return len(self._workers)

    @property
    def workers(self) -> list[Any]:
        return list(self._workers)

    def dispatch_info(self, mesh_name: str) -> MeshInfo:
        """The DP rank and collect flag every rank registered for ``mesh_name`` (fetched once)."""
        if mesh_name not in self._mesh_info:
            refs = [w.get_dispatch_info.remote(mesh_name) for w in self._workers]
            infos = self.wait(refs, list(range(self.world_size)))
            self._mesh_info[mesh_name] = MeshInfo([d for d, _ in infos], [c for _, c in infos])
        return self._mesh_info[mesh_name]

    def submit(self, method: str, *args: Any, threads: int | None = None, **kwargs: Any) -> Any:
        """Start a group method without waiting for it: ``submit("update_critic", batch, adv=adv)``
        runs what ``group.update_critic(batch, adv=adv)`` runs. For a blocking method it returns a
        `PendingCall`, whose ``result`` returns what the direct call returns; a method registered with
        ``blocking=False`` returns what its direct call returns (its future). The driver can then start
        another group's call that runs alongside (`as_completed`).

        Args:
            method: a registered method.
            threads: intra-op threads every rank computes the call with (its own count when None), for
                calls that share a bundle's CPU cores with another role's call running at the same time.
        """
        spec = self._specs.get(method)
        if spec is None:
            raise ValueError(f"worker group {self.name!r} has no registered method {method!r}")
        if threads is not None and int(threads) < 1:
            raise ValueError(f"worker group {self.name!r}: submit({method!r}) threads={threads} must be >= 1")
        if not spec.blocking:
            return self._call(method, spec, args, kwargs, threads)
        return self._start(method, spec, args, kwargs, threads)

    def _call(
        self, name: str, spec: MethodSpec, args: tuple, kwargs: dict, threads: int | None = None
    ) -> Any:
        if not spec.blocking and is_data_parallel(spec):
            dispatched, gather, refs = self._launch(name, spec, args, kwargs, threads)
            peers = [(ref, self.name, r) for r, ref in enumerate(refs) if r not in gather]
            return future_from_refs(
                [refs[r] for r in gather],
                dispatched.chunk_sizes,
                dispatched.pad_size,
                peers + _future_watch(args, kwargs),
            )
        call = self._start(name, spec, args, kwargs, threads)
        if not spec.blocking:
            return GroupFuture(self, call.refs, call.ranks, list)
        return call.result()

    def _start(
        self, name: str, spec: MethodSpec, args: tuple, kwargs: dict, threads: int | None
    ) -> PendingCall:
        dispatched, gather, refs = self._launch(name, spec, args, kwargs, threads)
        ranks, watch = list(range(self.world_size)), _future_watch(args, kwargs)
        if not is_data_parallel(spec):
            return PendingCall(self, refs, ranks, watch, list)

        def collect(outputs: list[Any]) -> Any:
            return collect_dp_proto(
                [outputs[r] for r in gather], dispatched.pad_size, sum(dispatched.chunk_sizes)
            )

        # Waits on every rank, not only the gathered ones: a failing sequence-parallel peer must
        # surface as its own error instead of leaving its collect rank stuck in a collective.
        return PendingCall(self, refs, ranks, watch, collect)

    def _launch(
        self, name: str, spec: MethodSpec, args: tuple, kwargs: dict, threads: int | None
    ) -> tuple[Any, list[int], list[Any]]:
        """Dispatch the arguments and start the method on every rank: ``(dispatched, gathered ranks, refs)``."""
        dispatched = dispatch_for(spec)(self, *args, **kwargs)
        gather = self._gather_ranks(spec) if is_data_parallel(spec) else list(range(self.world_size))
        refs = []
        for r in range(self.world_size):
            call_kwargs = dict(dispatched.kwargs[r])
            if r not in gather:
                call_kwargs[DROP_OUTPUT_KWARG] = True
            if threads is not None:
                call_kwargs[THREADS_KWARG] = int(threads)
            refs.append(getattr(self._workers[r], name).remote(*dispatched.args[r], **call_kwargs))
        return dispatched, gather, refs

    def _gather_ranks(self, spec: MethodSpec) -> list[int]:
        if isinstance(spec.dispatch_mode, MeshDispatch):
            return self.dispatch_info(spec.dispatch_mode.mesh_name).collect_order()
        return list(range(self.world_size))

    def wait(
        self,
        refs: list[Any],
        ranks: list[int],
        watch: list[tuple[Any, str, int]] | None = None,
        timeout_s: float | None = None,
        what: str | None = None,
    ) -> list[Any]:
        """Results of ``refs`` (one per rank in ``ranks``), failing fast when any rank dies or raises.

        Results are taken as they finish, so a dead rank is reported even while its peers are still
        blocked (for example in a collective that will never complete). ``watch`` holds ``(ref, group,
        rank)`` of other calls this one depends on (the non-gathered ranks of an input future): they are
        waited on alongside, and an error in one of them is raised as that rank's own error. With
        ``what`` (a description of the call), a heartbeat line is logged every ``heartbeat_s`` and the
        wait is bounded by ``timeout_s`` (default ``call_timeout_s``).
        """
        if what is not None:
            wait_all([(GroupFuture(self, list(refs), list(ranks), list), what)], timeout_s, self.heartbeat_s)
        results: list[Any] = [None] * len(refs)
        position = {ref: i for i, ref in enumerate(refs)}
        watched = {ref: (group, rank) for ref, group, rank in watch or []}
        pending, watching = list(refs), list(watched)
        deadline = None if self.call_timeout_s is None else time.monotonic() + self.call_timeout_s
        while pending:
            ready, _ = ray.wait(pending + watching, num_returns=1, timeout=1.0, fetch_local=False)
            for ref in ready:
                if ref in watched:
                    watching.remove(ref)
                    _get_one(ref, *watched[ref])  # None, or the peer's error
                    continue
                pending.remove(ref)
                i = position[ref]
                results[i] = _get_one(ref, self.name, ranks[i])
            if deadline is not None and pending and time.monotonic() > deadline:
                late = sorted(ranks[position[r]] for r in pending)
                raise WorkerGroupError(
                    f"worker group {self.name!r}: ranks {late} did not finish within call_timeout_s={self.call_timeout_s:g}"
                )
        return results

    def shutdown(self) -> None:
        """Kill this group's actors (the resource pool stays, other roles may still use it)."""
        for w in self._workers:
            try:
                ray.kill(w, no_restart=True)
            except Exception as e:  # pragma: no cover - best effort at shutdown
                logger.warning("could not kill an actor of %s: %s", self.name, e)
        self._workers = []


def _get_one(ref: Any, group: str, rank: int) -> Any:
    """``ray.get(ref)``, naming the group and rank in the error of a dead or failing rank."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayActorError as e:
        raise WorkerGroupError(f"worker group {group!r}: rank {rank} died ({type(e).__name__}): {e}") from e
    except ray.exceptions.RayTaskError as e:
        cause = e.as_instanceof_cause()
        if hasattr(cause, "add_note"):
            cause.add_note(f"(raised in worker group {group!r}, rank {rank})")
        raise cause from None


def _future_watch(args: tuple, kwargs: dict) -> list[tuple[Any, str, int]]:
    """The peer refs of every future among a call's arguments (see `RayWorkerGroup.wait`)."""
    return [
        entry
        for value in (*args, *kwargs.values())
        if isinstance(value, DataProtoFuture)
        for entry in value.watch
    ]


__all__ = [
    "DataProtoFuture",
    "GroupFuture",
    "RayClassWithInitArgs",
    "RayWorkerGroup",
    "WorkerGroupError",
    "wait_all",
]
