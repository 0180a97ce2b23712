"""Keys under the schema's free-form sections (``dict`` fields) pass validation, as the docs promise."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from rlflow.config import load_config, validate_config


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("data.apply_chat_template_kwargs", "enable_thinking", False),
        ("custom_reward_function.reward_kwargs", "bonus", 0.5),
    ],
)
def test_a_key_under_a_free_form_section_passes_validation(section, key, value):
    cfg = load_config([f"+{section}.{key}={str(value).lower()}"], config_name="demo_two_ranks")
    validate_config(cfg)
    assert OmegaConf.select(cfg, section) == {key: value}
