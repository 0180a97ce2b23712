"""Names the config tests share: the embedded tiny model's attention heads (what validation checks the
layout against) and the two long section prefixes."""

from __future__ import annotations

HEADS = {"num_attention_heads": 4, "num_key_value_heads": 2}  # the embedded tiny model
ACTOR = "actor_rollout_ref.actor"
ROLLOUT = "actor_rollout_ref.rollout"
