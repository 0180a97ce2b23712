"""Shared fixtures: one local Ray instance for the whole session, shut down at the end."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device (marked gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray cluster with 4 logical CPUs and a small object store, shared by all tests."""
    import ray

    from rlflow.single_controller import init_ray

    if not ray.is_initialized():
        init_ray(num_cpus=4, object_store_memory=400 * 2**20)
    yield ray
    ray.shutdown()


def pytest_sessionfinish(session, exitstatus):
    try:
        import ray

        if ray.is_initialized():
            ray.shutdown()
    except Exception:
        pass
