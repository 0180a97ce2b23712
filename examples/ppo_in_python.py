"""Library use: compose the config in Python, train a few PPO steps, read the metrics.

Run it as a script (``python examples/ppo_in_python.py``) or paste the cells into a notebook; the test
suite executes it (tests/trainer/test_examples.py).
"""

# %% Compose the config: the same keys as the command line overrides. config_name="demo" starts from the
# embedded CPU demo (config/demo.yaml); the default, "ppo_trainer", has verl's defaults.
from rlflow.config import load_config
from rlflow.trainer.main_ppo import run_ppo

cfg = load_config(
    [
        "trainer.total_training_steps=2",
        "trainer.test_freq=2",
        "trainer.logger=[jsonl]",
        "trainer.experiment_name=notebook",
        "trainer.log_dir=outputs/notebook",
    ],
    config_name="demo",
)
print("actor lr:", cfg.actor_rollout_ref.actor.optim.lr, "| estimator:", cfg.algorithm.adv_estimator)

# %% Train (starts a local Ray, builds the colocated actor and critic groups, shuts them down after).
result = run_ppo(cfg)

# %% Read the metrics of every step.
for row in result["history"]:
    score = row.get("critic/score/mean")
    print(row["step"], "score", score, "vf_loss", row.get("critic/vf_loss"))
final = result["final"]
print("validation score:", final.get("val-core/rlflow/repeat/reward/mean@1"))
