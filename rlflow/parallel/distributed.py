"""Process-group set-up shared by every rlflow worker.

`init_distributed` is the only place that calls `torch.distributed.init_process_group`. It reads the
usual launcher variables (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, ``LOCAL_RANK``),
picks gloo on a CPU-only machine and NCCL (plus gloo for CPU tensors) when CUDA is available, and does
nothing when a process group already exists. It also keeps the intra-op thread pools of the process's
other threads at one thread (`serial_side_threads`), so that gloo's threads cannot slow down the
worker's own CPU ops.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "DistInfo",
    "bind_master_store",
    "current_device",
    "default_backend",
    "device_type",
    "get_rank",
    "get_world_size",
    "init_distributed",
    "intra_op_threads",
    "serial_side_threads",
    "spawn_workers",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the default process group.

    Attributes:
        rank: global rank.
        world_size: number of processes.
        local_rank: rank on this node (selects the CUDA device).
        backend: the backend string given to ``init_process_group``.
    """

    rank: int
    world_size: int
    local_rank: int
    backend: str


def device_type() -> str:
    """Return ``"cuda"`` when a CUDA device is visible, else ``"cpu"``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def current_device() -> torch.device:
    """This process's compute device: the current CUDA device when CUDA is visible, else the CPU."""
    return (
        torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_available()
        else torch.device("cpu")
    )


def default_backend() -> str:
    """Backend for this machine: gloo on CPU; NCCL for CUDA tensors and gloo for CPU tensors on GPU.

    The GPU string ``"cpu:gloo,cuda:nccl"`` keeps CPU-side collectives (object broadcasts, CPU-offloaded
    state) working next to NCCL.
    """
    return "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"


_held_store: Any = None
"""The rendezvous store this process bound as rank 0 (`bind_master_store`), used by `init_distributed`."""


def bind_master_store(host: str, world_size: int, timeout_s: float = 1800.0) -> int:
    """Rank 0: bind the rendezvous store now, on a port the kernel assigns as it binds; returns the port.

    A port that is only *checked* free (bind, close, hand out) can be taken by another process before the
    store binds it seconds later (EADDRINUSE when the ranks meet; on some machines outgoing connections take
    local ports from the whole range, not only the ephemeral one). Here the store holds its port from the
    start; `init_distributed` builds the process group on it, and the other ranks connect to
    ``MASTER_ADDR:<the port>`` as usual.
    """
    global _held_store
    _held_store = dist.TCPStore(
        host,
        0,
        world_size,
        is_master=True,
        timeout=datetime.timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )
    return int(_held_store.port)


def _env_int(name: str, default: int | None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        if default is None:
            raise ValueError(f"environment variable {name} must be set for a multi-process run")
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from exc


def serial_side_threads() -> int:
    """Give every thread of this process that has not computed yet a one-thread intra-op pool, keeping
    the calling thread's own size; returns that size.

    Why: libgomp, the OpenMP runtime of torch's CPU builds, lets its threads spin between parallel regions
    only while the process holds no more OpenMP threads than it has CPUs; past that, a waiting thread
    sleeps after about a hundred spins and every parallel region pays a futex wake-up. Gloo's worker
    threads run the copies that unflatten an all-gather's output as parallel regions of their own, so the
    first all-gather of a tensor over torch's grain size (32768 elements: the generation replica's
    weight sync, FSDP's gathers) leaves a second OpenMP team in the process for good. From then on the
    small ops of the worker's thread ran 4-5x slower (a (16, 128) x (128, 512) matmul 23 -> 105 us with
    2 threads; decoding the 1M bench model's 16 rows in the actor worker took 0.19 s, 0.10 s outside it).

    torch sizes a thread's pool once, when that thread first asks for it, from a process-wide setting.
    This fixes the calling thread's size first, then sets the process-wide one to 1 from a short-lived
    helper thread (`torch.set_num_threads` sets both the process-wide value and the caller's own pool).
    Threads that compute later (gloo's, a threaded actor's pool) run their ops on one thread each. A
    later `torch.set_num_threads` in any thread sets the process-wide value again.
    """
    threads = torch.get_num_threads()  # sizes this thread's pool (torch does it once per thread)
    helper = threading.Thread(target=torch.set_num_threads, args=(1,), name="rlflow-serial-side-threads")
    helper.start()
    helper.join()
    return threads


@contextlib.contextmanager
def intra_op_threads(threads: int) -> Iterator[None]:
    """Run the block with ``threads`` intra-op threads in the calling thread, then give it back its own count.

    For calls that share the CPU cores of a bundle with another role's call running at the same time
    (``trainer.overlap_updates``): each takes its part of the cores instead of both running every core's
    worth of threads, where OpenMP's spinning threads would take turns on the same cores. The process-wide
    setting is then put back to one thread for threads that have not computed yet (`serial_side_threads`:
    `torch.set_num_threads` sets it along with the caller's own count).

    Args:
        threads: intra-op threads for the block, >= 1.
    """
    if threads < 1:
        raise ValueError(f"intra_op_threads: threads={threads} must be >= 1")
    previous = torch.get_num_threads()
    if threads == previous:
        yield
        return
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
        serial_side_threads()


def init_distributed(backend: str | None = None, timeout_s: float | None = None) -> DistInfo:
    """Initialise the default process group from the environment (idempotent).

    With ``WORLD_SIZE`` unset or 1, a single-process group is created on ``127.0.0.1`` and a free port,
    so the same worker code runs unchanged without a launcher. With ``WORLD_SIZE > 1``, ``RANK``,
    ``MASTER_ADDR`` and ``MASTER_PORT`` must be set (``ValueError`` naming the missing one otherwise).
    On CUDA machines the current device is set to ``LOCAL_RANK``.

    Args:
        backend: process-group backend; ``None`` picks `default_backend()`.
        timeout_s: collective timeout in seconds; ``None`` keeps torch's default.

    Returns:
        The `DistInfo` of this process (also when the group already existed).
    """
    local_rank = _env_int("LOCAL_RANK", 0)
    if dist.is_initialized():
        return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, str(dist.get_backend()))
    world_size = _env_int("WORLD_SIZE", 1)
    if world_size < 1:
        raise ValueError(f"environment variable WORLD_SIZE={world_size} must be >= 1")
    if world_size == 1:
        rank = _env_int("RANK", 0)
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if not os.environ.get("MASTER_PORT"):
            os.environ["MASTER_PORT"] = str(bind_master_store(os.environ["MASTER_ADDR"], 1))
    else:
        rank = _env_int("RANK", None)
        for name in ("MASTER_ADDR", "MASTER_PORT"):
            if not os.environ.get(name):
                raise ValueError(f"environment variable {name} must be set for a multi-process run")
    if not 0 <= rank < world_size:
        raise ValueError(f"environment variable RANK={rank} must be in [0, WORLD_SIZE={world_size})")
    backend = backend or default_backend()
    if torch.cuda.is_available():
        # Ray (and Slurm with GPU binding) shows each process only its own GPU: device 0.
        torch.cuda.set_device(local_rank if torch.cuda.device_count() > 1 else 0)
    kwargs: dict[str, Any] = {} if timeout_s is None else {"timeout": datetime.timedelta(seconds=timeout_s)}
    serial_side_threads()  # before gloo's threads first compute
    if rank == 0 and _held_store is not None and str(_held_store.port) == os.environ.get("MASTER_PORT"):
        # bound when the port was chosen (bind_master_store); the other ranks rendezvous by env://, whose
        # store torch wraps in PrefixStore("default_pg"), so rank 0's keys get the same prefix
        kwargs["store"] = dist.PrefixStore("default_pg", _held_store)
    dist.init_process_group(backend=backend, rank=rank, world_size=world_size, **kwargs)
    return DistInfo(rank, world_size, local_rank, backend)


def get_rank() -> int:
    """Global rank, 0 when no process group exists."""
    return dist.get_rank() if dist.is_initialized() else 0


def get_world_size() -> int:
    """World size, 1 when no process group exists."""
    return dist.get_world_size() if dist.is_initialized() else 1


def _share_master_port(local_rank: int, world_size: int, out_dir: str, timeout_s: float = 120.0) -> int:
    """Rank 0 binds the rendezvous store (`bind_master_store`) and writes its port to ``out_dir``; the
    other ranks wait for that file."""
    path = os.path.join(out_dir, "master_port")
    if local_rank == 0:
        port = bind_master_store("127.0.0.1", world_size)
        with open(path + ".tmp", "w") as f:
            f.write(str(port))
        os.replace(path + ".tmp", path)  # atomic: a reader sees the whole number or no file
        return port
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise RuntimeError(f"spawned rank {local_rank}: rank 0 wrote no master port in {timeout_s:.0f} s")
        time.sleep(0.01)
    with open(path) as f:
        return int(f.read())


def _spawn_entry(local_rank: int, fn: Callable[..., Any], world_size: int, out_dir: str, args: tuple) -> None:
    port = _share_master_port(local_rank, world_size, out_dir)
    os.environ.update(
        RANK=str(local_rank),
        LOCAL_RANK=str(local_rank),
        WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    init_distributed(timeout_s=300)
    try:
        result = fn(local_rank, *args)
        torch.save(result, os.path.join(out_dir, f"rank{local_rank}.pt"))
    finally:
        dist.destroy_process_group()
    # The result is on disk: leave without interpreter finalization. Gloo's C++ threads can still hold
    # work objects whose destruction needs the GIL while the interpreter is torn down, which aborts
    # the process (SIGABRT, "terminate called without an active exception") at random after a
    # successful run. Errors raised by ``fn`` never get here: spawn reports them with their traceback.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn_workers(
    fn: Callable[..., Any], world_size: int, args: tuple = (), signal_retries: int = 1
) -> list[Any]:
    """Run ``fn(rank, *args)`` in ``world_size`` fresh processes joined by a local process group.

    For tests and single-node experiments: each process gets ``RANK``/``WORLD_SIZE``/``MASTER_*``, one
    intra-op thread and `init_distributed`. ``fn`` must be importable (a module-level function) and its
    return value picklable with ``torch.save``. An exception in any process is re-raised here.

    A rank killed by a signal (a native crash such as a heap-corruption abort inside gloo, seen once in a
    full test run and not again) makes every rank run again, up to ``signal_retries`` times, with a
    warning that names the rank, where it died and the signal; a crash that comes back fails the call.
    Python exceptions and non-zero exits are never retried. With retries ``fn`` must be safe to run again
    (the tests' and the warm start's are: a fresh computation per call); a training run passes 0
    (`rlflow.trainer.main_sft`: an out-of-memory kill would only come back).

    Args:
        fn: ``fn(rank, *args)`` run on every rank.
        world_size: number of processes.
        args: extra positional arguments for ``fn``.
        signal_retries: reruns after a rank dies by a signal (0: fail at once).

    Returns:
        The return values of ``fn``, indexed by rank.
    """
    if signal_retries < 0:
        raise ValueError(f"spawn_workers: signal_retries={signal_retries} must be >= 0")
    retries = 0
    while True:
        try:
            return _spawn_once(fn, world_size, args)
        except _SignalDeath as death:
            if retries == signal_retries:
                raise RuntimeError(str(death)) from death.__cause__
            retries += 1
            logger.warning(
                "%s; running all %d ranks again (retry %d of %d)", death, world_size, retries, signal_retries
            )


class _SignalDeath(Exception):
    """A spawned rank was killed by a signal (`spawn_workers` may run the ranks again)."""


def _spawn_once(fn: Callable[..., Any], world_size: int, args: tuple) -> list[Any]:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as out_dir:
        try:
            mp.spawn(_spawn_entry, args=(fn, world_size, out_dir, args), nprocs=world_size)
        except mp.ProcessExitedException as exc:
            saved = os.path.exists(os.path.join(out_dir, f"rank{exc.error_index}.pt"))
            where = "after saving its result" if saved else f"inside {getattr(fn, '__name__', fn)!r}"
            message = f"spawned rank {exc.error_index} died {where}: {exc}"
            if getattr(exc, "signal_name", None):
                raise _SignalDeath(message) from exc
            raise RuntimeError(message) from exc
        return [
            torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False) for r in range(world_size)
        ]
