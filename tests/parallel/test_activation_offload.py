"""`rlflow.parallel.activation_offload` (verl's ``model.enable_activation_offload``) and
``fsdp_config.model_dtype``: the hooks see the activations a backward needs and never a parameter, the
update they wrap gives the same numbers as without them, and a role built with bf16 weights keeps and
updates bf16 weights. On CPU the saved tensors are already in host memory (passed through, counted); the
copy to pinned host memory and back is checked on a GPU (``gpu`` mark)."""

from __future__ import annotations

import dataclasses
from unittest import mock

import pytest
import torch
from torch import nn

from rlflow.parallel.activation_offload import ActivationOffload
from rlflow.parallel.distributed import spawn_workers


def test_a_linear_layer_saves_one_activation_and_its_weight_is_not_counted():
    """``y = x W^T + b``: autograd saves ``x`` (for dW) and a view of ``W`` (for dx); only ``x`` is an
    activation. The weight's transposed view is recognised through its base."""
    torch.manual_seed(0)
    layer = nn.Linear(3, 2)
    x = torch.randn(4, 3, requires_grad=True)  # its gradient needs W: autograd saves a view of W too
    with ActivationOffload() as offload:
        y = layer(x)
    y.sum().backward()
    assert offload.saved == 1 and offload.offloaded_bytes == 0  # CPU: nothing to move
    # dW = sum over rows of x (the upstream gradient is all ones)
    torch.testing.assert_close(layer.weight.grad, x.sum(0).expand(2, 3), rtol=0, atol=1e-6)
    with ActivationOffload(enabled=False) as off:
        layer(x).sum().backward()
    assert off.saved == 0


def _tiny_model(checkpointing: bool) -> nn.Module:
    from rlflow.models.tiny import TinyModelConfig, build_tiny_model

    model = build_tiny_model(TinyModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2))
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.train()


def _grads(checkpointing: bool, offload: bool, device: str = "cpu") -> tuple[dict, int, int]:
    model = _tiny_model(checkpointing).to(device)
    ids = torch.randint(0, 272, (3, 10), generator=torch.Generator().manual_seed(1)).to(device)
    with ActivationOffload(offload) as hooks:
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()
    grads = {n: p.grad.detach().cpu() for n, p in model.named_parameters()}
    return grads, hooks.saved, hooks.offloaded_bytes


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointing"])
def test_gradients_are_those_without_offload(checkpointing):
    expected, _, _ = _grads(checkpointing, offload=False)
    got, saved, _ = _grads(checkpointing, offload=True)
    assert saved > 0
    for name, grad in expected.items():
        assert torch.equal(got[name], grad), name  # the same ops on the same tensors: bit for bit


def test_with_gradient_checkpointing_far_fewer_activations_are_saved():
    _, plain, _ = _grads(False, offload=True)
    _, checkpointed, _ = _grads(True, offload=True)
    assert checkpointed < plain / 2, (checkpointed, plain)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_a_gpu_the_activations_go_to_pinned_host_memory_and_come_back():
    expected, _, _ = _grads(True, offload=False, device="cuda")
    got, saved, moved = _grads(True, offload=True, device="cuda")
    assert saved > 0 and moved > 0
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-5, atol=1e-6, msg=name)


# -- the engine and the worker's model builder (one gloo rank) ----------------------------------------


def _actor_update(offload: bool) -> dict:
    from rlflow.parallel.sharded import gather_full_params
    from tests.engine.test_batch_invariance import _batch, _build, _role

    settings = {"micro": 8, "rmpad": True}  # one micro-batch: 51 packed tokens, a size no weight has
    model, _dims, groups = _build("actor", settings, 1)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    data = _batch()
    role = _role(
        "actor", settings, model, torch.optim.SGD(model.parameters(), lr=1.0), groups, 8, "token-mean"
    )
    role.update = dataclasses.replace(role.update, offload_activations=offload)
    seen: list[int] = []
    shapes: set[tuple[int, ...]] = set()

    class Counting(ActivationOffload):  # the real hooks, recording what each mini-batch's pass saved
        def _pack(self, tensor):
            before = self.saved
            packed = super()._pack(tensor)
            if self.saved > before:
                shapes.add(tuple(tensor.shape))
            return packed

        def __exit__(self, *exc):
            super().__exit__(*exc)
            seen.append(self.saved)

    with mock.patch("rlflow.engine.ppo_loop.ActivationOffload", Counting):
        metrics = role.update_policy(data)
    params = gather_full_params(model)
    weight_shapes = {
        s for p in params.values() if p.dim() == 2 for s in (tuple(p.shape), tuple(p.shape)[::-1])
    }
    return {"metrics": metrics, "params": params, "saved": seen, "weights_seen": shapes & weight_shapes}


def _bf16_role() -> dict:
    from rlflow.config import config_section
    from rlflow.config.engine_schema import FSDPConfig
    from rlflow.workers.role_setup import RoleLayout, build_role_module, setup_role_parallel

    model_cfg = config_section(
        "actor_rollout_ref.model",
        path="rlflow://tiny",
        use_remove_padding=False,
        enable_gradient_checkpointing=False,
    )
    out = {}
    for dtype in ("fp32", "bf16"):
        fsdp = dataclasses.replace(FSDPConfig(), model_dtype=dtype)
        layout = RoleLayout("actor_rollout_ref.actor", model_cfg, "fsdp2", 1, fsdp)
        from rlflow.models.loader import load_model_config
        from rlflow.workers.role_setup import model_path

        parallel = setup_role_parallel(1, layout, load_model_config(model_path(model_cfg)))
        module = build_role_module("causal_lm", layout, parallel)
        ids = torch.randint(1, 100, (2, 12), generator=torch.Generator().manual_seed(0))
        logits = module(input_ids=ids, use_cache=False).logits.float()
        dtypes = {p.dtype for p in module.parameters()}
        optim = torch.optim.AdamW(module.parameters(), lr=1e-3)
        logits.logsumexp(-1).mean().backward()
        optim.step()
        state_dtypes = {v.dtype for s in optim.state.values() for k, v in s.items() if k != "step"}
        out[dtype] = {"logits": logits.detach(), "dtypes": dtypes, "state": state_dtypes}
    return out


def _worker(rank: int) -> dict:
    return {"off": _actor_update(False), "on": _actor_update(True), "bf16": _bf16_role()}


@pytest.fixture(scope="module")
def results() -> dict:
    return spawn_workers(_worker, 1)[0]


def test_an_actor_update_with_activation_offload_equals_the_one_without(results):
    off, on = results["off"], results["on"]
    for key, value in off["metrics"].items():
        assert on["metrics"][key] == value, key
    for name, param in off["params"].items():
        assert torch.equal(on["params"][name], param), name
    # one mini-batch: the hooks saw its activations only when switched on
    assert off["saved"] == [0] and len(on["saved"]) == 1 and on["saved"][0] > 0
    # what it saw are activations (packed tokens x features), never an FSDP-gathered weight or its
    # transposed view (the LM head, outside the checkpointed layers, saves W^T for its input gradient)
    assert on["weights_seen"] == set()


def test_model_dtype_bf16_keeps_and_updates_bf16_weights(results):
    fp32, bf16 = results["bf16"]["fp32"], results["bf16"]["bf16"]
    assert fp32["dtypes"] == {torch.float32} and bf16["dtypes"] == {torch.bfloat16}
    assert bf16["state"] == {torch.bfloat16}  # AdamW's moments follow the weights
    # the same model rounded to bf16 (8 mantissa bits): logits of size ~1 agree to a few 1e-2
    scale = float(fp32["logits"].abs().max())
    err = float((bf16["logits"] - fp32["logits"]).abs().max())
    assert 0 < err < 0.05 * scale, (err, scale)
