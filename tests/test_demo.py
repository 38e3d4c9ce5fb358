"""The README main job (scout_sglang.demo): a real scout server on the bundled
suite model answers through the OpenAI API and reports the co-attention
statistics, its predicted-query cosine among them."""

import json

import pytest
from support import requires_sglang

from scout_sglang import demo
from scout_sglang.env import config_from_env
from scout_sglang.retrieval import tasks
from scout_sglang.retrieval.evaluate import bundled_model_dir, engine_correct, load_model

pytestmark = [requires_sglang, pytest.mark.slow]


def test_the_main_job_serves_answers_and_reports_co_attention(capsys):
    assert demo.main(["--contexts", "512", "1024", "--budget", "128"]) == 0
    printed = capsys.readouterr().out
    report = json.loads(printed.strip().splitlines()[-1])
    answers = report["answers"]
    assert len(answers) == 3 and answers[-1]["streamed"]
    assert answers[-1]["answer"] == answers[0]["answer"]  # streamed == not streamed (greedy)
    samples = demo.demo_samples([512, 1024])
    assert [item["task"] for item in answers] == ["niah", "values", "niah"]  # the suite's tasks in turn
    for item, sample in zip(answers, [*samples, samples[0]]):  # sets in any order
        assert item["correct"] == sample.is_correct([tasks.TOKEN_ID.get(w, -1) for w in item["answer"].split()])
    # Right and wrong exactly where the engine's reference decoder is, in the same mode and budget.
    model = load_model(bundled_model_dir("ruler-llama"))
    config = config_from_env({"SCOUT_CONFIG": "tiny", "SCOUT_TOKEN_BUDGET": "128", "SCOUT_CPU_GROUPS": "1"})
    expected = engine_correct(model, samples, config)
    assert [item["correct"] for item in answers[:2]] == expected
    stats = report["scout"]
    assert stats["cpu_ratio"] > 0 and stats["cpu_launched_ahead_fraction"] == 1.0
    assert stats["decode_steps"] >= 4 and stats["usage"]["requests"] == 0
    # The suite model's layer-ahead prediction, as in real models, over the demo's own requests: SGLang's warm-up
    # prompt (padding tokens, zero queries, cosine 0) comes before them.
    assert stats["demo_predicted_query_cosine"] > 0.9
    assert f"requests {stats['demo_predicted_query_cosine']:.2f} " in printed


def test_the_cosine_between_two_reports_is_that_of_the_queries_in_between():
    before = {"predicted_query_cosine": 0.0, "predicted_queries": 56}
    after = {"predicted_query_cosine": 0.6, "predicted_queries": 156}
    assert demo.cosine_between(before, after) == pytest.approx(0.6 * 156 / 100)
    assert demo.cosine_between(after, after) is None
