"""The single controller: a driver process that calls methods on groups of Ray worker actors."""

from rlflow.single_controller.decorator import (
    Dispatch,
    MeshDispatch,
    make_nd_compute_dataproto_dispatch_fn,
    register,
)
from rlflow.single_controller.ray_init import init_ray
from rlflow.single_controller.resource_pool import RayResourcePool, ResourceUnavailableError
from rlflow.single_controller.worker import Worker
from rlflow.single_controller.worker_group import RayClassWithInitArgs, RayWorkerGroup, WorkerGroupError

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
