"""rlflow.logging.rollout_viewer: the dump format and the text / markdown / HTML renderings of a hand-made dump."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from rlflow.logging.rollout_viewer import dump_generations, load_rollouts, main, render_rollouts

ROWS = [
    {"step": 2, "prompt": "repeat a x2", "response": "aa", "score": 1.0, "ground_truth": "aa",
     "data_source": "repeat"},
    {"step": 2, "prompt": "line1\nline2 | <b>bold</b> & *star*", "response": "x_y`z`", "score": 0.25,
     "ground_truth": "xy", "data_source": "repeat"},
    {"step": 5, "prompt": "p3", "response": "r3\n", "score": None, "ground_truth": {"n": 3},
     "data_source": "gsm8k", "acc": True},
]  # fmt: skip


@pytest.fixture
def dump(tmp_path: Path) -> Path:
    path = tmp_path / "gens.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS) + "\n")  # a trailing blank line is skipped
    return path


def test_dump_generations_directory_and_file(tmp_path: Path) -> None:
    scores = torch.tensor([0.5, float("nan")])
    extra = {"ground_truth": ["aa", "b"], "data_source": np.array(["repeat", "repeat"])}
    out = dump_generations(tmp_path / "val", 7, ["p0", "p1"], ["r0", "r1\n"], scores, extra)
    assert out == str(tmp_path / "val" / "7.jsonl")
    lines = Path(out).read_text().splitlines()
    assert [json.loads(x) for x in lines] == [
        {"step": 7, "prompt": "p0", "response": "r0", "score": 0.5, "ground_truth": "aa", "data_source": "repeat"},
        {"step": 7, "prompt": "p1", "response": "r1\n", "score": None, "ground_truth": "b", "data_source": "repeat"},
    ]  # fmt: skip
    dump_generations(tmp_path / "val", 9, ["p"], ["r"], [1])
    assert [r["step"] for r in load_rollouts(tmp_path / "val")] == [7, 7, 9]
    assert load_rollouts(tmp_path / "val", step=-1) == [
        {"step": 9, "prompt": "p", "response": "r", "score": 1}
    ]
    single = tmp_path / "all.jsonl"
    dump_generations(single, 1, ["a"], ["b"], [0.0])
    dump_generations(single, 2, ["c"], ["d"], np.array([1.0]))
    assert [(r["step"], r["score"]) for r in load_rollouts(single)] == [(1, 0.0), (2, 1.0)]


def test_dump_generations_rejects_ragged_fields(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'score' has 1 values for 2 prompts"):
        dump_generations(tmp_path / "d", 0, ["a", "b"], ["x", "y"], [1.0])
    with pytest.raises(ValueError, match="'data_source' has 3 values for 2 prompts"):
        dump_generations(tmp_path / "d", 0, ["a", "b"], ["x", "y"], [1.0, 0.0], {"data_source": ["s"] * 3})
    with pytest.raises(ValueError, match="would overwrite"):
        dump_generations(tmp_path / "d", 0, ["a"], ["x"], [1.0], {"prompt": ["z"]})


def test_markdown_table_escapes_and_shows_newlines(dump: Path, tmp_path: Path) -> None:
    text = render_rollouts(dump, tmp_path / "out.md", fmt="markdown")
    assert (tmp_path / "out.md").read_text() == text
    lines = text.splitlines()
    assert lines[0] == "## step 2 (2 rows, mean score 0.625)"
    assert lines[2] == "| # | data_source | score | ground_truth | prompt | response |"
    assert lines[3] == "|---|---|---|---|---|---|"
    assert lines[4] == "| 0 | repeat | 1 | aa | repeat a x2 | aa |"
    assert lines[5] == (
        "| 1 | repeat | 0.25 | xy | line1⏎<br>line2 &#124; &lt;b&gt;bold&lt;/b&gt; &amp; &#42;star&#42; "
        "| x&#95;y&#96;z&#96; |"
    )
    assert "## step 5 (1 row)" in lines  # no numeric score → no mean
    assert "| # | data_source | score | ground_truth | acc | prompt | response |" in lines
    assert '| 0 | gsm8k | — | {"n": 3} | true | p3 | r3⏎<br> |' in lines
    for line in lines:  # every table row has exactly its column separators
        if line.startswith("| 0 | gsm8k"):
            assert line.count(" | ") == 6


def test_html_page_escapes_and_preserves_whitespace(dump: Path) -> None:
    text = render_rollouts(dump, fmt="html", step=2)
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    assert "<h2>step 2 (2 rows, mean score 0.625)</h2>" in text
    assert "<td><pre>line1\nline2 | &lt;b&gt;bold&lt;/b&gt; &amp; *star*</pre></td>" in text
    assert "<b>" not in text and "step 5" not in text
    assert "white-space: pre-wrap" in text
    assert text.count("<tr><td>") == 2


def test_text_rendering_max_rows_and_cut(dump: Path) -> None:
    text = render_rollouts(dump, fmt="text", max_rows=2, max_chars=5)
    assert text.splitlines()[:7] == [
        "=== step 2 (2 rows, mean score 0.625) ===",
        "--- #0  data_source=repeat  score=1  ground_truth=aa",
        "  prompt:",
        "    repea … (6 more characters)",
        "  response:",
        "    aa",
        "--- #1  data_source=repeat  score=0.25  ground_truth=xy",
    ]
    assert "step 5" not in text
    assert (
        "  prompt:\n    line1 … (29 more characters)\n  response:\n    x_y`z … (1 more character)\n" in text
    )


def test_bad_dumps_name_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "response": "b"}\n{not json}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not valid JSON"):
        render_rollouts(bad)
    bad.write_text('{"prompt": "a", "response": 3}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: field 'response' must be a string"):
        load_rollouts(bad)
    bad.write_text("[1, 2]\n")
    with pytest.raises(ValueError, match="expected a JSON object, got list"):
        load_rollouts(bad)
    with pytest.raises(FileNotFoundError, match="no such rollout dump"):
        load_rollouts(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="fmt='pdf'"):
        render_rollouts(bad, fmt="pdf")


def test_step_filter_errors(dump: Path) -> None:
    assert [r["prompt"] for r in load_rollouts(dump, step=-2)] == [ROWS[0]["prompt"], ROWS[1]["prompt"]]
    with pytest.raises(ValueError, match=r"no rows with step=3 \(steps: \[2, 5\]\)"):
        load_rollouts(dump, step=3)
    with pytest.raises(ValueError, match="step=-3 but the dump has 2 step"):
        load_rollouts(dump, step=-3)


def test_cli_prints_and_writes(dump: Path, tmp_path: Path, capsys) -> None:
    assert main([str(dump), "--step", "5"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("=== step 5 (1 row) ===\n--- #0  data_source=gsm8k  score=—")
    assert main([str(dump), "--out", str(tmp_path / "v.html")]) == 0
    assert (tmp_path / "v.html").read_text() == render_rollouts(dump, fmt="html")
    assert main([str(tmp_path / "nope.jsonl")]) == 2
    assert "view_rollouts: error:" in capsys.readouterr().err
    script = Path(__file__).resolve().parents[2] / "scripts" / "view_rollouts.py"
    proc = subprocess.run(
        [sys.executable, str(script), str(dump), "--format", "markdown", "--max_rows", "1"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[4] == "| 0 | repeat | 1 | aa | repeat a x2 | aa |"
