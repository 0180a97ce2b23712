"""Ray placement groups for worker groups: checked against the cluster before anything is created."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

logger = logging.getLogger(__name__)


class ResourceUnavailableError(RuntimeError):
    """The cluster cannot (or not within the time allowed) provide the resources a pool asks for."""


@dataclass(frozen=True)
class NodeResources:
    node_id: str
    address: str
    cpu: float
    gpu: float

    def describe(self) -> str:
        return f"node {self.node_id[:12]} ({self.address}): {self.cpu:g} CPU, {self.gpu:g} GPU"


def alive_nodes() -> list[NodeResources]:
    """Total resources of every alive node of the connected Ray cluster."""
    out = []
    for node in ray.nodes():
        if not node.get("Alive", False):
            continue
        res = node.get("Resources", {})
        out.append(
            NodeResources(
                node["NodeID"], node.get("NodeManagerAddress", "?"), res.get("CPU", 0.0), res.get("GPU", 0.0)
            )
        )
    return out


def check_pool_fits(
    name: str,
    process_on_nodes: list[int],
    cpus_per_bundle: float,
    gpus_per_bundle: float,
    nodes: list[NodeResources],
) -> list[str]:
    """Plan which node each placement group goes to; raise if the pool can never be placed.

    Each entry of ``process_on_nodes`` is one placement group that must fit on a single node
    (``STRICT_PACK``). Groups are matched largest first, each to a node that holds none of the pool's
    groups yet when possible (one group per node), else to the node with the most free CPU. The
    :class:`ResourceUnavailableError` names what is required and, for every node, what it has.

    Returns:
        The node id planned for each placement group, in ``process_on_nodes`` order.
    """
    free = {n.node_id: [n.cpu, n.gpu] for n in nodes}
    used: dict[str, int] = {}
    plan: dict[int, str] = {}
    for i, count in sorted(enumerate(process_on_nodes), key=lambda t: -t[1]):
        need_cpu, need_gpu = count * cpus_per_bundle, count * gpus_per_bundle
        fits = [nid for nid, (c, g) in free.items() if c + 1e-9 >= need_cpu and g + 1e-9 >= need_gpu]
        if not fits:
            have = "; ".join(n.describe() for n in nodes) or "no alive nodes"
            short = _short_resources(need_cpu, need_gpu, nodes)
            raise ResourceUnavailableError(
                f"resource pool {name!r}: node group {i} needs {count} bundles of {cpus_per_bundle:g} CPU"
                f"{f' + {gpus_per_bundle:g} GPU' if gpus_per_bundle else ''} on one node "
                f"({need_cpu:g} CPU, {need_gpu:g} GPU) but no node has that ({short}). Cluster: {have}"
            )
        best = min(fits, key=lambda nid: (used.get(nid, 0), -free[nid][0], nid))
        free[best][0] -= need_cpu
        free[best][1] -= need_gpu
        used[best] = used.get(best, 0) + 1
        plan[i] = best
    return [plan[i] for i in range(len(process_on_nodes))]


def _short_resources(need_cpu: float, need_gpu: float, nodes: list[NodeResources]) -> str:
    most_cpu = max((n.cpu for n in nodes), default=0.0)
    most_gpu = max((n.gpu for n in nodes), default=0.0)
    parts = []
    if most_cpu < need_cpu:
        parts.append(f"short of CPU: largest node has {most_cpu:g}, required {need_cpu:g}")
    if most_gpu < need_gpu:
        parts.append(f"short of GPU: largest node has {most_gpu:g}, required {need_gpu:g}")
    return "; ".join(parts) or "the remaining nodes are already taken by other groups of this pool"


class RayResourcePool:
    """Placement groups, one per node, whose bundles the worker groups of one or more roles share.

    Args:
        process_on_nodes: number of bundles (= ranks) on each node, e.g. ``[2]`` or ``[4, 4]``.
        use_gpu: give each bundle one GPU.
        max_colocate_count: how many roles (worker groups) share each bundle; each role's actor takes
            ``1 / max_colocate_count`` of the bundle's CPU (and GPU), so roles live in separate processes.
        cpus_per_bundle: CPUs reserved by each bundle.
        name_prefix: names the placement groups and appears in errors.
        placement_timeout_s: how long to wait for the placement groups before giving up with an error.
        max_threads: most intra-op threads of one actor (`cpu_threads`), e.g. the cores of the machine a
            local Ray runs on, shared by the pool's ranks; None = the bundle's CPUs.
    """

    def __init__(
        self,
        process_on_nodes: list[int],
        use_gpu: bool = False,
        max_colocate_count: int = 1,
        cpus_per_bundle: float = 1.0,
        name_prefix: str = "rlflow",
        placement_timeout_s: float = 60.0,
        max_threads: int | None = None,
    ) -> None:
        if not process_on_nodes or any(int(n) <= 0 for n in process_on_nodes):
            raise ValueError(
                f"process_on_nodes must be a non-empty list of positive counts, got {process_on_nodes}"
            )
        if max_colocate_count < 1:
            raise ValueError(f"max_colocate_count must be >= 1, got {max_colocate_count}")
        self.process_on_nodes = [int(n) for n in process_on_nodes]
        self.use_gpu = use_gpu
        self.max_colocate_count = max_colocate_count
        self.cpus_per_bundle = float(cpus_per_bundle)
        self.name_prefix = name_prefix
        self.placement_timeout_s = placement_timeout_s
        if max_threads is not None and int(max_threads) < 1:
            raise ValueError(f"max_threads must be >= 1 or None, got {max_threads}")
        self.max_threads = None if max_threads is None else int(max_threads)
        self._pgs: list[PlacementGroup] | None = None

    @property
    def world_size(self) -> int:
        return sum(self.process_on_nodes)

    @property
    def gpus_per_bundle(self) -> float:
        return 1.0 if self.use_gpu else 0.0

    def actor_resources(self) -> dict[str, float]:
        """Resources of one role's actor inside a bundle."""
        res = {"num_cpus": self.cpus_per_bundle / self.max_colocate_count}
        if self.use_gpu:
            res["num_gpus"] = 1.0 / self.max_colocate_count
        return res

    def cpu_threads(self) -> int:
        """Intra-op threads of each actor: all of its bundle's CPUs (at least 1), at most ``max_threads``.

        The roles colocated on a bundle take turns (the driver calls them one after the other), so each
        computes with every CPU of the bundle while the others wait. Calls the driver runs at the same time
        on one bundle (``trainer.overlap_updates``) split these threads between them, call by call
        (`RayWorkerGroup.submit` with ``threads``). Ray alone would set
        ``OMP_NUM_THREADS`` from the actor's fractional share (``1 / max_colocate_count`` of the bundle),
        i.e. one thread per role however many cores the bundle holds. An ``OMP_NUM_THREADS`` set in the
        driver's environment wins.
        """
        explicit = os.environ.get("OMP_NUM_THREADS")
        if explicit and explicit.isdigit() and int(explicit) > 0:
            return int(explicit)
        threads = max(1, int(self.cpus_per_bundle))
        return threads if self.max_threads is None else min(threads, self.max_threads)

    def allocator_env(self) -> dict[str, str]:
        """glibc ``malloc`` settings for the actors of a CPU pool: freed memory stays in the process.

        By default glibc serves blocks above a moving threshold (at most 32 MiB) with ``mmap`` and gives
        them, and the heap's free top, back to the OS when they are freed. Every phase of a step then
        faults its activations in again page by page (a 13M model's forward over the PPO bench's 2458
        tokens holds about 0.7 GB in 15 MB tensors, each page zeroed by the kernel on first touch).
        With ``MALLOC_MMAP_THRESHOLD_`` 4 GiB and ``MALLOC_TRIM_THRESHOLD_`` 16 GiB the heap keeps freed
        blocks for the next phase. On the PPO 13M bench the forwards of the reference and reward model
        took 0.48-0.51 s instead of 0.53-0.64, and a step 6.08 / 6.49 s instead of 6.55 / 6.82
        (docs/benchmarks.md). A process then keeps its peak: RSS does not fall back after a phase.
        GPU pools keep glibc's defaults (their activations live on the device). A ``MALLOC_*`` setting in
        the driver's environment wins (both of ours are left out then).
        """
        if self.use_gpu or any(k.startswith("MALLOC_") for k in os.environ):
            return {}
        return {"MALLOC_MMAP_THRESHOLD_": str(4 << 30), "MALLOC_TRIM_THRESHOLD_": str(16 << 30)}

    def get_placement_groups(self) -> list[PlacementGroup]:
        """Create (once) and return the placement groups, ready; raise a clear error otherwise."""
        if self._pgs is None:
            plan = check_pool_fits(
                self.name_prefix,
                self.process_on_nodes,
                self.cpus_per_bundle,
                self.gpus_per_bundle,
                alive_nodes(),
            )
            self._pgs = [self._create_pg(i, n, plan[i]) for i, n in enumerate(self.process_on_nodes)]
        return self._pgs

    def node_ids(self) -> list[str]:
        """The node each placement group landed on (rank order follows these groups)."""
        table = ray.util.placement_group_table
        return [next(iter(table(pg)["bundles_to_node_id"].values())) for pg in self.get_placement_groups()]

    def _create_pg(self, index: int, count: int, target_node: str | None = None) -> PlacementGroup:
        bundle = {"CPU": self.cpus_per_bundle}
        if self.use_gpu:
            bundle["GPU"] = 1.0
        pg = placement_group(
            [dict(bundle) for _ in range(count)],
            strategy="STRICT_PACK",
            name=f"{self.name_prefix}_{index}",
            _soft_target_node_id=target_node,  # one group per node where the cluster allows it
        )
        try:
            ray.get(pg.ready(), timeout=self.placement_timeout_s)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(pg)
            raise ResourceUnavailableError(
                f"resource pool {self.name_prefix!r}: placement group {index} ({count} bundles of {bundle}) "
                f"was not placed within {self.placement_timeout_s:g} s; available now: "
                f"{_fmt_resources(ray.available_resources())}, cluster total: {_fmt_resources(ray.cluster_resources())}"
            ) from None
        return pg

    def bundle_slots(self) -> list[tuple[PlacementGroup, int, int]]:
        """(placement group, bundle index, local rank on the node) for every rank, in rank order."""
        slots = []
        for pg, count in zip(self.get_placement_groups(), self.process_on_nodes):
            slots.extend((pg, b, b) for b in range(count))
        return slots

    def remove(self) -> None:
        """Release the placement groups (the actors in them should be gone first)."""
        for pg in self._pgs or []:
            try:
                remove_placement_group(pg)
            except Exception as e:  # pragma: no cover - best effort at shutdown
                logger.warning("could not remove placement group %s: %s", pg.id, e)
        self._pgs = None


def _fmt_resources(res: dict[str, Any]) -> str:
    keys = [k for k in ("CPU", "GPU", "memory") if k in res]
    return (
        ", ".join(f"{k}={res[k]:g}" if k != "memory" else f"memory={res[k] / 2**30:.1f}GiB" for k in keys)
        or "none"
    )
