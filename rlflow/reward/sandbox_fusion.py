"""Score code answers by running them in a SandboxFusion service (verl's ``reward_model.sandbox_fusion``).

SandboxFusion (github.com/bytedance/SandboxFusion) executes code sent to its ``/run_code`` endpoint and
returns what it printed. A code task's ``ground_truth`` holds its tests as JSON, ``{"inputs": [...],
"outputs": [...]}`` (the layout of APPS / CodeContests / TACO rows in verl's data recipes): each input is
fed to the program's standard input and its standard output must equal the expected output up to
surrounding whitespace on each line. The program is the last fenced code block of the response.

The score is the fraction of tests passed (``acc`` is 1.0 when every test passed). A test that fails to
compile, exits non-zero or runs past ``run_timeout_s`` fails. A service that cannot be reached, answers
with an HTTP error or reports its own ``SandboxError`` raises ``SandboxError`` naming the URL after the
retries: an outage must not turn into zero rewards silently.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

__all__ = ["SandboxError", "SandboxSettings", "extract_code", "parse_tests", "score_code"]

_FENCE = re.compile(r"```[ \t]*([\w+#-]*)[ \t]*\n(.*?)```", re.DOTALL)


class SandboxError(RuntimeError):
    """The sandbox service failed (unreachable, HTTP error, or its own ``SandboxError`` status)."""


@dataclass(frozen=True)
class SandboxSettings:
    """Where and how to run code (``reward_model.sandbox_fusion``).

    Attributes:
        url: the service's ``run_code`` endpoint, e.g. ``http://localhost:8080/run_code``.
        max_concurrent: requests one scoring process keeps in flight (a sample's tests run in parallel).
        memory_limit_mb: memory limit of one run.
        run_timeout_s: wall-clock limit of one run.
        language: SandboxFusion's language name of the programs.
        retries: attempts per request before `SandboxError`.
    """

    url: str
    max_concurrent: int = 64
    memory_limit_mb: int = 1024
    run_timeout_s: float = 10.0
    language: str = "python"
    retries: int = 3


def extract_code(response: str) -> str | None:
    """The last fenced code block of ``response`` (```` ```python ... ``` ```` or a bare fence), else None."""
    blocks = _FENCE.findall(response)
    return blocks[-1][1] if blocks else None


def parse_tests(ground_truth: Any) -> tuple[list[str], list[str]]:
    """``(inputs, outputs)`` of a code task's ``ground_truth`` (a JSON string or a mapping).

    Raises:
        ValueError: not ``{"inputs": [...], "outputs": [...]}`` of equal lengths (``fn_name`` tasks, which
            call a function instead of reading standard input, are refused).
    """
    tests = json.loads(ground_truth) if isinstance(ground_truth, str | bytes) else ground_truth
    if not isinstance(tests, dict) or "inputs" not in tests or "outputs" not in tests:
        raise ValueError(
            f"code ground_truth must be {{'inputs': [...], 'outputs': [...]}} (JSON), got {ground_truth!s:.80}"
        )
    if tests.get("fn_name"):
        raise ValueError(
            f"code ground_truth names fn_name={tests['fn_name']!r}: only standard-input tests are run; score "
            "call-based tasks with a custom_reward_function"
        )
    inputs, outputs = list(tests["inputs"]), list(tests["outputs"])
    if len(inputs) != len(outputs) or not inputs:
        raise ValueError(f"code ground_truth has {len(inputs)} inputs and {len(outputs)} outputs")
    return [_text(x) for x in inputs], [_text(x) for x in outputs]


def _text(value: Any) -> str:
    return "\n".join(map(str, value)) if isinstance(value, list) else str(value)


def _same_output(got: str, expected: str) -> bool:
    """Equal up to surrounding whitespace on each line and trailing blank lines."""

    def lines(text: str) -> list[str]:
        return [line.strip() for line in text.strip().splitlines()]

    return lines(got) == lines(expected)


def run_code(settings: SandboxSettings, code: str, stdin: str) -> dict[str, Any]:
    """One ``run_code`` request; the service's JSON answer.

    Raises:
        SandboxError: after ``settings.retries`` failed attempts, naming the URL and the last error.
    """
    body = json.dumps(
        {
            "code": code,
            "stdin": stdin,
            "language": settings.language,
            "run_timeout": settings.run_timeout_s,
            "memory_limit_MB": settings.memory_limit_mb,
        }
    ).encode()
    request = urllib.request.Request(settings.url, data=body, headers={"Content-Type": "application/json"})
    error = "no attempt"
    for attempt in range(settings.retries):
        try:
            with urllib.request.urlopen(request, timeout=settings.run_timeout_s + 30) as answer:
                result = json.loads(answer.read())
            if result.get("status") == "SandboxError":
                error = f"the service reported SandboxError: {result.get('message', '')!s:.200}"
            else:
                return result
        except (urllib.error.URLError, TimeoutError, ConnectionError, json.JSONDecodeError) as err:
            error = f"{type(err).__name__}: {err}"
        if attempt + 1 < settings.retries:
            time.sleep(0.5 * 2**attempt)
    raise SandboxError(f"SandboxFusion at {settings.url} failed {settings.retries} times: {error}")


def _passed(result: dict[str, Any], expected: str) -> bool:
    run = result.get("run_result") or {}
    return (
        run.get("status") == "Finished"
        and run.get("return_code") == 0
        and _same_output(run.get("stdout", ""), expected)
    )


def score_code(settings: SandboxSettings, response: str, ground_truth: Any) -> dict[str, float]:
    """Run the response's program on every test of ``ground_truth``.

    Returns:
        ``{"score": passed / tests, "acc": 1.0 if all passed else 0.0, "tests_passed": passed}``; a response
        with no fenced code block scores 0.
    """
    inputs, outputs = parse_tests(ground_truth)
    code = extract_code(response)
    if code is None:
        return {"score": 0.0, "acc": 0.0, "tests_passed": 0.0}
    with ThreadPoolExecutor(max_workers=min(settings.max_concurrent, len(inputs))) as pool:
        results = list(pool.map(lambda stdin: run_code(settings, code, stdin), inputs))
    passed = sum(_passed(r, expected) for r, expected in zip(results, outputs, strict=True))
    return {"score": passed / len(inputs), "acc": float(passed == len(inputs)), "tests_passed": float(passed)}
