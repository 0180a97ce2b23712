"""rlflow.models.peft_adapter against PEFT itself (the independent reference for the on-disk format).

An adapter that ``peft`` trained and saved, loaded by rlflow (`adapter_spec` + `inject_lora` +
`apply_peft_adapter`), gives PEFT's logits; an adapter rlflow saved loads in ``PeftModel.from_pretrained``
and gives rlflow's logits (fp64, so the two sides differ by summation order only); and every malformed
or unsupported adapter is refused naming its file and field.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from transformers import Qwen2ForCausalLM

from rlflow.models.lora import LoRALinear, LoRASpec, inject_lora
from rlflow.models.peft_adapter import (
    ADAPTER_CONFIG,
    adapter_spec,
    apply_peft_adapter,
    check_peft_adapter,
    load_peft_weights,
    save_peft_adapter,
)
from rlflow.models.tiny import TinyModelConfig, build_tiny_model

peft = pytest.importorskip("peft")


def _base(seed: int = 0, layers: int = 2) -> Qwen2ForCausalLM:
    """The tiny Qwen2 (vocab 272, hidden 16) in fp64: both sides differ by summation order only."""
    config = TinyModelConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=layers)
    return build_tiny_model(config, seed=seed).to(torch.float64).eval()


def _ids() -> torch.Tensor:
    return torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(3))


def _randomize(params: list[nn.Parameter], seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in params:
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.3)


def _peft_adapter(tmp_path, **lora_kwargs) -> tuple[torch.Tensor, str]:
    """A PEFT model of `_base` with random A and B: its logits on `_ids` and its saved adapter dir."""
    model = peft.get_peft_model(_base(), peft.LoraConfig(task_type="CAUSAL_LM", **lora_kwargs))
    _randomize([p for n, p in model.named_parameters() if "lora_" in n], seed=5)
    out = tmp_path / "peft_adapter"
    model.save_pretrained(out)
    model.eval()  # get_peft_model leaves it in train mode (LoRA dropout on)
    with torch.no_grad():
        return model(_ids()).logits, str(out)


def _rlflow_model(path: str) -> Qwen2ForCausalLM:
    model = _base()
    inject_lora(model, adapter_spec(path))
    apply_peft_adapter(model, path)
    return model.eval()


@pytest.mark.parametrize(
    "lora_kwargs",
    [
        {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"},
        {"r": 2, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"], "use_rslora": True},
        {
            "r": 3,
            "lora_alpha": 5,
            "target_modules": ["q_proj", "down_proj"],
            "exclude_modules": ["1.mlp.down_proj"],
        },
        {"r": 4, "lora_alpha": 4, "target_modules": r".*\.mlp\.(gate|up)_proj", "lora_dropout": 0.1},
    ],
    ids=["all-linear", "rslora", "exclude", "regex+dropout"],
)
def test_an_adapter_peft_saved_gives_peft_logits_in_rlflow(tmp_path, lora_kwargs):
    expected, path = _peft_adapter(tmp_path, **lora_kwargs)
    model = _rlflow_model(path)
    adapted = {n for n, m in model.named_modules() if isinstance(m, LoRALinear)}
    assert adapted == set(load_peft_weights(path))
    if lora_kwargs.get("exclude_modules"):
        assert "model.layers.1.mlp.down_proj" not in adapted and "model.layers.0.mlp.down_proj" in adapted
    scale = lora_kwargs["lora_alpha"] / (
        lora_kwargs["r"] ** 0.5 if lora_kwargs.get("use_rslora") else lora_kwargs["r"]
    )
    scalings = {float(m.lora_scaling) for m in model.modules() if isinstance(m, LoRALinear)}
    assert len(scalings) == 1 and scalings.pop() == pytest.approx(scale, rel=1e-7)  # a float32 buffer
    with torch.no_grad():
        got = model(_ids()).logits
        base = _base()(_ids()).logits
    assert (expected - base).abs().max() > 1e-2  # the adapters move the logits...
    # ...and rlflow moves them as PEFT does; the scale is a float32 buffer (5/3, 16/sqrt(2) round at ~6e-8),
    # so the fp64 logits (of size ~1) agree to about that, not to fp64's 1e-15
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


def test_an_adapter_rlflow_saved_loads_in_peft_with_the_same_logits(tmp_path):
    model = _base()
    spec = LoRASpec(
        rank=3,
        alpha=6.0,
        target_modules=("q_proj", "up_proj", "o_proj"),
        exclude_modules=("0.self_attn.o_proj",),
    )
    inject_lora(model, spec)
    _randomize([m.lora_B for m in model.modules() if isinstance(m, LoRALinear)], seed=7)
    adapters = {n: (m.lora_A, m.lora_B) for n, m in model.named_modules() if isinstance(m, LoRALinear)}
    assert "model.layers.0.self_attn.o_proj" not in adapters and len(adapters) == 5
    out = save_peft_adapter(tmp_path / "lora_adapter", adapters, spec, "/models/base")
    config = json.loads((tmp_path / "lora_adapter" / ADAPTER_CONFIG).read_text())
    assert (config["r"], config["lora_alpha"], config["base_model_name_or_path"]) == (3, 6.0, "/models/base")

    loaded = peft.PeftModel.from_pretrained(_base(), out).eval()
    peft_adapted = {
        n.removeprefix("base_model.model.")
        for n, m in loaded.named_modules()
        if hasattr(m, "lora_A") and isinstance(m.lora_A, nn.ModuleDict)
    }
    assert peft_adapted == set(adapters)  # PEFT adapts exactly these modules (the exclusion held)
    with torch.no_grad():
        torch.testing.assert_close(loaded(_ids()).logits, model.eval()(_ids()).logits, rtol=0, atol=1e-10)

    again = _rlflow_model(out)  # and back: the same matrices, bit for bit
    for name, module in again.named_modules():
        if isinstance(module, LoRALinear):
            assert torch.equal(module.lora_A, adapters[name][0]) and torch.equal(
                module.lora_B, adapters[name][1]
            )


def test_a_value_model_adapter_rlflow_saved_loads_in_peft_with_its_head_and_the_same_values(tmp_path):
    """The critic's adapter (``critic/lora_adapter``): a ``TOKEN_CLS`` adapter with the value head among
    ``modules_to_save``; PEFT loads it on the untrained value model and computes rlflow's values."""
    from transformers import Qwen2ForTokenClassification

    from rlflow.models.lora import output_head

    def value_model() -> Qwen2ForTokenClassification:
        config = _base().config
        config.num_labels = 1
        torch.manual_seed(11)
        return Qwen2ForTokenClassification(config).to(torch.float64).eval()

    model = value_model()
    spec = LoRASpec(rank=2, alpha=4.0, key_prefix="critic.model")
    inject_lora(model, spec, trainable=[output_head(model)])
    _randomize([m.lora_B for m in model.modules() if isinstance(m, LoRALinear)], seed=7)
    _randomize([model.score.weight, model.score.bias], seed=8)  # the head trained too
    adapters = {n: (m.lora_A, m.lora_B) for n, m in model.named_modules() if isinstance(m, LoRALinear)}
    head = {"score.weight": model.score.weight, "score.bias": model.score.bias}
    out = save_peft_adapter(tmp_path / "lora_adapter", adapters, spec, "/models/base", head, "TOKEN_CLS")
    config = json.loads((tmp_path / "lora_adapter" / ADAPTER_CONFIG).read_text())
    assert (config["task_type"], config["modules_to_save"]) == ("TOKEN_CLS", ["score"])

    base = value_model()
    assert not torch.equal(base.score.weight, model.score.weight)
    loaded = peft.PeftModel.from_pretrained(base, out).eval()
    with torch.no_grad():
        expected = model.eval()(_ids()).logits
        torch.testing.assert_close(loaded(_ids()).logits, expected, rtol=0, atol=1e-10)


def _edit(path: str, **fields) -> str:
    file = f"{path}/{ADAPTER_CONFIG}"
    with open(file) as f:
        config = json.load(f)
    config.update(fields)
    with open(file, "w") as f:
        json.dump(config, f)
    return file


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"use_dora": True}, "use_dora=True (DoRA's magnitude vectors) is not supported"),
        ({"bias": "all"}, "bias='all' (trained biases) is not supported"),
        ({"modules_to_save": ["lm_head"]}, "modules_to_save=['lm_head'] (full copies of extra modules)"),
        ({"rank_pattern": {"q_proj": 8}}, "per-module ranks"),
        ({"peft_type": "IA3"}, "peft_type='IA3'; only LoRA adapters"),
        ({"r": 0}, "r=0 must be a positive integer"),
        ({"r": 5}, "says r=5"),
        ({"target_modules": None}, "target_modules=None must be a list"),
    ],
)
def test_unsupported_or_inconsistent_adapters_are_refused_naming_file_and_field(tmp_path, fields, message):
    _, path = _peft_adapter(tmp_path, r=4, lora_alpha=8, target_modules=["q_proj"])
    file = _edit(path, **fields)
    with pytest.raises(ValueError, match=r"adapter") as err:
        check_peft_adapter(path)
    assert message in str(err.value) and str(tmp_path) in str(err.value)
    assert file in str(err.value) or "adapter_model" in str(err.value)


def test_missing_files_and_a_foreign_base_model_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"lora_adapter_path='.*nowhere': not a PEFT adapter directory"):
        check_peft_adapter(tmp_path / "nowhere")
    _, path = _peft_adapter(tmp_path, r=4, lora_alpha=8, target_modules=["q_proj"])
    bigger = _base(layers=3)
    inject_lora(bigger, adapter_spec(path))
    with pytest.raises(ValueError, match=r"in the model only: \['model.layers.2.self_attn.q_proj'\]"):
        apply_peft_adapter(bigger, path)
    (tmp_path / "peft_adapter" / "adapter_model.safetensors").unlink()
    with pytest.raises(ValueError, match=r"no adapter_model.safetensors \(or adapter_model.bin\)"):
        check_peft_adapter(path)


def test_embedding_adapters_are_refused(tmp_path):
    model = peft.get_peft_model(_base(), peft.LoraConfig(r=2, target_modules=["embed_tokens", "q_proj"]))
    model.save_pretrained(tmp_path / "emb")
    with pytest.raises(ValueError, match=r"embed_tokens\..*' is not a LoRA matrix of a linear layer"):
        check_peft_adapter(tmp_path / "emb")
