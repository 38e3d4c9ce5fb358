"""The README main job (scout_sglang.demo): a real scout server on the bundled
retrieval model answers through the OpenAI API and reports the co-attention
statistics."""

import json

import pytest
from support import requires_sglang

from scout_sglang import demo
from scout_sglang.env import config_from_env
from scout_sglang.retrieval.evaluate import engine_correct, load_model

pytestmark = [requires_sglang, pytest.mark.slow]


def test_the_main_job_serves_answers_and_reports_co_attention(capsys):
    assert demo.main(["--contexts", "512", "1024", "--budget", "128"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    answers = report["answers"]
    assert len(answers) == 3 and answers[-1]["streamed"]
    assert answers[-1]["answer"] == answers[0]["answer"]  # streamed == not streamed (greedy)
    for item in answers:
        assert item["correct"] == (item["answer"].split()[:3] == item["expected"].split())
    # Right and wrong exactly where the engine's reference decoder is, in the same mode and budget.
    model = load_model()
    config = config_from_env({"SCOUT_CONFIG": "tiny", "SCOUT_TOKEN_BUDGET": "128", "SCOUT_CPU_GROUPS": "1"})
    expected = engine_correct(model, demo.demo_samples([512, 1024]), config)
    assert [item["correct"] for item in answers[:2]] == expected
    stats = report["scout"]
    assert stats["cpu_ratio"] > 0 and stats["cpu_launched_ahead_fraction"] == 1.0
    assert stats["decode_steps"] >= 4 and stats["usage"]["requests"] == 0
