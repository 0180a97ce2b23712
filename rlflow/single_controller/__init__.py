"""The single controller: a driver process that calls methods on groups of Ray worker actors.

The worker side (`Worker`, `register`, the dispatch modes) does not need Ray: a role worker can be built
and called in a plain process (``scripts/gpu_check.py`` does, on machines without Ray). The driver side
(resource pools, worker groups, ``init_ray``) imports Ray when first used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rlflow.single_controller.decorator import (
    Dispatch,
    MeshDispatch,
    make_nd_compute_dataproto_dispatch_fn,
    register,
)
from rlflow.single_controller.worker import Worker

if TYPE_CHECKING:
    from rlflow.single_controller.ray_init import init_ray
    from rlflow.single_controller.resource_pool import RayResourcePool, ResourceUnavailableError
    from rlflow.single_controller.worker_group import RayClassWithInitArgs, RayWorkerGroup, WorkerGroupError

_RAY_SIDE = {
    "init_ray": "ray_init",
    "RayResourcePool": "resource_pool",
    "ResourceUnavailableError": "resource_pool",
    "RayClassWithInitArgs": "worker_group",
    "RayWorkerGroup": "worker_group",
    "WorkerGroupError": "worker_group",
}

__all__ = [
    "Dispatch",
    "MeshDispatch",
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "ResourceUnavailableError",
    "Worker",
    "WorkerGroupError",
    "init_ray",
    "make_nd_compute_dataproto_dispatch_fn",
    "register",
]


def __getattr__(name: str) -> Any:
    if name in _RAY_SIDE:
        return getattr(importlib.import_module(f"rlflow.single_controller.{_RAY_SIDE[name]}"), name)
    raise AttributeError(f"module 'rlflow.single_controller' has no attribute {name!r}")
