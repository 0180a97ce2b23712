"""``python -m rlflow.trainer.main_sft [overrides]``: supervised fine-tuning (verl's fsdp_sft_trainer keys).

With no overrides it fine-tunes the random-init embedded tiny model on the embedded ``repeat`` task (one
epoch, CPU, about a minute). Launching:

* one process per rank is started here (``trainer.nnodes=1``, ``trainer.n_gpus_per_node`` ranks; one rank
  runs in this process);
* under ``torchrun`` / ``srun`` (``WORLD_SIZE`` set) every launched process runs one rank, and the world
  size must equal ``trainer.nnodes × trainer.n_gpus_per_node``::

      torchrun --nproc_per_node=8 -m rlflow.trainer.main_sft data.train_files=... model.partial_pretrain=...

The final checkpoint's ``huggingface/`` directory is a model ``main_ppo`` takes as
``actor_rollout_ref.model.path``. Library use::

    from rlflow.config import load_sft_config
    from rlflow.trainer.main_sft import run_sft

    result = run_sft(load_sft_config(["trainer.total_training_steps=20"]))   # {"final", "hf_dir", ...}
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import hydra
import torch.distributed as dist
from omegaconf import DictConfig

from rlflow.config.loading import SFT_CONFIG_NAME, config_dir, to_typed_sft
from rlflow.config.sft_schema import SFTConfig
from rlflow.config.sft_validate import validate_sft_config
from rlflow.config.suggest import check_override_keys, drop_append_on_known_keys

__all__ = ["main", "run_sft"]

logger = logging.getLogger(__name__)


def _run_rank(rank: int, config: SFTConfig) -> dict[str, Any]:
    from rlflow.trainer.sft_trainer import FSDPSFTTrainer

    return FSDPSFTTrainer(config).fit()


def run_sft(cfg: DictConfig | SFTConfig) -> dict[str, Any]:
    """Validate, then train on every rank (see the module docstring for how ranks are started).

    Returns:
        Rank 0's result: ``final`` (the last step's metrics), ``global_step`` and ``hf_dir`` (the final
        HF model directory).
    """
    if isinstance(cfg, DictConfig):
        validate_sft_config(cfg)
        config = to_typed_sft(cfg)
    else:
        validate_sft_config(cfg)
        config = cfg
    world = int(config.trainer.nnodes) * int(config.trainer.n_gpus_per_node)
    launched = os.environ.get("WORLD_SIZE")
    if launched is not None and int(launched) > 1:
        if int(launched) != world:
            raise ValueError(
                f"the launcher started WORLD_SIZE={launched} processes but trainer.nnodes × "
                f"trainer.n_gpus_per_node = {world}; make them agree"
            )
        return _run_rank(int(os.environ.get("RANK", "0")), config)
    if config.trainer.nnodes > 1:
        raise ValueError(
            f"trainer.nnodes={config.trainer.nnodes}: start one process per rank with torchrun or srun "
            "(WORLD_SIZE is not set)"
        )
    if config.trainer.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the ranks pick their device from CUDA visibility
    if world == 1:
        owned = not dist.is_initialized()
        try:
            return _run_rank(0, config)
        finally:
            if owned and dist.is_initialized():
                dist.destroy_process_group()
    from rlflow.parallel.distributed import spawn_workers

    return spawn_workers(_run_rank, world, args=(config,), signal_retries=0)[0]


@hydra.main(config_path=str(config_dir()), config_name=SFT_CONFIG_NAME, version_base=None)
def _hydra_main(cfg: DictConfig) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    result = run_sft(cfg)
    if result.get("hf_dir"):
        logger.info("final model: %s (actor_rollout_ref.model.path for main_ppo)", result["hf_dir"])


def main() -> None:
    """Command-line entry point (unknown keys are refused with the closest ones before Hydra runs)."""
    from rlflow.trainer.cli import hydra_options_first

    sys.argv = [sys.argv[0], *drop_append_on_known_keys(hydra_options_first(sys.argv[1:]), SFTConfig)]
    try:
        check_override_keys(sys.argv[1:], SFTConfig, doc="config/sft_trainer.yaml")
    except ValueError as err:
        raise SystemExit(f"rlflow.trainer.main_sft: {err}") from None
    _hydra_main()


if __name__ == "__main__":
    main()
