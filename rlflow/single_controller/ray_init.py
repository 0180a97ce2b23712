"""Starting (or joining) the Ray cluster that rlflow's worker groups run on."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import ray

logger = logging.getLogger(__name__)

DEFAULT_OBJECT_STORE_BYTES = 2 * 2**30


def default_object_store_bytes() -> int:
    """A bounded object store: 2 GiB, or a fifth of the machine's memory when that is smaller."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return DEFAULT_OBJECT_STORE_BYTES
    return int(min(DEFAULT_OBJECT_STORE_BYTES, total // 5))


def worker_env_vars(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for every worker process: the driver's import path, so that worker classes defined in
    the user's scripts, notebooks or tests import by reference, and quiet tokenizers."""
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    existing = os.environ.get("PYTHONPATH", "")
    env = {
        "PYTHONPATH": os.pathsep.join(dict.fromkeys([*paths, *existing.split(os.pathsep)]).keys()).strip(
            os.pathsep
        ),
        "TOKENIZERS_PARALLELISM": "false",
    }
    env.update(extra or {})
    return env


def init_ray(
    address: str | None = None,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    object_store_memory: int | None = None,
    env_vars: dict[str, str] | None = None,
    namespace: str | None = None,
    runtime_env: dict[str, Any] | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Start a local Ray instance (dashboard off, bounded object store) or join ``address``.

    ``address`` falls back to the ``RAY_ADDRESS`` environment variable; with neither, a fresh local
    cluster is started.  Does nothing when Ray is already initialised.  Returns the cluster resources.
    ``runtime_env`` is the job's Ray runtime environment (``ray_init.runtime_env``); its ``env_vars`` are
    added to `worker_env_vars` (``env_vars`` wins).
    """
    if ray.is_initialized():
        return ray.cluster_resources()
    address = address or os.environ.get("RAY_ADDRESS") or None
    user = {k: v for k, v in (runtime_env or {}).items() if v is not None}  # verl spells out null fields
    runtime_env = {
        **user,
        "env_vars": worker_env_vars({**dict(user.get("env_vars") or {}), **(env_vars or {})}),
    }
    if address:
        logger.info("joining the Ray cluster at %s", address)
        ray.init(address=address, runtime_env=runtime_env, namespace=namespace, **kwargs)
    else:
        # "local": a new cluster even when <ray tmp>/ray_current_cluster names one (a running or crashed
        # earlier run), which ray.init() without an address would try to join.
        ray.init(
            address="local",
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            include_dashboard=False,
            object_store_memory=object_store_memory or default_object_store_bytes(),
            runtime_env=runtime_env,
            namespace=namespace,
            **kwargs,
        )
    return ray.cluster_resources()
