"""The engine alone, without a server: co-attention decoding on a small model
built in place (no download), on the CPU when there is no GPU.

Decodes the same prompts with transformers' own dense decoding and with the
engine in scout mode at a budget that covers the context (tokens must match)
and at a sparse budget (prints the co-attention statistics: CPU compute ratio,
recalls, CPU wait, block change rate). Run: python -P -m scout_sglang.engine_demo
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch


def log(message: str) -> None:
    print(f"[demo] {message}", file=sys.stderr, flush=True)


def summarize(telemetry) -> dict:
    totals = [step.totals() for step in telemetry]
    budget = sum(t.budget_blocks for t in totals)
    compared = sum(t.compared_blocks for t in totals)
    return {
        "cpu_ratio": round(sum(t.cpu_blocks for t in totals) / budget, 4) if budget else 0.0,
        "recalled_blocks": sum(t.recalled_blocks for t in totals),
        "recall_mib": round(sum(t.recall_bytes for t in totals) / 2**20, 3),
        "cpu_wait_ms": round(1e3 * sum(t.cpu_wait_s for t in totals), 2),
        "block_change_rate": round(sum(t.changed_blocks for t in totals) / compared, 4) if compared else 0.0,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--budget", type=int, default=256, help="sparse token budget")
    args = parser.parse_args(argv)

    from scout_sglang.config import ScoutConfig
    from scout_sglang.hf.reference_decoder import ReferenceDecoder, dense_generate
    from scout_sglang.hf.tiny_models import tiny_model

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = tiny_model("qwen3", num_layers=4, hidden=128, num_heads=8, num_kv_heads=2, head_dim=32, vocab=256,
                       init_std=0.1).to(device)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in (args.prompt_tokens, args.prompt_tokens // 2)]
    log(f"model: random-weight Qwen3, 4 layers, 8 query / 2 KV heads, on {device}; prompts {[len(p) for p in prompts]}")

    start = time.perf_counter()
    dense = dense_generate(model, prompts, args.new_tokens)
    log(f"dense decoding (transformers): {time.perf_counter() - start:.1f} s")
    report = {"device": device}
    longest = max(map(len, prompts)) + args.new_tokens
    for label, budget in (("covering", 32 * (-(-longest // 32))), ("sparse", args.budget)):
        config = ScoutConfig(mode="scout", block_size=32, token_budget=budget, sink_blocks=1, local_blocks=2)
        decoder = ReferenceDecoder(model, config, max_requests=len(prompts), max_tokens_per_request=longest)
        try:
            start = time.perf_counter()
            result = decoder.generate(prompts, args.new_tokens)
            elapsed = time.perf_counter() - start
        finally:
            decoder.close()
        same = sum(a == b for x, y in zip(result.tokens, dense.tokens) for a, b in zip(x, y))
        total = sum(map(len, dense.tokens))
        stats = summarize(result.telemetry)
        cosine = {layer: round(sum(v) / len(v), 3) for layer, v in result.query_cosine.items()}
        log(f"scout, budget {budget} ({label}): {elapsed:.1f} s, tokens equal to dense {same}/{total}, {stats}")
        log(f"  predicted-vs-real query cosine per layer: {cosine}")
        print(f"request 0 ({label} budget) first tokens: {result.tokens[0][:16]}")
        report[label] = {"budget": budget, "tokens_equal_to_dense": f"{same}/{total}", **stats}
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
