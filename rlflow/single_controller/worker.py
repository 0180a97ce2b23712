"""``Worker``: the base class of everything that runs inside a worker-group actor."""

from __future__ import annotations

import os
import socket

import torch

from rlflow.parallel.distributed import bind_master_store
from rlflow.single_controller.decorator import Dispatch, register
from rlflow.single_controller.profiling import ProfileSelection, StepProfiler


def node_ip_address() -> str:
    """This node's IP as Ray sees it (falls back to loopback outside Ray)."""
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except Exception:  # pragma: no cover - Ray missing or not a Ray process
        pass
    return "127.0.0.1"


class Worker:
    """A rank of a worker group.

    Rank, world size and the rendezvous address come from the environment (``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR``, ``MASTER_PORT``, ``LOCAL_RANK``), which the worker group sets for each actor; rank 0
    picks a free port when none is given, and the group hands it to the other ranks.  Outside a group
    (a plain process) a worker is rank 0 of 1.
    """

    def __init__(self) -> None:
        self.device = torch.device("cpu")
        """Where this rank computes: data-parallel methods receive their batches here (set by the role
        when it joins its process group, e.g. ``cuda:0``)."""
        self._rank = int(os.environ.get("RANK", "0"))
        self._world_size = int(os.environ.get("WORLD_SIZE", "1"))
        os.environ.setdefault("LOCAL_RANK", "0")
        if not os.environ.get("MASTER_ADDR") or not os.environ.get("MASTER_PORT"):
            if self._rank != 0:
                raise RuntimeError(f"worker rank {self._rank} started without MASTER_ADDR/MASTER_PORT")
            os.environ["MASTER_ADDR"] = node_ip_address()
            # the store binds its port now and keeps it (no window for another process to take it)
            os.environ["MASTER_PORT"] = str(bind_master_store(os.environ["MASTER_ADDR"], self._world_size))
        self._dispatch_info: dict[str, tuple[int, bool]] = {}
        self.step_profiler: StepProfiler | None = None
        """Set by `start_profile`; every registered call passes through its ``call`` context."""

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    def get_master_addr_port(self) -> tuple[str, str]:
        return os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]

    def get_node_and_pid(self) -> tuple[str, int]:
        """(Ray node id or hostname, process id): lets tests and logs see where each rank runs."""
        try:
            import ray

            node = ray.get_runtime_context().get_node_id()
        except Exception:  # pragma: no cover
            node = socket.gethostname()
        return node, os.getpid()

    # ---- mesh-aware dispatch ---------------------------------------------------------------------------

    def register_dispatch_info(self, mesh_name: str, dp_rank: int, is_collect: bool) -> None:
        """Declare this rank's data-parallel rank on ``mesh_name`` and whether its output is gathered."""
        self._dispatch_info[mesh_name] = (int(dp_rank), bool(is_collect))

    def get_dispatch_info(self, mesh_name: str) -> tuple[int, bool]:
        if mesh_name not in self._dispatch_info:
            raise KeyError(f"rank {self._rank} registered no dispatch info for mesh {mesh_name!r}")
        return self._dispatch_info[mesh_name]

    # ---- profiling ------------------------------------------------------------------------------------

    def profile_selections(self) -> list[ProfileSelection]:
        """This worker's profile settings (`rlflow.single_controller.profiling`); none by default."""
        return []

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def start_profile(self, step: int, out_dir: str, role: str = "worker") -> bool:
        """Begin profiling ``step`` on this rank if its settings select it; returns whether it records."""
        if self.step_profiler is None:
            self.step_profiler = StepProfiler(role, self._rank, self.profile_selections())
        self.step_profiler.start(step, out_dir)
        return self.step_profiler.selected

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def stop_profile(self) -> list[str]:
        """End the profiled step; returns the trace files this rank wrote."""
        return [] if self.step_profiler is None else self.step_profiler.stop()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def execute_fn(self, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        """Run ``fn(self, *args, **kwargs)`` on every rank (for tests and one-off inspection)."""
        return fn(self, *args, **kwargs)
