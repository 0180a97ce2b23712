"""Ray-facing workers, one small class per role (composition, no role flags):

* `ActorRolloutWorker` — the policy: rollout, old log-probs, PPO update.
* `RefWorker` — the frozen reference policy (``compute_ref_log_prob``).
* `CriticWorker` — values, the step's advantages and returns (both non-blocking: the driver gets
  futures), and the value update.
* `RewardModelWorker` — sequence-classification reward model scores.

Each role is its own worker group (own processes, own process group and FSDP mesh), colocated with the
others on one placement group. Data methods use mesh dispatch: samples are split by the DP rank each
worker registers, Ulysses peers get the same samples and only sp-rank-0 outputs are gathered.
"""

from rlflow.workers.actor_rollout import ActorRolloutWorker
from rlflow.workers.critic import CriticWorker
from rlflow.workers.ref import RefWorker
from rlflow.workers.reward_model import RewardModelWorker

__all__ = ["ActorRolloutWorker", "CriticWorker", "RefWorker", "RewardModelWorker"]
