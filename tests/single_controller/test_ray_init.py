"""``init_ray`` with no address starts a fresh local Ray, whatever cluster file an earlier run left."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path


def test_a_stale_cluster_file_does_not_hijack_a_local_start():
    """Ray's ``ray.init()`` joins the cluster named in ``<tmp>/ray/ray_current_cluster`` when there is one;
    a crashed run leaves that file behind, and the next local start then failed ("When connecting to an
    existing cluster, num_cpus and num_gpus must not be provided"). ``ray_init.address=null`` means a
    fresh local cluster, so rlflow asks Ray for exactly that."""
    tmp_path = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # short: Ray's socket paths live under it
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text("192.0.2.2:44651")  # nobody listens there
    script = textwrap.dedent(
        """
        import ray
        from rlflow.single_controller import init_ray
        resources = init_ray(num_cpus=1, object_store_memory=80 * 2**20)
        print("CPU", resources["CPU"])
        ray.shutdown()
        """
    )
    env = {**os.environ, "RAY_TMPDIR": str(tmp_path), "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=180
    )
    shutil.rmtree(tmp_path, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "CPU 1.0" in proc.stdout
