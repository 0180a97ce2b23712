"""rlflow.model_merger: FSDP2 checkpoints of the actor and the critic → HF directories, no process group.

Two gloo ranks build the actor (causal LM) and the critic (value model with a fresh head) the way the
trainer does (`rlflow.workers.role_setup.build_role_module`, FSDP2), take one AdamW step (so the
checkpoint also holds optimizer state, which the merger must skip) and add seeded noise to every shard,
then save with `save_checkpoint`. The merger runs in this process (function) and in a subprocess
(``python -m rlflow.model_merger``); the exported models must carry exactly the sharded module's full
weights and give its logits / values (atol 1e-6).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer

from rlflow.config import config_section
from rlflow.config.schema import OptimConfig
from rlflow.engine.optim import build_optimizer
from rlflow.model_merger import main, merge_checkpoint, resolve_base_model_path
from rlflow.models.tiny import TinyModelConfig, build_tiny_tokenizer, save_tiny_model
from rlflow.parallel.checkpoint import save_checkpoint
from rlflow.parallel.dims import ParallelDims
from rlflow.parallel.distributed import spawn_workers
from rlflow.parallel.sharded import get_full_state_dict
from rlflow.workers.role_setup import RoleLayout, RoleParallel, build_role_module

CFG = TinyModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, max_position_embeddings=64)
OPTIM = OptimConfig(lr=1e-2, weight_decay=0.0, lr_scheduler_type="constant")
KINDS = {"actor": "causal_lm", "critic": "value"}
TEXT = "repeat b x3"


def _input_ids() -> torch.Tensor:
    gen = torch.Generator().manual_seed(7)
    return torch.randint(3, 259, (3, 10), generator=gen)


def _perturb_(model: torch.nn.Module, rank: int) -> None:
    """Add different N(0, 0.02²) noise to each rank's shard of every parameter."""
    gen = torch.Generator().manual_seed(1000 + rank)
    with torch.no_grad():
        for p in model.parameters():
            local = p._local_tensor if hasattr(p, "_local_tensor") else p
            local.add_(0.02 * torch.randn(local.shape, generator=gen))


def _save_role(rank: int, root: str, base: str, role: str) -> dict:
    dims = ParallelDims(world_size=2).build_meshes("cpu")
    parallel = RoleParallel(dims, None, None, None)
    model_cfg = config_section("actor_rollout_ref.model", path=base, use_remove_padding=False)
    layout = RoleLayout(role, model_cfg, "fsdp2", 1, config_section("critic.fsdp_config"))
    model = build_role_module(KINDS[role], layout, parallel, seed=3)
    optimizer = build_optimizer(model.parameters(), OPTIM)
    model(input_ids=_input_ids(), use_cache=False).logits.float().pow(2).mean().backward()
    optimizer.step()
    _perturb_(model, rank)
    save_checkpoint(f"{root}/global_step_3/{role}", model, optimizer, extra_state={"global_step": 3})
    full = get_full_state_dict(model, rank0_only=True)
    with torch.no_grad():
        logits = model(input_ids=_input_ids(), use_cache=False).logits
    return {"state": full, "logits": logits}


def _worker(rank: int, root: str, base: str) -> dict:
    return {role: _save_role(rank, root, base, role) for role in ("actor", "critic")}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    root = tmp_path_factory.mktemp("merger")
    base = save_tiny_model(root / "base", CFG, seed=0)
    ranks = spawn_workers(_worker, 2, (str(root / "ckpt"), base))
    return root, base, ranks[0]


def _check_export(out_dir, expected: dict, role: str) -> None:
    auto_cls = AutoModelForCausalLM if role == "actor" else AutoModelForTokenClassification
    model = auto_cls.from_pretrained(out_dir, dtype=torch.float32).eval()
    got = model.state_dict()
    assert set(got) == set(expected["state"])
    for name, tensor in expected["state"].items():
        torch.testing.assert_close(got[name], tensor, rtol=0, atol=0, msg=name)
    with torch.no_grad():
        logits = model(input_ids=_input_ids(), use_cache=False).logits
    assert logits.shape == ((3, 10, 272) if role == "actor" else (3, 10, 1))
    torch.testing.assert_close(logits, expected["logits"], rtol=0, atol=1e-6)
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    assert tokenizer(TEXT)["input_ids"] == build_tiny_tokenizer()(TEXT)["input_ids"]


@pytest.mark.parametrize("role", ["actor", "critic"])
def test_merge_in_process_matches_sharded_module(saved: tuple, role: str) -> None:
    root, base, expected = saved
    out = merge_checkpoint(root / "ckpt" / "global_step_3" / role, root / f"hf_{role}", model_path=base)
    assert out == str(root / f"hf_{role}")
    # the perturbation and the AdamW step moved every weight away from the base model
    base_model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    moved = expected[role]["state"]["model.norm.weight"] - base_model.model.norm.weight
    assert moved.abs().min() > 0
    _check_export(out, expected[role], role)


def test_merge_cli_subprocess(saved: tuple) -> None:
    root, base, expected = saved
    step_dir = root / "ckpt" / "global_step_3"
    cmd = [sys.executable, "-m", "rlflow.model_merger", "--local_dir", str(step_dir), "--role", "critic"]
    cmd += ["--target_dir", str(root / "cli_critic"), "--model_path", base]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert f"wrote {root / 'cli_critic'}" in proc.stdout
    _check_export(root / "cli_critic", expected["critic"], "critic")


def test_bf16_export_casts_weights(saved: tuple) -> None:
    root, base, expected = saved
    out = merge_checkpoint(root / "ckpt/global_step_3/actor", root / "hf_bf16", model_path=base, dtype="bf16")
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.dtype == torch.bfloat16
    want = expected["actor"]["state"]["model.embed_tokens.weight"].to(torch.bfloat16)
    torch.testing.assert_close(model.model.embed_tokens.weight, want, rtol=0, atol=0)


def test_base_model_lookup_order(saved: tuple, tmp_path) -> None:
    root, base, _ = saved
    ckpt = root / "ckpt" / "global_step_3" / "actor"
    with pytest.raises(ValueError, match="pass --model_path"):
        resolve_base_model_path(ckpt)
    assert resolve_base_model_path(ckpt, base) == base
    copy = tmp_path / "actor"
    (copy / "huggingface").mkdir(parents=True)
    (copy / "huggingface" / "config.json").write_text("{}")
    assert resolve_base_model_path(copy) == str(copy / "huggingface")
    (copy / "meta.json").write_text(json.dumps({"model_path": base}))
    assert resolve_base_model_path(copy) == base


def test_cli_errors_name_the_problem(saved: tuple, tmp_path, capsys) -> None:
    root, base, _ = saved
    ckpt = root / "ckpt" / "global_step_3" / "actor"
    assert main(["--local_dir", str(ckpt), "--target_dir", str(tmp_path / "out")]) == 2
    assert "pass --model_path" in capsys.readouterr().err
    other = save_tiny_model(tmp_path / "wide", TinyModelConfig(hidden_size=64, num_hidden_layers=2))
    args = ["--local_dir", str(ckpt), "--target_dir", str(tmp_path / "out"), "--model_path", other]
    assert main(args) == 2
    assert "does not fit Qwen2ForCausalLM" in capsys.readouterr().err
    partial = tmp_path / "partial"
    shutil.copytree(ckpt, partial)
    (partial / "COMPLETE").unlink()
    assert (
        main(["--local_dir", str(partial), "--target_dir", str(tmp_path / "out"), "--model_path", base]) == 2
    )
    assert "no COMPLETE marker" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
