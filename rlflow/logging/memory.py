"""Peak memory of the calling process (``perf/max_rss_gb``, ``perf/max_memory_allocated_gb``, ...)."""

from __future__ import annotations

import resource
import sys

import torch

__all__ = ["get_memory_metrics"]

_GIB = float(2**30)


def get_memory_metrics(device: str | torch.device | None = None) -> dict[str, float]:
    """Peak memory of the calling process (not pure: reads process and allocator state).

    Args:
        device: a CUDA device to report the allocator peak of; None = the current CUDA device when CUDA
            is available, else none.

    Returns:
        ``perf/max_rss_gb``: peak resident set size of this process in GiB (``getrusage`` ru_maxrss);
        on CUDA also ``perf/max_memory_allocated_gb`` and ``perf/max_memory_reserved_gb``: the caching
        allocator's peaks since the start (or the last ``torch.cuda.reset_peak_memory_stats``), in GiB.
    """
    max_rss = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    max_rss_bytes = max_rss if sys.platform == "darwin" else max_rss * 1024.0  # Linux reports KiB
    metrics = {"perf/max_rss_gb": max_rss_bytes / _GIB}
    use_cuda = torch.cuda.is_available() if device is None else torch.device(device).type == "cuda"
    if use_cuda:
        metrics["perf/max_memory_allocated_gb"] = torch.cuda.max_memory_allocated(device) / _GIB
        metrics["perf/max_memory_reserved_gb"] = torch.cuda.max_memory_reserved(device) / _GIB
    return metrics
