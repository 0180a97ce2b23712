"""`RewardModelWorker`: a sequence-classification reward model's Ray actor."""

from __future__ import annotations

import logging

import torch
from tensordict import TensorDict

from rlflow.config.reads import track_reads, tracking_enabled
from rlflow.config.schema import PPOTrainerConfig
from rlflow.engine.batching import log_prob_spec
from rlflow.engine.ppo_loop import split_micro_batches
from rlflow.models.attention import set_packed_attention
from rlflow.models.cpu_linear import install_onednn_linear, resolve_cpu_linear_kernel
from rlflow.models.loader import load_reward_model, load_tokenizer
from rlflow.parallel.distributed import current_device, init_distributed
from rlflow.parallel.fsdp import mixed_precision_dtypes
from rlflow.protocol import DataProto
from rlflow.reward.retokenize import retokenize_conversations
from rlflow.reward.reward_model import place_on_last_token, sequence_scores
from rlflow.single_controller import Dispatch, Worker, register
from rlflow.workers.role_setup import model_path

__all__ = ["RewardModelWorker"]

logger = logging.getLogger(__name__)


class RewardModelWorker(Worker):
    """A sequence-classification reward model; scores go at the last valid response token.

    Inference only: every rank holds a full copy (no FSDP) and scores its share of the samples in
    micro-batches of ``reward_model.micro_batch_size_per_gpu`` samples (or, with ``use_dynamic_bsz``, of at
    most ``forward_max_token_len_per_gpu`` valid tokens). It reads the policy's tokens, or, with
    ``reward_model.model.input_tokenizer`` (a reward model with its own tokenizer and chat template), the
    conversations re-tokenized (`rlflow.reward.retokenize`).

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
        self.tokenizers = (
            None  # set by init_model: (the data's tokenizer, the reward model's) when they differ
        )

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
        setting = self.config.trainer.cpu_linear_kernel
        if resolve_cpu_linear_kernel(setting, self.device.type, torch.get_num_threads()) == "onednn":
            install_onednn_linear(self.module)
        if model.input_tokenizer is not None:
            trust = bool(model.trust_remote_code)
            self.tokenizers = (
                load_tokenizer(str(model.input_tokenizer), trust_remote_code=trust),
                load_tokenizer(model_path(model), trust_remote_code=trust),
            )

    def _inputs(self, data: DataProto) -> tuple[TensorDict, torch.Tensor]:
        """What the reward model reads — the policy's tokens, or the conversations re-tokenized with its own
        tokenizer (``model.input_tokenizer``) — and the policy's response mask, where the scores go."""
        response_mask = data.batch["attention_mask"][:, -data.batch["responses"].shape[-1] :]
        if self.tokenizers is None:
            return data.batch, response_mask
        if "raw_prompt" not in data.non_tensor_batch:
            raise ValueError(
                "reward_model.model.input_tokenizer needs the prompts' chat messages: set data.return_raw_chat=true"
            )
        limit = self.max_lengths["prompt"] + self.max_lengths["response"]
        tensors, truncated = retokenize_conversations(
            data.batch["responses"].cpu(),
            response_mask.cpu(),
            list(data.non_tensor_batch["raw_prompt"]),
            *self.tokenizers,
            max_length=limit,
        )
        if truncated:
            logger.warning(
                "reward model: %d of %d conversations are longer than reward_model.inference.prompt_length + "
                "response_length = %d tokens in the reward model's tokenizer; their last %d tokens are scored",
                truncated,
                len(data),
                limit,
                limit,
            )
        device = data.batch["responses"].device
        batch = TensorDict({k: v.to(device) for k, v in tensors.items()}, batch_size=[len(data)])
        return batch, response_mask

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
            None if rm.micro_batch_size_per_gpu is None else int(rm.micro_batch_size_per_gpu),
            int(rm.forward_max_token_len_per_gpu),
            1,
        )
        inputs, response_mask = self._inputs(data)
        micro = split_micro_batches(inputs, spec)  # no collectives: ranks may differ in count
        parts = []
        if self.offload:
            self.module.to(self.device)
        with torch.no_grad():
            for mb in micro.batches:
                parts.append(
                    sequence_scores(
                        self.module,
                        mb["input_ids"],
                        mb["attention_mask"],
                        mb["position_ids"],
                        use_remove_padding=self.use_remove_padding,
                    )
                )
        if self.offload:  # back to host memory until the next batch
            self.module.to("cpu")
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        return DataProto.from_dict(
            tensors={"rm_scores": place_on_last_token(micro.restore(parts), response_mask)}
        )
