"""``DataProto``: the batch that travels between the driver and the workers.

A ``DataProto`` holds three things about one batch of samples:

* ``batch``: a :class:`tensordict.TensorDict` whose first (and only) batch dimension is the sample axis;
* ``non_tensor_batch``: a dict of 1-D numpy object arrays, one entry per sample (strings, dicts, ids);
* ``meta_info``: a dict of batch-level values (temperature, metrics, flags).

Names and semantics follow verl's ``DataProto`` so that code written against it ports with few changes.

What a non-blocking worker-group call returns instead, the object refs of a ``DataProto`` still in
Ray's object store, is `rlflow.single_controller.futures.DataProtoFuture`.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

__all__ = [
    "DataProto",
    "DataProtoItem",
    "pad_dataproto_to_divisor",
    "union_numpy_dict",
    "union_tensor_dict",
    "unpad_dataproto",
]

_ALIGN = 64  # byte alignment of each tensor inside the packed pickling buffer


# ----------------------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------------------


def _as_object_array(values: Any, key: str) -> np.ndarray:
    """Turn a list / array into a 1-D numpy object array without numpy splitting nested lists."""
    if isinstance(values, np.ndarray) and values.dtype == object and values.ndim == 1:
        return values
    if isinstance(values, np.ndarray) and values.ndim == 1:
        return values.astype(object)
    if isinstance(values, np.ndarray):
        raise ValueError(f"non_tensor_batch[{key!r}] must be 1-D, got shape {values.shape}")
    if not isinstance(values, list | tuple):
        raise TypeError(
            f"non_tensor_batch[{key!r}] must be a list or numpy array, got {type(values).__name__}"
        )
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


def union_tensor_dict(a: TensorDict, b: TensorDict) -> TensorDict:
    """Merge ``b`` into ``a``; a key present in both must hold equal tensors."""
    if a.batch_size != b.batch_size:
        raise ValueError(f"union: batch sizes differ: {tuple(a.batch_size)} vs {tuple(b.batch_size)}")
    for key in b.keys():  # iterating a TensorDict itself walks the batch dimension
        if key in a.keys() and not torch.equal(a[key], b[key]):
            raise ValueError(f"union: key {key!r} is in both batches with different values")
        a[key] = b[key]
    return a


def union_numpy_dict(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Merge ``b`` into ``a``; a key present in both must hold equal arrays."""
    for key, val in b.items():
        if key in a and not _object_arrays_equal(a[key], val):
            raise ValueError(f"union: non-tensor key {key!r} is in both batches with different values")
        a[key] = val
    return a


def _object_arrays_equal(x: np.ndarray, y: np.ndarray) -> bool:
    if x.shape != y.shape:
        return False
    try:
        return bool(np.all(x == y))
    except Exception:  # elements whose == is not elementwise (e.g. arrays inside)
        return all(_py_equal(u, v) for u, v in zip(x.tolist(), y.tolist()))


def _py_equal(u: Any, v: Any) -> bool:
    if isinstance(u, np.ndarray) or isinstance(v, np.ndarray):
        return bool(np.array_equal(np.asarray(u), np.asarray(v)))
    return bool(u == v)


def _merge_meta(metas: Sequence[dict]) -> dict:
    """Meta info of a concatenation: the first part's, with every part's ``metrics`` merged into lists."""
    merged = dict(metas[0]) if metas else {}
    if not any("metrics" in m for m in metas):
        return merged
    metrics: dict[str, list] = {}
    for m in metas:
        for name, value in m.get("metrics", {}).items():
            bucket = metrics.setdefault(name, [])
            bucket.extend(value) if isinstance(value, list) else bucket.append(value)
    merged["metrics"] = metrics
    return merged


def _to_python(obj: Any, where: str) -> Any:
    """Convert numpy scalars / arrays nested in ``obj`` into plain Python for the safe on-disk format."""
    if obj is None or isinstance(obj, bool | int | float | str | torch.Tensor):
        return obj
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        if obj.dtype == object:
            return [_to_python(v, where) for v in obj.tolist()]
        return torch.from_numpy(np.ascontiguousarray(obj))
    if isinstance(obj, list | tuple):
        return [_to_python(v, where) for v in obj]
    if isinstance(obj, dict):
        return {str(k): _to_python(v, where) for k, v in obj.items()}
    raise TypeError(f"save_to_disk: {where} holds a {type(obj).__name__}, which the safe format cannot store")


# ----------------------------------------------------------------------------------------------------------
# DataProto
# ----------------------------------------------------------------------------------------------------------


@dataclass
class DataProtoItem:
    """One sample of a :class:`DataProto` (what ``data[i]`` returns for an integer ``i``)."""

    batch: TensorDict | None = None
    non_tensor_batch: dict = field(default_factory=dict)
    meta_info: dict = field(default_factory=dict)


@dataclass
class DataProto:
    """A batch of samples: tensors, per-sample Python objects and batch-level meta information."""

    batch: TensorDict | None = None
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.non_tensor_batch = {k: _as_object_array(v, k) for k, v in self.non_tensor_batch.items()}
        self.check_consistency()

    # ---- construction ----------------------------------------------------------------------------------

    @classmethod
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor] | None = None,
        non_tensors: dict[str, Any] | None = None,
        meta_info: dict[str, Any] | None = None,
    ) -> DataProto:
        """Build from a dict of tensors (same first dimension), non-tensor lists/arrays and meta info."""
        tensors = tensors or {}
        non_tensors = non_tensors or {}
        batch = None
        if tensors:
            sizes = {k: (v.shape[0] if v.dim() > 0 else None) for k, v in tensors.items()}
            first_key, n = next(iter(sizes.items()))
            for key, size in sizes.items():
                if size is None:
                    raise ValueError(f"tensor {key!r} is 0-dimensional; every tensor needs a batch dimension")
                if size != n:
                    raise ValueError(
                        f"tensor {key!r} has batch size {size} but {first_key!r} has {n}; "
                        "all tensors must share their first dimension"
                    )
            batch = TensorDict(dict(tensors), batch_size=[n])
        return cls(batch=batch, non_tensor_batch=dict(non_tensors), meta_info=dict(meta_info or {}))

    @classmethod
    def from_single_dict(cls, data: dict[str, Any], meta_info: dict[str, Any] | None = None) -> DataProto:
        """Build from one dict, sorting tensors from non-tensors (numpy arrays / lists)."""
        tensors = {k: v for k, v in data.items() if isinstance(v, torch.Tensor)}
        non_tensors = {k: v for k, v in data.items() if not isinstance(v, torch.Tensor)}
        return cls.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta_info)

    def check_consistency(self) -> None:
        """Raise ``ValueError`` unless the batch is 1-D and every non-tensor has the same length."""
        n = None
        if self.batch is not None:
            if len(self.batch.batch_size) != 1:
                raise ValueError(
                    f"batch must have exactly one batch dimension, got {tuple(self.batch.batch_size)}"
                )
            n = self.batch.batch_size[0]
        for key, val in self.non_tensor_batch.items():
            if n is None:
                n = len(val)
            elif len(val) != n:
                raise ValueError(
                    f"non_tensor_batch[{key!r}] has {len(val)} entries but the batch has {n} samples"
                )

    # ---- basic protocol --------------------------------------------------------------------------------

    def __len__(self) -> int:
        if self.batch is not None:
            return int(self.batch.batch_size[0])
        if self.non_tensor_batch:
            return len(next(iter(self.non_tensor_batch.values())))
        return 0

    def __getitem__(self, item: int | slice | Sequence[int] | np.ndarray | torch.Tensor) -> Any:
        """``int`` → :class:`DataProtoItem`; ``slice`` / index list / bool mask → :class:`DataProto`."""
        if isinstance(item, int | np.integer):
            idx = int(item)
            if not -len(self) <= idx < len(self):
                raise IndexError(f"index {idx} out of range for DataProto of length {len(self)}")
            batch = self.batch[idx] if self.batch is not None else None
            non_tensor = {k: v[idx] for k, v in self.non_tensor_batch.items()}
            return DataProtoItem(batch=batch, non_tensor_batch=non_tensor, meta_info=self.meta_info)
        if isinstance(item, slice):
            return self.slice(item.start, item.stop, item.step)
        return self.select_idxs(item)

    def __iter__(self) -> Iterator[DataProtoItem]:
        for i in range(len(self)):
            yield self[i]

    def select_idxs(self, idxs: Sequence[int] | np.ndarray | torch.Tensor) -> DataProto:
        """Samples at ``idxs`` (integers, or a boolean mask of length ``len(self)``), in that order."""
        idx = torch.as_tensor(np.asarray(idxs) if not isinstance(idxs, torch.Tensor) else idxs)
        if idx.dtype == torch.bool:
            if idx.numel() != len(self):
                raise ValueError(f"boolean mask has {idx.numel()} entries for a batch of {len(self)}")
            idx = idx.nonzero().flatten()
        idx = idx.long().flatten()
        idx_np = idx.numpy()
        batch = self.batch[idx] if self.batch is not None else None
        non_tensor = {k: v[idx_np] for k, v in self.non_tensor_batch.items()}
        return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(self.meta_info))

    def slice(self, start: int | None = None, end: int | None = None, step: int | None = None) -> DataProto:
        """Samples ``[start:end:step]`` (views of the tensors, no copy)."""
        sl = slice(start, end, step)
        batch = self.batch[sl] if self.batch is not None else None
        non_tensor = {k: v[sl] for k, v in self.non_tensor_batch.items()}
        return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(self.meta_info))

    def to(self, device: str | torch.device) -> DataProto:
        """Move the tensors to ``device`` (in place) and return ``self``."""
        if self.batch is not None:
            self.batch = self.batch.to(device)
        return self

    # ---- key operations --------------------------------------------------------------------------------

    def select(
        self,
        batch_keys: Sequence[str] | None = None,
        non_tensor_batch_keys: Sequence[str] | None = None,
        meta_info_keys: Sequence[str] | None = None,
        deepcopy: bool = False,
    ) -> DataProto:
        """A new DataProto with only the named keys (``None`` keeps all of that kind)."""
        self._check_keys(batch_keys, non_tensor_batch_keys)
        batch = self.batch
        if batch is not None and batch_keys is not None:
            batch = batch.select(*batch_keys)
        non_tensor = self.non_tensor_batch
        if non_tensor_batch_keys is not None:
            non_tensor = {k: v for k, v in non_tensor.items() if k in non_tensor_batch_keys}
        meta = self.meta_info
        if meta_info_keys is not None:
            meta = {k: v for k, v in meta.items() if k in meta_info_keys}
        if deepcopy:
            non_tensor, meta = copy.deepcopy(non_tensor), copy.deepcopy(meta)
            batch = batch.clone() if batch is not None else None
        return DataProto(batch=batch, non_tensor_batch=dict(non_tensor), meta_info=dict(meta))

    def pop(
        self,
        batch_keys: Sequence[str] | None = None,
        non_tensor_batch_keys: Sequence[str] | None = None,
        meta_info_keys: Sequence[str] | None = None,
    ) -> DataProto:
        """Remove the named keys from ``self`` and return them as a new DataProto."""
        batch_keys, non_tensor_batch_keys = list(batch_keys or []), list(non_tensor_batch_keys or [])
        self._check_keys(batch_keys, non_tensor_batch_keys)
        tensors = {k: self.batch.pop(k) for k in batch_keys} if batch_keys else {}
        non_tensors = {k: self.non_tensor_batch.pop(k) for k in non_tensor_batch_keys}
        meta = {k: self.meta_info.pop(k) for k in list(meta_info_keys or [])}
        out = DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta)
        if out.batch is None and self.batch is not None and not non_tensors:
            out.batch = TensorDict({}, batch_size=self.batch.batch_size)
        return out

    def _check_keys(self, batch_keys: Sequence[str] | None, non_tensor_keys: Sequence[str] | None) -> None:
        have = set(self.batch.keys()) if self.batch is not None else set()
        for key in batch_keys or []:
            if key not in have:
                raise KeyError(f"batch key {key!r} not found; available: {sorted(have)}")
        for key in non_tensor_keys or []:
            if key not in self.non_tensor_batch:
                raise KeyError(
                    f"non-tensor key {key!r} not found; available: {sorted(self.non_tensor_batch)}"
                )

    def rename(self, old_keys: str | Sequence[str], new_keys: str | Sequence[str]) -> DataProto:
        """Rename tensor keys in place (a single name or equal-length lists)."""
        old = [old_keys] if isinstance(old_keys, str) else list(old_keys)
        new = [new_keys] if isinstance(new_keys, str) else list(new_keys)
        if len(old) != len(new):
            raise ValueError(f"rename: {len(old)} old keys but {len(new)} new keys")
        self._check_keys(old, None)
        for o, n in zip(old, new):
            self.batch.rename_key_(o, n)
        return self

    def union(self, other: DataProto) -> DataProto:
        """Merge ``other`` into ``self``: new keys are added, equal shared keys kept, conflicts raise."""
        if self.batch is None:
            self.batch = other.batch
        elif other.batch is not None:
            self.batch = union_tensor_dict(self.batch, other.batch)
        if self.non_tensor_batch and other.non_tensor_batch and len(self) != len(other):
            raise ValueError(f"union: lengths differ ({len(self)} vs {len(other)})")
        self.non_tensor_batch = union_numpy_dict(self.non_tensor_batch, other.non_tensor_batch)
        for key, val in other.meta_info.items():
            if key in self.meta_info and not _py_equal(self.meta_info[key], val):
                raise ValueError(f"union: meta_info key {key!r} differs ({self.meta_info[key]!r} vs {val!r})")
            self.meta_info[key] = val
        self.check_consistency()
        return self

    # ---- splitting and joining -------------------------------------------------------------------------

    def chunk(self, chunks: int) -> list[DataProto]:
        """Split into ``chunks`` equal parts; the length must be divisible (pad first, see below)."""
        if chunks <= 0:
            raise ValueError(f"chunk: chunks must be positive, got {chunks}")
        if len(self) % chunks != 0:
            raise ValueError(
                f"chunk: batch of {len(self)} is not divisible by {chunks}; "
                "use pad_dataproto_to_divisor first or a dispatch mode that pads"
            )
        return self.split(len(self) // chunks)

    def split(self, split_size: int) -> list[DataProto]:
        """Consecutive parts of ``split_size`` samples (the last may be shorter)."""
        if split_size <= 0:
            raise ValueError(f"split: split_size must be positive, got {split_size}")
        return [self.slice(i, i + split_size) for i in range(0, len(self), split_size)]

    @staticmethod
    def concat(data: Sequence[DataProto]) -> DataProto:
        """Join along the sample axis; meta info from the first part, ``metrics`` from all parts merged."""
        if not data:
            raise ValueError("concat: nothing to concatenate")
        batches = [d.batch for d in data]
        batch = None
        if all(b is not None for b in batches):
            batch = torch.cat(batches, dim=0)
        elif any(b is not None for b in batches):
            raise ValueError("concat: some parts have tensors and some do not")
        keys = set(data[0].non_tensor_batch)
        for i, d in enumerate(data[1:], start=1):
            if set(d.non_tensor_batch) != keys:
                raise ValueError(
                    f"concat: part {i} has non-tensor keys {sorted(d.non_tensor_batch)}, part 0 has {sorted(keys)}"
                )
        non_tensor = {k: np.concatenate([d.non_tensor_batch[k] for d in data]) for k in keys}
        return DataProto(
            batch=batch, non_tensor_batch=non_tensor, meta_info=_merge_meta([d.meta_info for d in data])
        )

    def reorder(self, indices: torch.Tensor | np.ndarray | Sequence[int]) -> None:
        """Permute the samples in place: sample ``i`` becomes old sample ``indices[i]``."""
        idx = torch.as_tensor(
            np.asarray(indices) if not isinstance(indices, torch.Tensor) else indices
        ).long()
        if sorted(idx.tolist()) != list(range(len(self))):
            raise ValueError(f"reorder: indices must be a permutation of range({len(self)})")
        reordered = self.select_idxs(idx)
        self.batch, self.non_tensor_batch = reordered.batch, reordered.non_tensor_batch

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> DataProto:
        """Repeat every sample; ``interleave`` gives a,a,b,b (else a,b,a,b)."""
        if repeat_times < 1:
            raise ValueError(f"repeat: repeat_times must be >= 1, got {repeat_times}")
        n = len(self)
        if interleave:
            idx = np.repeat(np.arange(n), repeat_times)
        else:
            idx = np.tile(np.arange(n), repeat_times)
        return self.select_idxs(idx)

    # ---- serialization ---------------------------------------------------------------------------------

    def __getstate__(self) -> dict:
        """Pack every tensor into one byte buffer (one pickled object, zero-copy in Ray's object store)."""
        return {
            "batch": _pack_tensordict(self.batch),
            "non_tensor_batch": self.non_tensor_batch,
            "meta_info": self.meta_info,
        }

    def __setstate__(self, state: dict) -> None:
        self.batch = _unpack_tensordict(state["batch"])
        self.non_tensor_batch = state["non_tensor_batch"]
        self.meta_info = state["meta_info"]

    def save_to_disk(self, filepath: str) -> None:
        """Write to ``filepath`` in a format that loads without executing code (``weights_only``)."""
        tensors = {k: v.detach().cpu() for k, v in self.batch.items()} if self.batch is not None else None
        payload = {
            "format": "rlflow.DataProto/1",
            "tensors": tensors,
            "non_tensors": {
                k: _to_python(v, f"non_tensor_batch[{k!r}]") for k, v in self.non_tensor_batch.items()
            },
            "meta_info": _to_python(self.meta_info, "meta_info"),
        }
        torch.save(payload, filepath)

    @classmethod
    def load_from_disk(cls, filepath: str) -> DataProto:
        """Read a file written by :meth:`save_to_disk` (``torch.load(weights_only=True)``)."""
        payload = torch.load(filepath, weights_only=True, map_location="cpu")
        if not isinstance(payload, dict) or payload.get("format") != "rlflow.DataProto/1":
            raise ValueError(f"{filepath}: not a DataProto file written by DataProto.save_to_disk")
        return cls.from_dict(
            tensors=payload["tensors"] or {},
            non_tensors={k: _as_object_array(v, k) for k, v in payload["non_tensors"].items()},
            meta_info=payload["meta_info"],
        )

    def print_size(self, prefix: str = "") -> str:
        """Human-readable memory footprint of the tensors."""
        nbytes = (
            sum(v.numel() * v.element_size() for v in self.batch.values()) if self.batch is not None else 0
        )
        return f"{prefix}DataProto: {len(self)} samples, {nbytes / 2**20:.3f} MiB of tensors"


def _pack_tensordict(td: TensorDict | None) -> dict | None:
    """One uint8 numpy buffer holding every tensor, plus (key, dtype, shape, offset) records."""
    if td is None:
        return None
    records, parts, offset = [], [], 0
    for key, tensor in td.items():
        t = tensor.detach().cpu().contiguous()
        nbytes = t.numel() * t.element_size()
        records.append((key, str(t.dtype).removeprefix("torch."), tuple(t.shape), offset, nbytes))
        if nbytes:
            parts.append(t.reshape(-1).view(torch.uint8))
        pad = (-nbytes) % _ALIGN
        if pad:
            parts.append(torch.zeros(pad, dtype=torch.uint8))
        offset += nbytes + pad
    buffer = torch.cat(parts).numpy() if parts else np.zeros(0, dtype=np.uint8)
    return {"batch_size": tuple(td.batch_size), "records": records, "buffer": buffer}


def _unpack_tensordict(packed: dict | None) -> TensorDict | None:
    if packed is None:
        return None
    # One copy of the whole buffer: object-store buffers are read-only, tensors must be writable.
    buffer = torch.from_numpy(np.array(packed["buffer"], copy=True))
    tensors = {}
    for key, dtype_name, shape, offset, nbytes in packed["records"]:
        dtype = getattr(torch, dtype_name)
        tensors[key] = buffer[offset : offset + nbytes].view(dtype).reshape(shape)
    return TensorDict(tensors, batch_size=list(packed["batch_size"]))


# ----------------------------------------------------------------------------------------------------------
# padding for even dispatch
# ----------------------------------------------------------------------------------------------------------


def pad_dataproto_to_divisor(data: DataProto, size_divisor: int) -> tuple[DataProto, int]:
    """Pad by repeating samples from the start so that ``len`` divides ``size_divisor``; return the pad size."""
    if size_divisor <= 0:
        raise ValueError(f"size_divisor must be positive, got {size_divisor}")
    n = len(data)
    pad_size = (-n) % size_divisor
    if pad_size == 0 or n == 0:
        return data, 0
    idx = np.arange(pad_size) % n
    padded = DataProto.concat([data, data.select_idxs(idx)])
    padded.meta_info = dict(data.meta_info)  # concat would merge the copied part's metrics twice
    return padded, pad_size


def unpad_dataproto(data: DataProto, pad_size: int) -> DataProto:
    """Drop the last ``pad_size`` samples added by :func:`pad_dataproto_to_divisor`."""
    if pad_size:
        return data.slice(0, len(data) - pad_size)
    return data
