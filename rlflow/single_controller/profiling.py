"""Step profiling of worker ranks with ``torch.profiler`` (verl's ``trainer.profile_steps`` and each role's
``profile_ranks`` / ``profile_ranks_all`` / ``profile_discrete``).

The driver calls ``start_profile(step, out_dir)`` on every group before a profiled step and
``stop_profile()`` after it. A rank records only if its role's settings select it (``profile_ranks_all``
or its rank in ``profile_ranks``; none by default). With ``profile_discrete=false`` the rank records one
trace for the whole step, ``<out_dir>/step_<N>/<role>_rank<R>.json``; with ``true`` one trace per worker
call, ``<role>_rank<R>_<method>[_<k>].json`` (the k-th call of that method in the step). The traces are
Chrome trace files (``chrome://tracing``, Perfetto); CUDA activity is recorded when the rank has a GPU.

verl records these steps with Nsight Systems; rlflow's traces come from ``torch.profiler`` on every device.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch

__all__ = ["ProfileSelection", "StepProfiler"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProfileSelection:
    """One role's profile settings on a worker.

    Attributes:
        ranks: the ranks of the group that record (ignored with ``all_ranks``).
        all_ranks: every rank records.
        discrete: one trace per worker call instead of one per step.
        methods: the worker methods these settings cover; None = every method (the actor and the rollout
            share a worker: ``generate_sequences`` follows the rollout's settings, the rest the actor's).
    """

    ranks: tuple[int, ...] = ()
    all_ranks: bool = False
    discrete: bool = False
    methods: frozenset[str] | None = None

    def selects(self, rank: int) -> bool:
        return self.all_ranks or rank in self.ranks


def _new_profile() -> torch.profiler.profile:
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(activities=activities, record_shapes=True)


class StepProfiler:
    """The profiler state of one worker rank.

    Args:
        role: names the trace files (the worker group's role: ``actor``, ``ref``, ``critic``).
        rank: this worker's rank in its group.
        selections: the role's settings (`ProfileSelection`), matched in order by method name.
    """

    def __init__(self, role: str, rank: int, selections: list[ProfileSelection]) -> None:
        self.role, self.rank = role, rank
        self.selections = list(selections)
        self._dir: str | None = None
        self._step_profile: torch.profiler.profile | None = None
        self._calls: dict[str, int] = {}
        self.written: list[str] = []

    @property
    def selected(self) -> bool:
        """True when some setting selects this rank."""
        return any(s.selects(self.rank) for s in self.selections)

    def start(self, step: int, out_dir: str) -> None:
        """Begin profiling ``step`` (a no-op on a rank no setting selects)."""
        if not self.selected:
            return
        self._dir = os.path.join(out_dir, f"step_{int(step)}")
        os.makedirs(self._dir, exist_ok=True)
        self._calls = {}
        if any(s.selects(self.rank) and not s.discrete for s in self.selections):  # one trace per step
            self._step_profile = _new_profile()
            self._step_profile.start()

    def stop(self) -> list[str]:
        """End the profiled step; returns the trace files this rank wrote in it."""
        if self._dir is None:
            return []
        if self._step_profile is not None:
            self._step_profile.stop()
            self._export(self._step_profile, f"{self.role}_rank{self.rank}.json")
            self._step_profile = None
        written, self.written, self._dir = self.written, [], None
        return written

    @contextlib.contextmanager
    def call(self, method: str) -> Iterator[None]:
        """Around one worker call: its own trace when a discrete setting covers ``method``."""
        selection = self._selection(method)
        if (
            self._dir is None
            or self._step_profile is not None
            or selection is None
            or not selection.discrete
            or not selection.selects(self.rank)
        ):
            yield
            return
        k = self._calls[method] = self._calls.get(method, 0) + 1
        profile = _new_profile()
        profile.start()
        try:
            yield
        finally:
            profile.stop()
            suffix = "" if k == 1 else f"_{k}"
            self._export(profile, f"{self.role}_rank{self.rank}_{method}{suffix}.json")

    def _selection(self, method: str) -> ProfileSelection | None:
        return next((s for s in self.selections if s.methods is None or method in s.methods), None)

    def _export(self, profile: torch.profiler.profile, name: str) -> None:
        path = os.path.join(str(self._dir), name)
        profile.export_chrome_trace(path)
        self.written.append(path)
        logger.info("profile trace written: %s", path)
