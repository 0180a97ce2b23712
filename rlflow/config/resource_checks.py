"""Does the placement group fit the local Ray? (part of `rlflow.config.validate.validate_config`)."""

from __future__ import annotations

import os
import sys

from omegaconf import DictConfig

from rlflow.config.checks import value_at

__all__ = ["check_local_resources", "cpus_per_rank", "ray_address", "ray_cpus"]


def ray_address(address: str | None) -> str | None:
    """The Ray cluster a run joins: ``ray_init.address`` (``address``), else ``RAY_ADDRESS``, as
    `rlflow.single_controller.init_ray` reads them; None = a local Ray started on this machine."""
    return address or os.environ.get("RAY_ADDRESS") or None


def ray_cpus(num_cpus: int | None) -> float:
    """CPUs of the Ray cluster the run uses: the running one's, else ``ray_init.num_cpus`` (``num_cpus``),
    else this machine's."""
    ray = sys.modules.get("ray")  # not imported → not running (and validation does not import it)
    if ray is not None and ray.is_initialized():
        return float(ray.cluster_resources().get("CPU", 0.0))
    return float(num_cpus or os.cpu_count() or 1)


def cpus_per_rank(cpus_per_worker: float | None, ranks: int, num_cpus: int | None) -> float:
    """The CPUs of one rank's bundle: ``trainer.cpus_per_worker``, or with null the cluster's CPUs
    (`ray_cpus`) shared evenly by all ``ranks`` (``nnodes × n_gpus_per_node``), at least 1."""
    if cpus_per_worker is not None:
        return float(cpus_per_worker)
    return max(1.0, ray_cpus(num_cpus) / ranks)


def check_local_resources(cfg: DictConfig) -> None:
    """A local Ray must hold the placement group: ``nnodes × n_gpus_per_node`` CUDA devices with
    ``trainer.device=cuda``; ``× cpus_per_worker`` CPUs on CPU. Checked here, before Ray starts, rather than
    as a placement timeout later."""
    if ray_address(value_at(cfg, "ray_init.address")) is not None:
        return  # a remote cluster: its resources are checked when the placement group is created
    import torch

    device = value_at(cfg, "trainer.device")
    ranks = int(value_at(cfg, "trainer.nnodes")) * int(value_at(cfg, "trainer.n_gpus_per_node"))
    if device == "cuda":
        have = torch.cuda.device_count()
        if have < ranks:
            raise ValueError(
                f"trainer.device=cuda with trainer.nnodes × trainer.n_gpus_per_node = {ranks} ranks, but this "
                f"machine has {have} CUDA device(s) and ray_init.address is null (local Ray)"
            )
        return
    if device == "auto" and torch.cuda.is_available():
        return  # the GPU count is checked by Ray's placement group on a GPU machine
    num_cpus = value_at(cfg, "ray_init.num_cpus")
    have = ray_cpus(num_cpus)
    per_worker = cpus_per_rank(value_at(cfg, "trainer.cpus_per_worker"), ranks, num_cpus)
    need = ranks * per_worker
    if need > have:
        raise ValueError(
            f"trainer.nnodes × trainer.n_gpus_per_node × trainer.cpus_per_worker = {ranks} × {per_worker:g} = "
            f"{need:g} CPUs for the placement group, but the local Ray has {have:g} (ray_init.num_cpus, else "
            "this machine's CPUs): lower trainer.n_gpus_per_node (ppo_trainer.yaml has verl's 8) or "
            "trainer.cpus_per_worker, or join a cluster with ray_init.address. The embedded CPU demo: "
            "python -m rlflow.trainer.main_ppo --config-name demo"
        )
