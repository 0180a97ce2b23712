"""Prompt datasets (``RLHFDataset``), resumable sampling, synthetic tasks and preprocessing helpers."""

from rlflow.data.rl_dataset import (
    RLHFDataset,
    collate_fn,
    create_rl_dataloader,
)
from rlflow.data.sampler import StatefulDataLoader, StatefulSampler
from rlflow.data.tasks import ensure_task_files

__all__ = [
    "RLHFDataset",
    "StatefulDataLoader",
    "StatefulSampler",
    "collate_fn",
    "create_rl_dataloader",
    "ensure_task_files",
]
