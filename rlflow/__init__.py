"""rlflow: reinforcement learning for language models on a Ray single controller."""

__version__ = "0.1.0"
