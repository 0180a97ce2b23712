"""LoRA adapters on a role's linear layers: the actor's (verl's ``actor_rollout_ref.model.lora_rank`` /
``lora_alpha`` / ``target_modules`` / ``exclude_modules``) and the critic's (``critic.model.lora_rank`` /
``lora_alpha`` / ``target_modules``).

`inject_lora` turns each selected ``nn.Linear`` into a `LoRALinear` in place: the same module, its
``weight`` and ``bias`` frozen, with two trainable matrices beside them,

    y = x Wᵀ + b + s · (x Aᵀ) Bᵀ,    A: (r, in), B: (out, r), s = lora_alpha / r,

A drawn like ``nn.Linear``'s weight (Kaiming-uniform), B zero, so the adapted model starts equal to the
base model. Every other parameter of the model (embeddings, norms, the LM head) is frozen too: only the
adapters train, and the optimizer holds only them. A value model's head (``score``, hidden -> 1) is never
adapted: the caller keeps it trainable in full (``trainable=``), as PEFT's token-classification task keeps
its head among ``modules_to_save``; a critic's fresh head has to learn whatever the adapters do.

Keeping the module (rather than wrapping it) keeps the parameter names of the base model:
``...q_proj.weight`` stays ``...q_proj.weight`` and the adapters are ``...q_proj.lora_A`` /
``...q_proj.lora_B``. A consumer of full weights (the rollout's replica, vLLM, the Hugging Face export,
the model merger) folds the adapters in with `merge_lora_stream` / `merge_lora_state_dict`:
``W' = W + s · B A``, so engines and exported models see a plain model. The role's sharded checkpoints
hold the adapters and each module's ``lora_scaling`` buffer, so a resume continues exactly and the
merger knows the scale.

The adapters are created on the device of the base weight (``meta`` on the ranks that receive their
shards from rank 0) and initialised from a generator seeded by ``seed`` and the module's position, so
every rank that loads the model itself draws the same adapters.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from rlflow.models.cpu_linear import linear

__all__ = [
    "LoRALinear",
    "LoRASpec",
    "inject_lora",
    "lora_modules",
    "lora_targets",
    "merge_lora_state_dict",
    "merge_lora_stream",
    "merge_lora_weights",
    "module_selection",
    "output_head",
]

_LORA_LEAVES = ("lora_A", "lora_B", "lora_scaling")
ALL_LINEAR = "all-linear"


@dataclass(frozen=True)
class LoRASpec:
    """What `inject_lora` adapts.

    Attributes:
        rank: r, the adapters' inner size (> 0).
        alpha: the scale numerator: s = alpha / rank.
        target_modules: ``"all-linear"`` (every ``nn.Linear`` except the output head, as PEFT does) or
            module-name suffixes (``["q_proj", "v_proj"]``) or one regular expression matched against
            the whole module name.
        exclude_modules: module-name suffixes (or one regular expression) left out of the targets.
        use_rslora: rsLoRA's scale s = alpha / sqrt(rank) (PEFT's ``use_rslora``; set by adapters loaded
            from ``lora_adapter_path`` that were trained with it).
        key_prefix: the config section the keys were read from (error messages).
    """

    rank: int
    alpha: float
    target_modules: str | tuple[str, ...] = ALL_LINEAR
    exclude_modules: str | tuple[str, ...] | None = None
    use_rslora: bool = False
    key_prefix: str = "actor_rollout_ref.model"

    @property
    def scaling(self) -> float:
        return float(self.alpha) / (math.sqrt(self.rank) if self.use_rslora else float(self.rank))


def module_selection(value: str | Iterable[str]) -> str | tuple[str, ...]:
    """A config's ``target_modules`` / ``exclude_modules`` as `LoRASpec` holds it: a string
    (``all-linear`` or a regular expression) as it is, a list of suffixes as a tuple."""
    return value if isinstance(value, str) else tuple(str(v) for v in value)


class LoRALinear(nn.Linear):
    """An ``nn.Linear`` with a low-rank trainable update (see the module docstring); made by `inject_lora`.

    Shapes: input (..., in_features) → output (..., out_features).
    """

    lora_A: nn.Parameter
    lora_B: nn.Parameter
    lora_scaling: torch.Tensor  # 0-dim fp32 buffer: alpha / rank, saved with the weights
    onednn: bool = False  # the frozen base product through oneDNN (`rlflow.models.cpu_linear`)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        base = linear(x, self.weight, self.bias, self.onednn)
        update = F.linear(F.linear(x, self.lora_A), self.lora_B)
        return base + update * self.lora_scaling.to(update.dtype)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, lora_rank={self.lora_A.shape[0]}"


def merge_lora_weights(
    weight: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scaling: float
) -> torch.Tensor:
    """``weight + scaling · lora_b @ lora_a``, computed in fp32 (fp64 for fp64 weights), returned in
    ``weight``'s dtype.

    Shapes: weight (out, in), lora_a (r, in), lora_b (out, r).
    """
    dtype = torch.promote_types(weight.dtype, torch.float32)
    delta = lora_b.to(dtype) @ lora_a.to(dtype)
    return (weight.to(dtype) + scaling * delta).to(weight.dtype)


def _matches(name: str, patterns: str | Sequence[str]) -> bool:
    if isinstance(patterns, str):
        return re.fullmatch(patterns, name) is not None
    return any(name == p or name.endswith(f".{p}") for p in patterns)


def output_head(model: nn.Module) -> nn.Module | None:
    """The model's output layer, which LoRA never adapts: a causal LM's LM head, a token / sequence
    classification model's ``score`` / ``classifier`` (a value or reward head); None if it has neither."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if head is not None:
        return head
    for name in ("score", "classifier"):
        head = getattr(model, name, None)
        if isinstance(head, nn.Linear):
            return head
    return None


def lora_targets(model: nn.Module, spec: LoRASpec) -> list[tuple[str, nn.Linear]]:
    """The ``(name, module)`` pairs `inject_lora` adapts, in module order (never the `output_head`).

    Raises:
        ValueError: no module matches ``target_modules`` (after ``exclude_modules``).
    """
    head = output_head(model)
    targets = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear) or module is head:
            continue
        if spec.target_modules != ALL_LINEAR and not _matches(name, spec.target_modules):
            continue
        if spec.exclude_modules is not None and _matches(name, spec.exclude_modules):
            continue
        targets.append((name, module))
    if not targets:
        linears = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)}
        head_name = next((n for n, m in model.named_modules() if m is head), None)
        raise ValueError(
            f"{spec.key_prefix}.target_modules={spec.target_modules!r} (exclude_modules="
            f"{spec.exclude_modules!r}) matches no linear layer of {type(model).__name__}; linear layers: "
            f"{sorted(linears - {head_name})}"
            + ("" if head_name is None else f" (the output layer {head_name!r} is never adapted)")
        )
    return targets


def inject_lora(
    model: nn.Module, spec: LoRASpec, seed: int = 0, trainable: Sequence[nn.Module] = ()
) -> list[str]:
    """Add LoRA adapters to ``model`` in place and freeze everything else but the ``trainable`` modules
    (a value model's head); returns the adapted names.

    Call it before sharding (the adapters are parameters like any other to FSDP) and before gradient
    checkpointing is enabled.
    """
    if spec.rank <= 0:
        raise ValueError(f"{spec.key_prefix}.lora_rank={spec.rank} must be > 0 to add adapters")
    targets = lora_targets(model, spec)
    kept = {id(p) for module in trainable for p in module.parameters()}
    for param in model.parameters():
        param.requires_grad_(id(param) in kept)
    for index, (_, module) in enumerate(targets):
        device = module.weight.device
        lora_a = torch.empty(spec.rank, module.in_features, dtype=torch.float32, device=device)
        lora_b = torch.zeros(module.out_features, spec.rank, dtype=torch.float32, device=device)
        if device.type != "meta":
            gen = torch.Generator().manual_seed(int(seed) * 1_000_003 + index)
            bound = 1.0 / math.sqrt(module.in_features)  # nn.Linear's kaiming_uniform_(a=sqrt(5)) bound
            cpu = torch.empty(lora_a.shape, dtype=torch.float32).uniform_(-bound, bound, generator=gen)
            lora_a.copy_(cpu)
        module.__class__ = LoRALinear
        module.lora_A = nn.Parameter(lora_a.to(module.weight.dtype))
        module.lora_B = nn.Parameter(lora_b.to(module.weight.dtype))
        module.register_buffer("lora_scaling", torch.tensor(spec.scaling, dtype=torch.float32, device=device))
    return [name for name, _ in targets]


def lora_modules(model: nn.Module) -> dict[str, float]:
    """``{module name: scaling}`` of the `LoRALinear` modules of ``model`` (names as ``named_modules``
    gives them, wrapper prefixes included); empty for a model without adapters."""
    return {name: float(m.lora_scaling) for name, m in model.named_modules() if isinstance(m, LoRALinear)}


def merge_lora_stream(
    pairs: Iterable[tuple[str, torch.Tensor]], adapted: dict[str, float]
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield the full tensors ``pairs`` with the adapters folded in: ``X.weight`` of an adapted module
    ``X`` (a key of ``adapted``, with its scaling) is held back until ``X.lora_A`` and ``X.lora_B`` have
    come too, in any order, then yielded merged; the adapters themselves are not yielded.

    Raises:
        ValueError: the stream ended with an adapted module incomplete.
    """
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in pairs:
        prefix, _, leaf = name.rpartition(".")
        if prefix not in adapted or leaf not in ("weight", *_LORA_LEAVES):
            yield name, tensor
            continue
        if leaf == "lora_scaling":
            continue
        slot = pending.setdefault(prefix, {})
        slot[leaf] = tensor
        if len(slot) == 3:
            del pending[prefix]
            merged = merge_lora_weights(slot["weight"], slot["lora_A"], slot["lora_B"], adapted[prefix])
            yield f"{prefix}.weight", merged
    if pending:
        raise ValueError(
            f"LoRA merge: incomplete adapted modules {sorted(pending)[:3]} (tensors seen: "
            f"{sorted(next(iter(pending.values())))})"
        )


def merge_lora_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` (a full state dict, e.g. a checkpoint's) with the adapters folded into their weights:
    the base model's keys only. Each adapted module ``X`` brings ``X.lora_A``, ``X.lora_B`` and its
    scaling ``X.lora_scaling`` (a buffer, so a checkpoint says how to merge it). A state dict without
    adapters comes back unchanged.

    Raises:
        ValueError: an adapted module lacks one of its tensors (`merge_lora_stream`).
    """
    adapted = {n.rpartition(".")[0] for n in state if n.endswith((".lora_A", ".lora_B"))}
    missing = sorted(p for p in adapted if f"{p}.lora_scaling" not in state)
    if missing:
        raise ValueError(f"LoRA merge: {missing[:3]} have adapters but no lora_scaling")
    scalings = {p: float(state[f"{p}.lora_scaling"]) for p in adapted}
    return dict(merge_lora_stream(state.items(), scalings))
