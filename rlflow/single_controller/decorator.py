"""``@register``: how a worker method's arguments are split over a worker group and its results joined.

A method of a :class:`~rlflow.single_controller.worker.Worker` subclass decorated with
``@register(dispatch_mode=..., blocking=...)`` becomes a method of the worker *group*: the driver calls
``group.method(data)`` once, the dispatch function turns the arguments into one set per rank, every rank
runs the method, and the collect function turns the per-rank results back into one value.

Dispatch modes (verl's names; the ones rlflow's workers use):

* ``ONE_TO_ALL``: every rank gets the same arguments; the result is the list of per-rank results.
* ``DP_COMPUTE_PROTO``: ``DataProto`` / ``DataProtoFuture`` arguments are padded to a multiple of the
  world size and chunked by rank; results are concatenated and the padding stripped.
* :func:`make_nd_compute_dataproto_dispatch_fn` (mesh-aware): data is chunked by the *data-parallel*
  rank a worker registered for a named mesh; sequence-parallel peers receive the same object (stored
  once), every rank runs, and only the ranks that registered as *collect* ranks are gathered.

Device contract: a data-parallel method receives its `DataProto` arguments with their tensors on the
worker's ``device`` and its returned `DataProto` goes back with CPU tensors; the wrapper `register`
builds does both, so no method moves data itself.

With ``blocking=False`` a data-parallel call returns a :class:`~rlflow.single_controller.futures.DataProtoFuture` at
once.  Passing that future to another group's method hands each of its workers exactly its samples,
routed by sample index; the driver moves object refs only, never the data.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

import numpy as np

from rlflow.parallel.distributed import intra_op_threads
from rlflow.protocol import DataProto, pad_dataproto_to_divisor, unpad_dataproto
from rlflow.single_controller.futures import DataProtoFuture, FutureSlice

if TYPE_CHECKING:
    from rlflow.single_controller.worker_group import RayWorkerGroup as WorkerGroup

MAGIC_ATTR = "__rlflow_register__"
DROP_OUTPUT_KWARG = "_rlflow_drop_output"
"""Keyword the worker group adds to a call on a rank whose output it does not gather."""
THREADS_KWARG = "_rlflow_intra_op_threads"
"""Keyword the worker group adds to a call that runs with fewer intra-op threads than the rank's own count
(`RayWorkerGroup.submit` with ``threads``; `rlflow.parallel.distributed.intra_op_threads`)."""


class Dispatch(Enum):
    """How a group method's arguments are split over the ranks (module docstring)."""

    ONE_TO_ALL = "one_to_all"
    DP_COMPUTE_PROTO = "dp_compute_proto"


@dataclass(frozen=True)
class MeshDispatch:
    """Mesh-aware data-parallel dispatch for the mesh that workers registered under ``mesh_name``."""

    mesh_name: str


def make_nd_compute_dataproto_dispatch_fn(mesh_name: str) -> MeshDispatch:
    """Dispatch mode that splits data by the DP rank workers registered for ``mesh_name``."""
    return MeshDispatch(mesh_name)


_UNPROFILED = frozenset({"start_profile", "stop_profile", "execute_fn"})
"""Registered methods never traced on their own (`rlflow.single_controller.profiling`)."""


@dataclass(frozen=True)
class MethodSpec:
    dispatch_mode: Dispatch | MeshDispatch
    blocking: bool


def register(
    dispatch_mode: Dispatch | MeshDispatch = Dispatch.ONE_TO_ALL,
    blocking: bool = True,
    materialize_futures: bool = True,
) -> Callable:
    """Mark a worker method as callable on the whole group (see the module docstring).

    Args:
        dispatch_mode: how arguments are split over ranks and results joined.
        blocking: ``False`` makes the group call return a future at once.
        materialize_futures: resolve future slices handed to this worker before the method runs.
    """
    if not isinstance(dispatch_mode, Dispatch | MeshDispatch):
        raise TypeError(f"register: dispatch_mode must be a Dispatch or MeshDispatch, got {dispatch_mode!r}")

    data_parallel = isinstance(dispatch_mode, MeshDispatch) or dispatch_mode == Dispatch.DP_COMPUTE_PROTO

    def decorator(func: Callable) -> Callable:
        @functools.wraps(func)
        def inner(*args: Any, **kwargs: Any) -> Any:
            drop_output = kwargs.pop(DROP_OUTPUT_KWARG, False)
            threads = kwargs.pop(THREADS_KWARG, None)
            if materialize_futures:
                args = tuple(_materialize(a) for a in args)
                kwargs = {k: _materialize(v) for k, v in kwargs.items()}
            if data_parallel:
                # The device contract (docs/gpu.md): the one place a worker's input reaches its device
                # and its output leaves it.
                device = args[0].device
                args = (args[0], *(_to(a, device) for a in args[1:]))
                kwargs = {k: _to(v, device) for k, v in kwargs.items()}
            profiler = getattr(args[0], "step_profiler", None) if args else None
            with contextlib.ExitStack() as scope:
                if threads is not None:
                    scope.enter_context(intra_op_threads(int(threads)))
                if profiler is not None and func.__name__ not in _UNPROFILED:
                    scope.enter_context(profiler.call(func.__name__))
                out = func(*args, **kwargs)
            if data_parallel:
                out = _to(out, "cpu")
            # A rank whose output is not gathered (a sequence-parallel peer of a collect rank) returns
            # None, so the driver can wait on it without fetching a duplicate of the data.
            return None if drop_output else out

        # Ray checks every call against the signature of the fully unwrapped method: stop unwrapping here.
        inner.__signature__ = _with_group_kwargs(inspect.signature(func))
        del inner.__wrapped__
        setattr(inner, MAGIC_ATTR, MethodSpec(dispatch_mode, blocking))
        return inner

    return decorator


def _with_group_kwargs(sig: inspect.Signature) -> inspect.Signature:
    """``sig`` plus the keyword-only `DROP_OUTPUT_KWARG` and `THREADS_KWARG` (before any ``**kwargs``)."""
    params = list(sig.parameters.values())
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return sig
    extra = [
        inspect.Parameter(DROP_OUTPUT_KWARG, inspect.Parameter.KEYWORD_ONLY, default=False),
        inspect.Parameter(THREADS_KWARG, inspect.Parameter.KEYWORD_ONLY, default=None),
    ]
    return sig.replace(parameters=[*params, *extra])


def get_method_spec(method: Callable) -> MethodSpec | None:
    return getattr(method, MAGIC_ATTR, None)


def registered_methods(cls: type) -> dict[str, MethodSpec]:
    """Every ``@register``-ed method of ``cls`` (including inherited ones), by name."""
    out = {}
    for name, member in inspect.getmembers(cls, predicate=callable):
        spec = get_method_spec(member)
        if spec is not None:
            out[name] = spec
    return out


def _to(value: Any, device: Any) -> Any:
    """``value`` with its tensors on ``device`` when it is a `DataProto` (a new object: the caller's batch
    is not moved under its feet); anything else unchanged."""
    if isinstance(value, DataProto) and value.batch is not None:
        batch = value.batch.to(device)
        batch = (
            batch.copy() if batch is value.batch else batch
        )  # a new mapping: keys the method adds stay its own
        return DataProto(batch=batch, non_tensor_batch=value.non_tensor_batch, meta_info=value.meta_info)
    return value


def _materialize(arg: Any) -> Any:
    """Inside a worker: fetch the samples a :class:`FutureSlice` stands for."""
    if isinstance(arg, FutureSlice):
        return arg.resolve()
    if isinstance(arg, DataProtoFuture):
        return arg.get()
    return arg


# ----------------------------------------------------------------------------------------------------------
# dispatch: driver-side arguments -> per-rank arguments
# ----------------------------------------------------------------------------------------------------------


@dataclass
class Dispatched:
    """Per-rank positional and keyword arguments, plus what collect needs to undo the dispatch."""

    args: list[tuple]
    kwargs: list[dict]
    pad_size: int = 0
    chunk_sizes: list[int] | None = None


def dispatch_one_to_all(wg: WorkerGroup, *args: Any, **kwargs: Any) -> Dispatched:
    n = wg.world_size
    return Dispatched([args] * n, [kwargs] * n)


def _data_length(args: tuple, kwargs: dict) -> int | None:
    lengths = {len(v) for v in (*args, *kwargs.values()) if isinstance(v, DataProto | DataProtoFuture)}
    if len(lengths) > 1:
        raise ValueError(
            f"data-parallel dispatch: DataProto arguments have different lengths {sorted(lengths)}"
        )
    return lengths.pop() if lengths else None


def chunk_for_dp(value: Any, n_chunks: int) -> tuple[list[Any], int]:
    """Pad ``value`` to a multiple of ``n_chunks`` (repeating its first samples) and split it by sample."""
    if isinstance(value, DataProto):
        padded, pad = pad_dataproto_to_divisor(value, n_chunks)
        return padded.chunk(n_chunks), pad
    if isinstance(value, DataProtoFuture):
        return _chunk_future(value, n_chunks)
    raise TypeError(
        f"data-parallel dispatch expects DataProto or DataProtoFuture, got {type(value).__name__}"
    )


def _chunk_future(future: DataProtoFuture, n_chunks: int) -> tuple[list[FutureSlice], int]:
    """Split a future by sample index; padding wraps around to the first samples, like the DataProto path."""
    n = len(future)
    pad = (-n) % n_chunks
    step = (n + pad) // n_chunks
    chunks = []
    for r in range(n_chunks):
        lo, hi = r * step, (r + 1) * step
        parts = future.slice_by_index(min(lo, n), min(hi, n)).parts
        start = max(lo, n)
        while start < hi:  # padded samples: index i >= n stands for sample i % n (may wrap several times)
            s = start % n
            e = min(s + (hi - start), n)
            parts = parts + future.slice_by_index(s, e).parts
            start += e - s
        chunks.append(FutureSlice(parts=parts))
    return chunks, pad


def dispatch_dp_compute_proto(wg: WorkerGroup, *args: Any, **kwargs: Any) -> Dispatched:
    n = wg.world_size
    return _dispatch_proto(n, list(range(n)), args, kwargs)


def _dispatch_proto(n_chunks: int, chunk_of_rank: list[int], args: tuple, kwargs: dict) -> Dispatched:
    """Chunk every DataProto-like argument into ``n_chunks``; rank ``r`` gets chunk ``chunk_of_rank[r]``."""
    length = _data_length(args, kwargs)
    if length is None:
        raise ValueError("data-parallel dispatch needs at least one DataProto or DataProtoFuture argument")
    pad = (-length) % n_chunks
    split_args = [chunk_for_dp(a, n_chunks)[0] if _is_data(a) else None for a in args]
    split_kwargs = {k: (chunk_for_dp(v, n_chunks)[0] if _is_data(v) else None) for k, v in kwargs.items()}
    shared_args = [_put_chunks(s) for s in split_args]
    shared_kwargs = {k: _put_chunks(s) for k, s in split_kwargs.items()}
    per_args, per_kwargs = [], []
    for chunk in chunk_of_rank:
        per_args.append(tuple(a if s is None else s[chunk] for a, s in zip(args, shared_args)))
        per_kwargs.append(
            {k: (v if shared_kwargs[k] is None else shared_kwargs[k][chunk]) for k, v in kwargs.items()}
        )
    sizes = [(length + pad) // n_chunks] * n_chunks
    return Dispatched(per_args, per_kwargs, pad_size=pad, chunk_sizes=sizes)


def _is_data(value: Any) -> bool:
    return isinstance(value, DataProto | DataProtoFuture)


def _put_chunks(chunks: list | None) -> list | None:
    """Store DataProto chunks in the object store once, so ranks sharing a chunk share one object."""
    if chunks is None:
        return None
    import ray

    return [ray.put(c) if isinstance(c, DataProto) else c for c in chunks]


def dispatch_mesh(mesh: MeshDispatch, wg: WorkerGroup, *args: Any, **kwargs: Any) -> Dispatched:
    info = wg.dispatch_info(mesh.mesh_name)
    dp_size = info.dp_size
    return _dispatch_proto(dp_size, info.dp_ranks, args, kwargs)


# ----------------------------------------------------------------------------------------------------------
# collect: per-rank results -> one value
# ----------------------------------------------------------------------------------------------------------


def collect_all(outputs: list[Any]) -> list[Any]:
    return outputs


def collect_dp_proto(outputs: list[Any], pad_size: int, input_rows: int | None = None) -> DataProto:
    """Concatenate the ranks' outputs and drop the rows that came from dispatch padding.

    A method may return a fixed multiple of its input rows (e.g. ``n`` responses per prompt, repeated
    in place); the padded inputs are the last ones, so their ``pad_size × multiple`` output rows are the
    last rows and are dropped. ``input_rows`` is the padded number of input rows.
    """
    for rank, out in enumerate(outputs):
        if not isinstance(out, DataProto):
            raise TypeError(
                f"rank {rank} returned {type(out).__name__}; a DP_COMPUTE_PROTO method must return DataProto"
            )
    joined = DataProto.concat(outputs)
    multiple = 1
    if pad_size and input_rows:
        if len(joined) % input_rows:
            raise ValueError(
                f"data-parallel call returned {len(joined)} rows for {input_rows} padded input rows; "
                "a method must return a whole multiple of its input rows"
            )
        multiple = len(joined) // input_rows
    return unpad_dataproto(joined, pad_size * multiple)


@dataclass
class MeshInfo:
    """Per-rank data-parallel rank and collect flag for one named mesh, gathered from the workers."""

    dp_ranks: list[int]
    is_collect: list[bool]

    def __post_init__(self) -> None:
        self.dp_size = max(self.dp_ranks) + 1
        collect_dp = sorted(d for d, c in zip(self.dp_ranks, self.is_collect) if c)
        if collect_dp != list(range(self.dp_size)):
            raise ValueError(
                f"mesh dispatch needs exactly one collect rank per dp rank 0..{self.dp_size - 1}, "
                f"got collect dp ranks {collect_dp}"
            )

    def collect_order(self) -> list[int]:
        """Worker ranks to gather, ordered by their DP rank."""
        ranks = [r for r, c in enumerate(self.is_collect) if c]
        return sorted(ranks, key=lambda r: self.dp_ranks[r])


def dispatch_for(spec: MethodSpec) -> Callable:
    table = {Dispatch.ONE_TO_ALL: dispatch_one_to_all, Dispatch.DP_COMPUTE_PROTO: dispatch_dp_compute_proto}
    if isinstance(spec.dispatch_mode, MeshDispatch):
        return functools.partial(dispatch_mesh, spec.dispatch_mode)
    return table[spec.dispatch_mode]


def is_data_parallel(spec: MethodSpec) -> bool:
    return isinstance(spec.dispatch_mode, MeshDispatch) or spec.dispatch_mode == Dispatch.DP_COMPUTE_PROTO


def future_from_refs(
    refs: list[Any],
    chunk_sizes: list[int],
    pad_size: int,
    watch: list[tuple[Any, str, int]] | None = None,
) -> DataProtoFuture:
    """The future of a data-parallel call: shards in order, padding excluded from its range; ``watch``
    holds the refs of the ranks that are not gathered (see `DataProtoFuture`)."""
    total = int(np.sum(chunk_sizes))
    return DataProtoFuture(
        refs=list(refs), shard_sizes=list(chunk_sizes), start=0, end=total - pad_size, watch=list(watch or [])
    )
