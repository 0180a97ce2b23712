"""Multi-token prediction (MTP): the extra prediction layers of DeepSeek-V3, GLM-4.5 and Nemotron-H
checkpoints, loaded, trained with their loss and saved back.

At depth ``k = 1 .. D`` an MTP layer combines the previous depth's hidden state at position ``t`` (depth 0:
the main model's final, normed hidden state, the LM head's input) with the embedding of token
``x[t + k]``, and predicts ``x[t + k + 1]`` through the model's own LM head::

    h_k[t] = final_norm(blocks(eh_proj(cat(enorm(embed(x[t + k])), hnorm(h_{k-1}[t])))))
    logits_k[t] = lm_head(h_k[t])

``blocks`` are the architecture's own decoder blocks (Nemotron-H: the ``mtp_layers_block_type`` pattern,
e.g. ``*E`` = an attention block then a mixture-of-experts block; other decoders: one decoder layer) and
attend causally with the main model's attention mask and rotary embeddings. With ``use_repeated_layer``
one physical layer serves every depth (Megatron's ``mtp_use_repeated_layer``).

Hugging Face drops these weights on load (``_keys_to_ignore_on_load_unexpected``); `install_mtp` builds
the layers as the model's submodule ``mtp`` and reads them from the checkpoint's safetensors in the
architecture's names (`MTPLayout`), or initialises them when the checkpoint has none (logged).
`checkpoint_tensors` gives them back in those names for export.

The loss (`MultiTokenPredictor.request`, opened by `rlflow.models.forward`): the MTP layers run inside the
model's forward, from a pre-hook the request puts on the LM head (so FSDP gathers their weights as for the
head; the fused head, `rlflow.models.fused_head`, included), on the
token streams `depth_streams` rolled from the micro-batch; each depth's cross-entropy is summed over the
response tokens it predicts. ``detach_encoder`` feeds the layers detached hidden states, embeddings and
head weight: the loss then trains the MTP layers only.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from rlflow.models.fused_head import fused_log_probs

__all__ = [
    "MTP_ATTR",
    "MTPLayout",
    "MTPSpec",
    "MultiTokenPredictor",
    "checkpoint_tensors",
    "depth_masks",
    "depth_streams",
    "install_mtp",
    "is_mtp_name",
    "mtp_layout",
    "predictor_of",
    "read_tensors",
    "split_for_export",
    "write_checkpoint_tensors",
]

logger = logging.getLogger(__name__)

MTP_ATTR = "mtp"
_PATTERN_CHARS = {"*": "full_attention", "E": "moe", "-": "mlp", "M": "linear_attention"}


def is_mtp_name(name: str) -> bool:
    """Whether a parameter / module name of the model lies in its MTP layers."""
    return f".{MTP_ATTR}." in f".{name}."


@dataclass(frozen=True)
class MTPSpec:
    """What the actor does with the MTP layers (``actor_rollout_ref.model.mtp``).

    Attributes:
        depths: prediction depths ``D`` run and trained.
        train: add the MTP loss (``enable_train``); otherwise the layers are loaded, frozen and saved.
        detach_encoder: the loss reaches the MTP layers only.
        loss_scale: ``mtp_loss_scaling_factor``; the actor adds ``loss_scale / D * sum_k loss_k``.
        repeated: one physical layer serves every depth.
        pattern: Nemotron-H's block pattern asked for (``mtp_hybrid_override_pattern``); None = the
            checkpoint's.
    """

    depths: int
    train: bool = False
    detach_encoder: bool = False
    loss_scale: float = 0.1
    repeated: bool = False
    pattern: str | None = None


@dataclass(frozen=True)
class MTPLayout:
    """An architecture's MTP layers: how many the checkpoint holds, their blocks, their checkpoint names.

    Attributes:
        name: ``"nemotron_h"`` (``mtp.layers.{i}.*``, the blocks of all layers numbered in one run) or
            ``"deepseek"`` (``model.layers.{num_hidden_layers + p}.*``, ``shared_head.norm``: DeepSeek-V3,
            GLM-4.5 and the plain decoders).
        physical: MTP layers in the checkpoint's config (``num_nextn_predict_layers``); 0 = none.
        block_types: Nemotron-H's per-layer block types; empty for one decoder layer per MTP layer.
        num_hidden_layers: the main model's layers.
    """

    name: str
    physical: int
    block_types: tuple[str, ...] = ()
    num_hidden_layers: int = 0

    def blocks_per_layer(self) -> int:
        return len(self.block_types) or 1

    def to_checkpoint(self, name: str) -> str:
        """The checkpoint's name of an rlflow MTP tensor name (``layers.{p}.…`` relative to ``mtp``)."""
        parts = name.split(".")
        p, rest = int(parts[1]), parts[2:]
        if self.name == "nemotron_h":
            if rest[0] == "blocks":
                return f"mtp.layers.{p * self.blocks_per_layer() + int(rest[1])}." + ".".join(rest[2:])
            last = p * self.blocks_per_layer() + (
                self.blocks_per_layer() - 1 if rest[0] == "final_layernorm" else 0
            )
            return f"mtp.layers.{last}." + ".".join(rest)
        base = f"model.layers.{self.num_hidden_layers + p}."
        if rest[0] == "blocks":
            return base + ".".join(rest[2:])
        if rest[0] == "final_layernorm":
            return base + "shared_head.norm." + ".".join(rest[1:])
        return base + ".".join(rest)


def mtp_layout(config: Any) -> MTPLayout:
    """The MTP layout of an HF config.

    Raises:
        ValueError: an architecture whose MTP layers rlflow does not build.
    """
    config = getattr(config, "get_text_config", lambda: config)()
    model_type = str(getattr(config, "model_type", ""))
    physical = int(getattr(config, "num_nextn_predict_layers", 0) or 0)
    if model_type == "nemotron_h":
        types = tuple(getattr(config, "mtp_layers_block_type", None) or ("full_attention", "moe"))
        return MTPLayout("nemotron_h", physical, types, len(config.layers_block_type))
    layer_types = [str(t) for t in (getattr(config, "layer_types", None) or ())]
    if model_type in ("qwen3_next", "qwen3_5", "qwen3_5_moe", "mimo", "mimo_v2_flash", "deepseek_v4") or any(
        t not in ("full_attention",) for t in layer_types
    ):
        raise ValueError(
            f"multi-token prediction for {model_type!r} models (hybrid or sliding-window layers) is not built by "
            "rlflow: it builds Nemotron-H's MTP layers and the DeepSeek-V3 layout of full-attention decoders "
            "(DeepSeek-V3, GLM-4.5, Llama, Qwen)"
        )
    return MTPLayout("deepseek", physical, (), int(config.num_hidden_layers))


def _rms_norm(model: nn.Module, hidden: int, eps: float) -> nn.Module:
    """An RMSNorm of the model's own class when it has one at ``model.model.norm`` / ``norm_f``, else torch's."""
    inner = getattr(model, "model", model)
    norm = getattr(inner, "norm", None) or getattr(inner, "norm_f", None)
    if norm is not None:
        try:
            return type(norm)(hidden, eps=eps)
        except TypeError:
            pass
    return nn.RMSNorm(hidden, eps=eps)


class MTPLayer(nn.Module):
    """One physical MTP layer: fusion (``enorm``, ``hnorm``, ``eh_proj``), ``blocks``, ``final_layernorm``."""

    def __init__(self, model: nn.Module, blocks: list[nn.Module], hidden: int, eps: float) -> None:
        super().__init__()
        self.enorm = _rms_norm(model, hidden, eps)
        self.hnorm = _rms_norm(model, hidden, eps)
        self.eh_proj = nn.Linear(2 * hidden, hidden, bias=False)
        self.blocks = nn.ModuleList(blocks)
        self.final_layernorm = _rms_norm(model, hidden, eps)

    def forward(
        self, embeds: torch.Tensor, hidden: torch.Tensor, block_kwargs: dict[str, Any]
    ) -> torch.Tensor:
        """(..., s, H) embeddings of the shifted tokens and previous-depth hidden states -> (..., s, H)."""
        h = self.eh_proj(torch.cat([self.enorm(embeds), self.hnorm(hidden)], dim=-1))
        for block in self.blocks:
            out = block(h, **block_kwargs)
            h = out[0] if isinstance(out, tuple) else out
        return self.final_layernorm(h)


@dataclass
class _Request:
    input_ids: list[torch.Tensor]
    labels: list[torch.Tensor]
    masks: list[torch.Tensor]
    block_kwargs: dict[str, Any] = field(default_factory=dict)
    loss_sums: torch.Tensor | None = None
    counts: torch.Tensor | None = None


class MultiTokenPredictor(nn.Module):
    """The model's MTP layers (submodule ``mtp``); runs inside the model's forward during a `request`."""

    def __init__(self, model: nn.Module, layout: MTPLayout, spec: MTPSpec, physical: int) -> None:
        super().__init__()
        config = model.config.get_text_config()
        hidden = int(config.hidden_size)
        eps = float(getattr(config, "rms_norm_eps", None) or getattr(config, "layer_norm_epsilon", 1e-6))
        self.layout, self.spec = layout, spec
        self.layers = nn.ModuleList(
            [MTPLayer(model, _build_blocks(model, layout, p), hidden, eps) for p in range(physical)]
        )
        self._request: _Request | None = None
        self._model = [model]  # a list: not a submodule (no cycle in the module tree)

    @contextlib.contextmanager
    def request(
        self, input_ids: list[torch.Tensor], labels: list[torch.Tensor], masks: list[torch.Tensor]
    ) -> Iterator[_Request]:
        """Run the MTP layers in the model forward(s) inside this context; the yielded request then holds
        ``loss_sums`` (D,) (each depth's cross-entropy summed over its masked positions, differentiable) and
        ``counts`` (D,). ``input_ids[k]`` / ``labels[k]`` / ``masks[k]``: depth ``k + 1``'s streams in the
        layout of the model's input (`depth_streams`)."""
        model = self._model[0]
        self._request = _Request(input_ids, labels, masks)
        # hooks for this request only, on the modules the model holds now (the fused head replaces the LM head)
        handles = [
            _capture_layer(model, self.layout).register_forward_pre_hook(self._capture, with_kwargs=True),
            model.get_output_embeddings().register_forward_pre_hook(self._run),
        ]
        try:
            yield self._request
        finally:
            for handle in handles:
                handle.remove()
            self._request = None

    def _capture(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        if self._request is not None:
            keep = {
                k: v for k, v in kwargs.items() if k not in ("hidden_states", "past_key_values", "use_cache")
            }
            self._request.block_kwargs = {**keep, "use_cache": False}

    def _run(self, module: nn.Module, args: tuple) -> None:
        req = self._request
        if req is None or req.loss_sums is not None:
            return
        hidden, weight = args[0], module.weight
        embed = self._model[0].get_input_embeddings()
        if self.spec.detach_encoder:
            hidden, weight = hidden.detach(), weight.detach()
        sums, counts = [], []
        for k in range(self.spec.depths):
            layer = self.layers[0 if self.spec.repeated else k]
            embeds = embed(req.input_ids[k])
            if self.spec.detach_encoder:
                embeds = embeds.detach()
            hidden = layer(embeds.to(hidden.dtype), hidden, req.block_kwargs)
            mask = req.masks[k].bool()
            log_probs, _ = fused_log_probs(hidden[mask], weight, req.labels[k][mask])
            sums.append(-log_probs.sum())
            counts.append(mask.sum())
        req.loss_sums, req.counts = torch.stack(sums), torch.stack(counts).float()


def _build_blocks(model: nn.Module, layout: MTPLayout, p: int) -> list[nn.Module]:
    """The decoder blocks of physical MTP layer ``p``, of the model's own classes and on its config object
    (so they follow its attention implementation, e.g. ``set_packed_attention``); the config's per-layer
    types are extended while they are built, then restored."""
    config = model.config.get_text_config()
    layers = model.model.layers
    saved = getattr(config, "layer_types", None)
    try:
        if layout.name == "nemotron_h":
            first = len(config.layers_block_type)
            config.layer_types = list(saved) + list(layout.block_types)
            return [type(layers[0])(config, first + b) for b in range(len(layout.block_types))]
        index = layout.num_hidden_layers + p
        if saved is not None:  # per-layer attention kinds: the MTP layer attends fully
            config.layer_types = list(saved) + ["full_attention"] * (index + 1 - len(saved))
        return [type(layers[-1])(config, index)]
    finally:
        if saved is not None:
            config.layer_types = saved


def _capture_layer(model: nn.Module, layout: MTPLayout) -> nn.Module:
    """The main layer whose keyword arguments (attention mask, positions, rotary embeddings) the MTP blocks
    reuse: the last full-attention layer."""
    layers = list(model.model.layers)
    if layout.name == "nemotron_h":
        attention = [layer for layer in layers if getattr(layer, "block_type", None) == "full_attention"]
        if not attention:
            raise ValueError("Nemotron-H multi-token prediction needs an attention layer in the main model")
        return attention[-1]
    return layers[-1]


def predictor_of(model: nn.Module) -> MultiTokenPredictor | None:
    """The model's `MultiTokenPredictor` (through FSDP1's wrapper), or None."""
    inner = getattr(model, "_fsdp_wrapped_module", model)
    found = getattr(inner, MTP_ATTR, None)
    return found if isinstance(found, MultiTokenPredictor) else None


def install_mtp(model: nn.Module, spec: MTPSpec, path: str | None, seed: int = 0) -> MultiTokenPredictor:
    """Build the model's MTP layers as ``model.mtp`` and read their weights from the checkpoint at ``path``
    (None: architecture only, e.g. on ``meta``). A checkpoint without them gets fresh layers, initialised
    by the architecture's own ``_init_weights`` from ``seed``, logged.

    Raises:
        ValueError: the architecture is not supported, the pattern or depths do not fit the checkpoint's
            layers, or the checkpoint holds some of the layers' tensors but not all.
    """
    config = model.config.get_text_config()
    layout = mtp_layout(config)
    if spec.pattern is not None and layout.name != "nemotron_h":
        raise ValueError(
            f"hybrid_override_pattern={spec.pattern!r} sets Nemotron-H's MTP blocks; a "
            f"{getattr(config, 'model_type', '?')} MTP layer is one decoder layer: set null"
        )
    if spec.pattern is not None:
        asked = tuple(_PATTERN_CHARS.get(c, c) for c in spec.pattern)
        if layout.physical and asked != layout.block_types:
            raise ValueError(
                f"hybrid_override_pattern={spec.pattern!r} differs from the checkpoint's MTP blocks "
                f"{list(layout.block_types)}"
            )
        layout = MTPLayout(layout.name, layout.physical, asked, layout.num_hidden_layers)
    if any(t not in ("full_attention", "moe", "mlp") for t in layout.block_types):
        raise ValueError(
            f"MTP blocks {list(layout.block_types)}: rlflow builds attention, moe and mlp blocks"
        )
    physical = 1 if spec.repeated else spec.depths
    if layout.physical and physical > layout.physical:
        raise ValueError(
            f"{spec.depths} MTP depths need {physical} MTP layers, the checkpoint has {layout.physical} "
            "(num_nextn_predict_layers): set mtp.num_layers (Megatron's mtp_num_layers) to at most that, or "
            "mtp.use_repeated_layer=true"
        )
    with torch.device(next(model.parameters()).device):  # on meta for the ranks that receive shards
        predictor = MultiTokenPredictor(model, layout, spec, physical)
    setattr(model, MTP_ATTR, predictor)
    dtype = next(model.parameters()).dtype
    predictor.to(dtype)
    if path is not None:
        _load_or_init(model, predictor, path, seed)
    if not spec.train:
        predictor.requires_grad_(False)
    return predictor


def read_tensors(path: str, names: set[str]) -> dict[str, torch.Tensor]:
    """The tensors of ``names`` found in the safetensors files of the checkpoint directory ``path``."""
    from pathlib import Path

    from safetensors import safe_open

    found: dict[str, torch.Tensor] = {}
    for file in sorted(Path(path).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for key in names.intersection(f.keys()):
                found[key] = f.get_tensor(key)
    return found


def write_checkpoint_tensors(out_dir: str, tensors: dict[str, torch.Tensor], physical: int) -> None:
    """Add the MTP tensors (checkpoint names) to a saved checkpoint: ``model-mtp.safetensors``, listed in
    ``model.safetensors.index.json`` (written for a single-file checkpoint), and the config's
    ``num_nextn_predict_layers`` (= ``physical``, the MTP layers), so Hugging Face, vLLM and rlflow find
    them."""
    import json
    from pathlib import Path

    from safetensors import safe_open
    from safetensors.torch import save_file

    out = Path(out_dir)
    save_file(
        {k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(out / "model-mtp.safetensors")
    )
    index_file = out / "model.safetensors.index.json"
    if index_file.exists():
        index = json.loads(index_file.read_text())
    else:
        with safe_open(str(out / "model.safetensors"), framework="pt") as f:
            index = {"metadata": {}, "weight_map": {k: "model.safetensors" for k in f.keys()}}
    index["weight_map"].update({k: "model-mtp.safetensors" for k in tensors})
    index_file.write_text(json.dumps(index, indent=2, sort_keys=True))
    config_file = out / "config.json"
    saved = json.loads(config_file.read_text())
    saved["num_nextn_predict_layers"] = physical
    config_file.write_text(json.dumps(saved, indent=2, sort_keys=True))


def _load_or_init(model: nn.Module, predictor: MultiTokenPredictor, path: str, seed: int) -> None:
    names = {name: predictor.layout.to_checkpoint(name) for name, _ in predictor.named_parameters()}
    found = read_tensors(path, set(names.values()))
    if not found:  # fresh layers, initialised as the architecture initialises its own (from seed)
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(seed)
            predictor.apply(model._init_weights)
        logger.warning(
            "%s holds no MTP weights: the %d MTP layer(s) start from fresh weights",
            path,
            len(predictor.layers),
        )
        return
    missing = sorted(ckpt for ckpt in names.values() if ckpt not in found)
    if missing:
        raise ValueError(f"{path}: the checkpoint's MTP layers lack {missing[:4]} ({len(missing)} tensors)")
    with torch.no_grad():
        for name, param in predictor.named_parameters():
            tensor = found[names[name]]
            if tuple(tensor.shape) != tuple(param.shape):
                raise ValueError(
                    f"{path}: {names[name]} has shape {tuple(tensor.shape)}, the MTP layer needs {tuple(param.shape)}"
                )
            param.copy_(tensor.to(param.dtype))


def checkpoint_tensors(
    model: nn.Module, state: dict[str, torch.Tensor]
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Split a full state dict into the main model's tensors and the MTP tensors in the checkpoint's names
    (the layout of the model's predictor, or, for a model without one, e.g. the merger's, of its config)."""
    predictor = predictor_of(model)
    if predictor is None and not any(is_mtp_name(name) for name in state):
        return state, {}
    layout = predictor.layout if predictor is not None else mtp_layout(model.config)
    main, mtp = {}, {}
    for name, tensor in state.items():
        if is_mtp_name(name):
            mtp[layout.to_checkpoint(name.split(MTP_ATTR + ".", 1)[1])] = tensor
        else:
            main[name] = tensor
    return main, mtp


def depth_streams(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, response_mask: torch.Tensor, depths: int
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """Each depth's input tokens, labels and loss mask on the padded layout (rows: left-padded prompt,
    right-padded response).

    Depth ``k`` at position ``t`` reads ``x[t + k]`` and predicts ``x[t + k + 1]``; its mask is the main
    loss's mask (the positions whose next token is a response token) rolled ``k`` to the left, on valid
    positions only: each depth predicts every response token whose position ``- k - 1`` is in the row.

    Args:
        input_ids, attention_mask: (bs, seqlen).
        response_mask: (bs, response_len) the response tokens that count.
        depths: D.

    Returns:
        ``(input_ids_k, labels_k, masks_k)`` for k = 1 .. D, each (bs, seqlen).
    """
    ids = [_roll_left(input_ids, k) for k in range(1, depths + 1)]
    labels = [_roll_left(input_ids, k + 1) for k in range(1, depths + 1)]
    return ids, labels, depth_masks(attention_mask, response_mask, depths)


def depth_masks(attention_mask: torch.Tensor, response_mask: torch.Tensor, depths: int) -> list[torch.Tensor]:
    """The loss masks of `depth_streams` alone: (bs, seqlen) bool for k = 1 .. D."""
    main_mask = torch.zeros_like(attention_mask)
    r = response_mask.shape[1]
    main_mask[:, -r - 1 : -1] = response_mask.to(attention_mask.dtype)
    valid = attention_mask.bool()
    return [_roll_left(main_mask, k).bool() & valid for k in range(1, depths + 1)]


def _roll_left(x: torch.Tensor, k: int) -> torch.Tensor:
    """``x[:, t + k]`` at column ``t``; zeros past the row's end."""
    out = torch.zeros_like(x)
    out[:, : x.shape[1] - k] = x[:, k:]
    return out


def split_for_export(model: nn.Module, state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], Any]:
    """`rlflow.parallel.checkpoint.export_hf`'s ``split_fn``: the main model's tensors, and a writer adding
    the MTP layers' in the checkpoint's names (`write_checkpoint_tensors`); None when there are none."""
    main, mtp = checkpoint_tensors(model, state)
    if not mtp:
        return main, None
    physical = len({name.split(".")[2] for name in state if is_mtp_name(name)})  # mtp.layers.<p>.*
    return main, lambda out_dir: write_checkpoint_tensors(out_dir, mtp, physical)
