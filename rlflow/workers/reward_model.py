"""`RewardModelWorker`: a sequence-classification reward model's Ray actor."""

from __future__ import annotations

import torch

from rlflow.config.reads import track_reads, tracking_enabled
from rlflow.config.schema import PPOTrainerConfig
from rlflow.engine.batching import log_prob_spec
from rlflow.engine.ppo_loop import split_micro_batches
from rlflow.models.attention import set_packed_attention
from rlflow.models.loader import load_reward_model
from rlflow.parallel.distributed import current_device, init_distributed
from rlflow.parallel.fsdp import mixed_precision_dtypes
from rlflow.protocol import DataProto
from rlflow.reward.reward_model import compute_rm_score
from rlflow.single_controller import Dispatch, Worker, register
from rlflow.workers.role_setup import model_path

__all__ = ["RewardModelWorker"]


class RewardModelWorker(Worker):
    """A sequence-classification reward model; scores go at the last valid response token.

    Inference only: every rank holds a full copy (no FSDP) and scores its share of the samples in
    micro-batches of ``reward_model.micro_batch_size_per_gpu`` samples (or, with ``use_dynamic_bsz``, of at
    most ``forward_max_token_len_per_gpu`` valid tokens). It must share the policy's tokenizer.

    Args:
        config: the typed trainer config.
        total_training_steps: unused (the roles share one constructor).
    """

    def __init__(self, config: PPOTrainerConfig, total_training_steps: int = 0) -> None:
        super().__init__()
        if tracking_enabled():
            track_reads(config)
        self.config = config
        inference = config.reward_model.inference
        self.max_lengths = {
            "prompt": int(inference.prompt_length),
            "response": int(inference.response_length),
        }
        self.offload = False  # set by init_model: param_offload on an accelerator

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def init_model(self) -> None:
        init_distributed()
        self.device = current_device()
        inference = self.config.reward_model.inference
        fraction = float(inference.gpu_memory_utilization)
        if self.device.type == "cuda":  # a cap on this process's share of the GPU (colocated roles share it)
            torch.cuda.set_per_process_memory_fraction(fraction, self.device)
        model = self.config.reward_model.model
        # The actor's compute dtype (bf16 on the usual GPU recipe), on this rank's device.
        dtype = mixed_precision_dtypes(self.config.actor_rollout_ref.actor.fsdp_config.mixed_precision)[0]
        self.module = load_reward_model(model_path(model), trust_remote_code=bool(model.trust_remote_code))
        self.use_remove_padding = bool(model.use_remove_padding)
        if self.use_remove_padding:
            set_packed_attention(self.module)
        self.offload = bool(model.fsdp_config.param_offload) and self.device.type != "cpu"
        self.module.to(device="cpu" if self.offload else self.device, dtype=dtype).eval()

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_rm_score(self, data: DataProto) -> DataProto:
        widths = {"response": data.batch["responses"].shape[-1]}
        widths["prompt"] = data.batch["input_ids"].shape[-1] - widths["response"]
        for side, width in widths.items():
            if width > self.max_lengths[side]:
                raise ValueError(
                    f"reward model: {side}s of {width} tokens, longer than "
                    f"reward_model.inference.{side}_length={self.max_lengths[side]}"
                )
        rm = self.config.reward_model
        spec = log_prob_spec(
            bool(rm.use_dynamic_bsz),
            int(rm.micro_batch_size_per_gpu),
            int(rm.forward_max_token_len_per_gpu),
            1,
        )
        micro = split_micro_batches(data.batch, spec)  # no collectives: ranks may differ in count
        parts = []
        if self.offload:
            self.module.to(self.device)
        with torch.no_grad():
            for mb in micro.batches:
                parts.append(
                    compute_rm_score(
                        self.module,
                        mb["input_ids"],
                        mb["attention_mask"],
                        mb["position_ids"],
                        mb["responses"].shape[-1],
                        use_remove_padding=self.use_remove_padding,
                    )
                )
        if self.offload:  # back to host memory until the next batch
            self.module.to("cpu")
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        return DataProto.from_dict(tensors={"rm_scores": micro.restore(parts)})
