"""RULER (and other lm-evaluation-harness tasks) against the SGLang server:
`--attention-backend scout` next to a stock backend, at matching budgets.

For each backend it starts `python -m sglang.launch_server` on the model,
runs lm-evaluation-harness's `local-completions` model against the server's
OpenAI completions endpoint, stops the server, and writes one comparison
table. lm-evaluation-harness lives in its own environment (its pins clash
with SGLang's); `make harness-setup` builds it in .venv-harness.

    # a GPU box with a downloaded model:
    python -P benchmarks/harness/ruler_lm_eval.py --model /models/Qwen3-8B --stock-backend flashinfer \\
        --scout-config qwen3-8b --tasks niah_single_1 niah_multikey_1 --lengths 16384 32768 --limit 100
    # a scout server that is already up (started as users start it), only lm-eval here:
    python -P benchmarks/harness/ruler_lm_eval.py --model /models/Qwen3-8B --server-url http://127.0.0.1:30000 \
        --served-name Qwen3-8B --tasks niah_multikey_2 niah_multivalue ruler_vt ruler_fwe --lengths 16384
    # LongBench, when its data is in the local Hugging Face cache (HF_DATASETS_OFFLINE=1):
    python -P benchmarks/harness/ruler_lm_eval.py --model /models/Qwen3-8B --tasks longbench_hotpotqa ...

RULER's needle tasks with the `repeat` haystack (niah_single_1) generate their
data locally; the essay haystacks download essays, and nltk tries to fetch
`punkt_tab` once, so offline runs stay with the `repeat` tasks.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HARNESS_PYTHON = REPO / ".venv-harness" / "bin" / "python"


def log(message: str) -> None:
    print(f"[harness] {message}", file=sys.stderr, flush=True)


def lm_eval_command(python: Path, base: str, args, output: Path) -> list[str]:
    model_args = (f"model={args.served_name},base_url={base}/v1/completions,tokenizer={args.tokenizer or args.model},"
                  f"tokenized_requests=False,num_concurrent={args.concurrency},max_length={args.max_length},"
                  f"timeout=600")
    command = [str(python), "-m", "lm_eval", "run", "--model", "local-completions", "--model_args", model_args,
               "--tasks", *args.tasks, "--output_path", str(output)]
    if args.lengths:
        command += ["--metadata", json.dumps({"max_seq_lengths": args.lengths,
                                              "tokenizer": str(args.tokenizer or args.model)})]
    if args.limit:
        command += ["--limit", str(args.limit)]
    return command


def scores(output: Path) -> dict:
    """{task: {metric: value}} from the newest results file lm-eval wrote under `output`."""
    files = sorted(output.rglob("results_*.json"), key=lambda p: p.stat().st_mtime)
    if not files:
        raise RuntimeError(f"lm-eval wrote no results under {output}")
    results = json.loads(files[-1].read_text())["results"]
    return {task: {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and "stderr" not in k}
            for task, metrics in results.items()}


def run_backend(name: str, server_args: list[str], env: dict, args) -> dict:
    from scout_sglang.server.launch import launched_server

    output = args.out / name
    output.mkdir(parents=True, exist_ok=True)
    log(f"{name}: starting the server ({' '.join(server_args)})")
    with launched_server(args.model, *server_args, "--served-model-name", args.served_name,
                         "--context-length", str(args.max_length + 256), env=env, device=args.device,
                         log_path=output / "server.log") as base:
        return run_lm_eval(name, base, args)


def run_lm_eval(name: str, base: str, args) -> dict:
    """lm-eval against the server at `base` (http://host:port); its scores, from args.out/name."""
    output = args.out / name
    output.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    command = lm_eval_command(args.lm_eval_python, base, args, output)
    log(f"{name}: {' '.join(command)}")
    subprocess.run(command, check=True, env=dict(os.environ, HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false"))
    log(f"{name}: lm-eval finished in {time.perf_counter() - start:.0f} s")
    for results_file in output.rglob("results_*.json"):
        strip_machine_paths(results_file)
    return scores(output)


def strip_machine_paths(path: Path) -> None:
    """lm-eval records absolute paths (task configs, the harness environment); keep results free of this
    machine's layout by writing them relative to the repository ("<repo>/...")."""
    text = path.read_text()
    path.write_text(text.replace(str(REPO), "<repo>"))


def table(results: dict) -> str:
    backends = list(results)
    rows = sorted({(task, metric) for r in results.values() for task, metrics in r.items() for metric in metrics})
    lines = ["| task | metric | " + " | ".join(backends) + " |", "|---|---|" + "---:|" * len(backends)]
    for task, metric in rows:
        cells = [f"{results[b].get(task, {}).get(metric, float('nan')):.4g}" for b in backends]
        lines.append(f"| {task} | {metric} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="local model directory")
    parser.add_argument("--tokenizer", type=Path, default=None)
    parser.add_argument("--tasks", nargs="+", default=["niah_single_1"])
    parser.add_argument("--lengths", type=int, nargs="*", default=[4096], help="RULER sequence lengths")
    parser.add_argument("--limit", type=int, default=50, help="samples per task (0: all)")
    parser.add_argument("--max-length", type=int, default=None, help="default: the longest of --lengths")
    parser.add_argument("--stock-backend", default="flashinfer", help="torch_native on a CPU-only machine")
    parser.add_argument("--scout-config", default="default", help="SCOUT_CONFIG for the scout server")
    parser.add_argument("--budget", type=int, default=None, help="SCOUT_TOKEN_BUDGET (default: the preset's)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-total-tokens", type=int, default=None,
                        help="KV pool size of both servers (default: concurrency x (max length + 512))")
    parser.add_argument("--served-name", default="model")
    parser.add_argument("--lm-eval-python", type=Path, default=HARNESS_PYTHON)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "harness")
    parser.add_argument("--server-url", default=None,
                        help="evaluate this running server (http://host:port) instead of launching stock and scout")
    args = parser.parse_args(argv)
    args.max_length = args.max_length or max(args.lengths or [4096])
    if not args.lm_eval_python.exists():
        parser.error(f"{args.lm_eval_python} not found: run `make harness-setup` (or pass --lm-eval-python)")
    if args.server_url:
        results = {f"server at {args.server_url}": run_lm_eval("server", args.server_url.rstrip("/"), args)}
        return write_table(results, args)
    scout_env = {"SCOUT_CONFIG": args.scout_config, **({"SCOUT_TOKEN_BUDGET": str(args.budget)} if args.budget else {})}
    common = ["--disable-radix-cache", "--max-running-requests", str(args.concurrency),
              "--max-total-tokens", str(args.max_total_tokens or args.concurrency * (args.max_length + 512))]
    results = {
        f"stock ({args.stock_backend})": run_backend("stock", ["--attention-backend", args.stock_backend, *common],
                                                     {}, args),
        f"scout ({args.scout_config}{f', budget {args.budget}' if args.budget else ''})":
            run_backend("scout", ["--attention-backend", "scout", *common], scout_env, args),
    }
    return write_table(results, args)


def write_table(results: dict, args) -> int:
    text = table(results)
    (args.out / "comparison.md").write_text(text)
    (args.out / "comparison.json").write_text(json.dumps(results, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
