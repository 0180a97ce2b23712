"""Score samples in worker processes with a per-sample timeout.

Each worker process holds the score function and scores one sample at a time. The parent hands a sample
to an idle worker (the clock starts then; process start-up is not counted), and if a sample runs longer
than ``timeout_s`` its worker is killed and replaced: that sample gets status ``"timeout"`` and the others
are unaffected. Workers start on first use and are reused
across calls; :meth:`ScoringPool.close` stops them.

The score function is sent to the workers by pickling, so it must be a module-level function, a
``functools.partial`` of one, or a :class:`~rlflow.reward.custom.CustomRewardFunction` (pickled by
path). The default start method is ``spawn`` (safe in processes that already run threads, e.g. torch or
Ray workers).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

__all__ = ["ScoringPool"]


def _worker_loop(conn: Connection, fn: Callable[..., Any]) -> None:
    """Say ready; then receive ``(index, kwargs)`` and send ``(index, "ok", result)`` or ``(index, "error", tb)``."""
    conn.send((-1, "ready", None))
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        index, kwargs = message
        try:
            conn.send((index, "ok", fn(**kwargs)))
        except Exception:
            conn.send((index, "error", traceback.format_exc()))


class _Worker:
    """One scoring process; the constructor returns once the process has loaded ``fn`` and said ready."""

    def __init__(self, ctx: Any, fn: Callable[..., Any], startup_timeout_s: float = 120.0):
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_worker_loop, args=(child, fn), daemon=True)
        self.process.start()
        child.close()
        self.task: tuple[int, float] | None = None  # (sample index, start time)
        try:
            if not self.conn.poll(startup_timeout_s):
                raise RuntimeError(f"scoring process did not start within {startup_timeout_s} s")
            self.conn.recv()
        except (EOFError, OSError) as exc:
            self.process.join(timeout=5)
            raise RuntimeError(
                f"scoring process failed to start (exit code {self.process.exitcode}); is the score function "
                "picklable and importable in a fresh process?"
            ) from exc

    def kill(self) -> None:
        self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()


class ScoringPool:
    """Worker processes that run a score function with a per-sample timeout.

    Args:
        fn: the score function (picklable), called as ``fn(**kwargs)``.
        num_workers: processes.
        timeout_s: per-sample limit in seconds (time spent scoring, not waiting); None for no limit.
        mp_context: multiprocessing start method.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        num_workers: int,
        timeout_s: float | None = None,
        mp_context: str = "spawn",
    ):
        if num_workers < 1:
            raise ValueError(f"ScoringPool: num_workers={num_workers} must be >= 1")
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"ScoringPool: timeout_s={timeout_s} must be positive or None")
        self.fn, self.num_workers, self.timeout_s = fn, num_workers, timeout_s
        self._ctx = mp.get_context(mp_context)
        self._workers: list[_Worker] = []

    def _ensure_workers(self) -> None:
        self._workers = [w for w in self._workers if w.process.is_alive()]
        while len(self._workers) < self.num_workers:
            self._workers.append(_Worker(self._ctx, self.fn))

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        self._workers[self._workers.index(worker)] = _Worker(self._ctx, self.fn)

    def map(self, kwargs_list: Sequence[dict[str, Any]]) -> list[tuple[str, Any]]:
        """Score every sample.

        Args:
            kwargs_list: keyword arguments of each call.

        Returns:
            Per sample, in order: ``("ok", result)``, ``("error", traceback text)`` or ``("timeout", None)``.
        """
        self._ensure_workers()
        results: list[tuple[str, Any] | None] = [None] * len(kwargs_list)
        pending = deque(range(len(kwargs_list)))
        while pending or any(w.task for w in self._workers):
            for worker in self._workers:
                if worker.task is None and pending:
                    index = pending.popleft()
                    worker.conn.send((index, kwargs_list[index]))
                    worker.task = (index, time.monotonic())
            self._collect(results)
        return results  # type: ignore[return-value]

    def _collect(self, results: list[tuple[str, Any] | None]) -> None:
        """Wait for one result or the nearest deadline; record results, kill and replace late workers."""
        busy = [w for w in self._workers if w.task is not None]
        wait_s = None
        if self.timeout_s is not None:
            wait_s = max(0.0, min(w.task[1] for w in busy) + self.timeout_s - time.monotonic())
        ready = wait([w.conn for w in busy], timeout=wait_s)
        now = time.monotonic()
        for worker in busy:
            index = worker.task[0]
            if worker.conn in ready:
                try:
                    got_index, status, value = worker.conn.recv()
                except (EOFError, OSError):
                    code = worker.process.exitcode
                    results[index] = ("error", f"scoring process died (exit code {code})")
                    worker.task = None
                    self._replace(worker)
                    continue
                results[got_index] = (status, value)
                worker.task = None
            elif self.timeout_s is not None and now - worker.task[1] >= self.timeout_s:
                results[index] = ("timeout", None)
                worker.task = None
                self._replace(worker)

    def close(self) -> None:
        """Stop the worker processes."""
        for worker in self._workers:
            with contextlib.suppress(OSError):
                worker.conn.send(None)
            worker.process.join(timeout=2)
            if worker.process.is_alive():
                worker.kill()
        self._workers = []

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()
