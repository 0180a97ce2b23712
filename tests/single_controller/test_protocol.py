"""DataProto and DataProtoFuture: every operation, with exact values."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from rlflow.protocol import DataProto, pad_dataproto_to_divisor, unpad_dataproto
from rlflow.single_controller.futures import DataProtoFuture


def make(n: int = 6, offset: int = 0) -> DataProto:
    ids = torch.arange(offset, offset + n)
    return DataProto.from_dict(
        tensors={"obs": ids.view(n, 1).repeat(1, 3).float(), "act": ids.clone()},
        non_tensors={"uid": [f"u{i}" for i in ids.tolist()], "info": [{"k": i} for i in ids.tolist()]},
        meta_info={"temperature": 1.0},
    )


def test_construction_checks_lengths():
    with pytest.raises(ValueError, match="'b' has batch size 3 but 'a' has 2"):
        DataProto.from_dict(tensors={"a": torch.zeros(2), "b": torch.zeros(3)})
    with pytest.raises(ValueError, match=r"non_tensor_batch\['x'\] has 3 entries but the batch has 2"):
        DataProto.from_dict(tensors={"a": torch.zeros(2)}, non_tensors={"x": [1, 2, 3]})
    with pytest.raises(ValueError, match="0-dimensional"):
        DataProto.from_dict(tensors={"a": torch.tensor(1.0)})


def test_nested_lists_stay_one_object_per_sample():
    d = DataProto.from_dict(tensors={"a": torch.zeros(2)}, non_tensors={"ids": [[1, 2], [3, 4]]})
    assert d.non_tensor_batch["ids"].shape == (2,)
    assert d.non_tensor_batch["ids"][1] == [3, 4]


def test_from_single_dict_sorts_kinds():
    d = DataProto.from_single_dict({"a": torch.ones(2, 2), "s": np.array(["x", "y"], dtype=object)})
    assert list(d.batch.keys()) == ["a"]
    assert list(d.non_tensor_batch) == ["s"]


def test_getitem_int_slice_list_mask():
    d = make(6)
    item = d[2]
    assert item.batch["act"].item() == 2 and item.non_tensor_batch["uid"] == "u2"
    assert d[1:4].batch["act"].tolist() == [1, 2, 3]
    assert d[[5, 0, 3]].non_tensor_batch["uid"].tolist() == ["u5", "u0", "u3"]
    assert d[torch.tensor([5, 0])].batch["act"].tolist() == [5, 0]
    mask = np.array([True, False, True, False, False, True])
    assert d[mask].batch["act"].tolist() == [0, 2, 5]
    with pytest.raises(IndexError):
        d[6]
    assert [it.batch["act"].item() for it in d] == list(range(6))


def test_select_pop_rename():
    d = make(4)
    s = d.select(batch_keys=["act"], non_tensor_batch_keys=["uid"])
    assert list(s.batch.keys()) == ["act"] and list(s.non_tensor_batch) == ["uid"]
    popped = d.pop(batch_keys=["obs"], non_tensor_batch_keys=["info"], meta_info_keys=["temperature"])
    assert list(d.batch.keys()) == ["act"] and "info" not in d.non_tensor_batch
    assert popped.batch["obs"].shape == (4, 3) and popped.meta_info == {"temperature": 1.0}
    assert d.meta_info == {}
    d.rename("act", "action")
    assert list(d.batch.keys()) == ["action"]
    with pytest.raises(KeyError, match="'nope' not found"):
        d.select(batch_keys=["nope"])


def test_union_adds_and_conflicts():
    a = make(3).select(batch_keys=["obs"], non_tensor_batch_keys=["uid"])
    b = make(3).select(batch_keys=["act", "obs"], non_tensor_batch_keys=["info"])
    a.union(b)
    assert sorted(a.batch.keys()) == ["act", "obs"] and sorted(a.non_tensor_batch) == ["info", "uid"]
    c = make(3)
    c.batch["act"] = c.batch["act"] + 1
    with pytest.raises(ValueError, match="key 'act' is in both batches with different values"):
        a.union(c.select(batch_keys=["act"]))
    e = make(3, offset=10).select(batch_keys=[], non_tensor_batch_keys=["uid"])
    with pytest.raises(ValueError, match="non-tensor key 'uid'"):
        a.union(e)
    with pytest.raises(ValueError, match="meta_info key 'temperature'"):
        a.union(DataProto.from_dict(tensors={"z": torch.zeros(3)}, meta_info={"temperature": 0.5}))


def test_chunk_split_concat_roundtrip():
    d = make(6)
    parts = d.chunk(3)
    assert [p.batch["act"].tolist() for p in parts] == [[0, 1], [2, 3], [4, 5]]
    back = DataProto.concat(parts)
    assert torch.equal(back.batch["obs"], d.batch["obs"])
    assert back.non_tensor_batch["uid"].tolist() == d.non_tensor_batch["uid"].tolist()
    assert [len(p) for p in d.split(4)] == [4, 2]
    with pytest.raises(ValueError, match="not divisible by 4"):
        d.chunk(4)


def test_concat_merges_worker_metrics():
    a, b = make(2), make(2, offset=2)
    a.meta_info["metrics"] = {"loss": [1.0, 2.0], "lr": 0.1}
    b.meta_info["metrics"] = {"loss": [3.0], "lr": 0.1}
    out = DataProto.concat([a, b])
    assert out.meta_info["metrics"] == {"loss": [1.0, 2.0, 3.0], "lr": [0.1, 0.1]}
    assert out.meta_info["temperature"] == 1.0


def test_reorder_and_repeat():
    d = make(3)
    d.reorder(torch.tensor([2, 0, 1]))
    assert d.batch["act"].tolist() == [2, 0, 1] and d.non_tensor_batch["uid"].tolist() == ["u2", "u0", "u1"]
    with pytest.raises(ValueError, match="permutation"):
        d.reorder([0, 0, 1])
    r = make(2).repeat(3, interleave=True)
    assert r.batch["act"].tolist() == [0, 0, 0, 1, 1, 1]
    assert r.non_tensor_batch["uid"].tolist() == ["u0", "u0", "u0", "u1", "u1", "u1"]
    t = make(2).repeat(2, interleave=False)
    assert t.batch["act"].tolist() == [0, 1, 0, 1]


def test_pad_and_unpad():
    d = make(5)
    padded, pad = pad_dataproto_to_divisor(d, 4)
    assert pad == 3 and padded.batch["act"].tolist() == [0, 1, 2, 3, 4, 0, 1, 2]
    assert unpad_dataproto(padded, pad).batch["act"].tolist() == [0, 1, 2, 3, 4]
    small, pad2 = pad_dataproto_to_divisor(make(2), 5)  # pad larger than the batch wraps around
    assert pad2 == 3 and small.batch["act"].tolist() == [0, 1, 0, 1, 0]
    same, pad3 = pad_dataproto_to_divisor(d, 5)
    assert pad3 == 0 and same is d


def test_pickle_roundtrip_dtypes_and_objects():
    d = DataProto.from_dict(
        tensors={
            "bf": torch.randn(3, 5).to(torch.bfloat16),
            "i64": torch.arange(3),
            "b": torch.tensor([True, False, True]),
            "f16": torch.randn(3, 2, 2).half(),
            "noncontig": torch.arange(12).view(4, 3).t()[:, :3].t().contiguous().t().t()[:3],
        },
        non_tensors={"obj": [{"a": [1, 2]}, "s", 3.5]},
        meta_info={"x": 1},
    )
    out = pickle.loads(pickle.dumps(d))
    for k in d.batch.keys():
        assert out.batch[k].dtype == d.batch[k].dtype
        assert torch.equal(out.batch[k], d.batch[k]), k
    assert out.non_tensor_batch["obj"].tolist() == [{"a": [1, 2]}, "s", 3.5]
    assert out.meta_info == {"x": 1}
    out.batch["i64"][0] = 7  # unpickled tensors are writable
    # one packed buffer, not one pickled object per tensor
    state = d.__getstate__()["batch"]
    assert isinstance(state["buffer"], np.ndarray) and len(state["records"]) == 5


def test_save_load_disk_is_safe(tmp_path):
    d = make(3)
    d.batch["bf"] = torch.randn(3, 2).to(torch.bfloat16)
    d.non_tensor_batch["np_scalar"] = np.array([np.int64(1), np.float32(2.5), None], dtype=object)
    path = tmp_path / "d.pt"
    d.save_to_disk(str(path))
    out = DataProto.load_from_disk(str(path))
    assert torch.equal(out.batch["bf"], d.batch["bf"]) and out.batch["bf"].dtype == torch.bfloat16
    assert out.non_tensor_batch["info"].tolist() == [{"k": 0}, {"k": 1}, {"k": 2}]
    assert out.non_tensor_batch["np_scalar"].tolist() == [1, 2.5, None]
    # a file carrying arbitrary pickled objects is refused by the weights-only loader
    evil = tmp_path / "evil.pt"
    torch.save(
        {"format": "rlflow.DataProto/1", "tensors": None, "non_tensors": {}, "meta_info": {"o": object()}},
        evil,
    )
    with pytest.raises(pickle.UnpicklingError):
        DataProto.load_from_disk(str(evil))
    torch.save({"hello": 1}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not a DataProto file"):
        DataProto.load_from_disk(str(tmp_path / "other.pt"))


def test_to_device_and_len():
    d = make(4).to("cpu")
    assert len(d) == 4
    assert d.batch.device in (torch.device("cpu"), None)


def test_future_slices_route_by_index(ray_session):
    import ray

    shards = [make(3, 0), make(3, 3), make(2, 6)]  # producer: 3 shards of uneven size
    fut = DataProtoFuture([ray.put(s) for s in shards], [3, 3, 2], start=0, end=7)  # last sample is padding
    assert len(fut) == 7
    parts = fut.split_sizes([2, 4, 1])
    assert [p.resolve().batch["act"].tolist() for p in parts] == [[0, 1], [2, 3, 4, 5], [6]]
    chunks = fut.chunk(7)
    assert [c.get().batch["act"].item() for c in chunks] == list(range(7))
    assert fut.get().non_tensor_batch["uid"].tolist() == [f"u{i}" for i in range(7)]
    with pytest.raises(ValueError, match="not divisible"):
        fut.chunk(2)


def test_future_chunks_wrap_around_more_than_once():
    """2 samples dispatched to 8 ranks: padded indices 2..7 stand for samples 0,1,0,1,0,1."""
    from rlflow.single_controller.decorator import _chunk_future

    future = DataProtoFuture(refs=["r0", "r1"], shard_sizes=[1, 1])
    chunks, pad = _chunk_future(future, 8)
    assert pad == 6
    assert [c.parts for c in chunks] == [[("r0", 0, 1)], [("r1", 0, 1)]] + [
        [("r0", 0, 1)],
        [("r1", 0, 1)],
    ] * 3


def test_padding_does_not_duplicate_metrics():
    data = DataProto.from_dict(tensors={"x": torch.arange(3)}, meta_info={"metrics": {"t": 1.0}})
    padded, pad = pad_dataproto_to_divisor(data, 2)
    assert pad == 1 and len(padded) == 4
    assert padded.meta_info == {"metrics": {"t": 1.0}}
