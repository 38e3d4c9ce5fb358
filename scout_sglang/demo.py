"""The main job: an SGLang server with `--attention-backend scout` on a small
model built in place (no download), asked through the OpenAI API.

Starts `python -m sglang.launch_server` (on the CPU when there is no GPU),
sends concurrent long-context chat requests and one streaming request, prints
the answers and the co-attention statistics the server reports (CPU compute
ratio, recalls, CPU wait, predicted-query cosine), and shuts the server down.
The last line printed is a JSON report. Run: python -P -m scout_sglang.demo
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import sys
import tempfile
import time
from pathlib import Path

DOCUMENT = ("scout attention keeps important blocks on the device and computes the rest on the cpu one layer "
            "ahead. a key and a value are hidden in a long text. ")
QUESTIONS = ["find the value of the key.", "what does the cpu compute?", "how are you today?",
             "which blocks stay on the device?"]
MODEL = dict(arch="qwen3", num_layers=4, hidden=128, num_heads=8, num_kv_heads=2, head_dim=32)


def log(message: str) -> None:
    print(f"[demo] {message}", file=sys.stderr, flush=True)


def chat(base: str, content: str, max_tokens: int) -> dict:
    from scout_sglang.server.client import post_json

    return post_json(base + "/v1/chat/completions", {
        "model": "scout-demo", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
        "temperature": 0})


def ask(base: str, documents: list[str], max_tokens: int) -> list[dict]:
    """The questions concurrently (each after its long document), then one streamed."""
    from scout_sglang.server.client import post_stream

    prompts = [f"{doc}\n{question}" for doc, question in zip(documents, QUESTIONS)]
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        replies = list(pool.map(lambda prompt: chat(base, prompt, max_tokens), prompts))
    answers = [{"question": q, "prompt_tokens": r["usage"]["prompt_tokens"],
                "answer": r["choices"][0]["message"]["content"]} for q, r in zip(QUESTIONS, replies)]
    events = post_stream(base + "/v1/chat/completions", {
        "model": "scout-demo", "messages": [{"role": "user", "content": prompts[0]}], "max_tokens": max_tokens,
        "temperature": 0})
    streamed = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))
    answers.append({"question": QUESTIONS[0] + " (streamed)", "prompt_tokens": answers[0]["prompt_tokens"],
                    "answer": streamed})
    return answers


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--document-repeats", type=int, default=12, help="length of each long document")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--config", default="tiny", help="SCOUT_CONFIG preset or YAML path")
    parser.add_argument("--log", type=Path, default=None, help="server log file (default: a temporary file)")
    args = parser.parse_args(argv)

    import torch

    from scout_sglang.hf.tiny_models import save_tiny_model
    from scout_sglang.server.client import scout_stats
    from scout_sglang.server.launch import launched_server

    device = "cuda" if torch.cuda.is_available() else "cpu"
    with tempfile.TemporaryDirectory(prefix="scout-demo-") as work:
        model_dir = save_tiny_model(Path(work) / "model", **MODEL)
        log_path = args.log or Path(work) / "server.log"
        log(f"model: random-weight Qwen3 ({MODEL['num_layers']} layers, {MODEL['num_heads']} query / "
            f"{MODEL['num_kv_heads']} KV heads), built in {model_dir}; its answers are not meaningful text")
        log(f"starting the SGLang server with --attention-backend scout on {device} (SCOUT_CONFIG={args.config}; "
            f"the first start also builds the native CPU kernel, about a minute); log: {log_path}")
        server_args = ("--attention-backend", "scout", "--max-total-tokens", "16384", "--max-running-requests", "8",
                       "--disable-radix-cache")
        start = time.perf_counter()
        with launched_server(model_dir, *server_args, env={"SCOUT_CONFIG": args.config}, log_path=log_path,
                             device=device) as base:
            log(f"server up at {base} after {time.perf_counter() - start:.0f} s; sending "
                f"{len(QUESTIONS)} concurrent chat requests and one streaming request")
            documents = [DOCUMENT * (args.document_repeats + 4 * i) for i in range(len(QUESTIONS))]
            start = time.perf_counter()
            answers = ask(base, documents, args.max_tokens)
            elapsed = time.perf_counter() - start
            stats = scout_stats(base)
        log("server stopped")
    for item in answers:
        print(f"Q ({item['prompt_tokens']} prompt tokens): {item['question']}\nA: {item['answer']!r}")
    print(f"co-attention since the server started (SGLang's warm-up request included): CPU compute ratio {stats['cpu_ratio']:.1%}, {stats['recalled_blocks']} blocks recalled "
          f"({stats['recall_mib']} MiB), CPU wait {stats['cpu_wait_ms']:.1f} ms over {stats['decode_steps']} decode "
          f"steps, CPU part launched one layer ahead {stats['cpu_launched_ahead_fraction']:.0%} of the time, "
          f"predicted-query cosine {stats['predicted_query_cosine']}")
    print(json.dumps({"device": device, "requests_seconds": round(elapsed, 2), "answers": answers, "scout": stats}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
