"""scripts/slurm/rlflow_ray.sbatch on a real Slurm cluster on this machine (this host as a node, plus a
virtual second node for ``--nodes=2``).

The fixture installs Slurm from the distribution's packages when it is missing (root and apt needed;
otherwise the tests skip and say why), starts munged, slurmctld and two slurmd from a private directory
(tests/cluster/slurm_setup.py) and stops them at the end. The tests then submit the script the way a user
would and check the job's exit status, its output and that no process of the job's Ray cluster is left.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.slurm_setup import SlurmCluster, install_slurm

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "slurm" / "rlflow_ray.sbatch"
OBJECT_STORE_BYTES = 400 * 2**20
# the shortest PPO run of the embedded CPU demo: one step, no validation, console metrics only
SHORT_RUN = [
    "--config-name=demo_two_ranks",
    "trainer.total_training_steps=1",
    "trainer.test_freq=-1",
    "trainer.val_before_train=false",
    "data.train_batch_size=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "trainer.logger=[console]",
    "trainer.n_gpus_per_node=2",
]


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    """Slurm with two nodes on this machine: the host itself and a virtual second node (its own slurmd)."""
    log = Path(tempfile.gettempdir()) / "rlflow-slurm-install.log"
    reason = install_slurm(log)
    if reason is not None:
        pytest.skip(f"Slurm cannot be installed here: {reason}")
    if os.geteuid() != 0:
        pytest.skip("Slurm is installed, but starting slurmd/slurmctld for the test needs root")
    cluster = SlurmCluster.start_or_reuse(nodes=2)
    try:
        cluster.wait_idle(nodes=1, timeout_s=60)
        yield cluster
    finally:
        if not cluster.reused:
            cluster.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class Job:
    """One submission of the sbatch script: its environment, output file and leftover-process check."""

    def __init__(self, cluster: SlurmCluster, workdir: Path) -> None:
        self.cluster = cluster
        self.workdir = workdir
        self.tag = uuid.uuid4().hex
        self.name = f"rlflow-test-{self.tag[:8]}"
        # short: Ray's socket paths below it must stay under 107 characters
        self.ray_tmp = Path(tempfile.mkdtemp(prefix="rlf", dir="/tmp"))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "RAY_"))}
        env.update(cluster.env)
        env.update(
            # the script finds python and ray on PATH: the interpreter running the tests comes first
            PATH=f"{Path(sys.executable).parent}:{cluster.env['PATH']}",
            RLFLOW_RAY_PORT=str(_free_port()),
            RLFLOW_RAY_TMPDIR=str(self.ray_tmp),
            RLFLOW_RAY_OBJECT_STORE_BYTES=str(OBJECT_STORE_BYTES),
            RLFLOW_READY_TIMEOUT="120",
            RLFLOW_TEST_TAG=self.tag,  # inherited by every process of the job
            TOKENIZERS_PARALLELISM="false",
        )
        self.env = env

    def sbatch(self, *args: str) -> list[str]:
        return [
            "sbatch",
            f"--job-name={self.name}",
            f"--chdir={self.workdir}",
            f"--output={self.workdir}/slurm-%j.out",
            "--time=10",
            *args,
            str(SCRIPT),
        ]

    def run_and_wait(self, sbatch_args: list[str], overrides: list[str], timeout_s: float = 240) -> int:
        """Submit the job and poll its state every 0.5 s (``sbatch --wait`` polls with a growing interval,
        up to tens of seconds); returns the job's exit status. Cancels the job on timeout."""
        cmd = [*self.sbatch("--parsable", *sbatch_args), *overrides]
        res = subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=30, cwd=self.workdir)
        if res.returncode:
            pytest.fail(f"sbatch exit {res.returncode}: {res.stderr}")
        job_id = res.stdout.strip().split(";")[0]
        deadline = time.monotonic() + timeout_s
        while (state := self.state(job_id))[0] not in FINISHED:
            if time.monotonic() > deadline:
                self.cancel()
                pytest.fail(
                    f"job {job_id} not finished in {timeout_s:.0f} s; job output:\n{self.output()[-4000:]}"
                )
            time.sleep(0.5)
        if not self.output():
            pytest.fail(f"job {job_id} ended {state[0]} with no job output")
        return state[1]

    def state(self, job_id: str) -> tuple[str, int]:
        """``(JobState, exit status)`` of the job from ``scontrol show job`` (kept for MinJobAge after it ends)."""
        out = self.cluster.run("scontrol", "--oneliner", "show", "job", job_id).stdout
        state = re.search(r"\bJobState=(\w+)", out)
        code = re.search(r"\bExitCode=(\d+):", out)
        return (state.group(1) if state else "UNKNOWN", int(code.group(1)) if code else -1)

    def output(self) -> str:
        files = sorted(self.workdir.glob("slurm-*.out"))
        return files[0].read_text(errors="replace") if files else ""

    def cancel(self) -> None:
        self.cluster.run("scancel", f"--name={self.name}")

    def queued(self) -> bool:
        res = self.cluster.run("squeue", "--noheader", f"--name={self.name}", "--format=%i")
        return bool(res.stdout.strip())

    def leftovers(self) -> list[str]:
        """Processes of this job still running: the tag in their environment, or this job's Ray temp dir
        in their command line or among their open files. Zombies do not count."""
        found = []
        tag = f"RLFLOW_TEST_TAG={self.tag}".encode()
        tmp = str(self.ray_tmp)
        for d in os.listdir("/proc"):
            if not d.isdigit() or int(d) == os.getpid():
                continue
            try:
                stat = Path(f"/proc/{d}/stat").read_bytes()
                if stat.rsplit(b")", 1)[1].split()[0] == b"Z":
                    continue
                cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                env = Path(f"/proc/{d}/environ").read_bytes().split(b"\0")
                fds = [os.readlink(f"/proc/{d}/fd/{fd}") for fd in os.listdir(f"/proc/{d}/fd")]
            except OSError:
                continue
            if tag in env or tmp in cmd or any(f.startswith(tmp) for f in fds):
                found.append(f"{d}: {cmd[:120]}")
        return found

    def wait_no_leftovers(self, timeout_s: float = 15.0) -> list[str]:
        deadline = time.monotonic() + timeout_s
        while (left := self.leftovers()) and time.monotonic() < deadline:
            time.sleep(0.5)
        return left

    def kill_leftovers(self) -> None:
        """Last resort for a failed test: SIGKILL what the job left (by pid), so the machine stays clean."""
        for entry in self.leftovers():
            with contextlib.suppress(OSError):
                os.kill(int(entry.split(":", 1)[0]), signal.SIGKILL)

    def close(self) -> None:
        if self.queued():
            self.cancel()
        self.kill_leftovers()
        shutil.rmtree(self.ray_tmp, ignore_errors=True)


@pytest.fixture
def job(slurm: SlurmCluster, tmp_path: Path) -> Iterator[Job]:
    j = Job(slurm, tmp_path)
    try:
        yield j
    finally:
        j.close()


def _cpus(cluster: SlurmCluster) -> int:
    res = cluster.run("sinfo", "--noheader", "--format=%c")
    return int(res.stdout.split()[0])


FINISHED = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
}
"""Slurm job states after which the job runs no more."""

STOPPED = re.compile(r"^\[rlflow-slurm\] \S+: (\d+) \+ (\d+) Ray process\(es\) stopped$", re.MULTILINE)


def test_sbatch_runs_ppo_and_stops_ray(job: Job) -> None:
    """`sbatch` of the script with a one-step PPO run: exit status 0, the trainer's step line, the
    resources the script gave Ray, and no process of the job afterwards."""
    rc = job.run_and_wait([], [*SHORT_RUN, f"trainer.default_local_dir={job.workdir}/ckpt"])
    out = job.output()
    assert rc == 0, f"job exit status {rc}; job output:\n{out[-6000:]}"
    cpus = _cpus(job.cluster)
    host = socket.gethostname().split(".")[0]
    # the layout line: one node, the Slurm node's CPUs for Ray, no GPU, CPUs as ranks per node
    layout = rf"1 node\(s\) \[{host}\], head {host} \(.*\), per node: {cpus} CPUs, 0 GPUs, {cpus} ranks"
    assert re.search(layout, out), out[-4000:]
    ready = re.search(r"Ray cluster ready: 1/1 nodes, (\{.*\})", out)
    assert ready, out[-4000:]
    assert f"'CPU': {float(cpus)}" in ready.group(1)
    assert f"'object_store_memory': {float(OBJECT_STORE_BYTES)}" in ready.group(1)
    # the driver joined that cluster and ran one PPO step (the console logger's per-step line)
    assert re.search(rf"joining the Ray cluster at [0-9.]+:{job.env['RLFLOW_RAY_PORT']}\b", out), out[-4000:]
    steps = re.findall(r"^step (\d+) \| .*vf_loss ([0-9.eE+-]+)", out, flags=re.MULTILINE)
    assert [s for s, _ in steps] == ["1"], out[-4000:]
    assert float(steps[0][1]) > 0.0
    assert "driver exited with status 0" in out
    assert re.search(r"shutting down \(exit status 0\)", out)
    assert len(STOPPED.findall(out)) == 1 and "Ray stopped" in out  # the per-node stop ran on the one node
    left = job.wait_no_leftovers()
    assert left == [], "processes of the finished job are still running:\n" + "\n".join(left)


def test_two_node_job_failing_driver(job: Job) -> None:
    """`sbatch --nodes=2`: a Ray worker joins from the second node; the driver fails (unknown config
    key), the job's exit status is the driver's (1) and Ray is stopped on both nodes."""
    try:
        job.cluster.wait_idle(nodes=2, timeout_s=30)
    except RuntimeError as exc:
        pytest.skip(f"this Slurm cannot run a second slurmd on one machine: {str(exc)[:500]}")
    names = sorted(job.cluster.idle_nodes())
    rc = job.run_and_wait(["--nodes=2"], ["trainer.no_such_key=1"], timeout_s=180)
    out = job.output()
    assert rc == 1, f"job exit status {rc}; job output:\n{out[-6000:]}"
    assert re.search(rf"2 node\(s\) \[{names[0]} {names[1]}\], head {names[0]} ", out), out[-4000:]
    assert "Ray cluster ready: 2/2 nodes" in out, out[-4000:]
    assert "unknown config key 'trainer.no_such_key'" in out
    assert "driver exited with status 1" in out
    assert re.search(r"shutting down \(exit status 1\)", out)
    stopped = STOPPED.findall(out)
    assert len(stopped) == 2, out[-4000:]  # one stop task per node
    left = job.wait_no_leftovers()
    assert left == [], "processes of the failed job are still running:\n" + "\n".join(left)


def test_scancel_stops_ray(job: Job) -> None:
    """`scancel` of a running job: the script's trap runs and no process of the job's Ray is left."""
    long_run = [
        *SHORT_RUN,
        "trainer.total_training_steps=200",
        f"trainer.default_local_dir={job.workdir}/ckpt",
    ]
    cmd = [*job.sbatch(), *long_run]
    res = subprocess.run(cmd, capture_output=True, text=True, env=job.env, timeout=30, cwd=job.workdir)
    assert res.returncode == 0, res.stderr
    # cancel while the driver runs and Ray has started worker processes (`ray::...`, renamed, not matched
    # by command line: the ones a teardown is most likely to leave behind)
    deadline = time.monotonic() + 150
    while "starting the driver" not in job.output() or not any(": ray::" in p for p in job.leftovers()):
        assert time.monotonic() < deadline, f"no driver and Ray workers after 150 s:\n{job.output()[-4000:]}"
        assert job.queued(), f"the job ended before the driver started:\n{job.output()[-4000:]}"
        time.sleep(1)
    job.cancel()
    deadline = time.monotonic() + 90
    while job.queued():
        assert time.monotonic() < deadline, "the cancelled job is still in the queue after 90 s"
        time.sleep(1)
    out = job.output()
    assert re.search(r"shutting down \(exit status 143\)", out), out[-4000:]
    assert "starting the driver" in out
    assert "driver exited" not in out  # the trap ran, not the normal end
    left = job.wait_no_leftovers()
    assert left == [], "processes of the cancelled job are still running:\n" + "\n".join(left)
