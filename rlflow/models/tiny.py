"""An embedded tiny model and tokenizer that need nothing from the network.

rlflow's default ``actor_rollout_ref.model.path`` is a tiny Qwen2-architecture causal LM with a
byte-level tokenizer, built in code on first use and cached on disk:

* Tokenizer: a byte-level BPE with **no merges** (one token per byte, so every text round-trips),
  three special tokens and a ChatML chat template. Token ids are fixed: ``<|endoftext|>`` = 0
  (pad), ``<|im_start|>`` = 1 (bos), ``<|im_end|>`` = 2 (eos), and byte ``b`` = ``3 + b``.
  transformers rebuilds a ``Qwen2Tokenizer`` from the saved vocabulary when it loads a directory
  whose model type is ``qwen2``; a byte-level BPE without merges survives that rebuild unchanged
  (a WordLevel tokenizer would lose its spaces), which the tests check.
* Model: ``Qwen2ForCausalLM`` sized by :class:`TinyModelConfig`, initialised by transformers'
  own init under ``torch.manual_seed(seed)``, so a seed gives identical weights.

The cache directory is ``$RLFLOW_CACHE_DIR/tiny-<hash>`` (default root ``~/.cache/rlflow``), where the
hash covers the model config, the seed and the tokenizer layout. Creation is atomic: the model is
written to a temporary directory next to the target and renamed into place, so a process racing
another never sees half a model.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

TINY_MODEL_SENTINEL = "rlflow://tiny"
"""A model path that :func:`resolve_model_path` turns into the cached default tiny model."""

PAD_TOKEN = "<|endoftext|>"
BOS_TOKEN = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN)
BYTE_TOKEN_OFFSET = len(SPECIAL_TOKENS)
"""Id of byte 0; byte ``b`` has id ``BYTE_TOKEN_OFFSET + b``."""

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""ChatML: ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message, then
``<|im_start|>assistant\\n`` when ``add_generation_prompt=True``."""

TOKENIZER_LAYOUT_VERSION = 1
"""Bump when the tokenizer layout changes, so old cache entries are not reused."""


@dataclass(frozen=True)
class TinyModelConfig:
    """Size of the default tiny Qwen2 model.

    Defaults give 3,219,712 parameters (about 3.2M): a PPO step on a batch of 64 short prompts takes
    seconds on two CPU cores. The head counts stay even so Ulysses sequence parallelism of size 2 can
    split both the query and the key/value heads.

    Attributes:
        vocab_size: embedding rows; at least the tokenizer's 259 tokens (padded up to 272).
        hidden_size: model width.
        intermediate_size: MLP width.
        num_hidden_layers: transformer blocks.
        num_attention_heads: query heads (must divide ``hidden_size``).
        num_key_value_heads: key/value heads (must divide ``num_attention_heads``).
        max_position_embeddings: longest sequence.
        rope_theta: RoPE base.
        tie_word_embeddings: share the input embedding with the LM head.
        initializer_range: std of the normal init of linear and embedding weights.
    """

    vocab_size: int = 272
    hidden_size: int = 256
    intermediate_size: int = 768
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 512
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = True
    initializer_range: float = 0.02

    def validate(self) -> None:
        """Raise ``ValueError`` naming the field when the sizes are inconsistent."""
        n_tokens = BYTE_TOKEN_OFFSET + 256
        if self.vocab_size < n_tokens:
            raise ValueError(
                f"TinyModelConfig.vocab_size={self.vocab_size} must be >= {n_tokens} (tokenizer size)"
            )
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"TinyModelConfig.hidden_size={self.hidden_size} must be divisible by "
                f"num_attention_heads={self.num_attention_heads}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"TinyModelConfig.num_attention_heads={self.num_attention_heads} must be divisible by "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        for name in ("hidden_size", "intermediate_size", "num_hidden_layers", "max_position_embeddings"):
            if getattr(self, name) <= 0:
                raise ValueError(f"TinyModelConfig.{name} must be positive, got {getattr(self, name)}")


def byte_to_unicode() -> dict[int, str]:
    """The byte-level alphabet: each byte maps to one printable unicode character.

    Printable Latin-1 bytes map to themselves; the others (control characters, space, ...) map,
    in byte order, to ``chr(256), chr(257), ...``. This is the mapping that the ``tokenizers``
    ``ByteLevel`` pre-tokenizer and decoder use.
    """
    printable = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    mapping: dict[int, str] = {}
    n_shifted = 0
    for b in range(256):
        if b in printable:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + n_shifted)
            n_shifted += 1
    return mapping


def build_tiny_tokenizer() -> Any:
    """Build the byte-level tokenizer (a transformers fast tokenizer) in memory.

    Returns:
        A ``PreTrainedTokenizerFast`` with pad/bos/eos set and the ChatML chat template.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for b, char in byte_to_unicode().items():
        vocab[char] = BYTE_TOKEN_OFFSET + b
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    # NFC matches what transformers' Qwen2Tokenizer applies when it rebuilds this tokenizer on load.
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(tok, special=True, normalized=False) for tok in SPECIAL_TOKENS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=None,
        padding_side="left",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_model(config: TinyModelConfig | None = None, seed: int = 0) -> Any:
    """Build a randomly initialised tiny ``Qwen2ForCausalLM`` (deterministic for ``seed``).

    Args:
        config: sizes; ``TinyModelConfig()`` when None.
        seed: seeds ``torch`` before the weights are initialised.

    Returns:
        The model in fp32, on CPU, in eval mode.
    """
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    config = config or TinyModelConfig()
    config.validate()
    hf_config = Qwen2Config(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        max_position_embeddings=config.max_position_embeddings,
        rope_parameters={"rope_theta": config.rope_theta, "rope_type": "default"},
        tie_word_embeddings=config.tie_word_embeddings,
        initializer_range=config.initializer_range,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(hf_config)
    model.generation_config = GenerationConfig(pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return model.eval()


def config_hash(config: TinyModelConfig, seed: int) -> str:
    """Short stable hash of the config, the seed and the tokenizer layout (names the cache dir)."""
    payload = {"config": dataclasses.asdict(config), "seed": seed, "tokenizer": TOKENIZER_LAYOUT_VERSION}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]


CACHE_DIR_ENV = "RLFLOW_CACHE_DIR"
"""Environment variable naming rlflow's cache root (tiny models, synthetic task files)."""


def cache_root() -> Path:
    """Root of rlflow's cache: ``$RLFLOW_CACHE_DIR`` or ``~/.cache/rlflow``."""
    return Path(os.environ.get(CACHE_DIR_ENV) or Path.home() / ".cache" / "rlflow").expanduser()


def save_tiny_model(out_dir: str | os.PathLike, config: TinyModelConfig | None = None, seed: int = 0) -> str:
    """Write the tiny model, its tokenizer and ``rlflow_tiny.json`` (config + seed) to ``out_dir``.

    Args:
        out_dir: target directory (created if missing; existing files are overwritten).
        config: sizes; ``TinyModelConfig()`` when None.
        seed: weight seed.

    Returns:
        ``out_dir`` as a string.
    """
    config = config or TinyModelConfig()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    build_tiny_model(config, seed).save_pretrained(out)
    build_tiny_tokenizer().save_pretrained(out)
    meta = {"config": dataclasses.asdict(config), "seed": seed, "tokenizer_layout": TOKENIZER_LAYOUT_VERSION}
    (out / "rlflow_tiny.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
    return str(out)


def atomic_build_dir(target: Path, build: Any) -> str:
    """Create ``target`` by ``build(tmp_dir)`` in a sibling temp dir and rename it into place.

    If ``target`` already exists it is returned untouched. If another process wins the race, its
    directory is kept and ours is deleted.

    Args:
        target: final directory.
        build: callable writing the contents into the directory it is given.

    Returns:
        ``str(target)``.
    """
    if target.is_dir():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache entry should be readable like any directory
        build(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():
                raise
            logger.info("rlflow: %s was created by another process; using it", target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return str(target)


def get_tiny_model_path(seed: int = 0, **overrides: Any) -> str:
    """Path of the cached tiny model for ``seed`` and config ``overrides``; built on first use.

    Args:
        seed: weight seed.
        **overrides: ``TinyModelConfig`` fields to change (e.g. ``hidden_size=64``).

    Returns:
        A directory that ``AutoTokenizer`` / ``AutoModelForCausalLM.from_pretrained`` load.
    """
    unknown = set(overrides) - {f.name for f in dataclasses.fields(TinyModelConfig)}
    if unknown:
        raise TypeError(f"get_tiny_model_path: unknown TinyModelConfig field(s) {sorted(unknown)}")
    config = dataclasses.replace(TinyModelConfig(), **overrides)
    config.validate()
    target = cache_root() / f"tiny-{config_hash(config, seed)}"
    if not target.is_dir():
        logger.info("rlflow: building tiny model (seed=%d, %s) in %s", seed, config, target)
    return atomic_build_dir(target, lambda tmp: save_tiny_model(tmp, config, seed))


def resolve_model_path(path: str) -> str:
    """Turn ``"rlflow://tiny"`` (optionally ``"rlflow://tiny?seed=1&hidden_size=64"``) into a directory.

    Any other path is returned with ``~`` expanded.

    Args:
        path: a model path from the config.

    Returns:
        A local directory path (or the input, e.g. a hub id, unchanged apart from ``~``).
    """
    if not path.startswith(TINY_MODEL_SENTINEL):
        return os.path.expanduser(path)
    if path.startswith(TINY_MODEL_SENTINEL + "-sft"):
        raise ValueError(
            f"model path {path!r}: the warm-started tiny models are built by the trainer before any worker "
            "starts (rlflow.trainer.warm_start.ensure_warm_start); pass the directory it returns"
        )
    rest = path[len(TINY_MODEL_SENTINEL) :]
    if rest and not rest.startswith("?"):
        raise ValueError(
            f"model path {path!r}: expected {TINY_MODEL_SENTINEL!r} or {TINY_MODEL_SENTINEL}?key=value&..."
        )
    kwargs: dict[str, Any] = {}
    field_types = {f.name: f.type for f in dataclasses.fields(TinyModelConfig)}
    for part in filter(None, rest[1:].split("&")):
        key, sep, value = part.partition("=")
        if not sep or (key != "seed" and key not in field_types):
            raise ValueError(
                f"model path {path!r}: bad option {part!r} (use seed or a TinyModelConfig field)"
            )
        kwargs[key] = _parse_option(value, field_types.get(key, "int"), path)
    return get_tiny_model_path(**kwargs)


def _parse_option(value: str, type_name: Any, path: str) -> Any:
    """Parse one ``key=value`` of a sentinel path into the field's type."""
    type_name = str(type_name)
    try:
        if "bool" in type_name:
            if value.lower() not in ("true", "false", "1", "0"):
                raise ValueError(value)
            return value.lower() in ("true", "1")
        if "float" in type_name:
            return float(value)
        return int(value)
    except ValueError:
        raise ValueError(f"model path {path!r}: cannot parse {value!r} as {type_name}") from None
