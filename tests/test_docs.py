"""docs/: the configuration reference is the generator's output and names every key; the hand-written pages
cite only files, functions and tests that exist."""

from __future__ import annotations

import importlib.util
import re
import shlex
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rlflow.config import load_config

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
CHECKED_PAGES = ("quickstart.md", "implementation_details.md", "migrating_from_verl.md", "gpu.md")
TRAINER = "python -m rlflow.trainer.main_ppo"
REF = re.compile(r"`((?:rlflow|tests|scripts|examples|config)/[\w./-]+?\.(?:py|yaml|md))(?:::(\w+))?`")


def _generator():
    if "gen_config_docs" in sys.modules:
        return sys.modules["gen_config_docs"]
    spec = importlib.util.spec_from_file_location("gen_config_docs", REPO / "scripts" / "gen_config_docs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_config_docs"] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def generated() -> str:
    return _generator().render_config_docs()


def _leaf_keys(node: dict, prefix: str = "") -> list[str]:
    keys: list[str] = []
    for key, value in node.items():
        path = f"{prefix}.{key}" if prefix else key
        keys += _leaf_keys(value, path) if isinstance(value, dict) and value else [path]
    return keys


def test_configuration_reference_is_up_to_date(generated: str) -> None:
    committed = (DOCS / "configuration.md").read_text()
    assert committed == generated, (
        "docs/configuration.md differs from the schema/YAML: run `python scripts/gen_config_docs.py`"
    )


def test_every_composed_key_is_documented(generated: str) -> None:
    keys = _leaf_keys(OmegaConf.to_container(load_config([]), resolve=False))
    assert len(keys) > 150
    rows = dict(re.findall(r"^\| `([\w.]+)` \| (.*) \|$", generated, flags=re.M))
    assert sorted(rows) == sorted(keys)
    missing = [k for k in keys if rows[k].rstrip().endswith("|")]
    assert not missing, f"keys without a meaning (document them in the schema or the YAML): {missing}"
    assert rows["critic.cliprange_value"].startswith("float | `0.5` | value clipping")
    assert rows["data.train_batch_size"].startswith("int | `1024` | prompts per step")


def test_check_mode_detects_a_stale_page(tmp_path: Path) -> None:
    gen = _generator()
    stale = tmp_path / "configuration.md"
    stale.write_text("old\n")
    assert gen.main(["--check", "--out", str(stale)]) == 1
    assert gen.main(["--out", str(stale)]) == 0
    assert gen.main(["--check", "--out", str(stale)]) == 0


@pytest.mark.parametrize("page", CHECKED_PAGES)
def test_hand_written_pages_cite_existing_code(page: str) -> None:
    text = (DOCS / page).read_text()
    refs = REF.findall(text)
    assert refs, f"{page} cites no file"
    for path, name in refs:
        file = REPO / path
        assert file.is_file(), f"{page} cites {path}, which does not exist"
        if name:
            pattern = rf"^\s*(?:def|class|async def) {name}\b|^{name}\s*[:=]"
            assert re.search(pattern, file.read_text(), flags=re.M), f"{page}: {path} defines no {name}"


def _trainer_commands(text: str, trainer: str = TRAINER) -> list[list[str]]:
    """The Hydra overrides of every ``python -m rlflow.trainer.main_ppo`` (or ``trainer``) line in bash
    (or unlabelled) code blocks; a trailing ``# comment`` is dropped."""
    commands, fence = [], None
    for line in text.replace("\\\n", " ").splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            fence = stripped[3:] if fence is None else None
        elif fence in ("", "bash") and trainer in stripped:
            commands.append(shlex.split(stripped.split(trainer, 1)[1], comments=True))
    return commands


def test_documented_trainer_commands_compose() -> None:
    """Every documented command line (README and docs) names existing keys with values of the right type,
    on the config it names (``--config-name``; verl's defaults otherwise)."""
    from rlflow.config import CONFIG_NAME
    from rlflow.trainer.cli import split_config_name

    count = 0
    for text in [(REPO / "README.md").read_text(), *((DOCS / page).read_text() for page in CHECKED_PAGES)]:
        for args in _trainer_commands(text):
            name, overrides = split_config_name(args)
            load_config(overrides, config_name=name or CONFIG_NAME)
            count += 1
    assert count >= 14


# What a documented command may fail on here: the user's own files and models, and a cluster's CPUs.
_USER_ENVIRONMENT = ("no such file", "cannot load the model config from", "CPUs for the placement group")


def test_documented_trainer_commands_pass_the_whole_validation() -> None:
    """Every documented command line passes every check made before Ray starts (`prepare_config`: the
    layout against its ranks, the files, the LoRA targets...), unless it names a file or model of the
    user's or needs a cluster's CPUs."""
    from rlflow.config import CONFIG_NAME
    from rlflow.trainer.cli import split_config_name
    from rlflow.trainer.main_ppo import prepare_config

    validated = 0
    for page, text in [("README.md", (REPO / "README.md").read_text())] + [
        (page, (DOCS / page).read_text()) for page in CHECKED_PAGES
    ]:
        for args in _trainer_commands(text):
            name, overrides = split_config_name(args)
            try:
                prepare_config(
                    load_config(overrides, config_name=name or CONFIG_NAME), build_warm_start=False
                )
            except ValueError as exc:
                assert any(reason in str(exc) for reason in _USER_ENVIRONMENT), f"{page}: {args}: {exc}"
                continue
            validated += 1
    assert validated >= 10


def test_the_readme_main_job_is_the_demo_config_with_no_overrides() -> None:
    main_job = _trainer_commands((REPO / "README.md").read_text())[0]
    assert main_job == ["--config-name", "demo"]


def test_documented_sft_commands_compose() -> None:
    """The ``main_sft`` command lines of the README and docs/sft.md name existing SFT keys."""
    from rlflow.config.loading import load_sft_config

    count = 0
    for text in ((REPO / "README.md").read_text(), (DOCS / "sft.md").read_text()):
        for overrides in _trainer_commands(text, "python -m rlflow.trainer.main_sft"):
            load_sft_config([o for o in overrides if "=" in o])
            count += 1
    assert count >= 3


_SECTIONS = "data|actor_rollout_ref|critic|reward_model|custom_reward_function|algorithm|trainer|ray_init"
_GUIDE_KEY = re.compile(rf"`\+?((?:{_SECTIONS})\.[\w.]+)(=[^`]*)?")


def _guide_keys(text: str) -> list[tuple[str, str | None]]:
    """``(key, value or None)`` of every full config key the text names in backticks (a trailing ``.*`` or
    ``.{a,b}`` names the section before it)."""
    out = []
    for key, value in _GUIDE_KEY.findall(text):
        out.append((key.rstrip("."), value[1:] if value else None))
    return out


def _known(key: str) -> bool:
    """A schema key or section, a key under a free-form section, or a verl alias of one."""
    from rlflow.config.aliases import FLAG_ALIASES, canonical_key
    from rlflow.config.profiler_layout import is_profiler_layout_key
    from rlflow.config.schema import PPOTrainerConfig
    from rlflow.config.suggest import schema_keys

    keys, open_sections = schema_keys(PPOTrainerConfig)
    key = canonical_key(key)
    if is_profiler_layout_key(key):  # verl's later profiler layout, read onto rlflow's profiler keys
        return True
    return key in keys or key in FLAG_ALIASES or any(key.startswith(s + ".") for s in open_sections)


def _refused(key: str, value: str | None) -> bool:
    from rlflow.config import validate_config

    try:
        validate_config(
            load_config([f"{key}={value if value is not None else 1}"], config_name="demo_two_ranks")
        )
    except ValueError:
        return True
    return False


def test_migration_guide_names_only_keys_that_exist_or_are_refused() -> None:
    """Every key of docs/migrating_from_verl.md exists in the schema (or is a verl alias); those the guide
    says rlflow does not have ("—" in its column) are refused when a user passes them."""
    text = (DOCS / "migrating_from_verl.md").read_text()
    same = text.split("## Same as verl", 1)[1].split("## Keys that differ", 1)[0]
    for key, _ in _guide_keys(same):
        if key == "reward_model.ground_truth":  # a parquet column of the data files, not a config key
            continue
        assert _known(key), f"'Same as verl' names {key}, which rlflow does not have"
    rows = re.findall(r"^\| (.+?) \| (.+?) \| (.*) \|$", text.split("## Keys that differ", 1)[1], flags=re.M)
    checked = 0
    for verl, ours, _note in rows[2:]:
        for key, _ in _guide_keys(ours):
            assert _known(key), f"the guide's rlflow column names {key}, which does not exist"
        if ours.strip() == "—":
            for key, value in _guide_keys(verl):
                assert _refused(key, value), f"the guide says rlflow has no {key}, but it is accepted"
                checked += 1
    assert checked >= 5  # the refused keys the guide lists (a floor: the table was parsed)
