"""`PreallocatedCache`: in-place KV storage that reads like transformers' ``DynamicCache``."""

from __future__ import annotations

import torch
from transformers import Qwen2Config
from transformers.cache_utils import DynamicCache

from rlflow.rollout.kv_cache import PreallocatedCache, PreallocatedLayer, supports_preallocated_cache


def _kv(b: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, 2, n, 4, generator=g), torch.randn(b, 2, n, 4, generator=g)


def test_updates_row_drops_and_growth_match_a_dynamic_cache():
    ours, ref = PreallocatedCache(num_layers=2, capacity=6), DynamicCache()
    steps = [(4, 5, 0), (4, 1, 1), (3, 1, 2), (3, 1, 3), (3, 1, 4)]  # prefill 5, then 4 single tokens
    for i, (b, n, seed) in enumerate(steps):
        if i == 2:  # row 1 finished: keep rows 0, 2, 3
            keep = torch.tensor([0, 2, 3])
            ours.batch_select_indices(keep)
            ref.batch_select_indices(keep)
        for layer in range(2):
            k, v = _kv(b, n, seed * 10 + layer)
            got = ours.update(k, v, layer)
            want = ref.update(k, v, layer)
            for x, y in zip(got, want):
                torch.testing.assert_close(x, y, rtol=0, atol=0)
        assert ours.get_seq_length() == ref.get_seq_length()
    # 9 positions were written into a capacity of 6: the storage doubled once, the contents kept
    assert ours.get_seq_length() == 9 and ours.layers[0]._keys.shape[-2] == 12


def test_the_storage_is_written_in_place_not_reallocated():
    layer = PreallocatedLayer(capacity=8)
    layer.update(*_kv(2, 3, 0))
    storage = layer._keys.data_ptr()
    for seed in range(1, 6):
        keys, _ = layer.update(*_kv(2, 1, seed))
    assert layer._keys.data_ptr() == storage and keys.shape == (2, 2, 8, 4)


def test_only_full_attention_decoders_use_it():
    assert supports_preallocated_cache(Qwen2Config(num_hidden_layers=2))
    sliding = Qwen2Config(num_hidden_layers=2, use_sliding_window=True, sliding_window=4, max_window_layers=0)
    assert not supports_preallocated_cache(sliding)
