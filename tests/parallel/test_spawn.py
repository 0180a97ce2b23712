"""`spawn_workers`: a rank's result counts once it is saved; a crash says where the rank died."""

from __future__ import annotations

import atexit
import os

import pytest
import torch
import torch.distributed as dist

from rlflow.parallel.distributed import spawn_workers


def _abort_at_exit(rank: int) -> int:
    # Stands in for gloo's threads aborting the process while the interpreter is torn down (seen in CI
    # as SIGABRT "terminate called without an active exception" after a test's worker had finished).
    atexit.register(os.abort)
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    return int(total.item())


def _abort_inside(rank: int) -> int:
    if rank == 1:
        os.abort()
    return rank


def test_teardown_crash_after_the_result_is_saved_does_not_fail_the_run():
    assert spawn_workers(_abort_at_exit, 2) == [3, 3]


def test_crash_inside_the_function_names_the_rank_and_where():
    with pytest.raises(RuntimeError, match=r"spawned rank 1 died inside '_abort_inside'.*SIGABRT"):
        spawn_workers(_abort_inside, 2)


def test_master_ports_are_outside_the_ports_the_kernel_and_ray_hand_out():
    """A ``MASTER_PORT`` found free must still be free when the rank-0 store binds it a moment later. A
    port from the kernel's ephemeral range can be taken in between by any outgoing connection (Ray opens
    many): the gloo store then fails with EADDRINUSE (seen in the multi-node test). Ray's workers listen
    on 10002..19999. So both pickers choose below the ephemeral range and above Ray's worker ports."""
    import socket

    from rlflow.parallel.distributed import find_free_port, port_range
    from rlflow.single_controller import worker

    low, high = port_range()
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral_low = int(f.read().split()[0])
    assert high <= ephemeral_low and low >= 20000
    for pick in (find_free_port, worker.find_free_port):
        for _ in range(20):
            port = pick()
            assert low <= port < high, port
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("127.0.0.1", port))  # free
