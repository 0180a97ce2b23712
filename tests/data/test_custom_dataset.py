"""``data.custom_cls`` (verl's key): the user's dataset class builds the PPO training and validation
sets; a wrong file, name or item layout is refused before Ray starts, naming the key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlflow.config import load_config, to_typed, validate_config
from rlflow.data.custom_dataset import build_rl_dataset, load_dataset_class
from rlflow.data.io import read_rows, write_parquet
from rlflow.data.rl_dataset import RLHFDataset
from rlflow.data.tasks import ensure_task_files
from rlflow.models.tiny import build_tiny_tokenizer

DATASETS = '''
from torch.utils.data import Dataset

from rlflow.data.rl_dataset import RLHFDataset


class FirstHalf(RLHFDataset):
    """The first half of the rows, each item tagged."""

    def __len__(self):
        return super().__len__() // 2

    def __getitem__(self, i):
        item = super().__getitem__(i)
        item["tag"] = f"half-{i}"
        return item


class VerlSignature(RLHFDataset):
    """verl's constructor: (data_files, tokenizer, config, processor=None)."""

    def __init__(self, data_files, tokenizer, config, processor=None):
        self.processor_seen = ("given", processor)
        super().__init__(data_files, tokenizer, config)


class TextOnly(Dataset):
    """Items without the padded prompt tensors."""

    def __init__(self, data_files, tokenizer, config):
        self.rows = [1, 2]

    def __len__(self):
        return 2

    def __getitem__(self, i):
        return {"text": "hello"}


def not_a_class():
    return None
'''


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("custom_cls")
    module = root / "my_datasets.py"
    module.write_text(DATASETS)
    train, val = ensure_task_files("repeat")
    return {
        "module": str(module),
        "train": write_parquet(read_rows(train)[:20], root / "train.parquet"),
        "val": write_parquet(read_rows(val)[:6], root / "val.parquet"),
    }


def _data(files: dict[str, str], name: str | None, path: str | None = None):
    return load_config(
        [
            f"data.train_files={files['train']}",
            f"data.val_files={files['val']}",
            f"data.custom_cls.path={path or files['module']}" if name else "data.custom_cls.path=null",
            f"data.custom_cls.name={name}" if name else "data.custom_cls.name=null",
            "data.max_prompt_length=64",
            "data.train_batch_size=4",
            "data.dataloader_num_workers=0",
        ],
        config_name="demo",
    )


def test_the_class_builds_both_datasets(files):
    from rlflow.trainer.main_ppo import build_data

    config = to_typed(_data(files, "FirstHalf"))
    train_loader, val_loader = build_data(config, build_tiny_tokenizer())
    train, val = train_loader.dataset, val_loader.dataset
    assert type(train).__name__ == "FirstHalf" and type(val).__name__ == "FirstHalf"
    assert (len(train), len(val)) == (10, 3)
    batch = next(iter(val_loader))
    assert list(batch["tag"]) == ["half-0", "half-1", "half-2"]  # extra keys travel with the samples
    assert tuple(batch["input_ids"].shape) == (3, 64)


def test_default_is_rlhf_dataset_and_verl_signature_gets_no_processor(files):
    assert load_dataset_class(None, None) is RLHFDataset
    config = to_typed(_data(files, "VerlSignature")).data
    cls = load_dataset_class(config.custom_cls.path, config.custom_cls.name)
    dataset = build_rl_dataset(cls, [files["val"]], build_tiny_tokenizer(), config)
    assert dataset.processor_seen == ("given", None) and len(dataset) == 6


@pytest.mark.parametrize(
    ("name", "path", "message"),
    [
        ("Missing", None, "data.custom_cls.name='Missing' is not defined in"),
        ("not_a_class", None, "is a function, not a torch.utils.data.Dataset subclass"),
        (
            "FirstHalf",
            "/nonexistent/datasets.py",
            "data.custom_cls.path='/nonexistent/datasets.py': no such file",
        ),
    ],
)
def test_a_wrong_file_or_name_is_refused_before_ray(files, name, path, message):
    with pytest.raises(ValueError, match=message):
        validate_config(_data(files, name, path))


def test_path_and_name_go_together(files):
    with pytest.raises(ValueError, match=r"data.custom_cls.name must be set when data.custom_cls.path="):
        validate_config(load_config([f"data.custom_cls.path={files['module']}"], config_name="demo"))
    with pytest.raises(ValueError, match=r"data.custom_cls.name='FirstHalf' needs data.custom_cls.path"):
        validate_config(load_config(["data.custom_cls.name=FirstHalf"], config_name="demo"))


def test_items_without_the_prompt_tensors_are_refused(files):
    from rlflow.trainer.main_ppo import build_data

    config = to_typed(_data(files, "TextOnly"))
    with pytest.raises(ValueError, match=r"data.custom_cls \(TextOnly\): item 0 has input_ids=NoneType"):
        build_data(config, build_tiny_tokenizer())


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_a_ppo_step_trains_on_the_custom_dataset(files, tmp_path: Path):
    from rlflow.trainer.main_ppo import run_ppo

    cfg = load_config(
        [
            f"data.train_files={files['train']}",
            f"data.val_files={files['val']}",
            f"data.custom_cls.path={files['module']}",
            "data.custom_cls.name=FirstHalf",
            "data.train_batch_size=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "trainer.total_epochs=1",
            "trainer.total_training_steps=null",
            "trainer.test_freq=-1",
            "trainer.val_before_train=false",
            "trainer.logger=[console]",
            f"trainer.default_local_dir={tmp_path / 'ckpt'}",
        ],
        config_name="demo",
    )
    history = run_ppo(cfg)["history"]
    assert [h["step"] for h in history] == [1]  # 10 items of FirstHalf, batches of 8, the last dropped


def test_max_samples_keeps_the_first_rows_or_a_seeded_draw(files):
    """``data.train_max_samples`` / ``val_max_samples`` (verl's): the first rows without shuffling, else
    rows drawn without replacement with ``data.seed``; the dataloaders follow."""
    import numpy as np

    from rlflow.trainer.main_ppo import build_data

    tokenizer = build_tiny_tokenizer()
    all_rows = read_rows(files["train"])
    prompts = [r["prompt"][0]["content"] for r in all_rows]

    def contents(dataset) -> list[str]:
        return [m[0]["content"] for m in (dataset[i]["raw_prompt"] for i in range(len(dataset)))]

    base = _data(files, None)
    base.data.return_raw_chat = True
    base.data.shuffle = False
    cfg = to_typed(base).data
    assert contents(RLHFDataset([files["train"]], tokenizer, cfg, max_samples=5)) == prompts[:5]
    assert len(RLHFDataset([files["train"]], tokenizer, cfg, max_samples=50)) == 20  # more than the rows
    base.data.shuffle = True
    base.data.seed = 7
    cfg = to_typed(base).data
    drawn = np.random.default_rng(7).choice(20, 5, replace=False).tolist()
    assert contents(RLHFDataset([files["train"]], tokenizer, cfg, max_samples=5)) == [
        prompts[i] for i in drawn
    ]

    base.data.train_max_samples, base.data.val_max_samples = 8, 2
    train_loader, val_loader = build_data(to_typed(base), tokenizer)
    assert (len(train_loader.dataset), len(val_loader.dataset), len(train_loader)) == (8, 2, 2)

    custom = _data(files, "VerlSignature")  # verl's signature without max_samples
    custom.data.val_max_samples = 2
    with pytest.raises(
        ValueError, match=r"^data\.val_max_samples=2: data\.custom_cls \(VerlSignature\) takes no"
    ):
        build_data(to_typed(custom), tokenizer)


OPTIONS_DATASET = '''
from rlflow.data.rl_dataset import RLHFDataset


class SwapOptions(RLHFDataset):
    """Reads its options as verl's CISGrpoDataset does: config.get("cis", {}) and attribute access."""

    def __init__(self, data_files, tokenizer, config, processor=None, max_samples=-1):
        super().__init__(data_files, tokenizer, config)
        cis = config.get("cis", {}) or {}
        self.options = (int(cis.get("swap_offset", 0)), int(cis.get("swap_seed", 7)), config.cis["shuffle"])
        self.image_key_seen = config.get("image_key", "none")
'''


def test_a_dataset_class_reads_its_own_options_from_data(files, tmp_path: Path):
    """verl's ``+data.<name>.*`` options of a custom dataset class (its InternVL CIS example): kept in
    ``data.custom_options`` and read by the class as ``config.get(name)`` / ``config.<name>``."""
    module = tmp_path / "options_dataset.py"
    module.write_text(OPTIONS_DATASET)
    cfg = load_config(
        [
            f"data.custom_cls.path={module}",
            "data.custom_cls.name=SwapOptions",
            "+data.cis.swap_offset=3",
            "+data.cis.swap_seed=11",
            "+data.cis.shuffle=True",
        ],
        config_name="demo",
    )
    validate_config(cfg)
    assert cfg.data.custom_options == {"cis": {"swap_offset": 3, "swap_seed": 11, "shuffle": True}}
    config = to_typed(cfg).data
    cls = load_dataset_class(config.custom_cls.path, config.custom_cls.name)
    dataset = build_rl_dataset(cls, [files["val"]], build_tiny_tokenizer(), config)
    assert dataset.options == (3, 11, True) and dataset.image_key_seen == "images"
    with pytest.raises(AttributeError, match="data has no key 'nope'"):
        _ = config.nope
    # without a dataset class the key is rlflow's unknown key, refused with the closest ones
    with pytest.raises(ValueError, match=re.escape("data.cis is not a config key (appended with '+'?)")):
        validate_config(load_config(["+data.cis.swap_offset=3"], config_name="demo"))
    # options set in a config file (no class on the command line) are refused without a class
    with pytest.raises(ValueError, match=re.escape("data.custom_options (['cis']) are read only by")):
        validate_config(load_config(["+data.custom_options.cis.swap_seed=1"], config_name="demo"))
