"""verl's later profiler layout (``global_profiler.*``, ``<role>.profiler.*``) on rlflow's profiler keys.

rlflow records ``torch.profiler`` traces of chosen training steps (`rlflow.single_controller.profiling`)
with ``trainer.profile_steps``, ``trainer.profile_dir`` and each role's ``profile_ranks`` /
``profile_ranks_all`` / ``profile_discrete`` (verl's earlier spelling). Before the config is composed,
the command line's overrides in verl's later layout are rewritten onto those keys:

==================================================  =====================================================
verl                                                rlflow
==================================================  =====================================================
``global_profiler.tool=torch`` (or ``<role>.         the profiler rlflow has; ``null`` (verl: no profiling)
profiler.tool``)                                    with steps set, and ``nsys`` / ``npu`` /
                                                    ``torch_memory``, are refused
``global_profiler.steps=[...]``                     ``trainer.profile_steps=[...]``
``global_profiler.save_path=D``                     ``trainer.profile_dir=D``
``global_profiler.profile_continuous_steps``        ``false`` only (one trace per profiled step)
``<role>.profiler.enable=true`` with ``ranks=[...]``  ``<role>.profile_ranks=[...]``
``<role>.profiler.enable=true`` with ``all_ranks``    ``<role>.profile_ranks_all=true``
``<role>.profiler.discrete``                        ``<role>.profile_discrete`` (one trace per worker
                                                    call instead of one per step)
``actor_rollout_ref.actor.profiler.*``              also the rollout's (verl's rollout profiler follows
                                                    the actor's, key by key, unless set itself)
``<role>.profiler.save_path``                       as ``global_profiler.save_path`` (one folder)
``*.tool_config.{nsys,npu,torch_memory}.*``,        settings of the tools rlflow does not have (or the
``global_profiler.global_tool_config.*``            trace's own defaults): accepted, they change nothing
``<role>.profiler.tool_config.torch.step_start=0``  the whole step (other values refused)
/ ``step_end=null``
``<role>.profiler.tool_config.torch.discrete``      as ``<role>.profiler.discrete``
``<role>.profiler.tool_config.torch.contents``      ``[]`` or a subset of what every trace holds (``cpu``,
                                                    ``cuda``, ``shapes``); ``memory`` / ``stack`` refused
``tool_config.torch.schedule.*``,                   their defaults only (``0`` / null / false / ``[]``:
``tool_config.torch.profile_token_{start,end}``,    one trace of the whole step, nothing run after it)
``global_profiler.{relocate_results,finish_hook_*}``
``*.tool_config.precision_debugger.*``              a tool rlflow does not have: accepted, changes nothing
``<role>.profiler.ranks`` / ``all_ranks`` in verl's  chose the ranks profiled on ``trainer.profile_steps``
earlier layout (no ``global_profiler``, no          (that layout had no ``enable`` switch)
``enable``)
``trainer.npu_profile.options.save_path`` (and the  ``trainer.profile_dir``; the NPU tool's other options
NPU recipes' ``profile.options.*``)                 (``level``, ``with_*``, ``record_shapes``, ``analysis``)
                                                    are accepted and change nothing
==================================================  =====================================================

``<role>`` is ``actor_rollout_ref.actor`` / ``.rollout`` / ``.ref`` or ``critic``; the reward model is
not profiled (``reward_model.profiler.enable=true`` is refused). ``enable=false`` profiles nothing, as in
verl, whatever ``ranks`` say.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from rlflow.config.override_syntax import parse_bool, split_override, unquote

logger = logging.getLogger(__name__)

__all__ = ["PROFILER_ROLES", "is_profiler_layout_key", "rewrite_profiler_overrides"]

PROFILER_ROLES = (
    "actor_rollout_ref.actor",
    "actor_rollout_ref.rollout",
    "actor_rollout_ref.ref",
    "critic",
    "reward_model",
)
_GLOBAL = "global_profiler"
_NULL = ("null", "none", "~", "")
_TOOLS_REFUSED = {
    "nsys": "Nsight Systems",
    "npu": "the Ascend NPU profiler",
    "torch_memory": "torch's CUDA memory snapshots",
}
_GLOBAL_KEYS = ("tool", "steps", "save_path", "profile_continuous_steps")
_ROLE_KEYS = (
    "tool",
    "enable",
    "ranks",
    "all_ranks",
    "discrete",
    "tool_config.torch.discrete",
    "tool_config.torch.contents",
    "save_path",
    "tool_config.torch.step_start",
    "tool_config.torch.step_end",
)
_NPU = "npu_options"
_NPU_SECTIONS = ("trainer.npu_profile.options", "profile.options")
_NPU_OPTIONS = (
    "level",
    "with_memory",
    "record_shapes",
    "with_npu",
    "with_cpu",
    "with_module",
    "with_stack",
    "analysis",
    "roles",
)
"""Options of verl's earlier Ascend NPU profiler section (``trainer.npu_profile.options.*``, and the
``profile.options.*`` of its NPU recipes): ``save_path`` is the trace folder; these configure the NPU tool."""
_GLOBAL_INERT = ("global_tool_config.",)
_ROLE_INERT = (
    "tool_config.nsys.",
    "tool_config.npu.",
    "tool_config.torch_memory.",
    "tool_config.precision_debugger.",
)
"""Sub-keys that configure tools rlflow does not have: accepted, and they change nothing."""
_WHOLE_STEP = "rlflow records one torch.profiler trace of each profiled step, whole"
_ROLE_DEFAULT_ONLY = {
    **{
        f"tool_config.torch.schedule.{k}": ("0",)
        for k in ("skip_first", "wait", "warmup", "active", "repeat")
    },
    "tool_config.torch.profile_token_start": _NULL,
    "tool_config.torch.profile_token_end": _NULL,
}
_GLOBAL_DEFAULT_ONLY = {
    "relocate_results": ("false",),
    "finish_hook_cmd": _NULL,
    "finish_hook_all_ranks": ("false",),
    "finish_hook_ranks": ("[]", *_NULL),
}
"""Sub-keys accepted at the value that leaves their feature off (a profiler schedule within the step, a token
window of the rollout, moving the results, a command run after profiling)."""
_TRACE_CONTENTS = ("cpu", "cuda", "shapes")
"""What every trace holds (`rlflow.single_controller.profiling`): CPU and CUDA activities, input shapes."""


def _section(key: str) -> tuple[str, str] | None:
    """``(owner, sub-key)`` of a verl profiler key (owner: ``global_profiler``, a role, or the NPU profiler's
    options section), else None."""
    if key.startswith(_GLOBAL + "."):
        return _GLOBAL, key[len(_GLOBAL) + 1 :]
    for section in _NPU_SECTIONS:
        if key.startswith(section + "."):
            return _NPU, key[len(section) + 1 :]
    for role in PROFILER_ROLES:
        if key.startswith(role + ".profiler."):
            return role, key[len(role) + len(".profiler.") :]
    return None


def is_profiler_layout_key(key: str) -> bool:
    """Whether ``key`` is in verl's later profiler layout (read by :func:`rewrite_profiler_overrides`)."""
    return _section(key) is not None or key in _NPU_SECTIONS


def rewrite_profiler_overrides(overrides: Iterable[str]) -> list[str]:
    """Replace verl's later profiler overrides by rlflow's (see the module docstring).

    Args:
        overrides: the command line's Hydra overrides (other ones pass through unchanged, in order).

    Returns:
        The overrides with the profiler ones rewritten, appended after the others.

    Raises:
        ValueError: a tool, value or combination rlflow does not have, naming the key and what to do.
    """
    out: list[str] = []
    found: dict[str, dict[str, tuple[str, str]]] = {}
    for item in overrides:
        prefix, key, rest = split_override(item)
        value = rest.removeprefix("=")
        where = _section(key) if rest and prefix != "~" and not item.startswith("-") else None
        if where is None:
            out.append(item)
            continue
        owner, sub = where
        found.setdefault(owner, {})[sub] = (key, value)
    if not found:
        return out
    new = _translate(found)
    logger.info(
        "verl's profiler layout %s read as %s", sorted(k for o in found.values() for k, _ in o.values()), new
    )
    return out + new


def _translate(found: dict[str, dict[str, tuple[str, str]]]) -> list[str]:
    tools = {owner: _check_tool(entries) for owner, entries in found.items()}
    torch_on = "torch" in tools.values()
    new: list[str] = []
    save_paths = set()
    for owner, entries in found.items():
        for sub, (key, value) in entries.items():
            if owner == _NPU:
                if sub == "save_path":
                    save_paths.add(unquote(value))
                elif sub not in _NPU_OPTIONS:
                    raise ValueError(
                        f"{key}: not an option of verl's NPU profiler section that rlflow reads (save_path, "
                        f"{', '.join(_NPU_OPTIONS)})"
                    )
                continue
            known, inert = (_GLOBAL_KEYS, _GLOBAL_INERT) if owner == _GLOBAL else (_ROLE_KEYS, _ROLE_INERT)
            if sub.startswith(inert):
                continue
            default_only = _GLOBAL_DEFAULT_ONLY if owner == _GLOBAL else _ROLE_DEFAULT_ONLY
            if sub in default_only:
                if unquote(value).replace(" ", "").lower() not in default_only[sub]:
                    raise ValueError(
                        f"{key}={value}: {_WHOLE_STEP}; keep {default_only[sub][0]} or drop the key"
                    )
                continue
            if sub == "tool_config.torch.contents":
                _check_contents(key, value)
                continue
            if sub not in known:
                raise ValueError(
                    f"{key}: not a key of verl's profiler layout that rlflow reads (global_profiler: "
                    f"{', '.join(_GLOBAL_KEYS)}, global_tool_config.*; <role>.profiler: {', '.join(_ROLE_KEYS)}, "
                    "tool_config.{nsys,npu,torch_memory,precision_debugger}.*)"
                )
            if sub in ("tool", "enable", "ranks", "all_ranks", "discrete", "tool_config.torch.discrete"):
                continue
            if sub == "steps":
                if unquote(value).lower() in _NULL:
                    continue
                if not torch_on:
                    raise ValueError(
                        f"{key}={value} with no profiler tool set profiles nothing (verl's tool=null): set "
                        "global_profiler.tool=torch for rlflow's torch.profiler traces, or drop the steps"
                    )
                new.append(f"trainer.profile_steps={value}")
            elif sub == "save_path":
                if unquote(value).lower() not in _NULL:
                    save_paths.add(unquote(value))
            elif sub == "profile_continuous_steps":
                if parse_bool(key, value):
                    raise ValueError(
                        f"{key}={value}: rlflow writes one trace per profiled step "
                        "(<profile_dir>/step_<N>/); set it false"
                    )
            elif sub == "tool_config.torch.step_start":
                if unquote(value) != "0":
                    raise ValueError(f"{key}={value}: rlflow traces the whole step; keep 0")
            elif sub == "tool_config.torch.step_end" and unquote(value).lower() not in _NULL:
                raise ValueError(f"{key}={value}: rlflow traces the whole step; keep null")
    if len(save_paths) > 1:
        raise ValueError(
            f"the profiler's save_path keys disagree ({sorted(save_paths)}): rlflow has one folder"
        )
    if save_paths:
        new.append(f"trainer.profile_dir={save_paths.pop()}")
    roles = {owner: entries for owner, entries in found.items() if owner not in (_GLOBAL, _NPU)}
    earlier = _GLOBAL not in found  # verl's earlier layout: trainer.profile_steps, no enable switch
    actor = roles.get("actor_rollout_ref.actor")
    if actor is not None:  # verl's rollout profiler follows the actor's, key by key, unless set itself
        roles["actor_rollout_ref.rollout"] = {**actor, **roles.get("actor_rollout_ref.rollout", {})}
    for role, entries in roles.items():
        new.extend(_role_overrides(role, entries, earlier))
    return new


def _check_contents(key: str, value: str) -> None:
    """verl's ``tool_config.torch.contents``: what the trace records; rlflow's holds ``_TRACE_CONTENTS``."""
    items = [i.strip().strip("'\"").lower() for i in unquote(value).strip("[] ").split(",") if i.strip()]
    missing = [i for i in items if i not in _TRACE_CONTENTS]
    if missing:
        raise ValueError(
            f"{key}={value}: rlflow's traces hold {list(_TRACE_CONTENTS)} (CPU and CUDA activities, input "
            f"shapes), not {missing}; drop those entries"
        )


def _discrete(entries: dict[str, tuple[str, str]]) -> bool:
    """``discrete`` or ``tool_config.torch.discrete`` (verl's later spelling); they must agree."""
    values = {
        sub: parse_bool(*entries[sub]) for sub in ("discrete", "tool_config.torch.discrete") if sub in entries
    }
    if len(set(values.values())) > 1:
        keys = [entries[sub][0] for sub in values]
        raise ValueError(f"{keys[0]} and {keys[1]} disagree; set one of them")
    return any(values.values())


def _check_tool(entries: dict[str, tuple[str, str]]) -> str | None:
    if "tool" not in entries:
        return None
    key, value = entries["tool"]
    tool = unquote(value).lower()
    if tool in _NULL:
        return None
    if tool in _TOOLS_REFUSED:
        raise ValueError(
            f"{key}={value}: rlflow has no {_TOOLS_REFUSED[tool]} integration; it records torch.profiler "
            "traces (set the tool to torch; open them in Perfetto or chrome://tracing)"
        )
    if tool != "torch":
        raise ValueError(f"{key}={value} is not one of verl's tools (nsys, npu, torch, torch_memory)")
    return tool


def _role_overrides(role: str, entries: dict[str, tuple[str, str]], earlier: bool) -> list[str]:
    """The role's profile keys; in verl's earlier layout (``trainer.profile_steps``, no ``global_profiler``)
    a role had no ``enable`` switch: its ``ranks`` / ``all_ranks`` chose the ranks profiled."""
    chosen = ("all_ranks" in entries and parse_bool(*entries["all_ranks"])) or (
        "ranks" in entries and unquote(entries["ranks"][1]).replace(" ", "") not in ("[]", *_NULL)
    )
    default = "true" if earlier and chosen else "false"  # verl's defaults spelled out choose no rank
    enable_key, enable_value = entries.get("enable", (f"{role}.profiler.enable", default))
    if not parse_bool(enable_key, enable_value):
        return []
    if role == "reward_model":
        raise ValueError(
            f"{enable_key}={enable_value}: rlflow does not profile the reward-model group; profile the "
            "actor, rollout, ref or critic"
        )
    discrete = [f"{role}.profile_discrete=true"] if _discrete(entries) else []
    if "all_ranks" in entries and parse_bool(*entries["all_ranks"]):
        return [f"{role}.profile_ranks_all=true", *discrete]
    ranks = entries.get("ranks")
    if ranks is None or unquote(ranks[1]).replace(" ", "") in ("[]", *_NULL):
        raise ValueError(
            f"{enable_key}=true profiles no rank: set {role}.profiler.ranks=[0,...] or "
            f"{role}.profiler.all_ranks=true"
        )
    return [f"{role}.profile_ranks={ranks[1]}", *discrete]
