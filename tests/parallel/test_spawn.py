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
