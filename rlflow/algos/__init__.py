"""Pure PPO-family algorithms: advantage estimators, policy / value / entropy / KL losses, loss aggregation
and their registries. Torch only: no process groups, no Ray, no config loading. verl-style code imports
them through ``rlflow.trainer.ppo.core_algos``."""
