"""Read and write row files (parquet, jsonl) as lists of plain Python dicts.

Parquet is read with pyarrow, so nested columns come back as Python lists and dicts (not numpy arrays):
``prompt`` is a ``list[dict]``, ``reward_model`` a ``dict``. Failures raise ``ValueError`` naming the file
(and the line, for jsonl).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["ROW_FILE_SUFFIXES", "read_rows", "write_parquet"]

ROW_FILE_SUFFIXES = (".parquet", ".jsonl", ".json")
"""Suffixes :func:`read_rows` understands (``.json`` is read as JSON lines)."""


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:
        raise ValueError(f"cannot read parquet file {str(path)!r}: {type(exc).__name__}: {exc}") from exc
    return table.to_pylist()


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read jsonl file {str(path)!r}: {type(exc).__name__}: {exc}") from exc
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"file {str(path)!r}, line {line_no}: invalid JSON ({exc})") from exc
        if not isinstance(row, dict):
            raise ValueError(
                f"file {str(path)!r}, line {line_no}: expected a JSON object per line, got {type(row).__name__}"
            )
        rows.append(row)
    return rows


def read_rows(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Read every row of a parquet or jsonl file.

    Args:
        path: a ``.parquet``, ``.jsonl`` or ``.json`` (JSON lines) file.

    Returns:
        One dict per row, in file order.

    Raises:
        ValueError: missing file, unknown suffix, or unreadable content (the message names the file).
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise ValueError(f"data file {str(path)!r} does not exist or is not a file")
    suffix = p.suffix.lower()
    if suffix == ".parquet":
        return _read_parquet(p)
    if suffix in (".jsonl", ".json"):
        return _read_jsonl(p)
    raise ValueError(
        f"data file {str(path)!r}: unknown suffix {suffix!r}; expected one of {ROW_FILE_SUFFIXES}"
    )


def write_parquet(rows: Sequence[dict[str, Any]], path: str | os.PathLike) -> str:
    """Write rows to a parquet file (via a temporary file renamed into place).

    Args:
        rows: dicts with the same keys; nested lists/dicts become parquet lists/structs.
        path: output file; parent directories are created.

    Returns:
        ``str(path)``.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    pq.write_table(pa.Table.from_pylist(list(rows)), tmp)
    os.replace(tmp, out)
    return str(out)
