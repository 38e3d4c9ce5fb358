"""The committed retrieval model: full attention answers held-out sequences,
Scout with a covering budget scores exactly like Full, and the SGLang server
path of the accuracy benchmark agrees with the engine's reference decoder."""

import pytest
from support import requires_sglang

from scout_sglang.config import ScoutConfig
from scout_sglang.env import config_from_env
from scout_sglang.retrieval import evaluate
from scout_sglang.retrieval.data import words

CONTEXT = 2048  # the bundled model reaches 95% here (training_report.json)


@pytest.fixture(scope="module")
def model():
    return evaluate.load_model()


@pytest.fixture(scope="module")
def samples():
    return evaluate.held_out(24, CONTEXT, seed=123)


def per_sample(model, samples, config):
    return evaluate.engine_correct(model, samples, config, batch_size=len(samples))


def test_full_attention_answers_held_out_sequences(model, samples):
    correct = per_sample(model, samples, ScoutConfig(mode="full", block_size=16, dense_layers=(0,)))
    assert sum(correct) / len(correct) >= 0.9


def test_scout_with_a_covering_budget_scores_exactly_like_full(model, samples):
    full = per_sample(model, samples, ScoutConfig(mode="full", block_size=16, dense_layers=(0,)))
    scout = per_sample(model, samples, ScoutConfig(mode="scout", block_size=16, token_budget=CONTEXT + 16,
                                                   sink_blocks=1, local_blocks=1, dense_layers=(0,), cpu_groups=1))
    assert scout == full


@requires_sglang
@pytest.mark.slow
def test_the_server_path_scores_what_the_reference_decoder_scores(model, tmp_path):
    from scout_sglang.server.launch import launched_server

    samples = evaluate.held_out(12, 512, seed=77)
    budget = 64
    env = {"SCOUT_CONFIG": "tiny", "SCOUT_TOKEN_BUDGET": str(budget), "SCOUT_CPU_GROUPS": "1"}
    config = config_from_env(env)  # the same engine settings, read as the server reads them
    args = ("--attention-backend", "scout", "--dtype", "float32", "--max-total-tokens", "16384",
            "--disable-radix-cache")
    with launched_server(evaluate.bundled_model_dir(), *args, env=env, log_path=tmp_path / "server.log") as base:
        served = evaluate.server_accuracy(base, samples)
    assert served == evaluate.engine_accuracy(model, samples, config)
    assert words(samples[0].prompt)[0] == "<bos>"  # the prompt text carries its own <bos>
