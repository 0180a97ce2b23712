"""Fused LM head: log-probs and entropy of the labels straight from the hidden states.

``actor_rollout_ref.model.use_fused_kernels=true`` (verl's key; ``fused_kernel_options.impl_backend=torch``)
stops the actor and the reference from materialising the ``(tokens, vocab)`` logits of a micro-batch: for
a 150k vocabulary and 16k tokens those are 9.8 GB in fp32, plus as much again for their gradient, while
the trainer only needs two numbers per token. `fused_log_probs` walks the tokens in chunks of
``chunk_size``: per chunk it computes the logits, the label's ``log_softmax`` and the entropy, and keeps
nothing but the hidden states and the head's weight for backward, where it recomputes each chunk's
logits. Peak memory of the head: one chunk of logits instead of all of them.

Gradients, per token with ``z = logits / T``, ``p = softmax(z)``, ``H = -sum p log p``, incoming ``g``
(for the log-prob) and ``h`` (for the entropy)::

    d log p_y / dz = onehot(y) - p          d H / dz = -p * (log p + H)
    d / d logits = (g * (onehot(y) - p) - h * p * (log p + H)) / T

How the model uses it: `install_fused_head` replaces the model's output embedding (``lm_head``) with a
`FusedLMHead` holding the same weight parameter (same name, same tying, same FSDP sharding). Outside a
request it is the plain linear layer (generation, the HF generation replica, checkpoint export see an
ordinary model). Inside ``head.request(labels, temperature, entropy)`` (`rlflow.models.forward` opens
one around the model call) it returns ``(..., 2)`` per token: ``[log_prob, entropy]`` of the labels, so the
forward runs inside the model's own ``forward`` (FSDP's hooks gather and reduce the head's weight as
for the linear layer).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["FusedLMHead", "fused_head_of", "fused_log_probs", "install_fused_head"]

DEFAULT_CHUNK = 1024


def _chunk_stats(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(log_softmax(z) (n, V), log p of the labels (n,), entropy (n,))`` of one chunk, fp32 or wider."""
    z = (hidden @ weight.t()).to(_stats_dtype(hidden)) / temperature
    logp = torch.log_softmax(z, dim=-1)
    label_logp = logp.gather(-1, labels[:, None])[:, 0]
    entropy = -(logp.exp() * logp).sum(-1)
    return logp, label_logp, entropy


def _stats_dtype(hidden: torch.Tensor) -> torch.dtype:
    return torch.promote_types(hidden.dtype, torch.float32)


class _FusedLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        labels: torch.Tensor,
        temperature: float,
        chunk: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = hidden.shape[0]
        log_probs = hidden.new_empty(n, dtype=_stats_dtype(hidden))
        entropy = torch.empty_like(log_probs)
        for start in range(0, n, chunk):
            end = min(start + chunk, n)
            _, log_probs[start:end], entropy[start:end] = _chunk_stats(
                hidden[start:end], weight, labels[start:end], temperature
            )
        ctx.save_for_backward(hidden, weight, labels, entropy)
        ctx.temperature, ctx.chunk = temperature, chunk
        return log_probs, entropy

    @staticmethod
    def backward(ctx: Any, grad_log_probs: torch.Tensor, grad_entropy: torch.Tensor) -> tuple:
        hidden, weight, labels, entropy = ctx.saved_tensors
        temperature, chunk = ctx.temperature, ctx.chunk
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        acc = _stats_dtype(hidden)
        grad_weight = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_weight else None
        n = hidden.shape[0]
        zeros = hidden.new_zeros(n, dtype=acc)
        g_lp = zeros if grad_log_probs is None else grad_log_probs.to(acc)
        g_h = zeros if grad_entropy is None else grad_entropy.to(acc)
        for start in range(0, n, chunk):
            end = min(start + chunk, n)
            h = hidden[start:end]
            logp, _, _ = _chunk_stats(h, weight, labels[start:end], temperature)
            p = logp.exp()
            grad_z = -g_lp[start:end, None] * p - g_h[start:end, None] * p * (logp + entropy[start:end, None])
            grad_z.scatter_add_(-1, labels[start:end, None], g_lp[start:end, None])
            grad_logits = (grad_z / temperature).to(weight.dtype)
            if need_hidden:
                grad_hidden[start:end] = grad_logits @ weight
            if need_weight:
                grad_weight += grad_logits.to(acc).t() @ h.to(acc)
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None


def fused_log_probs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropy of ``labels`` under ``softmax(hidden @ weight.T / temperature)``, chunked.

    Args:
        hidden: (..., hidden_size) final hidden states.
        weight: (vocab, hidden_size) the LM head's weight.
        labels: (...) token ids, the shape of ``hidden`` without its last dimension.
        temperature: > 0.
        chunk_size: tokens per chunk (the logits of one chunk are the head's peak memory).

    Returns:
        ``(log_probs, entropy)``: each of shape ``labels.shape``, fp32 (fp64 inputs: fp64), differentiable with respect to
        ``hidden`` and ``weight``.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if tuple(labels.shape) != tuple(hidden.shape[:-1]):
        raise ValueError(
            f"labels {tuple(labels.shape)} must be the shape of hidden {tuple(hidden.shape)} minus the last dim"
        )
    flat = hidden.reshape(-1, hidden.shape[-1])
    log_probs, entropy = _FusedLogProbs.apply(
        flat, weight, labels.reshape(-1).long(), float(temperature), chunk_size
    )
    return log_probs.reshape(labels.shape), entropy.reshape(labels.shape)


@dataclass
class _Request:
    labels: torch.Tensor
    temperature: float


class FusedLMHead(nn.Module):
    """The LM head with a fused log-prob mode (see the module docstring). Holds the original ``weight``
    parameter (and ``bias`` when the head has one; then the fused mode is refused)."""

    def __init__(self, head: nn.Linear, chunk_size: int = DEFAULT_CHUNK) -> None:
        super().__init__()
        self.weight = head.weight
        self.bias = head.bias
        self.chunk_size = chunk_size
        self._request: _Request | None = None

    @property
    def in_features(self) -> int:
        return int(self.weight.shape[1])

    @property
    def out_features(self) -> int:
        return int(self.weight.shape[0])

    @contextlib.contextmanager
    def request(self, labels: torch.Tensor, temperature: float) -> Iterator[None]:
        """Within the block, ``forward`` returns ``[log_prob, entropy]`` of ``labels`` (the hidden shape minus
        its last dimension) instead of logits."""
        if self.bias is not None:
            raise ValueError(
                "use_fused_kernels: the model's LM head has a bias, which the fused head does not add"
            )
        self._request = _Request(labels, float(temperature))
        try:
            yield
        finally:
            self._request = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self._request is None:
            return F.linear(hidden, self.weight, self.bias)
        req = self._request
        log_probs, entropy = fused_log_probs(
            hidden, self.weight, req.labels, req.temperature, self.chunk_size
        )
        return torch.stack([log_probs, entropy], dim=-1)


def install_fused_head(model: nn.Module, chunk_size: int = DEFAULT_CHUNK) -> nn.Module:
    """Replace the output embedding of an HF causal LM by a `FusedLMHead` (same parameter); returns it."""
    head = model.get_output_embeddings()
    if isinstance(head, FusedLMHead):
        return model
    if not isinstance(head, nn.Linear):
        raise ValueError(
            f"actor_rollout_ref.model.use_fused_kernels=true needs a linear LM head; {type(model).__name__} has "
            f"{type(head).__name__}"
        )
    model.set_output_embeddings(FusedLMHead(head, chunk_size))
    return model


def fused_head_of(module: nn.Module) -> FusedLMHead | None:
    """The `FusedLMHead` of ``module`` (an HF model, possibly FSDP1-wrapped), or None."""
    inner = getattr(module, "module", module)  # FSDP1 wrapper
    get = getattr(inner, "get_output_embeddings", None)
    head = get() if callable(get) else None
    return head if isinstance(head, FusedLMHead) else None
