"""StatefulSampler / StatefulDataLoader: seeded order, exact mid-epoch resume, state checks."""

from __future__ import annotations

import numpy as np
import pytest
from torch.utils.data import Dataset

from rlflow.data.rl_dataset import create_rl_dataloader
from rlflow.data.sampler import StatefulSampler


class Indices(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


def as_list(batch):
    return list(batch)


def run(loader, epochs, stop_after=None):
    """Batches seen over ``epochs`` epochs (as the trainer loops), stopping after ``stop_after`` batches."""
    seen = []
    for _ in range(epochs):
        for batch in loader:
            seen.append(batch)
            if stop_after is not None and len(seen) == stop_after:
                return seen
    return seen


def test_epoch_order_is_seeded():
    s = StatefulSampler(10, shuffle=True, seed=3)
    assert s.epoch_order(0) == np.random.default_rng([3, 0]).permutation(10).tolist()
    assert s.epoch_order(0) == StatefulSampler(10, seed=3).epoch_order(0)
    assert s.epoch_order(1) != s.epoch_order(0)
    assert StatefulSampler(10, seed=4).epoch_order(0) != s.epoch_order(0)
    assert StatefulSampler(5, shuffle=False).epoch_order(7) == [0, 1, 2, 3, 4]


def test_epochs_cover_every_sample_once():
    loader = create_rl_dataloader(Indices(10), 3, seed=0, drop_last=False, collate=as_list)
    assert len(loader) == 4
    epoch0 = run(loader, 1)
    assert [len(b) for b in epoch0] == [3, 3, 3, 1]
    flat = [i for b in epoch0 for i in b]
    assert sorted(flat) == list(range(10))
    assert flat == np.random.default_rng([0, 0]).permutation(10).tolist()
    dropping = create_rl_dataloader(Indices(10), 3, seed=0, drop_last=True, collate=as_list)
    assert len(dropping) == 3 and [len(b) for b in run(dropping, 1)] == [3, 3, 3]


@pytest.mark.parametrize("stop", [1, 2, 3, 4, 5, 7])
def test_resume_is_exact(stop):
    def make():
        return create_rl_dataloader(Indices(10), 3, shuffle=True, seed=11, drop_last=True, collate=as_list)

    full = run(make(), 3)
    assert len(full) == 9
    first = make()
    head = run(first, 3, stop_after=stop)
    state = first.state_dict()
    assert state["sampler"]["epoch"] == stop // 3 and state["sampler"]["offset"] == 3 * (stop % 3)
    resumed = make()
    resumed.load_state_dict(state)
    epochs_left = 3 - state["sampler"]["epoch"]
    tail = run(resumed, epochs_left)
    assert head + tail == full


def test_prefetching_workers_do_not_move_the_position():
    loader = create_rl_dataloader(Indices(12), 2, seed=0, num_workers=1, collate=as_list)
    it = iter(loader)
    first = next(it)
    assert loader.state_dict()["sampler"]["offset"] == 2
    del it
    resumed = create_rl_dataloader(Indices(12), 2, seed=0, collate=as_list)
    resumed.load_state_dict(loader.state_dict())
    rest = run(resumed, 1)
    assert [first, *rest] == run(create_rl_dataloader(Indices(12), 2, seed=0, collate=as_list), 1)


def test_state_mismatch_errors():
    loader = create_rl_dataloader(Indices(10), 3, seed=0, collate=as_list)
    state = loader.state_dict()
    with pytest.raises(ValueError, match="sampler state seed=0 does not match this sampler's 1"):
        create_rl_dataloader(Indices(10), 3, seed=1, collate=as_list).load_state_dict(state)
    with pytest.raises(ValueError, match="num_samples=10 does not match this sampler's 11"):
        create_rl_dataloader(Indices(11), 3, seed=0, collate=as_list).load_state_dict(state)
    with pytest.raises(ValueError, match="batch_size=3 != 2"):
        create_rl_dataloader(Indices(10), 2, seed=0, collate=as_list).load_state_dict(state)
    with pytest.raises(ValueError, match="batch_size=20 exceeds the dataset size 10"):
        create_rl_dataloader(Indices(10), 20, collate=as_list)
