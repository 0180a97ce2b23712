"""Activation offload (verl's ``model.enable_activation_offload``): the tensors a training forward saves
for its backward wait in host memory instead of on the accelerator.

`ActivationOffload` is a ``torch.autograd.graph.saved_tensors_hooks`` pair. In the forward, every saved
tensor that lives on an accelerator is copied to host memory (pinned, so the copy back can overlap) and
the device copy is freed with the forward's other temporaries; in the backward it is copied back to the
device it came from just before the gradient that needs it. Parameters are not copied: FSDP gathers them
again for the backward, and a host copy of every layer's full weight would cost more than it saves.
With gradient checkpointing (rlflow's default) the saved tensors are the checkpointed layers' inputs, one
``(tokens, hidden)`` activation per layer, which is what verl offloads too.

On a CPU device the saved tensors are already in host memory: the hooks pass them through unchanged and
count them, so the same code path runs on CPU and GPU and a CPU test can check which tensors it sees.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

import torch

__all__ = ["ActivationOffload"]


class ActivationOffload:
    """Context manager: saved activations go to host memory during the forward run inside it.

    Args:
        enabled: False makes the context a no-op (no hooks installed).

    Attributes:
        saved: activations the hooks saw (parameters excluded) since construction.
        offloaded_bytes: bytes of those that were copied from an accelerator to host memory.
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = bool(enabled)
        self.saved = 0
        self.offloaded_bytes = 0
        self._hooks: Any = None

    def _pack(self, tensor: torch.Tensor) -> Any:
        # a parameter, or a view of one (a linear layer saves ``W.t()``; FSDP1's weights are views of
        # its flat parameter): kept as it is
        base = tensor if tensor._base is None else tensor._base
        if isinstance(base, torch.nn.Parameter):
            return tensor
        self.saved += 1
        if tensor.device.type == "cpu":
            return tensor
        host = torch.empty(
            tensor.size(),
            dtype=tensor.dtype,
            layout=tensor.layout,
            pin_memory=not tensor.is_sparse,
        )
        host.copy_(tensor)
        self.offloaded_bytes += host.numel() * host.element_size()
        return (tensor.device, host)

    @staticmethod
    def _unpack(packed: Any) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        device, host = packed
        return host.to(device, non_blocking=True)

    def __enter__(self) -> ActivationOffload:
        if self.enabled:
            self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
            self._hooks.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._hooks is not None:
            self._hooks.__exit__(exc_type, exc, tb)
            self._hooks = None
