"""Per-rank batch sizes of one role, derived once from the typed config.

Config sizes are global and in prompts (``ppo_mini_batch_size`` counts prompts before ``rollout.n``, as in
verl); the engine works per rank and in samples (responses). Those numbers get their own names here, so no
config key changes its unit on the way to a worker:

* `MicroBatchSpec` — how one pass over a rank's samples is cut into micro-batches (a fixed number of
  samples, or a token budget already multiplied by the Ulysses size).
* `UpdateSpec` — one PPO update on a rank: samples per optimizer step, epochs, shuffle, gradient clip.

`actor_update_spec`, `critic_update_spec` and `log_prob_spec` build them from the schema sections.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlflow.config.schema import ActorConfig, CriticConfig

__all__ = ["MicroBatchSpec", "UpdateSpec", "actor_update_spec", "critic_update_spec", "log_prob_spec"]


@dataclass(frozen=True)
class MicroBatchSpec:
    """How one pass over a rank's samples is split.

    Attributes:
        use_dynamic_bsz: form micro-batches under ``max_tokens_per_rank`` valid tokens each (balanced), else
            ``samples_per_micro_batch`` samples each.
        samples_per_micro_batch: samples per micro-batch (fixed batching); None = the whole pass at once.
        max_tokens_per_rank: token budget per micro-batch of this rank (dynamic batching), already times the
            Ulysses size: an SP group processes one micro-batch together.
    """

    use_dynamic_bsz: bool = False
    samples_per_micro_batch: int | None = None
    max_tokens_per_rank: int | None = None


@dataclass(frozen=True)
class UpdateSpec:
    """One PPO update (``epochs`` × mini-batches × micro-batches) on one data-parallel rank.

    Attributes:
        samples_per_mini_batch: samples (responses) of one optimizer step on this rank.
        epochs: passes over the rank's samples (``ppo_epochs``).
        shuffle: permute the samples before each pass (seeded by ``seed``, the step and the epoch).
        seed: base seed of that permutation (``trainer.seed``).
        grad_clip: maximum total gradient norm; <= 0 = no clipping.
        micro: how each mini-batch is split.
        offload_activations: the forward's saved activations wait in host memory for the backward
            (``model.enable_activation_offload``, `rlflow.parallel.activation_offload`).
    """

    samples_per_mini_batch: int
    epochs: int = 1
    shuffle: bool = False
    seed: int = 0
    grad_clip: float = 1.0
    micro: MicroBatchSpec = field(default_factory=MicroBatchSpec)
    offload_activations: bool = False


def _per_rank(prompts: int, rollout_n: int, dp_size: int, key: str) -> int:
    samples = int(prompts) * int(rollout_n)
    if samples % dp_size:
        raise ValueError(
            f"{key}={prompts} × rollout.n={rollout_n} = {samples} responses must be divisible by the "
            f"data-parallel size {dp_size}"
        )
    return samples // dp_size


def log_prob_spec(
    use_dynamic_bsz: bool,
    micro_batch_size_per_gpu: int | None,
    max_token_len_per_gpu: int | None,
    sp_size: int,
) -> MicroBatchSpec:
    """A forward-only pass (old / reference log-probs, values): the ``*_per_gpu`` keys of its section.

    Args:
        use_dynamic_bsz: ``log_prob_use_dynamic_bsz`` (or the critic's ``use_dynamic_bsz``).
        micro_batch_size_per_gpu: samples per micro-batch on one rank.
        max_token_len_per_gpu: token budget per rank and micro-batch.
        sp_size: Ulysses size of the role.
    """
    return MicroBatchSpec(
        use_dynamic_bsz=bool(use_dynamic_bsz),
        samples_per_micro_batch=micro_batch_size_per_gpu,
        max_tokens_per_rank=None if max_token_len_per_gpu is None else int(max_token_len_per_gpu) * sp_size,
    )


def actor_update_spec(
    actor: ActorConfig, rollout_n: int, dp_size: int, seed: int, offload_activations: bool = False
) -> UpdateSpec:
    """The actor's `UpdateSpec` from ``actor_rollout_ref.actor``.

    Args:
        actor: the actor section.
        rollout_n: responses per prompt.
        dp_size: data-parallel size of the actor (world size / Ulysses size).
        seed: ``trainer.seed``.
        offload_activations: ``actor_rollout_ref.model.enable_activation_offload``.
    """
    key = "actor_rollout_ref.actor.ppo_mini_batch_size"
    sp = int(actor.ulysses_sequence_parallel_size)
    return UpdateSpec(
        samples_per_mini_batch=_per_rank(actor.ppo_mini_batch_size, rollout_n, dp_size, key),
        epochs=int(actor.ppo_epochs),
        shuffle=bool(actor.shuffle),
        seed=int(seed),
        grad_clip=float(actor.grad_clip),
        micro=log_prob_spec(
            actor.use_dynamic_bsz, actor.ppo_micro_batch_size_per_gpu, actor.ppo_max_token_len_per_gpu, sp
        ),
        offload_activations=bool(offload_activations),
    )


def critic_update_spec(critic: CriticConfig, rollout_n: int, dp_size: int, seed: int) -> UpdateSpec:
    """The critic's `UpdateSpec` from the ``critic`` section (its own layout; activation offload from
    ``critic.model.enable_activation_offload``).

    Args:
        critic: the critic section.
        rollout_n: responses per prompt.
        dp_size: data-parallel size of the critic.
        seed: ``trainer.seed``.
    """
    sp = int(critic.ulysses_sequence_parallel_size)
    return UpdateSpec(
        samples_per_mini_batch=_per_rank(
            critic.ppo_mini_batch_size, rollout_n, dp_size, "critic.ppo_mini_batch_size"
        ),
        epochs=int(critic.ppo_epochs),
        shuffle=bool(critic.shuffle),
        seed=int(seed),
        grad_clip=float(critic.grad_clip),
        micro=log_prob_spec(
            critic.use_dynamic_bsz, critic.ppo_micro_batch_size_per_gpu, critic.ppo_max_token_len_per_gpu, sp
        ),
        offload_activations=bool(critic.model.enable_activation_offload),
    )
