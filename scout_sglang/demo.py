"""The main job: an SGLang server with `--attention-backend scout` on a bundled model (trained here, no
download), asked through the OpenAI API.

It serves the 8-layer suite model (ruler-llama, scout_sglang/retrieval/train_suite.py) by default: its
layers change the residual stream little, as real models' do, so each layer's query predicted from the
layer before is close to the real one (a cosine of 0.97 over its layers, the paper's 0.93-0.97), which is
what scout's layer-ahead selection and CPU part are built on. The 3-layer needle model (`--model-name
needle-llama`) predicts its first offloaded layer from the embeddings (cosine ~0.3; 0.44 over its layers): it
exercises the machinery, not the method as meant to run.

Starts `python -m sglang.launch_server` (on the CPU when there is no GPU), sends concurrent long-context chat
requests, one of each of the suite's tasks by default (a needle among 8, a key's 4 values, a 3-hop variable
chain, the 3 most frequent words; scout_sglang.retrieval.tasks), and one streaming request, prints each answer
next to the right one and the co-attention statistics the server reports (CPU compute ratio, recalls, CPU
wait, predicted-query cosine), and shuts the server down. The last line printed is a JSON report.
Run: python -P -m scout_sglang.demo
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import sys
import tempfile
import time
from pathlib import Path

CONTEXTS = (1024, 1536, 2048, 2048)  # prompt tokens of the concurrent requests (the models are trained to 2048)
MODELS = ("ruler-llama", "needle-llama")
ABOUT = {"ruler-llama": "an 8-layer Llama trained on four RULER-style tasks; scout_sglang.retrieval.train_suite",
         "needle-llama": "a 3-layer Llama trained on needle retrieval; scout_sglang.retrieval.train"}


def log(message: str) -> None:
    print(f"[demo] {message}", file=sys.stderr, flush=True)


def demo_samples(contexts, model_name: str = MODELS[0]) -> list:
    """One held-out sequence per context length (fixed seeds: the same questions every run): the suite's tasks in
    turn for ruler-llama, needle questions for needle-llama."""
    from scout_sglang.retrieval import tasks
    from scout_sglang.retrieval.evaluate import held_out

    if model_name == "needle-llama":
        return [held_out(1, length, seed=4242 + i)[0] for i, length in enumerate(contexts)]
    return [tasks.make_batch(tasks.TASKS[i % len(tasks.TASKS)], 1, length, seed=4242 + i)[0]
            for i, length in enumerate(contexts)]


def chat(base: str, content: str, max_tokens: int) -> dict:
    from scout_sglang.server.client import post_json

    return post_json(base + "/v1/chat/completions", {
        "model": "demo", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
        "temperature": 0})


def ask(base: str, samples, max_tokens: int) -> list[dict]:
    """The samples concurrently, then the first one again, streamed."""
    from scout_sglang.retrieval import tasks
    from scout_sglang.retrieval.evaluate import answer_length, judge
    from scout_sglang.server.client import post_stream

    prompts = [" ".join(tasks.words(s.prompt)) for s in samples]
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        replies = list(pool.map(lambda prompt: chat(base, prompt, max_tokens), prompts))
    texts = [r["choices"][0]["message"]["content"] for r in replies]
    events = post_stream(base + "/v1/chat/completions", {
        "model": "demo", "messages": [{"role": "user", "content": prompts[0]}], "max_tokens": max_tokens,
        "temperature": 0})
    texts.append("".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices")))
    answers = []
    for index, (sample, text) in enumerate(zip([*samples, samples[0]], texts)):
        length = answer_length(sample)
        got = [tasks.TOKEN_ID.get(word, -1) for word in text.split()[:length]]
        answers.append({"task": getattr(sample, "task", "niah"), "prompt_tokens": len(sample.prompt),
                        "query": " ".join(tasks.words(sample.prompt)[-2:]),
                        "expected": " ".join(tasks.words(sample.answer[:length])), "answer": text.strip(),
                        "correct": judge(sample, got), "streamed": index == len(samples)})
    return answers


def cosine_between(before: dict, after: dict) -> float | None:
    """The mean predicted-query cosine of the queries predicted between two reports of the server's statistics."""
    count = after["predicted_queries"] - before["predicted_queries"]
    if count <= 0:
        return None
    total = (after["predicted_query_cosine"] or 0.0) * after["predicted_queries"] - (
        (before["predicted_query_cosine"] or 0.0) * before["predicted_queries"])
    return round(total / count, 6)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contexts", type=int, nargs="+", default=list(CONTEXTS), help="prompt tokens per request")
    parser.add_argument("--max-tokens", type=int, default=5)
    parser.add_argument("--config", default="tiny", help="SCOUT_CONFIG preset or YAML path")
    parser.add_argument("--budget", type=int, default=256, help="SCOUT_TOKEN_BUDGET (tokens per request, layer, head)")
    parser.add_argument("--model-name", choices=MODELS, default=MODELS[0],
                        help="the bundled model to serve (default: the suite model, whose predicted queries are "
                             "close to the real ones, as in real models)")
    parser.add_argument("--estimate", choices=("on", "off"), default=None,
                        help="SCOUT_ESTIMATE (default: the preset's)")
    parser.add_argument("--log", type=Path, default=None, help="server log file (default: a temporary file)")
    args = parser.parse_args(argv)

    import torch

    from scout_sglang.retrieval.evaluate import bundled_model_dir
    from scout_sglang.server.client import scout_stats
    from scout_sglang.server.launch import launched_server

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model_dir = bundled_model_dir(args.model_name)
    samples = demo_samples(args.contexts, args.model_name)
    with tempfile.TemporaryDirectory(prefix="scout-demo-") as work:
        log_path = args.log or Path(work) / "server.log"
        log(f"model: {model_dir.name} ({ABOUT[args.model_name]})")
        log(f"starting the SGLang server with --attention-backend scout on {device} (SCOUT_CONFIG={args.config}, "
            f"budget {args.budget} tokens; the first start also builds the native CPU kernel, about a minute); "
            f"log: {log_path}")
        server_args = ("--attention-backend", "scout", "--max-total-tokens", "16384", "--max-running-requests", "8",
                       "--disable-radix-cache")
        env = {"SCOUT_CONFIG": args.config, "SCOUT_TOKEN_BUDGET": str(args.budget)}
        if args.estimate is not None:
            env["SCOUT_ESTIMATE"] = args.estimate
        start = time.perf_counter()
        with launched_server(model_dir, *server_args, env=env, log_path=log_path, device=device) as base:
            log(f"server up at {base} after {time.perf_counter() - start:.0f} s; sending {len(samples)} concurrent "
                f"chat requests ({', '.join(map(str, args.contexts))} tokens) and one streaming request")
            before = scout_stats(base)  # after SGLang's warm-up request (padding tokens: zero queries, cosine 0)
            start = time.perf_counter()
            answers = ask(base, samples, args.max_tokens)
            elapsed = time.perf_counter() - start
            stats = scout_stats(base)
        stats["demo_predicted_query_cosine"] = cosine_between(before, stats)
        log("server stopped")
    for item in answers:
        mark = "right" if item["correct"] else "WRONG"
        print(f"{item['task']}, {item['prompt_tokens']} tokens, asking {item['query']!r}"
              f"{' (streamed)' if item['streamed'] else ''}: answered {item['answer']!r}, "
              f"expected {item['expected']!r} (sets in any order): {mark}")
    cosine = stats["demo_predicted_query_cosine"]
    print(f"co-attention since the server started (SGLang's warm-up request included): CPU compute ratio {stats['cpu_ratio']:.1%}, {stats['recalled_blocks']} blocks recalled "
          f"({stats['recall_mib']} MiB), CPU wait {stats['cpu_wait_ms']:.1f} ms over {stats['decode_steps']} decode "
          f"steps, CPU part launched one layer ahead {stats['cpu_launched_ahead_fraction']:.0%} of the time, "
          f"predicted-query cosine over this demo's requests {'none' if cosine is None else f'{cosine:.2f}'} (the "
          "query each offloaded layer selected with, computed one layer ahead, against its real one)")
    memory = stats["memory"]
    print(f"KV memory (scout {memory['layout']} pool, 16384 logical tokens): {memory['device_bytes_allocated'] / 2**20:.2f} "
          f"MiB on the {device} ({memory['digest_bytes_allocated'] / 2**20:.2f} digests, "
          f"{memory['window_and_resident_bytes_allocated'] / 2**20:.2f} windows and resident buffers, "
          f"{memory['dense_layer_bytes_allocated'] / 2**20:.2f} dense layers {memory['dense_layers']}, "
          f"{memory['sglang_pool_device_bytes'] / 2**20:.2f} SGLang's placeholder pool), "
          f"{memory['host_bytes_allocated'] / 2**20:.2f} MiB "
          f"of K/V in host memory; full attention would keep {16384 * memory['token_bytes'] / 2**20:.2f} MiB "
          "on the device")
    print(json.dumps({"device": device, "requests_seconds": round(elapsed, 2), "answers": answers, "scout": stats}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
