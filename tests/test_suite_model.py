"""The committed suite model (ruler-llama): full attention answers every task at 2048 tokens, its layer-ahead
predicted queries are residual-dominated, Scout with a covering budget answers exactly like Full, and the
SGLang server path of the accuracy benchmark agrees with the engine's reference decoder per sequence."""

import pytest
from support import requires_sglang

from scout_sglang.config import ScoutConfig
from scout_sglang.env import config_from_env
from scout_sglang.retrieval import evaluate, tasks

CONTEXT = 2048
FULL = ScoutConfig(mode="full", block_size=16, dense_layers=(0,))


@pytest.fixture(scope="module")
def model():
    return evaluate.load_model(evaluate.bundled_model_dir("ruler-llama"))


def held_out(task, count, context=CONTEXT, seed=555):
    return tasks.make_batch(task, count, context, seed=seed + tasks.TASKS.index(task))


@pytest.mark.parametrize("task", tasks.TASKS)
def test_full_attention_answers_every_task_at_2048_tokens(model, task):
    samples = held_out(task, 40)
    correct = evaluate.engine_correct(model, samples, FULL, batch_size=20)
    assert sum(correct) / len(correct) >= 0.95, f"{task}: {sum(correct)}/{len(correct)}"


def test_the_layer_ahead_prediction_is_close_to_the_real_query(model):
    """Residual-dominated: Scout's predicted query (from the previous layer's input) against the real one,
    mean over decode steps and layers, at least 0.85; every layer's above 0.6."""
    config = ScoutConfig(mode="scout", block_size=16, token_budget=CONTEXT // 8, sink_blocks=1, local_blocks=1,
                         dense_layers=(0,), cpu_groups=1)
    cosines = {}
    for task in tasks.TASKS:
        _, per_layer = evaluate.engine_run(model, held_out(task, 6), config, batch_size=6)
        for layer, value in per_layer.items():
            cosines.setdefault(layer, []).append(value)
    means = {layer: sum(v) / len(v) for layer, v in cosines.items()}
    assert sorted(means) == list(range(1, 8))
    assert sum(means.values()) / len(means) >= 0.85 and min(means.values()) > 0.6, means


def test_scout_with_a_covering_budget_answers_exactly_like_full(model):
    scout = ScoutConfig(mode="scout", block_size=16, token_budget=CONTEXT + 16, sink_blocks=1, local_blocks=1,
                        dense_layers=(0,), cpu_groups=1)
    for task in ("values", "common"):
        samples = held_out(task, 6, seed=99)
        assert evaluate.engine_correct(model, samples, scout) == evaluate.engine_correct(model, samples, FULL)


@requires_sglang
@pytest.mark.slow
def test_the_server_answers_each_sequence_as_the_reference_decoder_does(model, tmp_path):
    from scout_sglang.server.launch import launched_server

    context, budget = 1024, 64
    samples = [s for task in tasks.TASKS for s in held_out(task, 4, context, seed=77)]
    env = {"SCOUT_CONFIG": "tiny", "SCOUT_TOKEN_BUDGET": str(budget), "SCOUT_CPU_GROUPS": "1"}
    args = ("--attention-backend", "scout", "--dtype", "float32", "--max-total-tokens", "16384",
            "--disable-radix-cache")
    with launched_server(evaluate.bundled_model_dir("ruler-llama"), *args, env=env,
                         log_path=tmp_path / "server.log") as base:
        served = evaluate.server_correct(base, samples)
    assert served == evaluate.engine_correct(model, samples, config_from_env(env))
