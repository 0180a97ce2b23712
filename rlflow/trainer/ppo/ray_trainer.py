"""verl's module name for the trainer class: ``from rlflow.trainer.ppo.ray_trainer import RayPPOTrainer``."""

from rlflow.trainer.ray_trainer import RayPPOTrainer

__all__ = ["RayPPOTrainer"]
