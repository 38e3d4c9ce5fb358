"""The main job: an SGLang server with `--attention-backend scout` on the
bundled retrieval model (trained here, no download), asked through the OpenAI API.

Starts `python -m sglang.launch_server` (on the CPU when there is no GPU),
sends concurrent long-context chat requests (needles hidden in a haystack, a
query naming one key; scout_sglang.retrieval.data) and one streaming request,
prints each answer next to the right one and the co-attention statistics the
server reports (CPU compute ratio, recalls, CPU wait, predicted-query cosine),
and shuts the server down. The last line printed is a JSON report.
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

CONTEXTS = (1024, 1536, 2048, 2048)  # prompt tokens of the concurrent requests (the model is trained to 2048)


def log(message: str) -> None:
    print(f"[demo] {message}", file=sys.stderr, flush=True)


def demo_samples(contexts) -> list:
    """One held-out needle sequence per context length (fixed seeds: the same questions every run)."""
    from scout_sglang.retrieval.evaluate import held_out

    return [held_out(1, length, seed=4242 + i)[0] for i, length in enumerate(contexts)]


def chat(base: str, content: str, max_tokens: int) -> dict:
    from scout_sglang.server.client import post_json

    return post_json(base + "/v1/chat/completions", {
        "model": "needle", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
        "temperature": 0})


def ask(base: str, samples, max_tokens: int) -> list[dict]:
    """The samples concurrently, then the first one again, streamed."""
    from scout_sglang.retrieval.data import words
    from scout_sglang.server.client import post_stream

    prompts = [" ".join(words(s.prompt)) for s in samples]
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        replies = list(pool.map(lambda prompt: chat(base, prompt, max_tokens), prompts))
    texts = [r["choices"][0]["message"]["content"] for r in replies]
    events = post_stream(base + "/v1/chat/completions", {
        "model": "needle", "messages": [{"role": "user", "content": prompts[0]}], "max_tokens": max_tokens,
        "temperature": 0})
    texts.append("".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices")))
    answers = []
    for index, (sample, text) in enumerate(zip([*samples, samples[0]], texts)):
        expected = " ".join(words(sample.answer[:3]))
        answers.append({"prompt_tokens": len(sample.prompt), "needle_depth": round(sample.needle_depth, 2),
                        "query": words(sample.prompt)[-1], "expected": expected, "answer": text.strip(),
                        "correct": text.split()[:3] == expected.split(), "streamed": index == len(samples)})
    return answers


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contexts", type=int, nargs="+", default=list(CONTEXTS), help="prompt tokens per request")
    parser.add_argument("--max-tokens", type=int, default=5)
    parser.add_argument("--config", default="tiny", help="SCOUT_CONFIG preset or YAML path")
    parser.add_argument("--budget", type=int, default=256, help="SCOUT_TOKEN_BUDGET (tokens per request, layer, head)")
    parser.add_argument("--model", type=Path, default=None, help="model directory (default: the bundled one)")
    parser.add_argument("--log", type=Path, default=None, help="server log file (default: a temporary file)")
    args = parser.parse_args(argv)

    import torch

    from scout_sglang.retrieval.evaluate import bundled_model_dir
    from scout_sglang.server.client import scout_stats
    from scout_sglang.server.launch import launched_server

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model_dir = args.model or bundled_model_dir()
    samples = demo_samples(args.contexts)
    with tempfile.TemporaryDirectory(prefix="scout-demo-") as work:
        log_path = args.log or Path(work) / "server.log"
        log(f"model: {model_dir.name} (a 3-layer Llama trained on needle retrieval; scout_sglang.retrieval)")
        log(f"starting the SGLang server with --attention-backend scout on {device} (SCOUT_CONFIG={args.config}, "
            f"budget {args.budget} tokens; the first start also builds the native CPU kernel, about a minute); "
            f"log: {log_path}")
        server_args = ("--attention-backend", "scout", "--max-total-tokens", "16384", "--max-running-requests", "8",
                       "--disable-radix-cache")
        env = {"SCOUT_CONFIG": args.config, "SCOUT_TOKEN_BUDGET": str(args.budget)}
        start = time.perf_counter()
        with launched_server(model_dir, *server_args, env=env, log_path=log_path, device=device) as base:
            log(f"server up at {base} after {time.perf_counter() - start:.0f} s; sending {len(samples)} concurrent "
                f"chat requests ({', '.join(map(str, args.contexts))} tokens) and one streaming request")
            start = time.perf_counter()
            answers = ask(base, samples, args.max_tokens)
            elapsed = time.perf_counter() - start
            stats = scout_stats(base)
        log("server stopped")
    for item in answers:
        mark = "right" if item["correct"] else "WRONG"
        print(f"{item['prompt_tokens']} tokens, needle at {item['needle_depth']:.0%}, query {item['query']}"
              f"{' (streamed)' if item['streamed'] else ''}: answered {item['answer']!r}, "
              f"expected {item['expected']!r}: {mark}")
    print(f"co-attention since the server started (SGLang's warm-up request included): CPU compute ratio {stats['cpu_ratio']:.1%}, {stats['recalled_blocks']} blocks recalled "
          f"({stats['recall_mib']} MiB), CPU wait {stats['cpu_wait_ms']:.1f} ms over {stats['decode_steps']} decode "
          f"steps, CPU part launched one layer ahead {stats['cpu_launched_ahead_fraction']:.0%} of the time, "
          f"predicted-query cosine {stats['predicted_query_cosine']}")
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
