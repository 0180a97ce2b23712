"""``trainer.log_system_metrics``: the driver node's CPU, memory, disk and GPU use, logged with each step.

The names are MLflow's system-metric names (``system/cpu_utilization_percentage``, ...), and they go to
every backend of ``trainer.logger`` with the step's other metrics:

* ``system/cpu_utilization_percentage``: the node's CPU use since the previous step (all cores);
* ``system/system_memory_usage_megabytes``, ``system/system_memory_usage_percentage``;
* ``system/disk_usage_megabytes``, ``system/disk_usage_percentage``: the file system of the log folder;
* ``system/gpu_<i>_memory_usage_megabytes``, ``..._memory_usage_percentage``, ``..._utilization_percentage``:
  each GPU of the driver's node through NVML (``pip install nvidia-ml-py``; whichever process holds the
  memory; none without NVML).

One sample per step, in the driver: the workers of other nodes are not included.
"""

from __future__ import annotations

import os
from types import ModuleType

import psutil

__all__ = ["SystemMetrics"]

_MB = 1024 * 1024


class SystemMetrics:
    """Samples the driver node's use of its CPUs, memory, disk and GPUs.

    Args:
        path: a path on the file system whose use is reported (the run's log folder).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._nvml = _init_nvml()
        psutil.cpu_percent(interval=None)  # the first call starts the interval the next one measures

    def sample(self) -> dict[str, float]:
        """The metrics of the module docstring, now (CPU: since the previous call)."""
        memory = psutil.virtual_memory()
        out = {
            "system/cpu_utilization_percentage": float(psutil.cpu_percent(interval=None)),
            "system/system_memory_usage_megabytes": (memory.total - memory.available) / _MB,
            "system/system_memory_usage_percentage": float(memory.percent),
        }
        disk_path = self.path
        while not os.path.exists(disk_path):  # the folder may not exist yet: its nearest parent's disk
            disk_path = os.path.dirname(os.path.abspath(disk_path))
        disk = psutil.disk_usage(disk_path)
        out["system/disk_usage_megabytes"] = disk.used / _MB
        out["system/disk_usage_percentage"] = float(disk.percent)
        if self._nvml is not None:
            out.update(_gpu_memory(self._nvml))
        return out


def _init_nvml() -> ModuleType | None:
    """``pynvml`` (from ``nvidia-ml-py``) once NVML is initialised; None when NVML or its driver is missing."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no NVML library, no driver, no GPU: no GPU metrics
        return None
    return pynvml


def _gpu_memory(pynvml: ModuleType) -> dict[str, float]:
    """Per-GPU memory and utilisation through NVML, which reads them without creating a CUDA context."""
    out = {}
    for i in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(i)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        out[f"system/gpu_{i}_memory_usage_megabytes"] = memory.used / _MB
        out[f"system/gpu_{i}_memory_usage_percentage"] = 100.0 * memory.used / memory.total
        out[f"system/gpu_{i}_utilization_percentage"] = float(
            pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
        )
    return out
