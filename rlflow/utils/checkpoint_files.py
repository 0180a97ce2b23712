"""Files of a checkpoint root every trainer writes: the pointer file, and the copy of each checkpoint.

``latest_checkpointed_iteration.txt`` names the last complete ``global_step_N``; it is written last and
atomically (:func:`write_latest_pointer`).

``trainer.default_hdfs_dir`` (verl's key) asks for a second copy of every saved checkpoint. After a
checkpoint is complete under ``trainer.default_local_dir`` (its pointer file written), the driver copies ``global_step_N/`` to ``<default_hdfs_dir>/global_step_N/`` and then points
``<default_hdfs_dir>/latest_checkpointed_iteration.txt`` at it, so the copy is itself a checkpoint
root a run can resume from (``trainer.default_local_dir=<the copy>``). The destination is

* a local or mounted directory (``/mnt/shared/ckpt``, ``file:///mnt/shared/ckpt``): ``shutil.copytree``;
* ``hdfs://...``: ``hdfs dfs -mkdir -p`` and ``hdfs dfs -put -f`` (the Hadoop client must be on
  ``PATH``: checked before anything starts).

The copy reads the checkpoint from the driver's file system, so ``default_local_dir`` must be visible
there (one node, or a shared file system, as for resuming). The copy keeps every step: the local
``max_*_ckpt_to_keep`` pruning does not delete from it. A failed copy raises (the local checkpoint is
already complete by then).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = ["LATEST_FILE", "CheckpointMirror", "check_mirror_destination", "write_latest_pointer"]

logger = logging.getLogger(__name__)

LATEST_FILE = "latest_checkpointed_iteration.txt"


def write_latest_pointer(root: str | os.PathLike, step: int) -> None:
    """Point ``root/latest_checkpointed_iteration.txt`` at ``step``, atomically (temporary file, then
    ``os.replace``): call it after the step's files are complete."""
    tmp = Path(root) / (LATEST_FILE + ".tmp")
    tmp.write_text(str(step))
    os.replace(tmp, Path(root) / LATEST_FILE)


def _is_hdfs(destination: str) -> bool:
    return destination.startswith("hdfs://")


def _local_path(destination: str) -> Path:
    return Path(destination.removeprefix("file://"))


def check_mirror_destination(
    destination: str | None, local_dir: str, key: str = "trainer.default_hdfs_dir"
) -> None:
    """Refuse a destination the copy cannot reach, before anything starts.

    Args:
        destination: ``trainer.default_hdfs_dir``.
        local_dir: ``trainer.default_local_dir`` (the copy must go elsewhere).

    Raises:
        ValueError: an empty value, a URL scheme other than ``hdfs://`` / ``file://``, ``hdfs://``
            without an ``hdfs`` command on ``PATH``, or the local checkpoint directory itself.
    """
    if destination is None:
        return
    value = str(destination)
    if not value.strip():
        raise ValueError(f"{key}='': give a directory (or hdfs://...) to copy checkpoints to, or null")
    if _is_hdfs(value):
        if shutil.which("hdfs") is None:
            raise ValueError(
                f"{key}={value!r}: the copy to HDFS runs `hdfs dfs -put`, and there is no hdfs command on "
                "PATH; install the Hadoop client on the driver's node, or give a mounted directory"
            )
        return
    if "://" in value and not value.startswith("file://"):
        raise ValueError(
            f"{key}={value!r}: copies go to a local or mounted directory or to hdfs://...; "
            f"mount {value.split('://')[0]} storage as a directory, or copy from trainer.default_local_dir"
        )
    if _local_path(value).resolve() == Path(local_dir).resolve():
        raise ValueError(
            f"{key}={value!r} is trainer.default_local_dir itself: give another directory to copy to, or null"
        )


class CheckpointMirror:
    """Copies each complete ``global_step_N`` directory to ``destination``, then its pointer file.

    Args:
        destination: ``trainer.default_hdfs_dir`` (checked by :func:`check_mirror_destination`).
    """

    def __init__(self, destination: str) -> None:
        self.destination = str(destination).rstrip("/")

    def copy(self, step_dir: Path, step: int) -> str:
        """Copy ``step_dir`` (a complete ``global_step_<step>``) and point the copy's pointer at it.

        Returns:
            where the step's copy is.

        Raises:
            RuntimeError: an ``hdfs dfs`` command failed (with its output).
        """
        step_dir = Path(step_dir)
        if _is_hdfs(self.destination):
            self._hdfs("-mkdir", "-p", self.destination)
            self._hdfs("-put", "-f", str(step_dir), self.destination)
            with tempfile.TemporaryDirectory() as tmp:
                pointer = Path(tmp) / LATEST_FILE
                pointer.write_text(str(step))
                self._hdfs("-put", "-f", str(pointer), f"{self.destination}/{LATEST_FILE}")
            target = f"{self.destination}/{step_dir.name}"
        else:
            root = _local_path(self.destination)
            root.mkdir(parents=True, exist_ok=True)
            target = str(root / step_dir.name)
            shutil.copytree(step_dir, target, dirs_exist_ok=True)
            write_latest_pointer(root, step)
        logger.info("copied checkpoint %s to %s", step_dir, target)
        return target

    @staticmethod
    def _hdfs(*args: str) -> None:
        cmd = ["hdfs", "dfs", *args]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(
                f"trainer.default_hdfs_dir: `{' '.join(cmd)}` failed (exit {proc.returncode}): "
                f"{(proc.stderr or proc.stdout).strip()[-2000:]}"
            )
