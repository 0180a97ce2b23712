"""A throwaway Slurm cluster on this machine for tests: install the distribution's packages, write a
minimal ``slurm.conf`` and run ``munged``, ``slurmctld`` and ``slurmd`` (as root) from a private directory.

The first node is this host under its own short name. With ``nodes=2`` a second, virtual node
``<host>-2`` runs from a second ``slurmd -N <host>-2`` on another port (Debian's Slurm is built with
multiple-slurmd support), so that multi-node submissions (``sbatch --nodes=2``) can run on one machine.

Everything lives under one base directory (``/tmp/rlflow-slurm`` unless ``RLFLOW_SLURM_TEST_DIR`` is set): the
config, a private munge key and socket, the controller state, the spool and the daemons' logs.  Clients
find the cluster through ``SLURM_CONF`` (see :attr:`SlurmCluster.env`); nothing under ``/etc`` is changed
and the daemons use non-default ports, so a system Slurm on the same machine is left alone.

Typical use::

    reason = install_slurm(log_path)        # None when the binaries are there (installs them if needed)
    cluster = SlurmCluster.start_or_reuse()  # reuses a cluster a previous run left running
    cluster.wait_idle()
    subprocess.run(["sbatch", "--wait", ...], env={**os.environ, **cluster.env})
    cluster.stop()                           # only if not cluster.reused
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "sinfo", "squeue", "scancel")
DEFAULT_BASE = "/tmp/rlflow-slurm"
CTLD_PORT = 16817  # not the default 6817/6818, so a system Slurm on the machine is not disturbed
SLURMD_PORT = 16818


def missing_binaries() -> list[str]:
    """Slurm and munge programs not found on ``PATH`` (``/usr/sbin`` included)."""
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    return [b for b in BINARIES if shutil.which(b, path=path) is None]


def _tail(path: Path, n: int = 15) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-n:])


def install_slurm(log_path: Path, timeout_s: float = 600.0) -> str | None:
    """Install ``slurmctld slurmd slurm-client munge`` with apt when any binary is missing.

    Args:
        log_path: file that receives apt's output.
        timeout_s: limit for each apt command.

    Returns:
        None when Slurm is usable, else the reason it could not be installed (with the log's tail).
    """
    if not missing_binaries():
        return None
    if os.geteuid() != 0:
        return f"Slurm is not installed ({', '.join(missing_binaries())} missing) and this is not root"
    if shutil.which("apt-get") is None:
        return f"Slurm is not installed ({', '.join(missing_binaries())} missing) and there is no apt-get"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a") as log:
        for cmd in (install, ["apt-get", "update", "-q"], install):
            log.write(f"$ {' '.join(cmd)}\n")
            log.flush()
            try:
                rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=timeout_s)
            except subprocess.TimeoutExpired:
                return f"`{' '.join(cmd)}` timed out after {timeout_s:.0f} s; {log_path}:\n{_tail(log_path)}"
            if cmd is install and rc.returncode == 0:
                break
    if missing_binaries():
        return (
            f"installing {' '.join(PACKAGES)} failed ({', '.join(missing_binaries())} still missing); "
            f"{log_path}:\n{_tail(log_path)}"
        )
    return None


def node_definition() -> str:
    """``NodeName=... CPUs=... RealMemory=...`` for this machine, from ``slurmd -C`` (memory lowered by 5%
    so that the node is never drained for having less memory than configured)."""
    out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True).stdout
    line = next((ln for ln in out.splitlines() if ln.startswith("NodeName=")), None)
    if line is None:
        raise RuntimeError(f"`slurmd -C` printed no NodeName line:\n{out}")
    fields = dict(item.split("=", 1) for item in line.split())
    fields["RealMemory"] = str(max(1, int(int(fields["RealMemory"]) * 0.95)))
    return " ".join(f"{k}={v}" for k, v in fields.items())


def node_names(host: str, nodes: int) -> list[str]:
    """Slurm node names: this host's short name, then ``<host>-2``, ``<host>-3``... (virtual nodes)."""
    return [host] + [f"{host}-{i}" for i in range(2, nodes + 1)]


def render_slurm_conf(base: Path, host: str, node: str, nodes: int = 1) -> str:
    """A minimal ``slurm.conf``: root daemons, no cgroups, no accounting, one partition ``debug``.

    Args:
        base: directory for state, spool, pid and log files and the munge socket.
        host: short host name of the controller and of every node.
        node: this machine's ``NodeName=...`` definition (:func:`node_definition`); every node gets its
            CPUs and memory.
        nodes: number of nodes; the ones after the first are virtual (same host, their own slurmd port).
    """
    hardware = " ".join(node.split()[1:])
    names = node_names(host, nodes)
    node_lines = [f"NodeName={names[0]} {hardware} State=UNKNOWN"]
    node_lines += [
        f"NodeName={name} NodeHostname={host} Port={SLURMD_PORT + i} {hardware} State=UNKNOWN"
        for i, name in enumerate(names[1:], start=1)
    ]
    node_block = "\n".join(node_lines)
    return f"""\
# Generated by tests/cluster/slurm_setup.py: a throwaway cluster on one machine.
ClusterName=rlflowtest
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
SlurmctldPort={CTLD_PORT}
SlurmdPort={SLURMD_PORT}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={base}/munge/munge.socket
StateSaveLocation={base}/state
SlurmdSpoolDir={base}/spool/%n
SlurmctldPidFile={base}/slurmctld.pid
SlurmdPidFile={base}/slurmd-%n.pid
SlurmctldLogFile={base}/slurmctld.log
SlurmdLogFile={base}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MailProg=/bin/true
KillWait=30
SlurmdTimeout=60
InactiveLimit=0
{node_block}
PartitionName=debug Nodes={",".join(names)} Default=YES MaxTime=INFINITE State=UP
"""


def _alive(pid: int, name: str) -> bool:
    """Whether ``pid`` runs and is the daemon ``name`` (``munged``, ``slurmctld``, ``slurmd:<node>``); a
    recycled pid or a zombie does not count."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                return False
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv0 = f.read().split(b"\0", 1)[0].decode(errors="replace")
    except OSError:
        return False
    return os.path.basename(argv0).startswith(name.split(":", 1)[0])


@dataclass
class SlurmCluster:
    """Handle on the private cluster under ``base``: its daemons' pids and the client environment.

    Daemon names: ``munged``, ``slurmctld`` and ``slurmd:<node>``.
    """

    base: Path
    pids: dict[str, int] = field(default_factory=dict)
    reused: bool = False
    procs: dict[str, subprocess.Popen] = field(default_factory=dict, repr=False)

    def running(self, name: str) -> bool:
        """Whether daemon ``name`` runs: our child's ``poll()``, else its recorded pid checked in /proc."""
        if name in self.procs:
            return self.procs[name].poll() is None
        return name in self.pids and _alive(self.pids[name], name)

    @property
    def conf(self) -> Path:
        return self.base / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """Environment entries that point Slurm clients (sbatch, sinfo, srun...) at this cluster."""
        path = os.environ.get("PATH", "")
        extra = ":".join(d for d in ("/usr/sbin", "/sbin") if d not in path.split(":"))
        return {"SLURM_CONF": str(self.conf), "PATH": f"{path}:{extra}" if extra else path}

    def run(self, *cmd: str, timeout: float = 30.0) -> subprocess.CompletedProcess:
        """Run a Slurm client command against this cluster (output captured, never raises on failure)."""
        return subprocess.run(
            cmd, capture_output=True, text=True, env={**os.environ, **self.env}, timeout=timeout
        )

    def node_states(self) -> dict[str, str]:
        """``{node: state}`` as ``sinfo`` reports it (``idle``, ``allocated``, ``down*``...); ``{}`` when
        the controller does not answer."""
        try:
            res = self.run("sinfo", "--noheader", "--Node", "--format=%N %T", timeout=15)
        except subprocess.TimeoutExpired:
            return {}
        if res.returncode != 0:
            return {}
        return dict(line.split()[:2] for line in res.stdout.splitlines() if len(line.split()) >= 2)

    def idle_nodes(self) -> list[str]:
        return [n for n, state in self.node_states().items() if state in ("idle", "mixed")]

    def wait_idle(self, nodes: int = 1, timeout_s: float = 60.0) -> None:
        """Wait until at least ``nodes`` nodes are idle; raise ``RuntimeError`` with the daemons' log
        tails otherwise (at once when a daemon has died)."""
        deadline = time.monotonic() + timeout_s
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            states = self.node_states()
            if sum(s in ("idle", "mixed") for s in states.values()) >= nodes:
                return
            if any(not self.running(name) for name in self.pids):
                break
            time.sleep(1.0)
        logs = "\n".join(f"--- {p.name}:\n{_tail(p)}" for p in sorted(self.base.glob("*.log")))
        raise RuntimeError(f"fewer than {nodes} idle Slurm node(s) after {timeout_s:.0f} s: {states}\n{logs}")

    def _state_file(self) -> Path:
        return self.base / "daemons.json"

    @classmethod
    def start_or_reuse(cls, base: str | Path | None = None, nodes: int = 1) -> SlurmCluster:
        """Reuse the cluster a previous run left under ``base`` if all its daemons live and it has
        ``nodes`` nodes; otherwise wipe ``base``, write the config and start munged, slurmctld and one
        slurmd per node."""
        base = Path(base or os.environ.get("RLFLOW_SLURM_TEST_DIR") or DEFAULT_BASE)
        cluster = cls(base)
        state = cluster._state_file()
        if state.exists():
            cluster.pids = {k: int(v) for k, v in json.loads(state.read_text()).items()}
            if all(cluster.running(n) for n in cluster.pids) and len(cluster.node_states()) == nodes:
                cluster.reused = True
                return cluster
            cluster.stop()
        cluster._start_fresh(nodes)
        return cluster

    def _start_fresh(self, nodes: int) -> None:
        if self.base.exists():
            shutil.rmtree(self.base)
        for sub in ("munge", "state", "spool"):
            (self.base / sub).mkdir(parents=True)
        # munged insists that its key is private and that every directory above its socket is searchable
        self.base.chmod(0o755)
        (self.base / "munge").chmod(0o755)
        key = self.base / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        host = socket.gethostname().split(".")[0]
        self.conf.write_text(render_slurm_conf(self.base, host, node_definition(), nodes))
        try:
            self._spawn_daemons(node_names(host, nodes))
        except BaseException:
            self.stop()
            raise
        self._state_file().write_text(json.dumps(self.pids))

    def _spawn_daemons(self, names: list[str]) -> None:
        b = str(self.base)
        self._spawn(
            "munged",
            ["munged", "-F", f"--socket={b}/munge/munge.socket", f"--key-file={b}/munge.key",
             f"--log-file={b}/munged.log", f"--pid-file={b}/munged.pid", f"--seed-file={b}/munged.seed"],
        )  # fmt: skip
        self._wait_for(self.base / "munge" / "munge.socket", "munged")
        self._spawn("slurmctld", ["slurmctld", "-D", "-c", "-f", str(self.conf)])
        for name in names:
            self._spawn(f"slurmd:{name}", ["slurmd", "-D", "-N", name, "-f", str(self.conf)])

    def _spawn(self, name: str, cmd: list[str]) -> None:
        with open(self.base / f"{name.replace(':', '-')}.out", "ab") as out:
            proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, **self.env},
            )
        self.procs[name] = proc
        self.pids[name] = proc.pid

    def _wait_for(self, path: Path, name: str, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not path.exists():
            if time.monotonic() > deadline or not self.running(name):
                raise RuntimeError(f"{name} did not create {path}:\n{_tail(self.base / f'{name}.out')}")
            time.sleep(0.2)

    def stop(self, timeout_s: float = 20.0) -> None:
        """Stop the daemons this handle knows, slurmd first and munged last (SIGTERM, then SIGKILL after
        ``timeout_s``), by their recorded pids."""
        order = sorted(self.pids, key=lambda n: ("slurmd", "slurmctld", "munged").index(n.split(":")[0]))
        for name in order:
            if not self.running(name):
                continue
            os.kill(self.pids[name], signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            while self.running(name) and time.monotonic() < deadline:
                time.sleep(0.2)
            if self.running(name):
                os.kill(self.pids[name], signal.SIGKILL)
            if name in self.procs:
                self.procs[name].wait(timeout=10)
        self._state_file().unlink(missing_ok=True)
        self.pids, self.procs = {}, {}
