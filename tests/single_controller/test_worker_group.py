"""Worker groups on a real local Ray cluster: dispatch modes, futures, colocation, failures."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import ray
import torch

from rlflow.protocol import DataProto
from rlflow.single_controller import (
    Dispatch,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    ResourceUnavailableError,
    Worker,
    WorkerGroupError,
    make_nd_compute_dataproto_dispatch_fn,
    register,
)
from rlflow.single_controller.futures import DataProtoFuture, FutureSlice

pytestmark = pytest.mark.usefixtures("ray_session")


def _timed_threads(data: DataProto, hold_s: float) -> DataProto:
    start = time.time()
    time.sleep(hold_s)
    n = len(data)
    return DataProto.from_dict(
        tensors={
            "threads": torch.full((n,), torch.get_num_threads()),
            "interval": torch.tensor([[start, time.time()]], dtype=torch.float64).expand(n, 2),
        }
    )


class EchoWorker(Worker):
    """Each method tags what it received with its rank, so the tests can see where samples went."""

    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        self.scale = scale

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def rank_plus(self, x: int) -> int:
        return self.rank * 100 + x

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def double(self, data: DataProto) -> DataProto:
        out = DataProto.from_dict(
            tensors={"y": data.batch["x"] * 2 * self.scale, "rank": torch.full((len(data),), self.rank)},
            non_tensors={"tag": data.non_tensor_batch["tag"]},
            meta_info={"metrics": {"n": len(data)}},
        )
        return out

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def double_async(self, data: DataProto) -> DataProto:
        return DataProto.from_dict(tensors={"y": data.batch["x"] * 2})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def plus_values(self, data: DataProto, values: DataProto) -> DataProto:
        """Consumer of a future: values arrive materialised, routed by sample index."""
        return DataProto.from_dict(
            tensors={"z": data.batch["x"] + values.batch["y"], "rank": torch.full((len(data),), self.rank)}
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def repeat_twice(self, data: DataProto) -> DataProto:
        """Two output rows per input row (like n=2 responses per prompt), repeated in place."""
        return data.repeat(2, interleave=True)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def placement(self) -> tuple[int, str | None, tuple[str, int]]:
        ctx = ray.get_runtime_context()
        return self.rank, ctx.get_placement_group_id(), self.get_node_and_pid()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def threads(self) -> int:
        return torch.get_num_threads()

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def timed_threads(self, data: DataProto, hold_s: float) -> DataProto:
        """Intra-op threads during the call and the call's wall-clock interval, per sample."""
        return _timed_threads(data, hold_s)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def timed_threads_async(self, data: DataProto, hold_s: float) -> DataProto:
        """`timed_threads` registered non-blocking (its direct call returns a future)."""
        return _timed_threads(data, hold_s)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def malloc_env(self) -> dict:
        return {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def die_on_rank(self, rank: int, block_s: float) -> int:
        if self.rank == rank:
            os._exit(1)
        time.sleep(block_s)  # a peer stuck, e.g. in a collective the dead rank never joins
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def raise_on_rank(self, rank: int) -> int:
        if self.rank == rank:
            raise ValueError(f"bad input on rank {rank}")
        return self.rank


class MeshWorker(EchoWorker):
    """Ranks form a (dp=2, sp=2) mesh: ranks 0,1 are sequence-parallel peers of dp rank 0, etc."""

    def __init__(self) -> None:
        super().__init__()
        self.register_dispatch_info("actor", dp_rank=self.rank // 2, is_collect=self.rank % 2 == 0)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("actor"))
    def mesh_compute(self, data: DataProto) -> DataProto:
        self.last_x = data.batch["x"].tolist()
        return DataProto.from_dict(
            tensors={"y": data.batch["x"] + 0, "rank": torch.full((len(data),), self.rank)}
        )


class FailingPeerWorker(MeshWorker):
    """A non-blocking mesh method whose sequence-parallel peer (rank 1) fails while its collect rank
    (rank 0) is left waiting, as in an all-to-all the failed peer never joins."""

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("actor"), blocking=False)
    def values_async(self, data: DataProto) -> DataProto:
        if self.rank == 1:
            raise RuntimeError("sequence-parallel peer failed in compute_values")
        if self.rank == 0:
            time.sleep(600)  # never returns within the test
        return DataProto.from_dict(tensors={"y": data.batch["x"] * 2})


class SlowWorker(Worker):
    """A worker whose actor start (constructor) or ``init_model`` takes ``start_s`` / ``init_s``."""

    def __init__(self, start_s: float = 0.0, init_s: float = 0.0) -> None:
        time.sleep(start_s)
        super().__init__()
        self.init_s = init_s

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def init_model(self) -> int:
        time.sleep(self.init_s)
        return self.rank


def _data(n: int) -> DataProto:
    return DataProto.from_dict(
        tensors={"x": torch.arange(n, dtype=torch.float32)},
        non_tensors={"tag": np.array([f"s{i}" for i in range(n)], dtype=object)},
    )


@pytest.fixture
def pool2():
    pool = RayResourcePool([2], cpus_per_bundle=1.0, name_prefix="test2", max_colocate_count=2)
    yield pool
    pool.remove()


@pytest.fixture
def group2(pool2):
    wg = RayWorkerGroup(pool2, RayClassWithInitArgs(EchoWorker, scale=1.0), name_prefix="echo")
    yield wg
    wg.shutdown()


def test_one_to_all(group2):
    assert group2.world_size == 2
    assert group2.rank_plus(7) == [7, 107]


def test_dp_compute_proto_even_and_uneven(group2):
    out = group2.double(_data(4))
    assert out.batch["y"].tolist() == [0.0, 2.0, 4.0, 6.0]
    assert out.batch["rank"].tolist() == [0, 0, 1, 1]
    assert out.non_tensor_batch["tag"].tolist() == ["s0", "s1", "s2", "s3"]
    assert out.meta_info["metrics"] == {"n": [2, 2]}  # merged from both ranks

    # 5 samples on 2 ranks: padded to 6 for dispatch (rank 1 also gets sample 0 again), stripped after.
    out = group2.double(_data(5))
    assert len(out) == 5
    assert out.batch["y"].tolist() == [0.0, 2.0, 4.0, 6.0, 8.0]
    assert out.batch["rank"].tolist() == [0, 0, 0, 1, 1]
    assert out.meta_info["metrics"] == {"n": [3, 3]}


def test_padding_stripped_from_outputs_with_several_rows_per_input(group2):
    out = group2.repeat_twice(_data(5))  # padded to 6 inputs -> 12 rows; the 2 rows of the pad dropped
    assert out.batch["x"].tolist() == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0]
    assert out.non_tensor_batch["tag"].tolist() == [
        "s0",
        "s0",
        "s1",
        "s1",
        "s2",
        "s2",
        "s3",
        "s3",
        "s4",
        "s4",
    ]


def test_mesh_dispatch_sp_peers_share_and_only_collect_ranks_gathered():
    pool = RayResourcePool([4], cpus_per_bundle=0.5, name_prefix="mesh")
    wg = RayWorkerGroup(pool, RayClassWithInitArgs(MeshWorker), name_prefix="mesh")
    try:
        out = wg.mesh_compute(_data(6))
        assert out.batch["y"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
        # dp rank 0 -> worker 0 (collect), dp rank 1 -> worker 2 (collect); workers 1 and 3 not gathered.
        assert out.batch["rank"].tolist() == [0, 0, 0, 2, 2, 2]
        # The sequence-parallel peers received exactly the same samples as their collect ranks.
        assert wg.execute_fn(lambda w: w.last_x) == [[0, 1, 2], [0, 1, 2], [3, 4, 5], [3, 4, 5]]
        # Uneven: 5 samples over dp=2 are padded to 6 and stripped again.
        out = wg.mesh_compute(_data(5))
        assert out.batch["y"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    finally:
        wg.shutdown()
        pool.remove()


def test_future_routed_by_sample_index_without_driver_fetch(monkeypatch):
    """A 2-rank producer's future feeds a 3-rank consumer; the driver only moves object refs."""
    producer_pool = RayResourcePool([2], cpus_per_bundle=0.5, name_prefix="producer")
    consumer_pool = RayResourcePool([3], cpus_per_bundle=0.5, name_prefix="consumer")
    producer = RayWorkerGroup(producer_pool, RayClassWithInitArgs(EchoWorker), name_prefix="producer")
    consumer = RayWorkerGroup(consumer_pool, RayClassWithInitArgs(EchoWorker), name_prefix="consumer")
    try:
        data = _data(7)
        future = producer.double_async(data)
        assert isinstance(future, DataProtoFuture)
        assert len(future) == 7 and future.shard_sizes == [4, 4]  # 7 padded to 8 on 2 ranks
        producer_refs = set(future.refs)

        fetched: list = []
        real_get = ray.get

        def counting_get(refs, *args, **kwargs):
            items = refs if isinstance(refs, list) else [refs]
            fetched.extend(r for r in items if r in producer_refs)
            return real_get(refs, *args, **kwargs)

        def no_resolve(self):
            raise AssertionError("the driver resolved a future slice")

        monkeypatch.setattr(ray, "get", counting_get)
        monkeypatch.setattr(FutureSlice, "resolve", no_resolve)
        out = consumer.plus_values(data, values=future)
        monkeypatch.undo()

        assert fetched == []
        # z = x + 2x; 7 samples padded to 9 on 3 consumer ranks (3 each), padding stripped.
        assert out.batch["z"].tolist() == [3.0 * i for i in range(7)]
        assert out.batch["rank"].tolist() == [0, 0, 0, 1, 1, 1, 2]
        # The future can also be fetched explicitly, and chunked by sample index.
        assert future.get().batch["y"].tolist() == [2.0 * i for i in range(7)]
    finally:
        for g in (producer, consumer):
            g.shutdown()
        producer_pool.remove()
        consumer_pool.remove()


@pytest.mark.timeout(120)
def test_failing_non_collect_rank_of_a_future_surfaces_its_own_error():
    """The producer's non-collect rank raises; the consumer waits on the stuck collect rank's shard. The
    driver's wait on the consumer watches every producer rank and raises the peer's own error."""
    producer_pool = RayResourcePool([4], cpus_per_bundle=0.5, name_prefix="peer_producer")
    consumer_pool = RayResourcePool([2], cpus_per_bundle=0.5, name_prefix="peer_consumer")
    producer = RayWorkerGroup(producer_pool, RayClassWithInitArgs(FailingPeerWorker), name_prefix="critic")
    consumer = RayWorkerGroup(consumer_pool, RayClassWithInitArgs(EchoWorker), name_prefix="actor")
    try:
        data = _data(4)
        start = time.monotonic()
        future = producer.values_async(data)
        with pytest.raises(RuntimeError, match="sequence-parallel peer failed") as info:
            consumer.plus_values(data, values=future)
        assert time.monotonic() - start < 60
        assert "worker group 'critic', rank 1" in "".join(getattr(info.value, "__notes__", []))
    finally:
        for g in (producer, consumer):
            g.shutdown()
        producer_pool.remove()
        consumer_pool.remove()


@pytest.mark.timeout(120)
def test_group_start_is_bounded_names_the_group_and_logs_a_heartbeat(pool2, caplog):
    caplog.set_level("INFO", logger="rlflow.single_controller.worker_group")
    start = time.monotonic()
    with pytest.raises(
        WorkerGroupError, match=r"worker group 'reward_model': start of the rank-0 actor.*within 3 s"
    ):
        RayWorkerGroup(
            pool2,
            RayClassWithInitArgs(SlowWorker, start_s=300.0),
            name_prefix="reward_model",
            start_timeout_s=3.0,
            heartbeat_s=1.0,
        )
    assert time.monotonic() - start < 20
    beats = [r.getMessage() for r in caplog.records if "still waiting" in r.getMessage()]
    assert beats and "worker group 'reward_model'" in beats[0] and "of 3 s" in beats[0]


@pytest.mark.timeout(120)
def test_init_of_several_groups_is_bounded_and_names_the_slow_one(pool2, caplog):
    from rlflow.single_controller.worker_group import wait_all

    caplog.set_level("INFO", logger="rlflow.single_controller.worker_group")
    fast = RayWorkerGroup(pool2, RayClassWithInitArgs(SlowWorker), name_prefix="actor")
    slow = RayWorkerGroup(pool2, RayClassWithInitArgs(SlowWorker, init_s=300.0), name_prefix="critic")
    try:
        start = time.monotonic()
        with pytest.raises(
            WorkerGroupError, match=r"worker group 'critic': init_model on ranks \[0, 1\]"
        ) as info:
            wait_all([(fast.init_model(), "init_model"), (slow.init_model(), "init_model")], 3.0, 1.0)
        assert "within 3 s" in str(info.value) and "'actor'" not in str(info.value)
        assert time.monotonic() - start < 20
        assert any("still waiting" in r.getMessage() and "'critic'" in r.getMessage() for r in caplog.records)
    finally:
        fast.shutdown()
        slow.shutdown()


def test_colocated_groups_share_placement_group_in_separate_processes(pool2):
    actor = RayWorkerGroup(pool2, RayClassWithInitArgs(EchoWorker), name_prefix="actor")
    critic = RayWorkerGroup(pool2, RayClassWithInitArgs(EchoWorker), name_prefix="critic")
    try:
        a, c = actor.placement(), critic.placement()
        pg_ids = {pg for _, pg, _ in a + c}
        assert pg_ids == {pool2.get_placement_groups()[0].id.hex()}
        pids = [pid for _, _, (_, pid) in a + c]
        assert len(set(pids)) == 4  # every rank of every role is its own process
        assert pool2.actor_resources() == {"num_cpus": 0.5}
        # Both groups work side by side on the same bundles.
        assert critic.double(_data(2)).batch["y"].tolist() == [0.0, 2.0]
        assert actor.double(_data(2)).batch["y"].tolist() == [0.0, 2.0]
    finally:
        actor.shutdown()
        critic.shutdown()


def test_colocated_roles_each_compute_with_every_cpu_of_the_bundle(monkeypatch):
    """Colocated roles take turns, so each one's intra-op threads are the bundle's CPUs, not its
    fractional Ray share (1 CPU of a 2-CPU bundle shared by two roles)."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    for key in [k for k in os.environ if k.startswith("MALLOC_")]:
        monkeypatch.delenv(key)
    pool = RayResourcePool([1], cpus_per_bundle=2.0, name_prefix="threads", max_colocate_count=2)
    groups = []
    try:
        groups = [RayWorkerGroup(pool, RayClassWithInitArgs(EchoWorker), name_prefix=n) for n in ("a", "b")]
        assert pool.actor_resources() == {"num_cpus": 1.0}
        assert [g.threads() for g in groups] == [[2], [2]]
        monkeypatch.setenv("OMP_NUM_THREADS", "1")  # an explicit setting in the driver's environment wins
        assert pool.cpu_threads() == 1
        # CPU pools: glibc keeps freed memory (4 GiB mmap threshold, 16 GiB trim threshold)
        keep = {"MALLOC_MMAP_THRESHOLD_": str(4 << 30), "MALLOC_TRIM_THRESHOLD_": str(16 << 30)}
        assert groups[0].malloc_env() == [keep] and pool.allocator_env() == keep
        monkeypatch.setenv("MALLOC_ARENA_MAX", "2")  # the user's own malloc tuning: ours left out
        assert pool.allocator_env() == {}
    finally:
        for g in groups:
            g.shutdown()
        pool.remove()


def test_submitted_calls_of_two_colocated_groups_run_together_with_their_threads(monkeypatch):
    """`RayWorkerGroup.submit` starts a blocking method without waiting: two roles' calls overlap in time,
    each with the threads it was given, the ranks get their own count back afterwards, and `result`
    returns what the blocking call returns (dispatch padding stripped). A non-blocking method returns its
    future, computed with the threads it was given."""
    from rlflow.single_controller.worker_group import as_completed

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    pool = RayResourcePool([1], cpus_per_bundle=2.0, name_prefix="overlap", max_colocate_count=2)
    groups = []
    try:
        groups = [RayWorkerGroup(pool, RayClassWithInitArgs(EchoWorker), name_prefix=n) for n in ("a", "b")]
        calls = {
            "a": groups[0].submit("timed_threads", _data(3), hold_s=1.0, threads=1),
            "b": groups[1].submit("timed_threads", _data(3), 1.0),
        }
        out = dict(as_completed(calls))
        assert sorted(out) == ["a", "b"]
        assert out["a"].batch["threads"].tolist() == [1, 1, 1]
        assert out["b"].batch["threads"].tolist() == [2, 2, 2]  # no threads given: the rank's own count
        (a0, a1), (b0, b1) = out["a"].batch["interval"][0].tolist(), out["b"].batch["interval"][0].tolist()
        assert a0 < b1 and b0 < a1  # the two calls ran at the same time
        assert [g.threads() for g in groups] == [[2], [2]]  # restored after the call
        done = groups[0].submit("double", _data(3)).result()
        assert torch.equal(done.batch["y"], groups[0].double(_data(3)).batch["y"])
        # a non-blocking method: its future, computed with the threads given, beside another call
        future = groups[0].submit("timed_threads_async", _data(3), hold_s=1.0, threads=1)
        assert isinstance(future, DataProtoFuture)
        beside = groups[1].submit("timed_threads", _data(3), 1.0).result()
        fetched = future.get()
        assert fetched.batch["threads"].tolist() == [1, 1, 1]
        (a0, a1), (b0, b1) = fetched.batch["interval"][0].tolist(), beside.batch["interval"][0].tolist()
        assert a0 < b1 and b0 < a1
        assert [g.threads() for g in groups] == [[2], [2]]
        with pytest.raises(ValueError, match="no registered method 'nope'"):
            groups[0].submit("nope")
        with pytest.raises(ValueError, match="threads=0 must be >= 1"):
            groups[0].submit("double", _data(2), threads=0)
    finally:
        for g in groups:
            g.shutdown()
        pool.remove()


def test_over_asked_resources_error_is_fast_and_names_resource():
    start = time.monotonic()
    pool = RayResourcePool([64], cpus_per_bundle=1.0, name_prefix="huge")
    with pytest.raises(ResourceUnavailableError, match=r"huge.*64 CPU.*short of CPU: largest node has 4"):
        RayWorkerGroup(pool, RayClassWithInitArgs(EchoWorker), name_prefix="huge")
    assert time.monotonic() - start < 10


def test_placement_timeout_when_resources_are_taken(pool2):
    pool2.get_placement_groups()  # holds 2 of the 4 CPUs
    other = RayResourcePool([3], cpus_per_bundle=1.0, name_prefix="late", placement_timeout_s=2.0)
    start = time.monotonic()
    with pytest.raises(ResourceUnavailableError, match=r"late.*not placed within 2 s"):
        other.get_placement_groups()
    assert time.monotonic() - start < 2.0 + 10


def test_dead_worker_raises_naming_group_and_rank_in_bounded_time(group2):
    start = time.monotonic()
    with pytest.raises(WorkerGroupError, match=r"worker group 'echo': rank 1 died"):
        group2.die_on_rank(1, 120.0)
    assert time.monotonic() - start < 30


def test_worker_exception_names_group_and_rank(group2):
    with pytest.raises(ValueError, match="bad input on rank 0") as info:
        group2.raise_on_rank(0)
    assert "worker group 'echo', rank 0" in "".join(getattr(info.value, "__notes__", []))


def test_no_ray_processes_left_after_shutdown(tmp_path):
    """A driver that starts Ray, runs a group and shuts down leaves no Ray process behind."""
    script = textwrap.dedent(
        """
        import sys, ray
        from rlflow.single_controller import init_ray, RayResourcePool, RayWorkerGroup, RayClassWithInitArgs, Worker
        init_ray(num_cpus=1, object_store_memory=100 * 2**20)
        print(ray._private.worker._global_node.get_session_dir_path())
        pool = RayResourcePool([1], name_prefix="t")
        wg = RayWorkerGroup(pool, RayClassWithInitArgs(Worker), name_prefix="t")
        assert wg.execute_fn(lambda w: w.rank) == [0]
        ray.shutdown()
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=180, cwd=str(tmp_path)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    session_dir = proc.stdout.strip().splitlines()[-1]
    session = os.path.basename(session_dir.rstrip("/"))
    deadline = time.monotonic() + 20
    while True:
        left = _processes_mentioning(session)
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert left == [], f"Ray processes left running: {left}"


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            found.append(f"{pid}: {cmd[:200]}")
    return found


INHERITED_MASTER_PORT = """
import socket, sys
import torch, torch.distributed as dist
from rlflow.parallel.distributed import init_distributed
from rlflow.single_controller import (
    Dispatch, RayClassWithInitArgs, RayResourcePool, RayWorkerGroup, Worker, init_ray, register,
)

class SumWorker(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def all_reduce(self):
        import os
        init_distributed(backend="gloo", timeout_s=60)
        t = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(t)
        return float(t), os.environ["MASTER_PORT"]

held = socket.socket()
held.bind(("127.0.0.1", 0))
held.listen()
import os
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(held.getsockname()[1]))  # set before Ray starts
init_ray(num_cpus=2, object_store_memory=100 * 2**20)
pool = RayResourcePool([2], name_prefix="m")
group = RayWorkerGroup(pool, RayClassWithInitArgs(SumWorker), name_prefix="m")
print(held.getsockname()[1], group.all_reduce())
"""


def test_a_master_port_inherited_from_the_driver_is_not_reused(tmp_path):
    """A driver that set MASTER_ADDR/PORT for itself before Ray started (its own process group, a launcher):
    the Ray processes inherit them, and a worker group's rank 0 must still bind a store of its own — the
    inherited port is taken (here by a listening socket), so using it fails with EADDRINUSE."""
    proc = subprocess.run(
        [sys.executable, "-c", INHERITED_MASTER_PORT],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    held, results = proc.stdout.strip().splitlines()[-1].split(" ", 1)
    assert "(3.0, " in results and held not in results, (held, results)
