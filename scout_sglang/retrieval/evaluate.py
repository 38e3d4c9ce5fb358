"""Exact-match accuracy of the retrieval models, through the engine or a server.

A needle sample (data.py) is right when the greedy continuation of its prompt
is `K V1 V2`: the key repeated (from the dense prefill), then both values of
the queried needle (from decode steps, where the sparse modes differ). A suite
sample (tasks.py) is right by its own TaskSample.is_correct.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from scout_sglang.retrieval import data, tasks
from scout_sglang.retrieval.tasks import TaskSample

ANSWER_TOKENS = 3  # K V1 V2
EVAL_SEED = 1_000  # held-out seeds: far from the training seeds (train.TRAIN_SEED + step)


def bundled_model_dir(name: str = "needle-llama") -> Path:
    """A committed model: needle-llama (scout_sglang.retrieval.train) or ruler-llama (train_suite)."""
    import scout_sglang.assets

    return Path(scout_sglang.assets.__file__).resolve().parent / name


def answer_length(sample) -> int:
    return len(sample.answer) if isinstance(sample, TaskSample) else ANSWER_TOKENS


def judge(sample, generated: list[int]) -> bool:
    return sample.is_correct(generated) if isinstance(sample, TaskSample) else is_correct(sample, generated)


def held_out(count: int, length: int, needles: int = 8, seed: int = EVAL_SEED) -> list[data.Sample]:
    return data.make_batch(count, length, needles, seed=seed + 7919 * length + needles)


def load_model(model_dir=None):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir or bundled_model_dir(), dtype=torch.float32).eval()


def is_correct(sample: data.Sample, generated: list[int]) -> bool:
    return list(generated[:ANSWER_TOKENS]) == sample.answer[:ANSWER_TOKENS]


def engine_correct(model, samples: list[data.Sample], config, batch_size: int = 16) -> list[bool]:
    """Per sample, whether the engine in `config`'s mode (the reference decoder) answers it; batch by batch."""
    return engine_run(model, samples, config, batch_size)[0]


def engine_run(model, samples: list, config, batch_size: int = 16,
               prediction_cosine: float | None = None) -> tuple[list[bool], dict[int, float]]:
    """Per-sample correctness and, per layer served with a predicted query, the mean cosine between the
    predicted and the real query over all decode steps (empty when the mode predicts nothing).
    prediction_cosine: the real query blended with noise to that cosine stands in for the prediction."""
    run = engine_generate(model, samples, config, batch_size=batch_size, prediction_cosine=prediction_cosine)
    return [judge(s, tokens) for s, tokens in zip(samples, run.tokens)], run.query_cosine


@dataclass
class EngineRun:
    tokens: list[list[int]]  # generated, per sample
    query_cosine: dict[int, float]  # per layer served with a predicted query: mean cosine with the real one
    prefills: list  # per sample, its reference_decoder.Prefill when kept (keep_prefills)


def engine_generate(model, samples: list, config, *, batch_size: int = 16, prediction_cosine: float | None = None,
                    prefills: list | None = None, keep_prefills: bool = False, engine=None) -> EngineRun:
    """Greedy answers of the engine in `config`'s mode (the reference decoder), batch by batch.

    prefills : each sample's Prefill from an earlier run (keep_prefills=True): the same dense prefill, not run
        again (ReferenceDecoder.generate)
    engine : optional factory engine(config, shape) of the engine the reference decoder drives"""
    from scout_sglang.hf.reference_decoder import ReferenceDecoder

    longest = max(len(s.prompt) + answer_length(s) for s in samples)
    decoder = ReferenceDecoder(model, config, max_requests=batch_size, max_tokens_per_request=longest,
                               track_changes=False, prediction_cosine=prediction_cosine, engine=engine)
    tokens, cosines, kept = [], {}, []
    try:
        for start in range(0, len(samples), batch_size):
            chunk = samples[start:start + batch_size]
            result = decoder.generate([s.prompt for s in chunk], max(map(answer_length, chunk)),
                                      prefills=None if prefills is None else prefills[start:start + batch_size],
                                      keep_prefills=keep_prefills)
            tokens += result.tokens
            kept += result.prefills
            for layer, values in result.query_cosine.items():
                cosines.setdefault(layer, []).extend(values)
    finally:
        decoder.close()
    return EngineRun(tokens, {layer: sum(values) / len(values) for layer, values in sorted(cosines.items())}, kept)


def engine_accuracy(model, samples: list[data.Sample], config, batch_size: int = 16) -> float:
    """Accuracy with the engine in `config`'s mode (the reference decoder)."""
    return sum(engine_correct(model, samples, config, batch_size)) / len(samples)


def server_accuracy(base: str, samples: list, concurrency: int = 8) -> float:
    """Accuracy through a running server's OpenAI completions API (prompt as text, greedy)."""
    correct = server_correct(base, samples, concurrency)
    return sum(correct) / len(correct)


def server_correct(base: str, samples: list, concurrency: int = 8) -> list[bool]:
    """Per sample, whether a running server answers it (OpenAI completions API, prompt as text, greedy)."""
    return [judge(s, tokens) for s, tokens in zip(samples, server_answers(base, samples, concurrency))]


def server_answers(base: str, samples: list, concurrency: int = 8) -> list[list[int]]:
    """Per suite sample, the tokens a running server answers (OpenAI completions API, prompt as text, greedy;
    -1 for a word outside the vocabulary)."""
    import concurrent.futures

    from scout_sglang.server.client import post_json

    def ask(sample):
        reply = post_json(base + "/v1/completions", {
            "model": "needle", "prompt": " ".join(tasks.words(sample.prompt)), "max_tokens": answer_length(sample),
            "temperature": 0})
        return [tasks.TOKEN_ID.get(w, -1) for w in reply["choices"][0]["text"].split()]

    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(ask, samples))
