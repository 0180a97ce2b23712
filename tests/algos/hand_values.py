"""Comparison helpers for the algorithm tests: hand-computed values against tensors."""

from __future__ import annotations

import torch

TOL = {"rtol": 1e-6, "atol": 1e-6}
EXACT = {"rtol": 0.0, "atol": 0.0}


def _close(actual, expected, tol=TOL):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), **tol)


def _t(rows):
    return torch.tensor(rows, dtype=torch.float32)
