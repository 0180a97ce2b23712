"""Keys of verl's generated ``ppo_trainer.yaml`` that ported command lines spell out: ``trainer.val_only``,
``ray_kwargs.timeline_json_file``, ``data.validation_shuffle``, ``actor_rollout_ref.model.custom_chat_template``,
``critic.rollout_n``, ``data.tokenizer``, and the switches of features rlflow lacks, accepted at their off value
(`rlflow.config.verl_defaults_only`).
"""

from __future__ import annotations

import json
import re

import pytest

from rlflow.config import load_config, to_typed
from rlflow.trainer.check_config import check_config
from rlflow.trainer.main_ppo import build_data, prepare_config, run_ppo


@pytest.mark.usefixtures("ray_session")
def test_val_only_validates_once_and_trains_nothing(tmp_path):
    """The demo's step-0 validation reward is the README's first point (0.4629, greedy decoding); with
    ``val_only`` it is all a run does, also with ``val_before_train=false``."""
    cfg = load_config(
        [
            "trainer.val_only=true",
            "trainer.val_before_train=false",
            f"trainer.log_dir={tmp_path / 'logs'}",
            f"trainer.default_local_dir={tmp_path / 'ckpt'}",
            f"ray_kwargs.timeline_json_file={tmp_path / 'trace' / 'timeline.json'}",  # verl's spelling
        ],
        config_name="demo",
    )
    history = run_ppo(cfg)["history"]
    assert [h["step"] for h in history] == [0]
    (only,) = history
    assert only["val-core/rlflow/repeat/reward/mean@1"] == pytest.approx(0.4629, abs=5e-5)
    assert not any(key.startswith(("actor/", "critic/", "timing_s/")) for key in only)
    # and Ray's timeline of the run: the validation's generation among its actor calls
    events = json.loads((tmp_path / "trace" / "timeline.json").read_text())
    assert any("generate" in str(event.get("name", "")) for event in events)


def _prompts(overrides: list[str]) -> list[str]:
    """The validation prompts as the driver's data loader gives them, decoded."""
    from rlflow.models.loader import load_tokenizer
    from rlflow.workers.role_setup import tokenizer_path

    config = to_typed(prepare_config(load_config(overrides, config_name="demo")))
    model = config.actor_rollout_ref.model
    tokenizer = load_tokenizer(tokenizer_path(model), chat_template=model.custom_chat_template)
    _, val = build_data(config, tokenizer)
    out = []
    for batch in val:
        ids, mask = batch["input_ids"], batch["attention_mask"]
        out += [tokenizer.decode(row[m.bool()]) for row, m in zip(ids, mask)]
    return out


def test_validation_shuffle_draws_a_seeded_order_of_the_same_prompts():
    plain = _prompts([])
    shuffled = _prompts(["data.validation_shuffle=true"])
    assert shuffled != plain and sorted(shuffled) == sorted(plain)
    assert _prompts(["data.validation_shuffle=true"]) == shuffled  # the same order every time
    assert _prompts(["data.validation_shuffle=true", "data.seed=7"]) != shuffled


def test_a_custom_chat_template_renders_the_prompts_and_a_broken_one_fails_before_ray():
    """``actor_rollout_ref.model.custom_chat_template`` (a quoted Jinja string on the command line)."""
    key = "actor_rollout_ref.model.custom_chat_template"
    template = (
        "{% for m in messages %}Q: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}A:{% endif %}"
    )
    prompts = _prompts([f"{key}='{template}'"])
    assert prompts[0] == "Q: repeat c x5\nA:"
    assert all(p.startswith("Q: ") and p.endswith("\nA:") for p in prompts)
    assert not any(p.startswith("Q: ") for p in _prompts([]))  # the tokenizer's own template otherwise
    with pytest.raises(
        ValueError, match=rf"^{re.escape(key)} does not render a conversation: TemplateSyntaxError"
    ):
        check_config([f"{key}='{{% for m in messages %}}{{{{ m.content }}}}'"], "demo")


def test_critic_rollout_n_is_verls_copy_of_rollout_n():
    check_config(["critic.rollout_n=1"], "demo")
    check_config(["actor_rollout_ref.rollout.n=4", "critic.rollout_n=4"], "demo")
    with pytest.raises(
        ValueError, match=re.escape("critic.rollout_n=2 must equal actor_rollout_ref.rollout.n=1")
    ):
        check_config(["critic.rollout_n=2"], "demo")


@pytest.mark.parametrize(
    ("off", "on", "message"),
    [
        ("actor_rollout_ref.actor.optim.total_training_steps=-1", "=500", "learning-rate schedule spans"),
        ("critic.optim.total_training_steps=-1", "=500", "learning-rate schedule spans"),
        ("actor_rollout_ref.rollout.over_sample_rate=0", "=0.1", "aborts the slowest"),
        ("actor_rollout_ref.rollout.cudagraph_capture_sizes=null", "=[1,2]", "CUDA graphs"),
        ("actor_rollout_ref.rollout.trace.backend=null", "=weave", "rollout tracing"),
        ("actor_rollout_ref.rollout.trace.token2text=False", "=true", "rollout tracing"),
        ("actor_rollout_ref.rollout.skip_rollout=false", "=true", "dumps the first rollouts"),
        ("actor_rollout_ref.rollout.agent.agent_loop_config_path=null", "=loops.yaml", "agent loop"),
        ("actor_rollout_ref.rollout.agent.custom_async_server.path=null", "=server.py", "agent loop"),
        ("data.sampler.class_path=null", "=curriculum.py", "curriculum"),
        ("data.sampler.class_name=None", "=MySampler", "curriculum"),
        ("data.datagen.path=null", "=gen.py", "dynamic data generation"),
        ("reward_model.max_length=null", "=4096", "truncating the reward model's input"),
        ("reward_model.ulysses_sequence_parallel_size=1", "=2", "one full copy per rank"),
        ("trainer.esi_redundant_time=0", "=600", "elastic (ESI) instance"),
        ("trainer.del_local_ckpt_after_load=false", "=true", "keeps the local checkpoint"),
    ],
)
def test_switches_of_features_rlflow_lacks_are_dropped_off_and_refused_on(off, on, message):
    check_config([off], "demo")
    key = off.split("=", 1)[0]
    with pytest.raises(ValueError, match=rf"^{re.escape(key)}=.*{re.escape(message)}"):
        check_config([key + on], "demo")


def test_keys_that_only_matter_beside_a_refused_switch_are_dropped_whatever_their_value():
    check_config(
        [
            "actor_rollout_ref.rollout.skip_dump_dir=/tmp/rollout_dump",
            "actor_rollout_ref.rollout.agent.num_workers=8",
            "trainer.ray_wait_register_center_timeout=300",
            "data.use_shm=true",
            "data.return_multi_modal_inputs=true",
            "data.return_raw_input_ids=false",
        ],
        "demo",
    )


def test_data_tokenizer_may_name_the_policys_tokenizer_only(tmp_path):
    from rlflow.models.tiny import resolve_model_path

    tiny = resolve_model_path("rlflow://tiny")
    check_config([f"actor_rollout_ref.model.path={tiny}", f"data.tokenizer={tiny}/"], "demo")
    with pytest.raises(
        ValueError, match=re.escape(f"set actor_rollout_ref.model.tokenizer_path={tmp_path} ")
    ):
        check_config([f"actor_rollout_ref.model.path={tiny}", f"data.tokenizer={tmp_path}"], "demo")
