"""Offline recall-interval profiler: per-layer recall intervals for a model preset.

Sits before the engine: it decodes a few prompts through the reference decoder
in scout mode with recall off, records each layer's CPU compute ratio (CPU
tokens / budget tokens, StepTelemetry) per decode step, and derives per layer
the largest recall interval that keeps the ratio <= beta (paper section 3.4).
The result is a YAML preset for scout_sglang.env (recall_policy: interval).

Interval of one layer in one request: with recall off the run starts right
after the resident buffer's initial fill, so the interval is the number of
decode steps before the ratio first exceeds beta (steps 0 .. s-1 stay <= beta
when step s is the first above it), at least 1, at most `max_interval`; a
layer that never exceeds beta gets `max_interval`. This matches the engine's
interval policy, which recalls after step I-1 so that step I runs on a
refreshed buffer.

Over requests (choose with `aggregate`):
  * "mean" (default): average the per-step ratio curves over the requests, then
    take the first step above beta: the paper's procedure (a layer's ratio
    curve over decoding steps, Figure 6a) and robust to one odd request;
  * "min": derive an interval per request and keep the smallest: every
    profiled request stays <= beta, at the cost of shorter intervals.

Layers in `dense_layers` never use the CPU and get the preset's default
`recall_interval`. Pure functions (`first_exceedance`, `intervals_from_ratios`,
`min_intervals`, `profile_intervals`, `preset_fields`) are kept apart
from the driving code (`collect_ratios`, `main`) so they can be tested alone.

    python -m scout_sglang.profiler --tiny qwen3 --preset tiny --prompt-len 1024 --out configs/tiny-qwen3.yaml
    python -m scout_sglang.profiler --model-dir DIR --prompt-file prompts.txt --out configs/NAME.yaml
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from scout_sglang.config import ScoutConfig

AGGREGATES = ("mean", "min")


# -- pure functions -------------------------------------------------------------
def first_exceedance(ratios: Sequence[float], beta: float) -> int | None:
    """Index of the first step whose ratio is > beta, or None when none is."""
    for step, ratio in enumerate(ratios):
        if ratio > beta:
            return step
    return None


def interval_from_curve(ratios: Sequence[float], *, beta: float, max_interval: int) -> int:
    """Recall interval of one layer from its ratio per decode step after a fill.

    Steps before the first one above beta are covered; the result is clamped to
    [1, max_interval], and a curve that never exceeds beta gives max_interval.
    """
    if max_interval < 1:
        raise ValueError(f"max_interval must be >= 1, got {max_interval}")
    step = first_exceedance(ratios, beta)
    if step is None:
        return max_interval
    return min(max(step, 1), max_interval)


def intervals_from_ratios(ratios: Sequence[Sequence[float]], beta: float, max_interval: int) -> list[int]:
    """Per-layer intervals of one request (or one averaged curve).

    Parameters
    ----------
    ratios : [steps][layers] CPU compute ratio of each layer at each decode
        step, step 0 being the first step after the resident buffer's fill.
    beta : ratio threshold, in (0, 1)
    max_interval : cap, and the answer for a layer that never exceeds beta

    Returns
    -------
    list of int, one interval per layer, each in [1, max_interval]
    """
    if not 0.0 < beta < 1.0:
        raise ValueError(f"beta must be in (0, 1), got {beta}")
    if not ratios:
        raise ValueError("ratios must hold at least one decode step")
    num_layers = len(ratios[0])
    if any(len(row) != num_layers for row in ratios):
        raise ValueError(f"every step must give {num_layers} layer ratios, got {sorted({len(r) for r in ratios})}")
    return [interval_from_curve([row[layer] for row in ratios], beta=beta, max_interval=max_interval)
            for layer in range(num_layers)]


def mean_curve(per_request: Sequence[Sequence[Sequence[float]]]) -> list[list[float]]:
    """Step-by-step mean of [requests][steps][layers] ratios over the requests.

    Requests may have different numbers of steps: the mean at a step covers the
    requests that reached it.
    """
    if not per_request:
        raise ValueError("need at least one request")
    steps = max(len(r) for r in per_request)
    out = []
    for step in range(steps):
        rows = [r[step] for r in per_request if step < len(r)]
        out.append([sum(values) / len(rows) for values in zip(*rows)])
    return out


def min_intervals(per_request: Sequence[Sequence[int]]) -> list[int]:
    """Layer-wise minimum of per-request interval lists ([requests][layers])."""
    return [min(values) for values in zip(*per_request)]


def profile_intervals(per_request: Sequence[Sequence[Sequence[float]]], *, beta: float, max_interval: int,
                      dense_layers: Sequence[int] = (), default_interval: int = 8,
                      aggregate: str = "mean") -> list[int]:
    """Per-layer recall intervals from [requests][steps][layers] ratios (see module docstring)."""
    if aggregate not in AGGREGATES:
        raise ValueError(f"aggregate must be one of {AGGREGATES}, got {aggregate!r}")
    if aggregate == "mean":
        intervals = intervals_from_ratios(mean_curve(per_request), beta, max_interval)
    else:
        intervals = min_intervals([intervals_from_ratios(r, beta, max_interval) for r in per_request])
    return [default_interval if layer in dense_layers else value for layer, value in enumerate(intervals)]


def ratios_from_telemetry(telemetry, num_layers: int) -> list[list[float]]:
    """[steps][layers] CPU ratios from a list of StepTelemetry (0 for a layer with no stats)."""
    return [[step.layers[layer].cpu_ratio if layer in step.layers else 0.0 for layer in range(num_layers)]
            for step in telemetry]


def preset_fields(base: dict, intervals: Sequence[int], provenance: dict) -> dict:
    """YAML-ready preset: the base fields, recall_policy interval, the intervals, and `extra`."""
    out = {key: list(value) if isinstance(value, tuple) else value for key, value in base.items() if key != "extra"}
    out["recall_policy"] = "interval"
    out["recall_intervals"] = [int(i) for i in intervals]
    extra = dict(base.get("extra") or {})
    extra["profile"] = provenance
    out["extra"] = extra
    ScoutConfig(**{key: tuple(value) if isinstance(value, list) else value for key, value in out.items()})  # validates
    return out


# -- driving code ----------------------------------------------------------------
def log(message: str) -> None:
    print(f"[profiler] {message}", file=sys.stderr, flush=True)


def random_prompts(count: int, length: int, vocab: int, *, seed: int) -> list[list[int]]:
    import torch

    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (length,), generator=generator).tolist() for _ in range(count)]


def file_prompts(path: str, model_dir: str, length: int, count: int) -> list[list[int]]:
    """One prompt per non-empty line of a text file, tokenized with the model's tokenizer, cut to `length`."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    lines = [line for line in Path(path).read_text().splitlines() if line.strip()]
    return [tokenizer(line)["input_ids"][:length] for line in lines[:count]]


def load_model(model_dir: str | None, tiny: str | None, tiny_kwargs: dict):
    """(model, description) from a saved HF model directory or a random tiny one."""
    import torch

    if model_dir:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        return model, f"{type(model).__name__} from {Path(model_dir).name}"
    from scout_sglang.hf.tiny_models import tiny_model

    model = tiny_model(tiny, **tiny_kwargs)
    sizes = ", ".join(f"{k}={v}" for k, v in sorted(tiny_kwargs.items()))
    return model, f"random-weight tiny {tiny} ({sizes})"


def collect_ratios(model, config: ScoutConfig, prompts: list[list[int]], decode_steps: int, *,
                   progress: bool = True) -> list[list[list[float]]]:
    """[requests][steps][layers] CPU ratios, recall off, each prompt decoded as its own request.

    One request at a time because the engine's telemetry sums over the batch.
    `decode_steps` telemetry steps are recorded (generate's first token comes
    from the prefill, so it is asked for decode_steps + 1 tokens).
    """
    config = config.replace(mode="scout", recall_policy="off")
    longest = max(len(p) for p in prompts) + decode_steps + 2 * config.block_size
    from scout_sglang.hf.reference_decoder import ReferenceDecoder

    decoder = ReferenceDecoder(model, config, max_requests=1, max_tokens_per_request=longest)
    num_layers = model.config.num_hidden_layers
    out = []
    try:
        for index, prompt in enumerate(prompts):
            start = time.perf_counter()
            result = decoder.generate([prompt], decode_steps + 1, first_rid=index)
            out.append(ratios_from_telemetry(result.telemetry, num_layers))
            if progress:
                mean = sum(map(sum, out[-1])) / max(1, len(out[-1]) * num_layers)
                log(f"prompt {index + 1}/{len(prompts)}: {len(prompt)} tokens, {decode_steps} steps, "
                    f"mean CPU ratio {mean:.3f}, {time.perf_counter() - start:.1f} s")
    finally:
        decoder.close()
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m scout_sglang.profiler", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model-dir", help="a locally saved transformers Llama/Qwen3 model")
    source.add_argument("--tiny", choices=("llama", "qwen3"), help="a random-weight tiny model (tests, demos)")
    parser.add_argument("--out", required=True, help="YAML preset to write, e.g. configs/NAME.yaml")
    parser.add_argument("--preset", default="default", help="base preset (name or YAML path) whose fields are kept")
    parser.add_argument("--token-budget", type=int, help="override the base preset's token_budget")
    parser.add_argument("--block-size", type=int, help="override the base preset's block_size")
    parser.add_argument("--beta", type=float, help="ratio threshold (default: the preset's recall_beta)")
    parser.add_argument("--max-interval", type=int, default=32, help="cap of every interval (default 32)")
    parser.add_argument("--decode-steps", type=int, help="decode steps per prompt (default: 2 x max-interval)")
    parser.add_argument("--aggregate", choices=AGGREGATES, default="mean", help="over requests (module docstring)")
    parser.add_argument("--prompts", type=int, default=4, help="number of prompts (default 4)")
    parser.add_argument("--prompt-len", type=int, default=2048, help="tokens per prompt (default 2048)")
    parser.add_argument("--prompt-file", help="text file, one prompt per line (needs --model-dir's tokenizer)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic prompts (and tiny weights)")
    tiny = parser.add_argument_group("tiny model")
    tiny.add_argument("--layers", type=int, default=4)
    tiny.add_argument("--hidden", type=int, default=128)
    tiny.add_argument("--heads", type=int, default=4)
    tiny.add_argument("--kv-heads", type=int, default=2)
    tiny.add_argument("--head-dim", type=int, default=32)
    tiny.add_argument("--vocab", type=int, default=1024)
    tiny.add_argument("--init-std", type=float, default=0.02)
    return parser


def main(argv: list[str] | None = None) -> int:
    import yaml

    from scout_sglang.env import load_preset

    args = build_parser().parse_args(argv)
    if args.prompt_file and not args.model_dir:
        raise SystemExit("--prompt-file needs --model-dir (its tokenizer)")
    base = load_preset(args.preset)
    for key, value in (("token_budget", args.token_budget), ("block_size", args.block_size)):
        if value is not None:
            base[key] = value
    config = ScoutConfig(**base)
    beta = config.recall_beta if args.beta is None else args.beta
    decode_steps = args.decode_steps or 2 * args.max_interval
    if decode_steps < args.max_interval:
        log(f"warning: {decode_steps} decode steps < max interval {args.max_interval}: a layer that stays below "
            f"beta for the whole run gets {args.max_interval}, longer than what was observed")

    tiny_kwargs = dict(num_layers=args.layers, hidden=args.hidden, num_heads=args.heads, num_kv_heads=args.kv_heads,
                       head_dim=args.head_dim, vocab=args.vocab, init_std=args.init_std, seed=args.seed,
                       max_positions=max(4096, 2 * (args.prompt_len + decode_steps)))
    model, description = load_model(args.model_dir, args.tiny, tiny_kwargs)
    if args.prompt_file:
        prompts = file_prompts(args.prompt_file, args.model_dir, args.prompt_len, args.prompts)
        prompt_source = f"{Path(args.prompt_file).name}, first {len(prompts)} lines, cut to {args.prompt_len} tokens"
    else:
        prompts = random_prompts(args.prompts, args.prompt_len, model.config.vocab_size, seed=args.seed + 1)
        prompt_source = f"{args.prompts} uniform random token sequences of {args.prompt_len} (seed {args.seed + 1})"
    if config.token_budget >= min(len(p) for p in prompts):
        log(f"warning: token_budget {config.token_budget} covers a whole prompt: nothing goes to the CPU there "
            "and every interval comes out at the cap (use longer prompts or --token-budget)")
    log(f"{description}; {len(prompts)} prompts; budget {config.token_budget}, block {config.block_size}, "
        f"beta {beta}, max interval {args.max_interval}")

    per_request = collect_ratios(model, config, prompts, decode_steps)
    num_layers = model.config.num_hidden_layers
    if any(layer >= num_layers for layer in config.dense_layers):
        raise SystemExit(f"dense_layers {config.dense_layers} out of range for {num_layers} layers")
    intervals = profile_intervals(per_request, beta=beta, max_interval=args.max_interval,
                                  dense_layers=config.dense_layers, default_interval=config.recall_interval,
                                  aggregate=args.aggregate)
    curve = mean_curve(per_request)
    offloaded = [layer for layer in range(num_layers) if layer not in config.dense_layers]
    provenance = {
        "tool": "scout_sglang.profiler",
        "model": description,
        "prompts": prompt_source,
        "decode_steps": decode_steps,
        "beta": beta,
        "max_interval": args.max_interval,
        "aggregate": args.aggregate,
        "mean_interval": round(sum(intervals[l] for l in offloaded) / max(1, len(offloaded)), 2),
        "mean_cpu_ratio_without_recall": [round(sum(row[l] for row in curve) / len(curve), 4)
                                          for l in range(num_layers)],
    }
    fields = preset_fields(base, intervals, provenance)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    header = f"# Recall intervals profiled by scout_sglang.profiler for {description}.\n"
    out.write_text(header + yaml.safe_dump(fields, sort_keys=False, default_flow_style=None))
    log(f"intervals {intervals} (mean over offloaded layers {provenance['mean_interval']}) -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
