"""A lean decoding step for Llama-family decoders, used by the HF rollout after transformers' prefill.

One decoding step of transformers' model forward costs, at the sizes rlflow's CPU runs use, more in
per-call Python and small ops than in arithmetic: building the 4-D mask from the 2-D one, the rotary
embedding, three projections for q, k and v and two for gate and up, output dataclasses. `FastDecoder`
runs the same step from the model's own modules with the projections of a layer fused into one matrix
each (q|k|v and gate|up, concatenated once per generation call, since the weights change every training
step), the keys and values written into the `PreallocatedCache` that transformers' prefill filled, and the
attention of one query token per row as two small matrix products over the cache with an additive mask
row.

The rotary embedding comes from the model's own ``rotary_emb`` module, so every RoPE variant it implements
is kept.

A decoding step multiplies a few rows by every weight of the model, so its projections run at the speed
the GEMM kernel streams weights (`Projection`). Where torch was built with oneDNN, the weights are
reordered once per generation call into oneDNN's blocked layout and multiplied with its
``_linear_pointwise`` kernel: all of them when they do not fit in the last-level cache together, else
those of 1 MiB or more (`PACK_MIN_BYTES`). On the 2-core AMD EPYC of docs/benchmarks.md, at the 13M bench model's
shapes and 16 rows, the 24 projections of a step take 3.2 ms that way and 5.5 ms through MKL. Other
projections are ``weight @ x.T``, BLAS's faster kernel for a tall weight times a narrow input.

Used on the CPU for ``Qwen2ForCausalLM``, ``LlamaForCausalLM``, ``MistralForCausalLM`` (no sliding window)
and ``Qwen3ForCausalLM`` with SiLU MLPs, standard RMSNorms and one tensor-parallel slice; any other model,
configuration or device decodes through transformers' forward (`fast_decoder_for` returns None; on an
accelerator the fused copies would hold most of the model's weights a second time). Its log-probs
equal transformers' to float rounding (``tests/rollout/test_fast_decode.py``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from rlflow.models.cpu_linear import OneDNNLinear
from rlflow.rollout.kv_cache import PreallocatedCache, supports_preallocated_cache
from rlflow.utils.onednn import onednn_linear, onednn_linear_available, reorder_linear_weight

__all__ = [
    "FastDecoder",
    "Projection",
    "fast_decoder_for",
    "last_level_cache_bytes",
    "packed_projections_available",
]

_CLASSES = ("Qwen2ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM", "Qwen3ForCausalLM")
_NORMS = ("Qwen2RMSNorm", "LlamaRMSNorm", "MistralRMSNorm", "Qwen3RMSNorm")
_LINEARS = (nn.Linear, OneDNNLinear)  # projections whose forward is ``F.linear`` (the step reads the weights)


def _rms_norm(x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    """transformers' RMSNorm (float32 statistics, the weight applied in the input dtype)."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), norm.weight, norm.variance_epsilon)
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * h.to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x`` (rows, heads, d), half-split layout: transformers' ``x * cos +
    rotate_half(x) * sin`` with ``rotate_half(x) * sin`` as ``roll(x, d / 2) * signed_sin`` (`_signed_sin`),
    the same products with the sign moved from ``x`` to ``sin``, so the same floats in two fewer ops.

    Args:
        x: (rows, heads, d).
        cos: (rows, 1, d).
        signed_sin: (rows, 1, d), `_signed_sin` of the step's ``sin``.
    """
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


def _signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """``sin`` with its first half negated (the sign ``rotate_half`` puts on the second half of ``x``)."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for the few rows of a decoding step, computed as ``weight @ x.T``.

    With 16 rows and weights that do not stay in cache between steps, the BLAS kernel for a tall
    weight times a narrow input is 1.4-2x faster than the one for a short input times a wide weight
    (measured on the 13M bench model's shapes: (3072, 384) 842 -> 510 us, (384, 1536) 319 -> 228 us).

    Args:
        x: (rows, in) activations.
        weight: (out, in).
        bias: (out,) or None.

    Returns:
        (rows, out), a transposed view (the next product reads its transpose, which is contiguous).
    """
    out = torch.mm(weight, x.t()) if bias is None else torch.addmm(bias[:, None], weight, x.t())
    return out.t()


_PACKED_DTYPES = (torch.float32, torch.bfloat16)
PACK_MIN_BYTES = 1 << 20
"""Smallest weight a `Projection` packs in a model whose projection weights fit in the last-level cache.
Below about 1 MiB a weight that stays in cache between steps costs more in oneDNN's per-call overhead than
its kernel saves (16 rows: (128, 128) 7.8 us with ``weight @ x.T``, 17.7 us packed; (384, 384) 35 and
37 us; (768, 384) 67 and 60 us; (3072, 384) 255 and 188 us). A model whose weights do not fit streams
every weight from memory on every step, and there the packed kernel streams the small ones faster too:
the 13M bench model (53 MB, 32 MiB L3) decodes 16 x 127 steps in 424 ms with every weight packed, against
447-467 ms with the (384, 384) output projections and the LM head unpacked (`FastDecoder`)."""

_DEFAULT_LLC_BYTES = 32 << 20
_SIZE_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


@functools.cache
def last_level_cache_bytes() -> int:
    """The CPU's last-level cache in bytes, from sysfs (Linux; read once per process); 32 MiB where it
    cannot be read."""
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    sizes = []
    for index in base.glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        if text[-1:] in _SIZE_UNITS and text[:-1].isdigit():
            sizes.append(int(text[:-1]) * _SIZE_UNITS[text[-1]])
        elif text.isdigit():
            sizes.append(int(text))
    return max(sizes, default=_DEFAULT_LLC_BYTES)


def packed_projections_available() -> bool:
    """True when this torch build multiplies by oneDNN-reordered weights on the CPU (`Projection`), as a
    probe checks (`rlflow.utils.onednn.onednn_linear_available`)."""
    return onednn_linear_available(packed=True)


class Projection:
    """``F.linear(x, weight, bias)`` for the few rows of a decoding step, with the weight fixed for the
    whole generation call.

    Packed (oneDNN present, fp32 or bf16, a weight of at least ``min_bytes``): the weight is reordered once
    into oneDNN's blocked layout (a copy: the projection does not follow later in-place updates of
    ``weight``). Else ``weight @ x.T`` (`_linear`) on the weight itself.

    Args:
        weight: (out, in).
        bias: (out,) or None.
        pack: use the packed kernel where `packed_projections_available`.
        min_bytes: pack only weights at least this large; None = `PACK_MIN_BYTES`.
    """

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        pack: bool = True,
        min_bytes: int | None = None,
    ) -> None:
        smallest = PACK_MIN_BYTES if min_bytes is None else min_bytes
        self.packed = (
            pack
            and weight.dtype in _PACKED_DTYPES
            and weight.numel() * weight.element_size() >= smallest
            and packed_projections_available()
        )
        weight, bias = weight.detach(), None if bias is None else bias.detach()
        self.weight = reorder_linear_weight(weight) if self.packed else weight
        self.bias = bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """(rows, in) -> (rows, out)."""
        if self.packed:
            return onednn_linear(x.contiguous(), self.weight, self.bias)
        return _linear(x, self.weight, self.bias)


def _cat_bias(*layers: nn.Linear) -> torch.Tensor | None:
    biases = [layer.bias for layer in layers]
    if all(b is None for b in biases):
        return None
    return torch.cat(
        [
            b if b is not None else layer.weight.new_zeros(layer.out_features)
            for b, layer in zip(biases, layers)
        ]
    )


@dataclass
class _Layer:
    ln1: nn.Module
    qkv: Projection  # hidden -> (q + k + v heads) * d
    q_norm: nn.Module | None
    k_norm: nn.Module | None
    o_proj: Projection
    ln2: nn.Module
    gate_up: Projection  # hidden -> 2 * intermediate
    down: Projection
    scaling: float


def fast_decoder_for(model: nn.Module) -> FastDecoder | None:
    """A `FastDecoder` over ``model`` on the CPU when its architecture is one it reproduces (to float
    rounding), else None.

    Args:
        model: an unsharded HF causal LM (the rollout's generation replica or a plain module).
    """
    if type(model).__name__ not in _CLASSES:
        return None
    if next(model.parameters()).device.type != "cpu":
        # an accelerator would hold the fused copies of the projections next to the weights (most of the
        # model twice), and other backends (e.g. lazy tensors) run transformers' forward as it is
        return None
    config = model.config
    inner = getattr(model, "model", None)
    if (
        inner is None
        or not supports_preallocated_cache(config)
        or getattr(config, "hidden_act", None) != "silu"
        or getattr(config, "pretraining_tp", 1) != 1
        or not hasattr(inner, "rotary_emb")
    ):
        return None
    for layer in inner.layers:
        norms = [layer.input_layernorm, layer.post_attention_layernorm]
        attn = layer.self_attn
        norms += [n for n in (getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)) if n is not None]
        if (
            any(type(n).__name__ not in _NORMS for n in norms)
            or type(layer.mlp.act_fn).__name__ != "SiLUActivation"
        ):
            return None
        if any(
            type(getattr(attn, p, None)) not in _LINEARS for p in ("q_proj", "k_proj", "v_proj", "o_proj")
        ):
            return None
        if any(
            type(getattr(layer.mlp, p, None)) not in _LINEARS for p in ("gate_proj", "up_proj", "down_proj")
        ):
            return None
    if type(inner.norm).__name__ not in _NORMS or type(model.lm_head) not in _LINEARS:
        return None
    return FastDecoder(model)


class FastDecoder:
    """Decoding steps of one generation call (see the module docstring); build it after the weights are
    final for the call (it concatenates the projections once).

    Args:
        model: a model `fast_decoder_for` accepted.
        pack: projections through oneDNN-reordered weights where available (`Projection`).
        min_bytes: the smallest weight packed; None = every weight when the decoder's projection weights
            exceed the last-level cache (`last_level_cache_bytes`), else `PACK_MIN_BYTES`.
    """

    def __init__(self, model: nn.Module, pack: bool = True, min_bytes: int | None = None) -> None:
        config = model.config
        if min_bytes is None:
            streamed = sum(
                m.weight.numel() * m.weight.element_size() for m in model.modules() if isinstance(m, _LINEARS)
            )
            min_bytes = 0 if streamed > last_level_cache_bytes() else PACK_MIN_BYTES
        self.model = model
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.heads)
        self.layers = []
        with torch.no_grad():
            for layer in model.model.layers:
                attn, mlp = layer.self_attn, layer.mlp
                qkv = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
                gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
                self.layers.append(
                    _Layer(
                        ln1=layer.input_layernorm,
                        qkv=Projection(
                            qkv, _cat_bias(attn.q_proj, attn.k_proj, attn.v_proj), pack, min_bytes
                        ),
                        q_norm=getattr(attn, "q_norm", None),
                        k_norm=getattr(attn, "k_norm", None),
                        o_proj=Projection(attn.o_proj.weight, attn.o_proj.bias, pack, min_bytes),
                        ln2=layer.post_attention_layernorm,
                        gate_up=Projection(gate_up, _cat_bias(mlp.gate_proj, mlp.up_proj), pack, min_bytes),
                        down=Projection(mlp.down_proj.weight, mlp.down_proj.bias, pack, min_bytes),
                        scaling=float(getattr(attn, "scaling", self.head_dim**-0.5)),
                    )
                )
            self.lm_head = Projection(model.lm_head.weight, model.lm_head.bias, pack, min_bytes)

    @torch.no_grad()
    def step(
        self,
        token: torch.Tensor,
        position: torch.Tensor,
        attention_mask: torch.Tensor,
        cache: PreallocatedCache,
    ) -> torch.Tensor:
        """One decoding step: append ``token`` to every row and return the next-token logits.

        Args:
            token: (rows,) the tokens just sampled.
            position: (rows, 1) their positions.
            attention_mask: (rows, cached + 1) 1 on the tokens each row attends to (left padding 0).
            cache: the `PreallocatedCache` of this call (holds ``cached`` positions; this step appends one).

        Returns:
            (rows, vocab) logits in the model's dtype.
        """
        model, rows = self.model, token.shape[0]
        x = model.model.embed_tokens(token)
        cos, sin = model.model.rotary_emb(x[:, None], position)  # (rows, 1, d)
        sin = _signed_sin(sin)
        bias = torch.zeros(attention_mask.shape, dtype=x.dtype, device=x.device)
        bias.masked_fill_(attention_mask == 0, torch.finfo(x.dtype).min)
        bias = bias[:, None, None, :]  # (rows, 1, 1, keys): the same row for every head of a group
        q_size, kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        group = self.heads // self.kv_heads
        for i, layer in enumerate(self.layers):
            h = _rms_norm(x, layer.ln1)
            qkv = layer.qkv(h)
            v = qkv[:, q_size + kv_size :].reshape(rows, self.kv_heads, self.head_dim)
            if layer.q_norm is None:  # q and k rotated together
                qk = qkv[:, : q_size + kv_size].reshape(rows, self.heads + self.kv_heads, self.head_dim)
                qk = _rotate(qk, cos, sin)
                q, k = qk[:, : self.heads], qk[:, self.heads :]
            else:
                q = _rms_norm(qkv[:, :q_size].reshape(rows, self.heads, self.head_dim), layer.q_norm)
                k = _rms_norm(
                    qkv[:, q_size : q_size + kv_size].reshape(rows, self.kv_heads, self.head_dim),
                    layer.k_norm,
                )
                q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
            keys, values = cache.layers[i].update(k[:, :, None], v[:, :, None])  # (rows, kv, keys, d)
            scores = torch.matmul(
                q.reshape(rows, self.kv_heads, group, self.head_dim), keys.transpose(-1, -2)
            )
            scores = scores.float().mul_(layer.scaling).add_(bias)
            attn = torch.matmul(torch.softmax(scores, dim=-1).to(values.dtype), values)
            x = x + layer.o_proj(attn.reshape(rows, q_size))
            h = _rms_norm(x, layer.ln2)
            gate, up = layer.gate_up(h).chunk(2, dim=-1)
            x = x + layer.down(F.silu(gate) * up)
        return self.lm_head(_rms_norm(x, model.model.norm)).contiguous()
