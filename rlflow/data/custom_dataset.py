"""``data.custom_cls``: the user's dataset class in place of `RLHFDataset` (verl's key).

``data.custom_cls.path`` names a Python file and ``data.custom_cls.name`` a ``torch.utils.data.Dataset``
subclass in it; the trainer builds the training and the validation set with it instead of
`rlflow.data.rl_dataset.RLHFDataset`, as verl does. The class is called with keyword arguments
``data_files`` (a list of paths), ``tokenizer`` and ``config`` (the typed ``data`` section,
`rlflow.config.schema.DataConfig`, read by attribute), plus ``processor=None`` when its constructor takes
one (verl's signature; rlflow trains text-only models). The usual way to write one is to subclass
`RLHFDataset` and change what it reads or returns; its items must keep `RLHFDataset`'s layout (the
left-padded ``input_ids`` / ``attention_mask`` / ``position_ids`` of ``data.max_prompt_length`` tokens and
``raw_prompt_ids``; any other key stays with its sample in the batch's non-tensor data, as the row
columns of `RLHFDataset` do). The class is imported and the first item of the built dataset checked
before Ray starts, so a wrong file, name or item layout fails at once with the key in the message.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import Dataset

from rlflow.data.rl_dataset import RLHFDataset
from rlflow.utils.import_utils import import_file

if TYPE_CHECKING:
    from rlflow.config.schema import DataConfig

__all__ = ["CUSTOM_CLS_KEY", "build_rl_dataset", "load_dataset_class"]

CUSTOM_CLS_KEY = "data.custom_cls"
_PADDED_KEYS = ("input_ids", "attention_mask", "position_ids")


def load_dataset_class(path: str | None, name: str | None) -> type[Dataset]:
    """The dataset class named by ``data.custom_cls`` (`RLHFDataset` when ``path`` is null).

    Raises:
        ValueError: naming ``data.custom_cls.path`` / ``.name``: one set without the other, no such file or
            attribute, or not a ``Dataset`` subclass.
    """
    if not path:
        if name:
            raise ValueError(
                f"{CUSTOM_CLS_KEY}.name={name!r} needs {CUSTOM_CLS_KEY}.path (the file defining it)"
            )
        return RLHFDataset
    if not name:
        raise ValueError(f"{CUSTOM_CLS_KEY}.name must be set when {CUSTOM_CLS_KEY}.path={path!r} is")
    module = import_file(path, f"{CUSTOM_CLS_KEY}.path")
    cls = getattr(module, name, None)
    if cls is None:
        raise ValueError(f"{CUSTOM_CLS_KEY}.name={name!r} is not defined in {path!r}")
    if not (isinstance(cls, type) and issubclass(cls, Dataset)):
        raise ValueError(
            f"{CUSTOM_CLS_KEY}.name={name!r} in {path!r} is a {type(cls).__name__}, not a torch.utils.data.Dataset "
            "subclass (subclass rlflow.data.rl_dataset.RLHFDataset)"
        )
    return cls


def build_rl_dataset(
    cls: type[Dataset],
    data_files: Sequence[str | os.PathLike],
    tokenizer: Any,
    config: DataConfig,
    max_samples: tuple[str, int] = ("data.train_max_samples", -1),
) -> Dataset:
    """``cls(data_files=..., tokenizer=..., config=...)`` (and ``processor=None`` when it takes one, and
    ``max_samples`` when it is set); a class other than `RLHFDataset` gets its first item checked against
    `RLHFDataset`'s layout.

    Args:
        max_samples: ``(key, value)`` of ``data.train_max_samples`` / ``val_max_samples``: > 0 passes
            ``max_samples=value`` (verl's argument).

    Raises:
        ValueError: naming ``data.custom_cls`` and the class: an empty dataset, an item without the
            left-padded prompt tensors, or a set ``max_samples`` the class does not take.
    """
    kwargs: dict[str, Any] = {
        "data_files": [str(f) for f in data_files],
        "tokenizer": tokenizer,
        "config": config,
    }
    parameters = inspect.signature(cls).parameters
    if "processor" in parameters:
        kwargs["processor"] = None
    key, limit = max_samples
    if int(limit) > 0:
        if "max_samples" not in parameters:
            raise ValueError(
                f"{key}={limit}: {CUSTOM_CLS_KEY} ({cls.__name__}) takes no max_samples argument; add one "
                "(verl's dataset signature) or subsample the files"
            )
        kwargs["max_samples"] = int(limit)
    dataset = cls(**kwargs)
    if cls is not RLHFDataset:
        _check_first_item(dataset, f"{CUSTOM_CLS_KEY} ({cls.__name__})", int(config.max_prompt_length))
    return dataset


def _check_first_item(dataset: Dataset, where: str, length: int) -> None:
    if len(dataset) == 0:  # type: ignore[arg-type]
        raise ValueError(f"{where}: the dataset built from the files has no items")
    item = dataset[0]
    if not isinstance(item, Mapping):
        raise ValueError(f"{where}: item 0 is a {type(item).__name__}, not a dict like RLHFDataset's items")
    for key in _PADDED_KEYS:
        value = item.get(key)
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != (length,):
            got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise ValueError(
                f"{where}: item 0 has {key}={got}, but every item needs the left-padded prompt's {key} as a "
                f"tensor of data.max_prompt_length={length} tokens (RLHFDataset's layout)"
            )
    if "raw_prompt_ids" not in item:
        raise ValueError(
            f"{where}: item 0 has no raw_prompt_ids (the unpadded prompt tokens), as RLHFDataset's"
        )
