"""`serial_side_threads` (applied by `init_distributed`): gloo's threads get one-thread intra-op pools.

A gloo all-gather unflattens its output with ``copy_`` on gloo's worker thread. With the process-wide
intra-op size above 1, that copy starts an OpenMP team of its own, which stays for good and turns the
spinning waits of the worker's own OpenMP threads into futex sleeps (small ops 4-5x slower). The check
here is the mechanism, not a timing: the OS threads of the process before and after the all-gather.
Each case runs in a fresh interpreter (the intra-op sizes are per process).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import json, os, sys, threading
import torch
import torch.distributed as dist
from rlflow.parallel.distributed import init_distributed, intra_op_threads

if sys.argv[1] == "plain":  # torch's own set-up, as before init_distributed did more
    import tempfile
    store = os.path.join(tempfile.mkdtemp(), "store")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
else:
    init_distributed()
torch.ones(4) + 1  # this thread computes before the gather, as a worker does
inside = None
if sys.argv[1] == "overlap":  # a call that shared the cores with another role's (trainer.overlap_updates)
    with intra_op_threads(1):
        inside = torch.get_num_threads()
        torch.ones(1 << 16) + 1
before = len(os.listdir("/proc/self/task"))
flat = torch.randn(1 << 20)
out = flat.new_empty(flat.numel())
dist.all_gather_into_tensor(out, flat)
after = len(os.listdir("/proc/self/task"))
fresh = []
helper = threading.Thread(target=lambda: fresh.append(torch.get_num_threads()))
helper.start()
helper.join()
print(json.dumps({"before": before, "after": after, "main": torch.get_num_threads(), "fresh": fresh[0],
                  "equal": bool(torch.equal(out, flat)), "inside": inside}))
"""


def _run(mode: str) -> dict:
    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT", "LOCAL_RANK")
    }
    env["OMP_NUM_THREADS"] = "2"
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc")
def test_gloo_all_gather_leaves_no_openmp_team_behind():
    plain = _run("plain")
    # without it the gather's copy starts a second OpenMP team on gloo's thread: one more OS thread
    assert plain["after"] == plain["before"] + 1, plain
    assert plain["fresh"] == 2
    fixed = _run("init_distributed")
    assert fixed["equal"] and fixed["main"] == 2, fixed  # the worker's own thread keeps its 2 threads
    assert fixed["after"] == fixed["before"], fixed
    assert fixed["fresh"] == 1


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc")
def test_a_call_with_fewer_threads_gives_the_worker_its_own_count_back():
    """`intra_op_threads` (a call overlapped with another role's): one thread inside, the worker's 2 after,
    and threads that compute later still get one-thread pools (no OpenMP team left behind by a gather)."""
    out = _run("overlap")
    assert out["inside"] == 1 and out["main"] == 2 and out["fresh"] == 1, out
    assert out["after"] == out["before"] and out["equal"], out
    from rlflow.parallel.distributed import intra_op_threads

    with pytest.raises(ValueError, match="threads=0 must be >= 1"), intra_op_threads(0):
        pass
