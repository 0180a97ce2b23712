"""FLOPs of a decoder-only transformer and the peak FLOP/s of a device, for model FLOPs utilisation.

Formula (training = forward + backward, per token of a sequence of length ``S``)::

    flops_per_token = 6 * N  +  12 * L * H * S          (forward only: 2 * N + 4 * L * H * S)

* ``N`` is the number of weights that take part in a matrix multiply per token: per layer the attention
  projections ``q, o: h x (n_heads * d)`` and ``k, v: h x (n_kv_heads * d)``, the gated MLP
  ``gate, up, down: 3 * h * f`` (SwiGLU, as in Llama / Qwen2 / Mistral), plus the LM head ``h x V``.
  A mixture-of-experts layer counts what one token goes through: its router ``h x E``, its ``k`` chosen
  experts ``k * 3 * h * f_e`` and any shared expert (Qwen2-MoE's ``3 * h * f_s`` and its ``h x 1`` gate);
  layers that stay dense (Qwen-MoE's ``mlp_only_layers`` / ``decoder_sparse_step``) count the gated MLP.
  Mixture-of-experts layouts read: ``qwen2_moe``, ``qwen3_moe``, ``mixtral``, ``olmoe``.
  The input embedding is a lookup (no FLOPs) and is left out, as Kaplan et al. leave it out of ``N``;
  biases, norms, activations, softmax and rotary embeddings are ignored (well under 1% here).
  A matrix multiply costs 2 FLOPs per weight per token forward and 4 backward (gradients of the
  inputs and of the weights): ``6 N`` — Kaplan et al. 2020, "Scaling Laws for Neural Language Models",
  section 2.1 (arXiv:2001.08361); Hoffmann et al. 2022 (Chinchilla), appendix F (arXiv:2203.15556).
* ``12 * L * H * S`` is the attention score and value product: per layer and token ``Q K^T`` and
  ``A V`` cost ``2 * S * H`` FLOPs each forward, times 3 with the backward, where
  ``H = n_heads * head_dim``. This is the term of Chowdhery et al. 2022, "PaLM", appendix B
  (arXiv:2204.02311), which counts the full ``S x S`` score matrix (the causal mask is not discounted).
  Summed over a sequence the term is ``12 * L * H * S^2``, so a batch costs
  ``sum_i (6 N s_i + 12 L H s_i^2)`` for sequence lengths ``s_i``.

Activation recomputation (gradient checkpointing) is not counted: the result is *model* FLOPs, so the
MFU does not rise when the hardware does extra work.

Peak FLOP/s (:func:`peak_flops`): a configured value wins; on CUDA a table of dense bf16 tensor-core
peaks from the vendors' datasheets, keyed by device name; on an unknown GPU or on the CPU a short
matrix-multiply benchmark, measured once per (device, dtype, thread count) and cached.
"""

from __future__ import annotations

import functools
import re
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlflow.utils.onednn import onednn_linear, onednn_linear_available

__all__ = [
    "FlopsCounter",
    "TransformerShape",
    "count_matmul_params",
    "estimate_flops_per_token",
    "lookup_gpu_peak_flops",
    "measure_peak_flops",
    "peak_flops",
    "transformer_shape",
]

# Dense (no sparsity) bf16 tensor-core peaks in TFLOP/s, from the vendors' datasheets. Checked in this
# order, so a more specific name (H100 PCIe) comes before a shorter one (H100).
_GPU_PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    ("GB200", 2500.0),
    ("B200", 2250.0),
    ("B100", 1750.0),
    ("GH200", 989.0),
    ("H200", 989.0),
    ("H100 NVL", 835.0),
    ("H100 PCIE", 756.0),
    ("H100", 989.0),
    ("H800", 989.0),
    ("H20", 148.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("A30", 165.0),
    ("A10", 125.0),
    ("L40S", 362.0),
    ("L40", 181.0),
    ("L4", 121.0),
    ("V100", 125.0),  # fp16 (no bf16 on Volta)
    ("MI300X", 1307.0),
)

_MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
_MOE_TYPES = ("qwen2_moe", "qwen3_moe", "mixtral", "olmoe")
"""Mixture-of-experts ``model_type``s whose layer layout `transformer_shape` reads."""


@dataclass(frozen=True)
class TransformerShape:
    """The sizes the FLOPs formula needs, read from a Hugging Face config.

    ``moe_layers`` of the ``num_layers`` route each token to ``experts_per_token`` of ``num_experts``
    experts of width ``expert_intermediate`` (plus a shared expert of width ``shared_intermediate`` with a
    one-output gate when ``shared_gate``); the others run the dense gated MLP of ``intermediate_size``.
    """

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    moe_layers: int = 0
    num_experts: int = 0
    experts_per_token: int = 0
    expert_intermediate: int = 0
    shared_intermediate: int = 0
    shared_gate: bool = False


def _attr(config: Any, name: str, default: Any = None) -> Any:
    if isinstance(config, dict):
        return config.get(name, default)
    return getattr(config, name, default)


def transformer_shape(hf_config: Any) -> TransformerShape:
    """Read the layer sizes of a Llama/Qwen2-style decoder from ``hf_config`` (object or dict).

    A multimodal config with a ``text_config`` is read from its ``text_config``.

    Raises:
        ValueError: a required field is missing (named), or the model is a mixture of experts whose layout
            is not one of `_MOE_TYPES` (the dense formula would be wrong).
    """
    text_config = _attr(hf_config, "text_config")
    config = text_config if text_config is not None else hf_config
    model_type = _attr(config, "model_type", "?")
    experts = next((e for e in (_attr(config, key) for key in _MOE_KEYS) if isinstance(e, int) and e > 1), 0)
    if experts and model_type not in _MOE_TYPES:
        raise ValueError(
            f"FLOPs estimate: {model_type} is a mixture of experts ({experts} experts) whose layer layout is not "
            f"read here (only {list(_MOE_TYPES)})"
        )
    values: dict[str, int] = {}
    for key in ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size"):
        value = _attr(config, key)
        if value is None:
            raise ValueError(f"FLOPs estimate: the model config ({model_type}) has no {key!r}")
        values[key] = int(value)
    num_kv_heads = _attr(config, "num_key_value_heads") or values["num_attention_heads"]
    head_dim = _attr(config, "head_dim") or values["hidden_size"] // values["num_attention_heads"]
    return TransformerShape(
        num_layers=values["num_hidden_layers"],
        hidden_size=values["hidden_size"],
        num_heads=values["num_attention_heads"],
        num_kv_heads=int(num_kv_heads),
        head_dim=int(head_dim),
        intermediate_size=values["intermediate_size"],
        vocab_size=values["vocab_size"],
        **(_moe_shape(config, model_type, experts, values) if experts else {}),
    )


def _moe_shape(config: Any, model_type: str, experts: int, values: dict[str, int]) -> dict[str, Any]:
    """The mixture-of-experts fields of `TransformerShape` for one of `_MOE_TYPES`."""
    layers = values["num_hidden_layers"]
    if model_type in ("qwen2_moe", "qwen3_moe"):  # sparse unless in mlp_only_layers or off the sparse step
        dense = set(_attr(config, "mlp_only_layers") or [])
        step = int(_attr(config, "decoder_sparse_step") or 1)
        moe_layers = sum(1 for i in range(layers) if i not in dense and (i + 1) % step == 0)
        expert_width = int(_attr(config, "moe_intermediate_size"))
    else:  # mixtral, olmoe: every layer, experts of intermediate_size
        moe_layers, expert_width = layers, values["intermediate_size"]
    shared = int(_attr(config, "shared_expert_intermediate_size") or 0) if model_type == "qwen2_moe" else 0
    return {
        "moe_layers": moe_layers,
        "num_experts": experts,
        "experts_per_token": int(_attr(config, "num_experts_per_tok")),
        "expert_intermediate": expert_width,
        "shared_intermediate": shared,
        "shared_gate": shared > 0,
    }


def count_matmul_params(shape: TransformerShape, head_outputs: int | None = None) -> int:
    """``N``: weights used in a matrix multiply per token (attention, gated MLP, the head; no embedding).

    Args:
        shape: the decoder's sizes.
        head_outputs: outputs of the head; None = the LM head (``vocab_size``), 1 for a value model.
    """
    h, d = shape.hidden_size, shape.head_dim
    attention = 2 * h * shape.num_heads * d + 2 * h * shape.num_kv_heads * d  # q, o + k, v
    mlp = 3 * h * shape.intermediate_size  # gate, up, down
    # a token's share of a MoE layer: the router, its k experts, the shared expert and its gate
    moe = h * shape.num_experts + shape.experts_per_token * 3 * h * shape.expert_intermediate
    moe += 3 * h * shape.shared_intermediate + (h if shape.shared_gate else 0)
    head = shape.vocab_size if head_outputs is None else int(head_outputs)
    dense_layers = shape.num_layers - shape.moe_layers
    return shape.num_layers * attention + dense_layers * mlp + shape.moe_layers * moe + h * head


def _attention_width(shape: TransformerShape) -> int:
    return shape.num_layers * shape.num_heads * shape.head_dim  # L * H


def estimate_flops_per_token(hf_config: Any, seq_len: int = 0, backward: bool = True) -> float:
    """FLOPs per token: ``6 N + 12 L H S`` with backward, ``2 N + 4 L H S`` forward only (module doc).

    Args:
        hf_config: a Hugging Face decoder config (Llama, Qwen2, Qwen3, Mistral, ...) or a dict of it.
        seq_len: length ``S`` of the sequence the token belongs to (0 drops the attention term).
        backward: count the backward pass too (training) or only the forward (log-prob, values).

    Returns:
        FLOPs per token.
    """
    shape = transformer_shape(hf_config)
    factor = 3 if backward else 1
    return float(factor * (2 * count_matmul_params(shape) + 4 * _attention_width(shape) * int(seq_len)))


class FlopsCounter:
    """Achieved TFLOP/s of a forward+backward pass over a batch of sequences.

    Args:
        hf_config: the model's Hugging Face config (see :func:`transformer_shape`).
        head_outputs: outputs of the head; None = the LM head, 1 for the critic's value head.
    """

    def __init__(self, hf_config: Any, head_outputs: int | None = None) -> None:
        self.shape = transformer_shape(hf_config)
        self.num_params = count_matmul_params(self.shape, head_outputs)

    def estimate_flops(self, batch_seqlens: Sequence[int], backward: bool = True) -> float:
        """Total FLOPs of one pass over sequences of lengths ``batch_seqlens`` (valid tokens each)."""
        lengths = [int(s) for s in batch_seqlens]
        total_tokens = sum(lengths)
        square_sum = sum(s * s for s in lengths)
        factor = 3 if backward else 1
        return float(
            factor * (2 * self.num_params * total_tokens + 4 * _attention_width(self.shape) * square_sum)
        )

    def estimate(self, batch_seqlens: Sequence[int], delta_time_s: float) -> float:
        """Achieved TFLOP/s: forward+backward FLOPs over ``batch_seqlens`` divided by ``delta_time_s``.

        Args:
            batch_seqlens: valid tokens of each sequence processed in ``delta_time_s``.
            delta_time_s: wall time in seconds, > 0.
        """
        if delta_time_s <= 0:
            raise ValueError(f"FlopsCounter.estimate: delta_time_s must be > 0, got {delta_time_s}")
        return self.estimate_flops(batch_seqlens) / delta_time_s / 1e12


def lookup_gpu_peak_flops(device_name: str) -> float | None:
    """Dense bf16 peak FLOP/s of a GPU from its name (``torch.cuda.get_device_name``), None if unknown.

    The table entry must appear as a whole word: ``NVIDIA A100-SXM4-80GB`` matches A100, ``RTX A1000``
    does not, and ``NVIDIA H100 PCIe`` takes the PCIe figure.
    """
    name = device_name.upper()
    for key, tflops in _GPU_PEAK_TFLOPS:
        if re.search(rf"(?<![A-Z0-9]){re.escape(key)}(?![A-Z0-9])", name):
            return tflops * 1e12
    return None


def _product(kernel: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None:
    """The matrix product `measure_peak_flops` times; None where this torch build lacks it."""
    if kernel == "matmul":
        return torch.matmul
    if kernel == "onednn":
        return onednn_linear if onednn_linear_available() else None
    raise ValueError(f"measure_peak_flops: kernel={kernel!r} is not 'matmul' or 'onednn'")


@functools.cache
def _measure(
    device: str, dtype: torch.dtype, num_threads: int, size: int, min_time_s: float, kernel: str
) -> float:
    product = _product(kernel)
    if product is None:
        return float("nan")
    dev = torch.device(device)
    a = torch.randn(size, size, device=dev, dtype=dtype)
    b = torch.randn(size, size, device=dev, dtype=dtype)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        for _ in range(3):  # the first products run below the kernel's rate (its setup, the clock)
            product(a, b)
        sync()
        best, spent, reps = 0.0, 0.0, 0
        while reps < 3 or spent < min_time_s:
            start = time.perf_counter()
            product(a, b)
            sync()
            elapsed = time.perf_counter() - start
            best = max(best, 2.0 * size**3 / max(elapsed, 1e-9))
            spent += elapsed
            reps += 1
    finally:
        torch.set_num_threads(previous)
    return best


def measure_peak_flops(
    device: str = "cpu",
    dtype: torch.dtype | None = None,
    num_threads: int | None = None,
    size: int | None = None,
    min_time_s: float = 0.2,
    kernel: str = "matmul",
    fresh: bool = False,
) -> float:
    """Best FLOP/s of a square matrix multiply on ``device``, measured once per arguments and cached
    (``fresh=True`` measures again and leaves the cache alone: a benchmark reads the rate of a shared
    machine before each of its runs).

    Runs three warm-up products, then repeats ``size x size`` products (at least 3, at least ``min_time_s``
    seconds) and keeps the fastest (``2 size^3`` FLOPs each) — the best case, since shared machines are
    noisy. On the CPU the result scales with the thread count: measure with the threads a worker uses
    (Ray sets one per CPU of the actor).

    Args:
        device: ``cpu``, ``cuda`` or ``cuda:<i>``.
        dtype: default float32 on CPU, bfloat16 on CUDA.
        num_threads: torch threads during the benchmark (CPU); default the current count.
        size: matrix side; default 1024 on CPU, 8192 on CUDA.
        min_time_s: minimum total time of the timed products.
        kernel: ``matmul`` (``torch.matmul``: MKL on x86 CPUs) or ``onednn`` (oneDNN's linear kernel, which
            the rollout's packed decoding projections use; CPU only, NaN where torch has no oneDNN).
        fresh: measure now instead of returning the cached result.
    """
    is_cuda = torch.device(device).type == "cuda"
    if is_cuda and kernel != "matmul":
        raise ValueError(f"measure_peak_flops: kernel={kernel!r} runs on the CPU only")
    dtype = dtype or (torch.bfloat16 if is_cuda else torch.float32)
    threads = int(num_threads or torch.get_num_threads())
    side = int(size or (8192 if is_cuda else 1024))
    measure = _measure.__wrapped__ if fresh else _measure
    return measure(str(device), dtype, threads, side, float(min_time_s), kernel)


def peak_flops(device: str, configured: float | None = None, num_threads: int | None = None) -> float:
    """Peak FLOP/s of one worker, the denominator of the MFU.

    Order: ``configured`` (FLOP/s, e.g. ``989e12``) when given; on CUDA the datasheet table
    (:func:`lookup_gpu_peak_flops`); on an unknown GPU (with a warning) or on the CPU the measured
    matrix-multiply rate (:func:`measure_peak_flops`, cached). A measured peak is what this machine
    reaches on a large matmul, so the MFU against it is higher than against a datasheet figure.

    Args:
        device: ``cpu``, ``cuda`` or ``cuda:<i>``.
        configured: a known peak in FLOP/s; wins over everything else. Must be > 0.
        num_threads: CPU threads of one worker for the measurement (default: this process's count).

    Returns:
        FLOP/s.
    """
    if configured is not None:
        if configured <= 0:
            raise ValueError(f"peak_flops: the configured peak must be > 0 FLOP/s, got {configured}")
        return float(configured)
    if torch.device(device).type == "cuda":
        name = torch.cuda.get_device_name(torch.device(device))
        known = lookup_gpu_peak_flops(name)
        if known is not None:
            return known
        warnings.warn(
            f"peak_flops: {name!r} is not in the table of GPU peaks; measuring a bf16 matmul instead "
            "(pass the datasheet figure as the configured peak to get a comparable MFU)",
            stacklevel=2,
        )
    return measure_peak_flops(device, num_threads=num_threads)
