"""The PPO update on one data-parallel rank: `DataParallelPPOActor`, `DataParallelPPOCritic`, the
epochs × mini-batches × micro-batches loop, micro-batch balancing and optimizers. No Ray: the Ray-facing
workers in ``rlflow.workers`` build these from the typed config."""
