"""The README main job (scout_sglang.demo): a real scout server answers through
the OpenAI API and reports the co-attention statistics."""

import json

import pytest
from support import requires_sglang

from scout_sglang import demo

pytestmark = [requires_sglang, pytest.mark.slow]


def test_the_main_job_serves_answers_and_reports_co_attention(capsys):
    assert demo.main(["--document-repeats", "6", "--max-tokens", "8"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    answers = report["answers"]
    assert len(answers) == len(demo.QUESTIONS) + 1 and all(a["answer"] for a in answers)
    assert min(a["prompt_tokens"] for a in answers) > 128  # longer than the tiny preset's budget
    assert answers[-1]["answer"] == answers[0]["answer"]  # streamed == not streamed (greedy)
    stats = report["scout"]
    assert stats["cpu_ratio"] > 0 and stats["cpu_launched_ahead_fraction"] == 1.0
    assert stats["decode_steps"] >= 7 and stats["usage"]["requests"] == 0
