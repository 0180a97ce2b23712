"""Prompt datasets (``RLHFDataset``), resumable sampling, synthetic tasks and preprocessing helpers."""

from rlflow.data.rl_dataset import (
    RLHFDataset,
    RLHFDatasetConfig,
    collate_fn,
    create_rl_dataloader,
    create_rl_sampler,
)
from rlflow.data.sampler import StatefulDataLoader, StatefulSampler
from rlflow.data.tasks import ensure_task_files

__all__ = [
    "RLHFDataset",
    "RLHFDatasetConfig",
    "StatefulDataLoader",
    "StatefulSampler",
    "collate_fn",
    "create_rl_dataloader",
    "create_rl_sampler",
    "ensure_task_files",
]
