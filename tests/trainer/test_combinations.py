"""The combination matrix (DESIGN invariant 6): every feature a user switches on works with the others.

Each cell is a real 2-step PPO run (local Ray, colocated FSDP groups, the embedded tiny model) with a
pairwise-covering set of the layout options switched on. The training step is one mini-batch (one
optimizer step) and the rollout samples by global row index, so before the first optimizer step every
layout sees the same responses, the same old log-probs and the same values: its step-1 losses and gradient
norms must equal the all-defaults reference run's (fp32 on CPU, rel 1e-4; ``actor/pg_loss`` is a mean of
O(1) terms that nearly cancel, so it is compared with an absolute 1e-4 of the advantages' scale). Step 2
must finish with finite numbers; it is not compared, because Adam's first update divides each gradient
element by its own magnitude and so amplifies float noise in near-zero elements.

``docs/combination_matrix.md`` lists the cells and what each pins. ``test_matrix_covers_every_pair`` checks
that the cells cover every allowed pair of option levels.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest

from rlflow.config import load_config
from rlflow.trainer.main_ppo import run_ppo

REPO = Path(__file__).resolve().parents[2]

# option -> the overrides that switch it on (off = the default)
OPTIONS: dict[str, list[str]] = {
    "actor_sp2": ["actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"],
    "critic_sp2": ["critic.ulysses_sequence_parallel_size=2"],
    "actor_gc": ["actor_rollout_ref.model.enable_gradient_checkpointing=true"],
    "critic_gc": ["critic.model.enable_gradient_checkpointing=true"],
    "dynamic_bsz": [
        "actor_rollout_ref.actor.use_dynamic_bsz=true",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=96",
        "critic.ppo_max_token_len_per_gpu=96",
    ],
    "no_rmpad": ["actor_rollout_ref.model.use_remove_padding=false"],
    "fsdp1": ["actor_rollout_ref.actor.strategy=fsdp", "critic.strategy=fsdp"],
    "param_offload": [
        "actor_rollout_ref.actor.fsdp_config.param_offload=true",
        "critic.fsdp_config.param_offload=true",
    ],
    "critic_world1": ["critic.world_size=1"],
    "tiled_mlp": [
        "actor_rollout_ref.model.tiled_mlp.enabled=true",
        "actor_rollout_ref.model.tiled_mlp.num_shards=3",
        "critic.model.tiled_mlp.enabled=true",
        "critic.model.tiled_mlp.num_shards=2",
    ],
    "n4": [],  # rollout.n=4 on 4 prompts (16 responses, as the n=1 cells' 16 prompts)
}

# A pairwise covering array over the options above, under the rules Ulysses SP needs remove-padding
# and a critic with SP 2 needs 2 ranks. Generated once, checked by test_matrix_covers_every_pair.
CELLS: dict[str, tuple[str, ...]] = {
    "c1": ("actor_sp2", "actor_gc", "fsdp1", "critic_world1", "tiled_mlp"),
    "c2": ("critic_gc", "dynamic_bsz", "no_rmpad", "param_offload", "n4", "tiled_mlp"),
    "c3": ("actor_sp2", "critic_sp2", "dynamic_bsz", "fsdp1", "n4", "tiled_mlp"),
    "c4": ("critic_sp2", "actor_gc", "critic_gc", "param_offload"),
    "c5": ("critic_gc", "no_rmpad", "fsdp1", "critic_world1", "n4"),
    "c6": ("actor_gc", "dynamic_bsz", "no_rmpad", "critic_world1"),
    "c7": ("actor_sp2", "dynamic_bsz", "fsdp1", "param_offload", "critic_world1"),
    "c8": ("actor_sp2", "actor_gc", "critic_gc", "n4"),
}
# Where GRPO applies (no critic): the actor-side options together, against the GRPO reference.
GRPO_CELLS: dict[str, tuple[str, ...]] = {
    "g1": ("actor_sp2", "actor_gc", "dynamic_bsz", "fsdp1", "param_offload", "tiled_mlp"),
}

COMPARED = ("actor/pg_loss", "actor/grad_norm", "critic/vf_loss", "critic/grad_norm", "actor/entropy")


def _allowed(on: set[str]) -> bool:
    if "no_rmpad" in on and ({"actor_sp2", "critic_sp2"} & on):
        return False
    return not ({"critic_sp2", "critic_world1"} <= on)


def test_matrix_covers_every_pair():
    """Every pair of option levels that some allowed run can have appears in at least one cell."""
    names = list(OPTIONS)
    rows = [set(c) for c in CELLS.values()]
    assert all(_allowed(r) for r in rows)
    every = [
        {n for n, v in zip(names, bits) if v}
        for bits in itertools.product([0, 1], repeat=len(names))
        if _allowed({n for n, v in zip(names, bits) if v})
    ]
    for a, b in itertools.combinations(names, 2):
        for va, vb in itertools.product([False, True], repeat=2):
            possible = any((a in r) == va and (b in r) == vb for r in every)
            covered = any((a in r) == va and (b in r) == vb for r in rows)
            assert covered or not possible, (a, va, b, vb)


def _base(tmp_path: Path, name: str, n4: bool, grpo: bool = False) -> list[str]:
    prompts, n = (4, 4) if n4 else (16, 1)
    out = [
        "trainer.total_training_steps=2",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        "trainer.logger=[jsonl]",
        "trainer.resume_mode=disable",
        f"trainer.log_dir={tmp_path / name}",
        f"trainer.default_local_dir={tmp_path / name / 'ckpt'}",
        f"data.train_batch_size={prompts}",
        f"actor_rollout_ref.rollout.n={n}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts}",  # one optimizer step per training step
    ]
    if grpo:
        out.append("algorithm.adv_estimator=grpo")
    return out


def _cell_overrides(options: tuple[str, ...]) -> list[str]:
    out = [o for name in options for o in OPTIONS[name]]
    if "dynamic_bsz" not in options:
        # fixed micro-batches smaller than a rank's share, so every cell also splits its mini-batch
        out += [
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "critic.ppo_micro_batch_size_per_gpu=2",
        ]
    return out


def _run(overrides: list[str]) -> list[dict]:
    history = run_ppo(load_config(overrides, config_name="demo_two_ranks"))["history"]
    assert [h["step"] for h in history] == [1, 2]
    for h in history:
        for key in COMPARED:
            if key in h:
                assert math.isfinite(h[key]), key
        assert h.get("actor/skipped_steps", 0.0) == 0.0 and h.get("critic/skipped_steps", 0.0) == 0.0
    return history


def _assert_step1_equal(got: dict, want: dict, cell: str) -> None:
    assert got["response_length/mean"] == want["response_length/mean"], cell  # the same rollouts
    for key in COMPARED:
        if key not in want:
            continue
        if key == "actor/pg_loss":
            scale = max(abs(want["critic/advantages/max"]), abs(want["critic/advantages/min"]))
            tol = {"abs": 1e-4 * scale}
        else:
            tol = {"rel": 1e-4}
        assert got[key] == pytest.approx(want[key], **tol), (cell, key)


def _report(cell: str, history: list[dict]) -> None:
    """One line per cell (``pytest -s`` shows it): the step times that docs/combination_matrix.md quotes."""
    times = ", ".join(f"{h['timing_s/step']:.2f}" for h in history)
    print(f"matrix cell {cell}: step times {times} s")


@pytest.fixture(scope="module")
def references(ray_session, tmp_path_factory) -> dict[str, dict]:
    tmp = tmp_path_factory.mktemp("matrix_ref")
    return {
        "n1": _run(_base(tmp, "ref_n1", n4=False))[0],
        "n4": _run(_base(tmp, "ref_n4", n4=True))[0],
        "grpo": _run(_base(tmp, "ref_grpo", n4=True, grpo=True))[0],
    }


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("cell", sorted(CELLS))
def test_ppo_cell_matches_the_reference(cell, references, tmp_path):
    options = CELLS[cell]
    n4 = "n4" in options
    history = _run(_base(tmp_path, cell, n4) + _cell_overrides(options))
    _report(cell, history)
    _assert_step1_equal(history[0], references["n4" if n4 else "n1"], cell)


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("cell", sorted(GRPO_CELLS))
def test_grpo_cell_matches_the_reference(cell, references, tmp_path):
    history = _run(_base(tmp_path, cell, n4=True, grpo=True) + _cell_overrides(GRPO_CELLS[cell]))
    _report(cell, history)
    assert "critic/vf_loss" not in history[0]
    _assert_step1_equal(history[0], references["grpo"], cell)
