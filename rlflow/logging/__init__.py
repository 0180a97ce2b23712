"""What a run reports: tracking backends (console, jsonl, tensorboard, wandb), training-curve plots, the
rollout viewer, FLOPs and memory accounting."""
