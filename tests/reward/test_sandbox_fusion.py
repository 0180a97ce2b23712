"""Code answers scored by a SandboxFusion service (`rlflow.reward.sandbox_fusion`), verl's
``reward_model.sandbox_fusion`` with the ``prime`` reward manager.

The service is a real HTTP server in this process that answers SandboxFusion's ``POST /run_code`` by
running the program in a Python subprocess (its request and answer fields are SandboxFusion's).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import numpy as np
import pytest
import torch

from rlflow.models.tiny import build_tiny_tokenizer
from rlflow.protocol import DataProto
from rlflow.reward.default import default_compute_score
from rlflow.reward.sandbox_fusion import SandboxError, SandboxSettings, extract_code, parse_tests, score_code

SUM = "a, b = map(int, input().split())\nprint(a + b)\n"
TESTS = json.dumps({"inputs": ["1 2\n", "10 -3\n", "0 0\n"], "outputs": ["3\n", "7\n", "0\n"]})


class _RunCode(BaseHTTPRequestHandler):
    requests: ClassVar[list[dict]] = []
    broken = False

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(request)
        if type(self).broken:
            answer = {"status": "SandboxError", "message": "no worker available"}
        else:
            try:
                proc = subprocess.run(
                    [sys.executable, "-c", request["code"]],
                    input=request["stdin"],
                    capture_output=True,
                    text=True,
                    timeout=request["run_timeout"],
                )
                run = {"status": "Finished", "return_code": proc.returncode, "stdout": proc.stdout}
            except subprocess.TimeoutExpired:
                run = {"status": "TimeLimitExceeded", "return_code": None, "stdout": ""}
            ok = run["status"] == "Finished" and run["return_code"] == 0
            answer = {"status": "Success" if ok else "Failed", "run_result": run, "compile_result": None}
        body = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:  # keep the test output quiet
        pass


@pytest.fixture(scope="module")
def sandbox_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _RunCode)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/run_code"
    server.shutdown()


def _answer(code: str) -> str:
    return f"Read the numbers and add them.\n```python\n{code}```\nDone."


def test_a_programs_tests_run_in_the_sandbox(sandbox_url):
    settings = SandboxSettings(sandbox_url, max_concurrent=2, memory_limit_mb=256, run_timeout_s=5)
    _RunCode.requests.clear()
    assert score_code(settings, _answer(SUM), TESTS) == {"score": 1.0, "acc": 1.0, "tests_passed": 3.0}
    assert sorted(r["stdin"] for r in _RunCode.requests) == ["0 0\n", "1 2\n", "10 -3\n"]
    first = _RunCode.requests[0]
    assert (first["language"], first["memory_limit_MB"], first["run_timeout"]) == ("python", 256, 5)
    wrong_sign = "a, b = map(int, input().split())\nprint(abs(a) + abs(b))\n"  # fails "10 -3" only
    assert score_code(settings, _answer(wrong_sign), TESTS)["score"] == pytest.approx(2 / 3)
    crash = "raise SystemExit(1)\n"
    assert score_code(settings, _answer(crash), TESTS) == {"score": 0.0, "acc": 0.0, "tests_passed": 0.0}
    assert score_code(settings, "no code here", TESTS)["score"] == 0.0
    slow = SandboxSettings(sandbox_url, run_timeout_s=0.5)
    assert score_code(slow, _answer("while True:\n    pass\n"), TESTS)["score"] == 0.0


def test_code_tasks_need_the_sandbox_and_its_failures_are_loud(sandbox_url):
    with pytest.raises(NotImplementedError, match=r"set reward_model\.sandbox_fusion\.url"):
        default_compute_score("codecontests", _answer(SUM), TESTS)
    settings = SandboxSettings(sandbox_url, retries=2)
    assert default_compute_score("apps", _answer(SUM), TESTS, sandbox=settings)["acc"] == 1.0
    _RunCode.broken = True
    try:
        with pytest.raises(
            SandboxError, match=r"at http://127\.0\.0\.1:\d+/run_code failed 2 times: .*SandboxError"
        ):
            score_code(settings, _answer(SUM), TESTS)
    finally:
        _RunCode.broken = False
    with pytest.raises(SandboxError, match=r"http://127\.0\.0\.1:9/run_code failed 1 times"):
        score_code(SandboxSettings("http://127.0.0.1:9/run_code", retries=1), _answer(SUM), TESTS)


def test_code_and_tests_are_read_as_verls_code_rows_write_them():
    assert extract_code("```\nfirst\n```\ntext\n```python\nsecond\n```") == "second\n"
    assert extract_code("plain text") is None
    assert parse_tests({"inputs": [["1", "2"]], "outputs": ["3"]}) == (["1\n2"], ["3"])
    with pytest.raises(ValueError, match="fn_name='solve': only standard-input tests"):
        parse_tests(json.dumps({"inputs": [[1]], "outputs": [1], "fn_name": "solve"}))
    with pytest.raises(ValueError, match="has 2 inputs and 1 outputs"):
        parse_tests({"inputs": ["1", "2"], "outputs": ["1"]})


def test_the_prime_manager_scores_code_rows_in_its_process_pool(sandbox_url):
    """verl's ``reward_manager=prime`` with ``reward_model.sandbox_fusion_url`` (its sandbox PPO script): the
    trainer's reward functions score a code row through the service, in worker processes."""
    from rlflow.config import load_config, to_typed
    from rlflow.reward.prime import PrimeRewardManager
    from rlflow.trainer.main_ppo import build_reward_fns, prepare_config

    cfg = load_config(
        ["reward_model.reward_manager=prime", f"reward_model.sandbox_fusion_url={sandbox_url}"],
        config_name="demo_two_ranks",
    )
    tok = build_tiny_tokenizer()
    train, _ = build_reward_fns(to_typed(prepare_config(cfg, build_warm_start=False)), tok)
    assert isinstance(train, PrimeRewardManager) and train.timeout_s == 300.0 and train._pool is not None
    responses = [tok(text, add_special_tokens=False)["input_ids"] for text in (_answer(SUM), "none")]
    width = max(map(len, responses))
    batch = DataProto.from_single_dict(
        {
            "prompts": torch.tensor([[5, 6], [5, 6]]),
            "responses": torch.tensor([r + [0] * (width - len(r)) for r in responses]),
            "attention_mask": torch.tensor(
                [[1, 1] + [1] * len(r) + [0] * (width - len(r)) for r in responses]
            ),
            "data_source": np.array(["codecontests", "codecontests"], dtype=object),
            "reward_model": np.array([{"style": "rule", "ground_truth": TESTS}] * 2, dtype=object),
        }
    )
    try:
        out = train(batch, return_dict=True)
    finally:
        train.close()
    scores = out["reward_tensor"]
    assert scores[0, len(responses[0]) - 1] == 1.0 and scores[1].abs().sum() == 0.0
    assert out["reward_extra_info"]["tests_passed"] == [3.0, 0.0]
