"""Generate docs/configuration.md from the config schema and the comments of config/ppo_trainer.yaml.

    python scripts/gen_config_docs.py            # rewrite docs/configuration.md
    python scripts/gen_config_docs.py --check    # exit 1 when docs/configuration.md is out of date

Sources, for every leaf key of the composed config (`rlflow.config.loading.load_config` with no
overrides):

* type: the annotation of the field in `rlflow.config.schema` (the dataclass tree under
  `PPOTrainerConfig`);
* default: the value in the composed config, unresolved (``${a.b}`` = follows key ``a.b``);
* meaning: the field's entry in the ``Attributes:`` docstring section of its schema dataclass, the key's
  end-of-line comment in ``ppo_trainer.yaml`` when it adds something, and a note from `CLASS_NOTES` /
  `KEY_NOTES` below (keys the other sources do not describe).

The section text comes from each dataclass's docstring summary. `tests/test_docs.py` checks that the
committed page equals this script's output and names every key.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from rlflow.config import config_dir, load_config
from rlflow.config.schema import PPOTrainerConfig

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "configuration.md"

_MODEL_NOTES = {
    "tokenizer_path": "accepted for verl compatibility (checked to exist when it is a local path) but not "
    "read yet: the tokenizer is loaded from the model path",
    "trust_remote_code": "allow custom model / tokenizer code shipped with the model directory",
    "enable_gradient_checkpointing": "recompute activations in the backward pass to save memory (HF "
    "gradient checkpointing, non-reentrant)",
}
_BATCH_NOTES = {
    "ppo_max_token_len_per_gpu": "token budget of one micro-batch on one rank when use_dynamic_bsz is true",
    "ppo_epochs": "passes over the step's batch per update",
    "shuffle": "shuffle the samples before cutting mini-batches, each epoch (seeded by trainer.seed and "
    "the step, so a resumed run sees the same order)",
    "grad_clip": "maximum global gradient norm (over all shards); a non-finite norm skips the optimizer "
    "step and counts it in `*/skipped_steps`",
    "ulysses_sequence_parallel_size": "Ulysses sequence-parallel size: each sequence is split over this "
    "many ranks (must divide the role's world size and the attention heads)",
}
_OPTIM_NOTES = {
    "lr": "AdamW learning rate after warm-up",
    "lr_warmup_steps_ratio": "warm-up length as a fraction of the total steps (used when lr_warmup_steps is -1)",
    "min_lr_ratio": "cosine schedule: the final learning rate as a fraction of lr",
    "weight_decay": "AdamW decoupled weight decay",
    "betas": "AdamW betas",
    "eps": "AdamW epsilon",
}
_FSDP_NOTES = {
    "param_offload": "keep sharded parameters, gradients and optimizer state on CPU (GPU runs; a logged "
    "no-op on CPU)",
    "optimizer_offload": "keep the optimizer state on CPU between updates (GPU runs; a logged no-op on CPU)",
    "reshard_after_forward": "free the gathered weights after each forward (ZeRO-3) or keep them (ZeRO-2)",
    "forward_prefetch": "gather the next decoder layer's weights as a layer starts its forward (overlap; "
    "one more layer held); the reference's follows the actor's",
    "fsdp_size": "ranks one parameter is sharded over; -1 = the whole role; the reference's follows the actor's",
    "offload_policy": "verl's FSDP2 offload switch: false only (param_offload is rlflow's)",
    "model_dtype": "dtype of the master weights: fp32 only (mixed_precision.param_dtype sets the compute dtype)",
}
CLASS_NOTES: dict[str, dict[str, str]] = {
    "DataConfig": {
        "tokenizer": "null, or the directory actor_rollout_ref.model.tokenizer_path (else its path) names",
        "reward_fn_key": "non-tensor column naming each sample's data source; the reward manager picks the "
        "scorer by it",
        "max_response_length": "maximum generated tokens per response (actor_rollout_ref.rollout."
        "response_length follows it)",
        "shuffle": "shuffle the training prompts each epoch (resumable sampler, rlflow/data/sampler.py)",
        "seed": "seed of the training-prompt shuffle",
        "dataloader_num_workers": "worker processes of the driver's data loaders (0: load in the driver)",
    },
    "ModelConfig": _MODEL_NOTES,
    "CriticModelConfig": {
        **_MODEL_NOTES,
        "path": "HF directory of the value model; a causal-LM directory gets a fresh value head "
        "(rlflow.models.loader.load_value_model)",
        "attn_implementation": "attention backend of the critic (as actor_rollout_ref.model.attn_implementation)",
        "use_remove_padding": "pack the valid tokens of a critic micro-batch into one row",
    },
    "ActorConfig": {
        **_BATCH_NOTES,
        "clip_ratio": "PPO clip range epsilon of the probability ratio (Schulman et al. 2017)",
        "entropy_coeff": "weight of the entropy bonus: loss = policy loss - entropy_coeff x entropy",
        "use_kl_loss": "add a KL(policy || reference) term to the actor loss (GRPO style); creates the "
        "reference policy",
        "kl_loss_coef": "weight of the KL loss term",
        "kl_loss_type": "KL estimator of the loss term: kl/k1, abs, mse/k2, low_var_kl/k3 (a '+' suffix "
        "gives the k2 gradient with the named estimator's value)",
    },
    "CriticConfig": {
        **_BATCH_NOTES,
        "strategy": "fsdp (FSDP1) | fsdp2",
        "ppo_mini_batch_size": "prompts per critic optimizer step (times rollout.n responses), over all ranks",
        "ppo_micro_batch_size_per_gpu": "responses per forward/backward on one critic rank (fixed batching)",
        "forward_micro_batch_size_per_gpu": "responses per forward of compute_values on one rank",
        "use_dynamic_bsz": "micro-batches by token budget (ppo_max_token_len_per_gpu, "
        "forward_max_token_len_per_gpu) instead",
        "forward_max_token_len_per_gpu": "token budget of one compute_values micro-batch with dynamic batching",
        "loss_agg_mode": "aggregation of the value loss (same modes as the actor's)",
    },
    "PolicyLossConfig": {
        "loss_mode": "a policy loss registered with core_algos.register_policy_loss: vanilla (clipped PPO, "
        "with dual clip), gspo, gpg (-A log pi, no ratio; with adv_estimator=gpg) or geo_mean (GMPO: "
        "geometric mean of the token ratios, clipped in log space)",
    },
    "OptimConfig": _OPTIM_NOTES,
    "FSDPConfig": _FSDP_NOTES,
    "RefFSDPConfig": _FSDP_NOTES,
    "RefConfig": {
        "log_prob_micro_batch_size_per_gpu": "responses per reference log-prob forward on one rank",
        "log_prob_use_dynamic_bsz": "micro-batches by token budget instead",
        "log_prob_max_token_len_per_gpu": "token budget of one micro-batch with dynamic batching",
        "ulysses_sequence_parallel_size": "Ulysses sequence-parallel size of the reference model",
    },
    "RewardModelConfig": {
        "enable": "score with a sequence-classification reward model (RewardModelWorker); its scores are "
        "passed to the reward function as rm_scores",
        "micro_batch_size_per_gpu": "responses per reward-model forward on one rank",
        "reward_manager": "or one registered with rlflow.reward.register_reward_manager; verl's batch and "
        "generative are refused with what to use",
        "launch_reward_fn_async": "only false; validation refuses true (use num_workers for a process pool)",
        "timeout_score": "score of a sample whose scoring timed out (num_workers > 0 and timeout_s set)",
    },
    "RewardModelPathConfig": {
        "path": "HF directory of the reward model (needed when reward_model.enable)",
        "trust_remote_code": _MODEL_NOTES["trust_remote_code"],
    },
    "AlgorithmConfig": {
        "gamma": "discount factor of the returns",
        "lam": "GAE lambda (Schulman et al. 2016, arXiv:1506.02438)",
        "norm_adv_by_std_in_grpo": "GRPO: divide the group-centred score by the group's std (false: only "
        "centre it, as in Dr. GRPO)",
        "use_kl_in_reward": "subtract kl_coef x KL(policy || reference) per token from the reward; creates "
        "the reference policy",
    },
    "KLCtrlConfig": {
        "kl_coef": "coefficient (initial one for adaptive) of the in-reward KL penalty",
        "horizon": "adaptive controller: number of samples over which the KL error is corrected",
        "target_kl": "adaptive controller: the KL it steers towards",
    },
    "TrainerConfig": {
        "project_name": "project name for the loggers and the default log and checkpoint directories",
        "experiment_name": "run name for the loggers, the default directories and Ray placement groups",
        "nnodes": "nodes; the resource pool has nnodes x n_gpus_per_node bundles",
        "cpus_per_worker": "CPUs of one bundle, shared by the roles colocated on it. The roles take turns, so "
        "each computes with all of them: every worker's `OMP_NUM_THREADS` is `int(cpus_per_worker)` (at least "
        "1; on a local Ray at most the machine's cores shared by the ranks, when `ray_init.num_cpus` counts "
        "more CPUs than it has; an `OMP_NUM_THREADS` in the driver's environment wins). Also the thread count of the CPU "
        "peak-FLOP/s estimate. null = the Ray cluster's CPUs shared evenly by the nnodes x n_gpus_per_node ranks "
        "(at least 1), what the demo uses. On a CPU machine with C cores one rank with every core is faster "
        "than C single-thread ranks (the demo: 1.4x on 2 cores, docs/benchmarks.md)",
        "total_epochs": "passes over the training prompts (the run stops earlier at total_training_steps)",
        "val_before_train": "validate once before the first step (not when resuming)",
        "default_local_dir": "checkpoint root: global_step_N/{actor,critic}/ and the driver state",
        "balance_batch": "reorder each batch so every actor data-parallel rank gets a similar token count",
        "balance_keep_minibatch": "with balance_batch, balance the rows of each actor mini-batch (ppo_mini_batch_size "
        "x rollout.n consecutive rows of the batch) on their own, so every optimizer step trains on the prompts it "
        "would train on unbalanced (verl's key; verl slices ppo_mini_batch_size rows without x n)",
        "seed": "seed of model building in every worker, the critic's fresh value head and the mini-batch "
        "shuffles",
        "placement_timeout_s": "seconds to wait for Ray to place the workers before a resource error",
        "resume_from_path": "the global_step_N directory to resume from when resume_mode=resume_path",
        "max_actor_ckpt_to_keep": "keep only the newest N actor checkpoints (null or <= 0: keep all)",
        "max_critic_ckpt_to_keep": "keep only the newest N critic checkpoints (null or <= 0: keep all)",
    },
    "RayInitConfig": {
        "num_cpus": "CPUs of a local Ray (null: Ray counts them)",
        "object_store_memory": "bytes of the Ray object store (null: Ray's default)",
    },
}
"""Meanings of fields that the schema docstrings and the YAML comments do not give (or get wrong), by
schema class; checked against the code that reads each key."""

KEY_NOTES: dict[str, str] = {
    "custom_reward_function.name": "the function in that file, called as fn(data_source=..., "
    "solution_str=..., ground_truth=..., extra_info=...); returns a number or a dict with a 'score'",
    "algorithm.custom_advantage_function.path": "a .py file holding a user advantage function "
    "(rlflow/algos/custom.py describes its keyword inputs)",
    "algorithm.custom_advantage_function.name": "the function in that file; returns (advantages, returns), "
    "each (bs, response_len)",
}
"""Meanings by full key path, for classes used at several places (`CustomFunctionConfig`)."""

_STOPWORDS = {
    "a",
    "an",
    "the",
    "of",
    "to",
    "in",
    "on",
    "at",
    "by",
    "for",
    "is",
    "are",
    "and",
    "or",
    "with",
    "s",
}

HEADER = """# Configuration reference

<!-- Generated by scripts/gen_config_docs.py from rlflow/config/schema.py and the comments of
config/ppo_trainer.yaml. Do not edit by hand: run `python scripts/gen_config_docs.py`. -->

Every key of the PPO trainer config (`config/ppo_trainer.yaml`), with its type, its default and what it
does. The defaults are verl's, except the few listed in `docs/migrating_from_verl.md` ("Defaults that
differ"); the embedded CPU demo's own values are in `config/demo.yaml` (`--config-name demo`). Set keys
on the command line as Hydra overrides:

```bash
python -m rlflow.trainer.main_ppo data.train_batch_size=32 actor_rollout_ref.actor.optim.lr=1e-5
```

or in Python with `rlflow.config.loading.load_config(["data.train_batch_size=32"])`. Precedence, lowest
first: the schema defaults (equal to `ppo_trainer.yaml`), `demo.yaml` with `--config-name demo`, command-line
overrides, then the file named by
`critic.config_path`, whose keys override the `critic` group (e.g. `config/examples/critic_sp2.yaml`).

An unknown key or a value of the wrong type fails at composition with the key path. Rules that involve
several keys (batch divisibility, world sizes, files, custom functions) are checked by
`rlflow.config.validate.validate_config` before any Ray actor starts.

A default written `${a.b}` follows key `a.b` unless set. Batch sizes named `ppo_mini_batch_size` count
prompts (multiplied by `actor_rollout_ref.rollout.n` into responses); `*_per_gpu` sizes count responses
on one rank (one process on CPU).
"""


# --------------------------------------------------------------------------- sources


def yaml_comments(path: Path) -> dict[str, str]:
    """``{key path: end-of-line comment}`` for the keys of a block-style YAML file (indent 2)."""
    out: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    pattern = re.compile(r"^(\s*)([A-Za-z_][\w]*):(.*)$")
    for line in path.read_text().splitlines():
        match = pattern.match(line)
        if not match:
            continue
        indent, key, rest = len(match.group(1)), match.group(2), match.group(3)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, key))
        if "#" in rest:
            out[".".join(k for _, k in stack)] = rest.split("#", 1)[1].strip()
    return out


def docstring_attributes(cls: type) -> tuple[str, dict[str, str]]:
    """The summary of a dataclass docstring and its ``Attributes:`` entries (``a / b: text`` → both)."""
    doc = inspect.cleandoc(cls.__doc__ or "")
    head, _, attrs = doc.partition("Attributes:")
    summary = " ".join(head.split())
    # drop the leading "``section.path``:" (the page heading names it); keep a parenthesised owner class
    summary = re.sub(
        r"^``[\w.*]+``(?: \(([^)]*)\))?[:.]\s*", lambda m: f"{m.group(1)}: " if m.group(1) else "", summary
    )
    summary = summary[:1].upper() + summary[1:]
    entries: dict[str, str] = {}
    names: list[str] = []
    for line in attrs.splitlines():
        match = re.match(r"^    (\w+(?: / \w+)*): (.*)$", line)
        if match:
            previous = entries[names[-1]] if names else ""
            names = match.group(1).split(" / ")
            text = match.group(2).strip()
            for name in names:
                entries[name] = previous if text == "idem." else text
        elif line.startswith("        ") and names:
            for name in names:
                entries[name] += " " + line.strip()
    return summary, entries


def type_name(tp: Any) -> str:
    """Short readable name of a type annotation: ``int``, ``str | None``, ``list[float]``, ``any``."""
    if tp is Any:
        return "any"
    if tp is type(None):
        return "None"
    origin = typing.get_origin(tp)
    if origin is None:
        return getattr(tp, "__name__", str(tp))
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    return f"{origin.__name__}[{', '.join(type_name(a) for a in args)}]"


# --------------------------------------------------------------------------- walking


@dataclasses.dataclass
class Row:
    key: str
    type: str
    default: str
    meaning: str


@dataclasses.dataclass
class Section:
    path: str
    summary: str
    rows: list[Row]


def _default_text(value: Any) -> str:
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f"`{value}`" if value else '`""`'
    return f"`{value}`"


def _words(text: str) -> set[str]:
    words = re.findall(r"[a-z0-9]+", text.lower().replace("null", "none"))
    return set(words) - _STOPWORDS


def _meaning(doc: str | None, comment: str | None, note: str | None) -> str:
    """The docstring entry, the YAML comment when it adds at least 3 words, and the note."""
    kept = [doc] if doc else []
    if comment and (not doc or len(_words(comment) - _words(doc)) >= 3):
        kept.append(comment)
    if note and not any(_words(note) <= _words(k) for k in kept):
        kept.append(note)
    return " — ".join(kept)


def walk(cls: type, node: Any, path: str, comments: dict[str, str], sections: list[Section]) -> None:
    """Add the section of dataclass ``cls`` at key ``path`` (and its nested sections) to ``sections``."""
    hints = typing.get_type_hints(cls)
    summary, attrs = docstring_attributes(cls)
    notes = CLASS_NOTES.get(cls.__name__, {})
    section = Section(path, summary, [])
    sections.append(section)
    nested: list[tuple[type, Any, str]] = []
    fields = {f.name for f in dataclasses.fields(cls)}
    extra = set(node) - fields
    if extra:
        raise ValueError(f"composed config has keys {sorted(extra)} under {path!r} that the schema lacks")
    for f in dataclasses.fields(cls):
        key = f"{path}.{f.name}" if path else f.name
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            nested.append((tp, node[f.name], key))
            continue
        doc = attrs.get(f.name)
        meaning = _meaning(doc, comments.get(key), notes.get(f.name) or KEY_NOTES.get(key))
        section.rows.append(Row(key, type_name(tp), _default_text(node[f.name]), meaning))
    for sub_cls, sub_node, key in nested:
        walk(sub_cls, sub_node, key, comments, sections)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_config_docs() -> str:
    """The full text of docs/configuration.md."""
    cfg = OmegaConf.to_container(load_config([]), resolve=False)
    comments = yaml_comments(config_dir() / "ppo_trainer.yaml")
    sections: list[Section] = []
    walk(PPOTrainerConfig, cfg, "", comments, sections)
    out = [HEADER]
    for section in sections[1:]:
        level = "##" if "." not in section.path else "###"
        out += [f"{level} `{section.path}`", ""]
        if section.summary:
            out += [section.summary, ""]
        if section.rows:
            out += ["| key | type | default | meaning |", "|---|---|---|---|"]
            out += [
                f"| `{r.key}` | {_cell(r.type)} | {_cell(r.default)} | {_cell(r.meaning)} |"
                for r in section.rows
            ]
            out.append("")
    return "\n".join(out)


def undocumented_keys(text: str) -> list[str]:
    """Keys whose meaning cell is empty in a rendered page."""
    return re.findall(r"^\| `([\w.]+)` \|.*\|  \|$", text, flags=re.M)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Generate docs/configuration.md from the config schema.")
    parser.add_argument("--check", action="store_true", help="exit 1 when the page is out of date")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    text = render_config_docs()
    missing = undocumented_keys(text)
    if missing:
        print(
            f"warning: keys without a meaning (add them to CLASS_NOTES or KEY_NOTES): {missing}",
            file=sys.stderr,
        )
    out = Path(args.out)
    if args.check:
        if not out.is_file() or out.read_text() != text:
            print(f"{out} is out of date: run python scripts/gen_config_docs.py", file=sys.stderr)
            return 1
        return 0
    out.write_text(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
