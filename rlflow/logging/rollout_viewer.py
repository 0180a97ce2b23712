"""Dump generations (prompts, responses, scores) as JSON lines and render them for a person to read.

Dump format: one JSON object per line, one line per sample::

    {"step": 10, "prompt": "...", "response": "...", "score": 0.75, "ground_truth": "...",
     "data_source": "repeat", ...any other per-sample field}

`dump_generations` writes it: into ``<dir>/<step>.jsonl`` when given a directory (verl's layout for
``trainer.rollout_data_dir`` / ``validation_data_dir``), or appended to one ``.jsonl`` file. Non-finite
scores are written as ``null`` (strict JSON).

`render_rollouts` reads a file or a directory of them and renders, per step, a table of the samples:

* ``"text"``: plain blocks for the terminal (the text is printed as is, indented);
* ``"markdown"``: a GitHub-flavoured table; text is HTML-escaped, Markdown/table characters are written as
  entities, a newline becomes ``⏎`` plus a line break, so the table never breaks and nothing renders as
  markup;
* ``"html"``: a standalone page; text is HTML-escaped and shown with its spaces and newlines.

Command line (also ``scripts/view_rollouts.py``)::

    python -m rlflow.logging.rollout_viewer outputs/val_generations --step -1 --max_rows 20
    python -m rlflow.logging.rollout_viewer gens.jsonl --format html --out gens.html
"""

from __future__ import annotations

import argparse
import html
import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["FORMATS", "dump_generations", "load_rollouts", "main", "render_rollouts"]

FORMATS = ("text", "markdown", "html")
STANDARD_KEYS = ("step", "prompt", "response", "score", "ground_truth", "data_source")
_FIRST_COLUMNS = ("data_source", "score", "ground_truth")
_MD_ENTITIES = {"|": "&#124;", "\\": "&#92;", "*": "&#42;", "_": "&#95;", "`": "&#96;", "[": "&#91;"}
_MD_ENTITIES.update({"]": "&#93;", "#": "&#35;", "~": "&#126;"})


# --------------------------------------------------------------------------- dumping


def _plain(value: Any) -> Any:
    """A JSON-ready copy: tensors/arrays → lists, numpy scalars → Python, non-finite floats → None."""
    if hasattr(value, "tolist"):  # torch.Tensor, numpy arrays and scalars
        value = value.tolist()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def dump_generations(
    path: str | os.PathLike,
    step: int,
    prompts: Sequence[str],
    responses: Sequence[str],
    scores: Sequence[float],
    extra: dict[str, Sequence[Any]] | None = None,
) -> str:
    """Write one JSON line per sample: ``step``, ``prompt``, ``response``, ``score`` and the ``extra`` fields.

    Args:
        path: a directory (created if needed; the rows go to ``<path>/<step>.jsonl``, replacing it) or a
            file ending in ``.jsonl`` (rows appended).
        step: training step (``trainer.global_steps``) the samples belong to.
        prompts: ``(bs,)`` decoded prompts.
        responses: ``(bs,)`` decoded responses.
        scores: ``(bs,)`` per-sample scores (floats, tensor or array).
        extra: per-sample fields, each of length ``bs`` (e.g. ``ground_truth``, ``data_source``).

    Returns:
        The file written.

    Raises:
        ValueError: when a field does not have one value per prompt.
    """
    columns: dict[str, list[Any]] = {
        "prompt": list(prompts),
        "response": list(responses),
        "score": _plain(scores) if hasattr(scores, "tolist") else list(scores),
    }
    for key, values in (extra or {}).items():
        if key in ("step", "prompt", "response", "score"):
            raise ValueError(f"dump_generations: extra field {key!r} would overwrite a standard field")
        columns[key] = _plain(values) if hasattr(values, "tolist") else list(values)
    n = len(columns["prompt"])
    for key, values in columns.items():
        if len(values) != n:
            raise ValueError(f"dump_generations: {key!r} has {len(values)} values for {n} prompts")
    target = Path(path)
    if target.suffix == ".jsonl":
        target.parent.mkdir(parents=True, exist_ok=True)
        mode = "a"
    else:
        target.mkdir(parents=True, exist_ok=True)
        target, mode = target / f"{int(step)}.jsonl", "w"
    with open(target, mode, encoding="utf-8") as f:
        for i in range(n):
            row = {"step": int(step), **{key: _plain(values[i]) for key, values in columns.items()}}
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return str(target)


# --------------------------------------------------------------------------- loading


def _jsonl_files(path: Path) -> list[Path]:
    if path.is_dir():

        def order(p: Path) -> tuple[int, int | str]:
            return (0, int(p.stem)) if p.stem.isdigit() else (1, p.stem)

        return sorted(path.glob("*.jsonl"), key=order)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such rollout dump (a .jsonl file or a directory of them)")
    return [path]


def load_rollouts(path: str | os.PathLike, step: int | None = None) -> list[dict[str, Any]]:
    """Read the rows of a dump file, or of every ``*.jsonl`` in a directory (in step order).

    Args:
        path: a ``.jsonl`` file or a directory.
        step: keep only this step; a negative value counts from the last step (-1 = the last one);
            None keeps all.

    Returns:
        The rows (dicts), in file order.

    Raises:
        ValueError: a line that is not a JSON object with string ``prompt`` and ``response`` (names
            file and line), or a step that is not in the dump.
    """
    rows: list[dict[str, Any]] = []
    for file in _jsonl_files(Path(path)):
        with open(file, encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{file}:{lineno}: not valid JSON ({exc.msg})") from None
                if not isinstance(row, dict):
                    raise ValueError(f"{file}:{lineno}: expected a JSON object, got {type(row).__name__}")
                for key in ("prompt", "response"):
                    if not isinstance(row.get(key), str):
                        raise ValueError(f"{file}:{lineno}: field {key!r} must be a string")
                rows.append(row)
    if step is None:
        return rows
    steps = sorted({r["step"] for r in rows if isinstance(r.get("step"), int)})
    if step < 0:
        if len(steps) < -step:
            raise ValueError(f"{path}: step={step} but the dump has {len(steps)} step(s)")
        step = steps[step]
    if step not in steps:
        raise ValueError(f"{path}: no rows with step={step} (steps: {steps[:20]})")
    return [r for r in rows if r.get("step") == step]


# --------------------------------------------------------------------------- rendering


def _groups(rows: list[dict[str, Any]]) -> list[tuple[Any, list[dict[str, Any]]]]:
    """Rows grouped by step, in first-seen order."""
    groups: dict[Any, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(row.get("step"), []).append(row)
    return list(groups.items())


def _columns(rows: list[dict[str, Any]]) -> list[str]:
    """Columns to show: data_source, score, ground_truth, other fields (first-seen order), prompt, response."""
    present = {k for r in rows for k in r}
    extras = list(dict.fromkeys(k for r in rows for k in r if k not in STANDARD_KEYS))
    return [k for k in _FIRST_COLUMNS if k in present] + extras + ["prompt", "response"]


def _value_text(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def _cut(text: str, max_chars: int | None) -> str:
    if max_chars is None or len(text) <= max_chars:
        return text
    rest = len(text) - max_chars
    return text[:max_chars] + f" … ({rest} more character{'s' if rest != 1 else ''})"


def _step_title(step: Any, rows: list[dict[str, Any]]) -> str:
    scores = [r["score"] for r in rows if isinstance(r.get("score"), (int, float))]
    mean = f", mean score {sum(scores) / len(scores):.4g}" if scores else ""
    name = "step ?" if step is None else f"step {step}"
    return f"{name} ({len(rows)} row{'s' if len(rows) != 1 else ''}{mean})"


def _md_cell(text: str) -> str:
    escaped = html.escape(text, quote=False)
    escaped = "".join(_MD_ENTITIES.get(c, c) for c in escaped)
    return escaped.replace("\r\n", "\n").replace("\n", "⏎<br>")


def _render_markdown(groups: list, max_chars: int | None) -> str:
    out: list[str] = []
    for step, rows in groups:
        cols = _columns(rows)
        out += [f"## {_step_title(step, rows)}", "", "| # | " + " | ".join(cols) + " |"]
        out.append("|---|" + "---|" * len(cols))
        for i, row in enumerate(rows):
            cells = [_md_cell(_cut(_value_text(row.get(c)), max_chars)) for c in cols]
            out.append(f"| {i} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


_HTML_HEAD = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: sans-serif; margin: 1em; }}
table {{ border-collapse: collapse; margin-bottom: 2em; }}
th, td {{ border: 1px solid #bbb; padding: 4px 8px; vertical-align: top; text-align: left; }}
td pre {{ white-space: pre-wrap; margin: 0; font-family: monospace; max-width: 60em; }}
</style></head><body>
<h1>{title}</h1>"""


def _render_html(groups: list, max_chars: int | None, title: str) -> str:
    out = [_HTML_HEAD.format(title=html.escape(title))]
    for step, rows in groups:
        cols = _columns(rows)
        out.append(f"<h2>{html.escape(_step_title(step, rows))}</h2>")
        out.append("<table><tr><th>#</th>" + "".join(f"<th>{html.escape(c)}</th>" for c in cols) + "</tr>")
        for i, row in enumerate(rows):
            cells = "".join(
                f"<td><pre>{html.escape(_cut(_value_text(row.get(c)), max_chars))}</pre></td>" for c in cols
            )
            out.append(f"<tr><td>{i}</td>{cells}</tr>")
        out.append("</table>")
    out.append("</body></html>\n")
    return "\n".join(out)


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.split("\n"))


def _render_text(groups: list, max_chars: int | None) -> str:
    out: list[str] = []
    for step, rows in groups:
        out.append(f"=== {_step_title(step, rows)} ===")
        for i, row in enumerate(rows):
            fields = [f"{c}={_value_text(row.get(c))}" for c in _columns(rows)[:-2]]
            out.append(f"--- #{i}  " + "  ".join(fields))
            for c in ("prompt", "response"):
                out += [f"  {c}:", _indent(_cut(row[c], max_chars))]
        out.append("")
    return "\n".join(out)


def render_rollouts(
    jsonl_path: str | os.PathLike,
    out_path: str | os.PathLike | None = None,
    fmt: str = "markdown",
    max_rows: int | None = None,
    step: int | None = None,
    max_chars: int | None = None,
) -> str:
    """Render a generation dump as a table per step (see the module docstring for the formats).

    Args:
        jsonl_path: a ``.jsonl`` dump or a directory of them.
        out_path: write the rendering there too (UTF-8); None only returns it.
        fmt: ``"markdown"``, ``"html"`` or ``"text"``.
        max_rows: show at most this many rows (the first ones, after the step filter); None = all.
        step: only this step (negative: from the last, -1 = the last step); None = all steps.
        max_chars: cut each prompt/response/field to this many characters (the rest is counted).

    Returns:
        The rendered text.
    """
    if fmt not in FORMATS:
        raise ValueError(f"fmt={fmt!r} must be one of {list(FORMATS)}")
    if max_rows is not None and max_rows < 0:
        raise ValueError(f"max_rows={max_rows} must be >= 0")
    rows = load_rollouts(jsonl_path, step)
    groups = _groups(rows[:max_rows] if max_rows is not None else rows)
    if fmt == "markdown":
        text = _render_markdown(groups, max_chars)
    elif fmt == "html":
        text = _render_html(groups, max_chars, f"Generations: {Path(jsonl_path).name}")
    else:
        text = _render_text(groups, max_chars)
    if out_path is not None:
        Path(out_path).write_text(text, encoding="utf-8")
    return text


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: print (``--format text`` by default) or write (``--out``) a rendering of a dump."""
    parser = argparse.ArgumentParser(
        description="Show the prompts, responses and scores of a generation dump."
    )
    parser.add_argument("path", help="a .jsonl dump or a directory of <step>.jsonl files")
    parser.add_argument(
        "--format", choices=FORMATS, default=None, help="default: html/markdown by --out suffix"
    )
    parser.add_argument("--out", default=None, help="write to this file instead of printing")
    parser.add_argument("--max_rows", type=int, default=None)
    parser.add_argument("--step", type=int, default=None, help="only this step; -1 = the last")
    parser.add_argument("--max_chars", type=int, default=None, help="cut long texts to this length")
    args = parser.parse_args(argv)
    fmt = args.format
    if fmt is None:
        suffix = Path(args.out).suffix.lower() if args.out else ""
        fmt = "html" if suffix in (".html", ".htm") else "markdown" if suffix == ".md" else "text"
    try:
        text = render_rollouts(args.path, args.out, fmt, args.max_rows, args.step, args.max_chars)
    except (FileNotFoundError, ValueError) as exc:
        print(f"view_rollouts: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}" if args.out else text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
