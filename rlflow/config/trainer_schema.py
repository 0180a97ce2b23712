"""Typed ``trainer`` and ``ray_init`` sections of the PPO trainer config (part of
`rlflow.config.schema.PPOTrainerConfig`, which re-exports them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["RayInitConfig", "TrainerConfig"]


@dataclass
class TrainerConfig:
    """``trainer``: run length, resources, logging, checkpoints.

    Attributes:
        n_gpus_per_node: ranks per node (processes on CPU).
        device: auto | cpu | cuda.
        logger: any of console, jsonl, tensorboard, wandb, mlflow.
        log_system_metrics: log the driver node's CPU, memory, disk and GPU use with every step
            (``system/*``, MLflow's names; `rlflow.logging.system_metrics`), to every logger.
        log_dir: None = ``outputs/<project_name>/<experiment_name>``.
        total_training_steps: None = ``total_epochs`` times the steps per epoch.
        save_freq / test_freq: every N steps; -1 = never.
        val_only: validate once (the resumed checkpoint's policy, or the initial one) and stop without
            training, whatever ``val_before_train`` says (verl's key; verl ignores it when
            ``val_before_train`` is false).
        ray_timeline_json_file: after the run, the driver writes Ray's timeline of every task and actor
            call there (``ray.timeline``; chrome://tracing or Perfetto opens it); verl's
            ``ray_kwargs.timeline_json_file``. None writes nothing.
        critic_warmup: first steps that train only the critic.
        overlap_updates: run the critic's and the actor's updates of a step at the same time, each rank
            computing with its part of its bundle's CPU threads (the actor ``ceil(t / 2)``, the critic
            ``floor(t / 2)``); the updates do not depend on each other, and their ops that do not fill
            every core (small ops, Python) then overlap. With a reference, the critic's values are likewise
            computed beside the reference's log-probs (the reference with the actor's part), so the actor's
            update does not wait for them. CPU pools only (on a GPU the roles of a bundle share one
            device). None = on where it helps: a CPU run with a critic that has the actor's ranks and at
            least 2 threads per rank (the default CPU layout; on a local Ray at most the machine's cores
            shared by the ranks are split, however many CPUs Ray counts); ``timing_s/update`` is then the
            phase, ``timing_s/update_critic`` / ``update_actor`` each role's time from its start, and
            ``timing_s/values`` the time until the values were ready (it overlaps ``timing_s/ref``).
        forward_ahead: run the forwards of single-pass updates (one PPO epoch over one mini-batch) before
            the advantages exist (`rlflow.engine.forward_ahead`): the critic's values are its update's own
            forwards, kept with their autograd graphs, and the actor runs its update's forwards right
            after them (with all the bundle's threads, or beside the critic's without a reference); the
            update phase then runs only the losses and the backwards. Same weights, same micro-batches:
            the same gradients, and the critic's forward runs once per step instead of twice. Each role
            holds its activations of the whole batch between the two phases. None = on where it applies
            and the updates overlap (``overlap_updates``); true = wherever it applies (else refused before
            Ray, naming what stops it); false = off. It applies with a critic, single-pass actor and critic
            updates, and no activation offload, MTP loss, router losses, routing replay, KL-Cov /
            Clip-Cov token selection or PF-PPO redraw. ``timing_s/forward_ahead`` is the actor's call.
        cpu_linear_kernel: what computes the fp32 linear layers of the CPU roles (forward and backward):
            ``aten`` is torch's ``F.linear`` (MKL's GEMM on x86), ``onednn`` oneDNN's kernel from the same
            torch build (`rlflow.models.cpu_linear`: exact fp32 in another summation order), ``auto``
            oneDNN where it measures at least 1.25x ``torch.matmul``'s rate at a rank's threads, else aten
            (measured by the driver on a local Ray, by each rank on a cluster joined by address; logged at
            INFO). On a 2-core AMD EPYC (Zen 5) oneDNN ran 2.1-2.3x faster and a 13M PPO step took 3.0 s
            instead of 4.4; on another EPYC the two were within 10 %; MKL is tuned for Intel's CPUs. A run
            on the GPU computes on CUDA and refuses ``onednn``. The demo pins ``aten`` (its README curve).
        worker_start_timeout_s: bound on starting every role's actors and building their models; a
            heartbeat line names what is still pending every 30 s, then an error names the role.
        resume_mode: auto | disable | resume_path (then ``resume_from_path`` is the checkpoint dir).
        peak_tflops: peak TFLOP/s of one worker for the MFU; None = datasheet table on GPU, measured
            matmul rate on CPU.
        validation_data_dir: write each validation's prompts, responses and scores to
            ``<dir>/<step>.jsonl`` (read them with ``python scripts/view_rollouts.py``); None = off.
        rollout_data_dir: write each step's training responses (prompt, response, score, uid) to
            ``<dir>/<step>.jsonl``, read by ``python scripts/view_rollouts.py``; None = off.
        log_val_generations: log the first N validation samples (prompt, response, score) to the
            loggers at every validation: printed on the console, appended to
            ``<log_dir>/val_generations.jsonl``, a text table in tensorboard, a wandb table; 0 = off.
        use_legacy_worker_impl: verl's choice between its two worker implementations; rlflow has one
            (`rlflow.workers`), so ``auto`` and ``disable`` (or ``false``, older verl's boolean) run it and
            ``enable`` is refused.
        profile_steps: the training steps profiled by the ranks each role's ``profile_ranks`` selects;
            traces under ``<profile_dir>/step_<N>/`` (`rlflow.single_controller.profiling`).
        profile_dir: where the traces go; null = ``<log_dir>/profile`` (verl's
            ``global_profiler.save_path``, `rlflow.config.profiler_layout`).
        default_hdfs_dir: verl's key: a directory (or ``hdfs://...``) every complete checkpoint is
            copied to, with its own pointer file (`rlflow.utils.checkpoint_files`); null = no copy.
    """

    project_name: str = "rlflow"
    experiment_name: str = "ppo"
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    log_system_metrics: bool = False
    log_dir: str | None = None
    nnodes: int = 1
    n_gpus_per_node: int = 8
    device: str = "auto"
    cpus_per_worker: float | None = 1.0
    total_epochs: int = 30
    total_training_steps: int | None = None
    save_freq: int = -1
    test_freq: int = -1
    val_before_train: bool = True
    val_only: bool = False
    ray_timeline_json_file: str | None = None
    critic_warmup: int = 0
    overlap_updates: bool | None = None
    forward_ahead: bool | None = None
    cpu_linear_kernel: str = "auto"
    default_local_dir: str = "checkpoints/${trainer.project_name}/${trainer.experiment_name}"
    default_hdfs_dir: str | None = None
    resume_mode: str = "auto"
    resume_from_path: str | None = None
    max_actor_ckpt_to_keep: int | None = None
    max_critic_ckpt_to_keep: int | None = None
    balance_batch: bool = True
    balance_keep_minibatch: bool = False
    seed: int = 1
    placement_timeout_s: float = 60
    worker_start_timeout_s: float = 600
    peak_tflops: float | None = None
    validation_data_dir: str | None = None
    rollout_data_dir: str | None = None
    log_val_generations: int = 0
    use_legacy_worker_impl: str = "auto"
    profile_steps: list[int] | None = None
    profile_dir: str | None = None


@dataclass
class RayInitConfig:
    """``ray_init``: arguments of ``ray.init`` (None = Ray's default; address None = a local Ray).

    Attributes:
        runtime_env: Ray's runtime environment of the job (verl's ``ray_kwargs.ray_init.runtime_env``):
            ``env_vars`` also reach every worker's process (after rlflow's own, before the per-rank
            variables, which are refused here); the other fields (``pip``, ``working_dir``, ...) go to
            ``ray.init`` when rlflow starts or joins Ray.
    """

    address: str | None = None
    num_cpus: int | None = None
    object_store_memory: int | None = None
    runtime_env: dict[str, Any] = field(default_factory=dict)
