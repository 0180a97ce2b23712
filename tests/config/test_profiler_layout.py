"""verl's later profiler layout (``global_profiler.*``, ``<role>.profiler.*``) read onto rlflow's keys.

The keys and defaults are those of verl's generated ``ppo_trainer.yaml`` (``global_profiler.tool``,
``steps``, ``save_path``, ``profile_continuous_steps``; ``<role>.profiler.{enable,all_ranks,ranks,tool,
save_path,tool_config.*}``). The profiled run itself is ``tests/trainer/test_rollout_correction_runs.py``.
"""

from __future__ import annotations

import os
import re

import pytest

from rlflow.config import load_config
from rlflow.config.validate import validate_config

A, R, REF, C = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.ref", "critic"


def _profile_keys(overrides: list[str]) -> dict:
    cfg = load_config(overrides, config_name="demo_two_ranks")
    validate_config(cfg)
    out = {"steps": cfg.trainer.profile_steps, "dir": cfg.trainer.profile_dir}
    for name, section in (("actor", A), ("rollout", R), ("ref", REF), ("critic", C)):
        node = cfg
        for part in section.split("."):
            node = node[part]
        out[name] = (node.profile_ranks, node.profile_ranks_all)
        out[f"{name}_discrete"] = node.profile_discrete
    return out


def test_a_verl_profiling_command_line_sets_rlflows_keys(tmp_path):
    got = _profile_keys(
        [
            "global_profiler.tool=torch",
            "global_profiler.steps=[1,3]",
            f"global_profiler.save_path={tmp_path / 'prof'}",
            "global_profiler.profile_continuous_steps=false",
            "global_profiler.global_tool_config.nsys.discrete=true",  # another tool's setting: inert
            f"{A}.profiler.enable=true",
            f"{A}.profiler.ranks=[1]",
            f"{A}.profiler.tool_config.torch.step_start=0",
            f"{C}.profiler.enable=true",
            f"{C}.profiler.all_ranks=true",
            f"{REF}.profiler.enable=false",
            f"{REF}.profiler.ranks=[0]",  # not enabled: nothing, as in verl
            "reward_model.profiler.enable=false",
        ]
    )
    assert got == {
        "steps": [1, 3],
        "dir": str(tmp_path / "prof"),
        "actor": ([1], False),
        "rollout": ([1], False),  # verl's rollout profiler follows the actor's
        "ref": (None, False),
        "critic": (None, True),
        **{f"{name}_discrete": False for name in ("actor", "rollout", "ref", "critic")},
    }


def test_discrete_gives_one_trace_per_worker_call():
    got = _profile_keys(
        ["global_profiler.tool=torch", "global_profiler.steps=[1]", f"{A}.profiler.enable=true",
         f"{A}.profiler.ranks=[0]", f"{A}.profiler.discrete=true", f"{C}.profiler.enable=true",
         f"{C}.profiler.all_ranks=true", f"{C}.profiler.discrete=false"]
    )  # fmt: skip
    assert (got["actor"], got["actor_discrete"]) == (([0], False), True)
    assert got["rollout_discrete"]  # follows the actor's
    assert (got["critic"], got["critic_discrete"]) == ((None, True), False)


def test_the_rollouts_own_keys_override_the_actors_one_by_one():
    got = _profile_keys(
        ["+global_profiler.tool=torch", "global_profiler.steps=[2]", f"{A}.profiler.enable=true",
         f"{A}.profiler.ranks=[0]", f"{R}.profiler.ranks=[1]"]
    )  # fmt: skip
    assert got["actor"] == ([0], False) and got["rollout"] == ([1], False)
    assert got["dir"] is None  # <log_dir>/profile


def test_verls_earlier_layout_chooses_ranks_without_an_enable_switch(tmp_path):
    """verl's NPU scripts (``run_qwen2_5_7b_grpo_e2e_prof_npu.sh``, ``..._discrete_prof_npu.sh``): steps in
    ``trainer.profile_steps``, ranks per role, the NPU tool's options; on rlflow, torch.profiler traces."""
    got = _profile_keys(
        [
            f"{A}.profiler.all_ranks=True",
            f"{A}.profiler.discrete=False",
            f"{REF}.profiler.ranks=[0]",
            f"{REF}.profiler.discrete=True",
            f"trainer.npu_profile.options.save_path={tmp_path / 'prof'}",
            "trainer.npu_profile.options.level=level1",
            "trainer.npu_profile.options.with_memory=False",
            "trainer.npu_profile.options.analysis=True",
            "profile.options.with_stack=False",
            "trainer.profile_steps=[2,4]",
        ]
    )
    assert got["steps"] == [2, 4] and got["dir"] == str(tmp_path / "prof")
    assert got["actor"] == (None, True) and got["rollout"] == (None, True)  # the rollout follows the actor
    assert (got["ref"], got["ref_discrete"]) == (([0], False), True)
    assert got["critic"] == (None, False)


def test_verls_default_ranks_spelled_out_profile_nothing():
    """verl's defaults (``all_ranks=false``, ``ranks=[]``) written out on a command line without
    ``enable`` choose no rank: nothing is profiled (they were read as a request to profile no rank and
    refused)."""
    for overrides in (
        [f"{A}.profiler.all_ranks=false"],
        [f"{C}.profiler.ranks=[]", f"{C}.profiler.all_ranks=False"],
        [f"{REF}.profiler.all_ranks=false", f"{REF}.profiler.ranks=null"],
    ):
        got = _profile_keys(overrides)
        assert all(got[role] == (None, False) for role in ("actor", "rollout", "ref", "critic")), overrides


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["global_profiler.tool=nsys"],
            "global_profiler.tool=nsys: rlflow has no Nsight Systems integration",
        ),
        ([f"{C}.profiler.tool=npu"], f"{C}.profiler.tool=npu: rlflow has no the Ascend NPU"),
        (["global_profiler.tool=perf"], "global_profiler.tool=perf is not one of verl's tools"),
        (
            ["global_profiler.steps=[1]"],
            "global_profiler.steps=[1] with no profiler tool set profiles nothing",
        ),
        (
            ["global_profiler.tool=torch", "global_profiler.profile_continuous_steps=true"],
            "global_profiler.profile_continuous_steps=true: rlflow writes one trace per profiled step",
        ),
        (
            ["global_profiler.tool=torch", f"{A}.profiler.tool_config.torch.step_end=3"],
            f"{A}.profiler.tool_config.torch.step_end=3: rlflow traces the whole step",
        ),
        (
            ["global_profiler.tool=torch", f"{A}.profiler.enable=true"],
            f"{A}.profiler.enable=true profiles no rank",
        ),
        (
            [
                "global_profiler.tool=torch",
                "reward_model.profiler.enable=true",
                "reward_model.profiler.ranks=[0]",
            ],
            "rlflow does not profile the reward-model group",
        ),
        (
            ["global_profiler.save_path=/a", f"{C}.profiler.save_path=/b"],
            "the profiler's save_path keys disagree",
        ),
        ([f"{C}.profiler.frequency=2"], f"{C}.profiler.frequency: not a key of verl's profiler layout"),
        ([f"{C}.profiler.steps=[1]"], f"{C}.profiler.steps: not a key of verl's profiler layout"),
    ],
)
def test_what_rlflows_profiler_cannot_do_is_refused_with_the_key(overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        _profile_keys(overrides)


def test_the_command_line_reads_verls_layout_too():
    import subprocess
    import sys

    import yaml

    args = ["global_profiler.tool=torch", "global_profiler.steps=[2]", f"{C}.profiler.enable=true",
            f"{C}.profiler.ranks=[1]"]  # fmt: skip
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlflow.trainer.main_ppo",
            "--config-name",
            "demo_two_ranks",
            "--cfg",
            "job",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "RAY_AUTH_MODE": "disabled"},
    )
    assert proc.returncode == 0, proc.stderr
    cfg = yaml.safe_load(proc.stdout)
    assert cfg["trainer"]["profile_steps"] == [2] and cfg["critic"]["profile_ranks"] == [1]


def test_the_defaults_of_verls_generated_profiler_section_compose():
    """Every profiler key of verl's generated ppo_trainer.yaml at its default value (a dumped config passed
    back) profiles nothing; ``tool_config.torch.discrete`` is ``discrete``; ``contents`` may name what every
    trace holds."""
    defaults = [
        *(
            f"{role}.profiler.tool_config.torch.{key}"
            for role in (A, REF, C)
            for key in ("contents=[]", "discrete=false", *(f"schedule.{k}=0" for k in
                        ("skip_first", "wait", "warmup", "active", "repeat")))
        ),
        *(f"{role}.profiler.tool_config.precision_debugger.steps=null" for role in (A, R, REF, C)),
        f"{R}.profiler.tool_config.torch.profile_token_start=null",
        f"{R}.profiler.tool_config.torch.profile_token_end=null",
        "global_profiler.relocate_results=false",
        "global_profiler.finish_hook_cmd=null",
        "global_profiler.finish_hook_all_ranks=false",
        "global_profiler.finish_hook_ranks=[]",
    ]  # fmt: skip
    got = _profile_keys(defaults)
    assert got["steps"] is None and got["actor"] == (None, False) and not got["actor_discrete"]
    got = _profile_keys(
        ["global_profiler.tool=torch", "global_profiler.steps=[1]", f"{C}.profiler.enable=true",
         f"{C}.profiler.all_ranks=true", f"{C}.profiler.tool_config.torch.discrete=true",
         f"{C}.profiler.tool_config.torch.contents=[cpu,cuda,shapes]"]
    )  # fmt: skip
    assert (got["critic"], got["critic_discrete"]) == ((None, True), True)
    refused = {
        f"{C}.profiler.tool_config.torch.contents=[cpu,memory,stack]": "not ['memory', 'stack']",
        f"{C}.profiler.tool_config.torch.schedule.active=2": "keep 0 or drop the key",
        "global_profiler.finish_hook_cmd=ls": "global_profiler.finish_hook_cmd=ls: rlflow records one",
        f"{C}.profiler.relocate_results=false": "not a key of verl's profiler layout",
    }
    for override, message in refused.items():
        with pytest.raises(ValueError, match=re.escape(message)):
            _profile_keys(["global_profiler.tool=torch", override])
    with pytest.raises(ValueError, match="disagree"):
        _profile_keys(["global_profiler.tool=torch", "global_profiler.steps=[1]", f"{C}.profiler.enable=true",
                       f"{C}.profiler.all_ranks=true", f"{C}.profiler.discrete=true",
                       f"{C}.profiler.tool_config.torch.discrete=false"])  # fmt: skip
