"""Soak: a real scout server under mixed OpenAI traffic for minutes, every completed answer checked.

A scout server on the bundled needle model (`python -m sglang.launch_server
--attention-backend scout`, on the CPU when there is no GPU, with SGLang's
radix cache on) gets N minutes of C concurrent clients. Each client loops: a
needle prompt of 256 to 4096 tokens (a fixed pool), chat or completions,
streamed or not; a share of the streams disconnects after the first event. A
share of the pool's prompts (--shared-prefix) start with one common preamble,
so the radix cache shares its K/V between requests and evicts it under
pressure. Optionally a share of the CPU attention
tasks fails on purpose (SCOUT_TEST_FAULTS: the layer computes the part itself).

The server runs where the CPU part decides the answers (SCOUT_ENV: the tiny
preset with no resident buffer and no recall, so every selected block past the
sink and the local window is attended on the CPU). A negative control shows it
first: a server at the same setting whose worker throws every CPU part away
(SCOUT_TEST_FAULTS=cpu_drop:1) is asked each prompt of the pool once, and most
of its answers must differ from the reference decoder's; otherwise answers
identical under faults would say nothing about the CPU part.

Every completed answer is compared with the reference decoder's greedy answer
for the same prompt (scout_sglang.hf.reference_decoder, the same engine
settings as the server). Reported: completed / disconnected / failed requests,
answers identical, latency percentiles over time, the scheduler's RSS over time
(growth after warm-up), pages in use once idle, the fallbacks the server counted.
Then a load ramp (soak_ramp.py): a resident-first server under 1 to 64 clients,
exact at low load, sparse with no failure at full load.

    make soak                                    # 10 minutes, 64 clients, 10% disconnects, 5% CPU faults; the ramp
    python -P benchmarks/soak.py --only-ramp     # the ramp alone, into the last soak's report
    python -P benchmarks/soak.py --quick         # about 3 minutes; prints one JSON line last

Writes benchmarks/results/soak.{json,md,png} (not with --quick).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
sys.path.insert(0, str(Path(__file__).resolve().parent))  # soak_ramp beside it (`python -P` leaves it off)
MAX_TOKENS = 6  # `K V1 V2 . <eos>` and one more: the server stops at <eos>
# No resident buffer and no recall: each step attends the selected blocks past the sink and the local window on
# the CPU. At the tiny preset alone the resident buffer holds most of them: with the CPU part dropped, 6 of this
# pool's 40 answers differ from the reference decoder's there, and 40 of 40 here (docs/testing.md).
SCOUT_ENV = {"SCOUT_CONFIG": "tiny", "SCOUT_CPU_GROUPS": "1", "SCOUT_RESIDENT_BLOCKS": "0",
             "SCOUT_RECALL_POLICY": "off"}
DROP_FAULTS = "cpu_drop:1"  # the negative control's fault: every CPU part reported done and OK with empty results
CONTROL_SHARE = 0.75  # the share of the pool's answers the control must change for the soak to have power
BLOCK = 16  # the tiny preset's block size: SGLang's page size under the radix cache
PREAMBLE_TOKENS = 1024  # the common start of the shared-prefix prompts


def log(message: str) -> None:
    print(f"[soak] {message}", file=sys.stderr, flush=True)


def prompt_pool(count: int, lengths: list[int], seed: int) -> list:
    """`count` needle samples, lengths cycling through `lengths` (fixed seeds: the same pool every run)."""
    from scout_sglang.retrieval.evaluate import held_out

    return [held_out(1, lengths[i % len(lengths)], seed=seed + i)[0] for i in range(count)]


def with_shared_prefix(samples: list, share: float, seed: int) -> tuple[list, set[int]]:
    """Every round(1 / share)-th sample starts with one common preamble of filler words (after <bos>); returns
    the samples and the indices of those that do."""
    from dataclasses import replace

    from scout_sglang.retrieval import data

    if share <= 0:
        return samples, set()
    rng = random.Random(seed)
    preamble = data.ids([rng.choice(data.FILLER) for _ in range(PREAMBLE_TOKENS)])
    shared = set(range(0, len(samples), max(1, round(1 / share))))
    return [replace(s, prompt=s.prompt[:1] + preamble + s.prompt[1:]) if i in shared else s
            for i, s in enumerate(samples)], shared


def reference_answers(samples: list, env: dict) -> list[list[str]]:
    """The reference decoder's greedy words per sample, up to <eos> (which the server does not return)."""
    from scout_sglang.env import config_from_env
    from scout_sglang.hf.reference_decoder import ReferenceDecoder
    from scout_sglang.retrieval import data
    from scout_sglang.retrieval.evaluate import load_model

    model = load_model()
    decoder = ReferenceDecoder(model, config_from_env(env), max_requests=8,
                               max_tokens_per_request=max(len(s.prompt) for s in samples) + MAX_TOKENS,
                               track_changes=False)
    answers = []
    try:
        for start in range(0, len(samples), 8):
            chunk = samples[start:start + 8]
            for tokens in decoder.generate([s.prompt for s in chunk], MAX_TOKENS).tokens:
                said = data.words(list(tokens))
                answers.append(said[:said.index("<eos>")] if "<eos>" in said else said)
    finally:
        decoder.close()
    return answers


def ask(base: str, text: str, *, chat: bool, stream: bool, disconnect: bool, timeout: float) -> tuple[str, str]:
    """One request; returns (outcome, answer text): outcome completed, disconnected or failed (text: why)."""
    import http.client
    from urllib.parse import urlparse

    path = "/v1/chat/completions" if chat else "/v1/completions"
    body = {"model": "needle", "max_tokens": MAX_TOKENS, "temperature": 0, "stream": stream}
    body.update({"messages": [{"role": "user", "content": text}]} if chat else {"prompt": text})
    url = urlparse(base)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
    try:
        connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            return "failed", f"HTTP {response.status}: {response.read()[:200]!r}"
        if not stream:
            choice = json.loads(response.read())["choices"][0]
            return "completed", choice["message"]["content"] if chat else choice["text"]
        pieces = []
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                return "completed", "".join(pieces)
            event = json.loads(line[len("data: "):])
            if "error" in event:
                return "failed", f"stream error: {event['error']}"
            for choice in event.get("choices", []):
                pieces.append((choice.get("delta", {}).get("content") if chat else choice.get("text")) or "")
            if disconnect:
                return "disconnected", ""  # closing the connection mid-answer
        return "failed", "stream ended without [DONE]"
    except Exception as exc:  # noqa: BLE001 - a failed request is a result, not a crash of the soak
        return "failed", f"{type(exc).__name__}: {exc}"
    finally:
        connection.close()


def negative_control(base: str, samples, answers, args) -> dict:
    """Each prompt of the pool once (completions, not streamed) to a server whose CPU parts are all dropped:
    how many answers differ from the reference decoder's."""
    from concurrent.futures import ThreadPoolExecutor

    from scout_sglang.retrieval import data

    def one(i):
        return ask(base, " ".join(data.words(samples[i].prompt)), chat=False, stream=False, disconnect=False,
                   timeout=args.timeout)

    with ThreadPoolExecutor(min(16, args.clients)) as pool:
        outcomes = list(pool.map(one, range(len(samples))))
    completed = [i for i, (outcome, _) in enumerate(outcomes) if outcome == "completed"]
    return {"fault": DROP_FAULTS, "prompts": len(samples), "completed": len(completed),
            "differ": sum(outcomes[i][1].split() != answers[i] for i in completed)}


def client_loop(index: int, base: str, samples, answers, args, end: float, records: list, lock) -> None:
    from scout_sglang.retrieval import data

    rng = random.Random(1000 + index)
    texts = [" ".join(data.words(s.prompt)) for s in samples]
    while time.monotonic() < end:
        pick = rng.randrange(len(samples))
        chat, stream = rng.random() < 0.5, rng.random() < 0.5
        disconnect = stream and rng.random() < args.disconnect
        start = time.monotonic()
        outcome, text = ask(base, texts[pick], chat=chat, stream=stream, disconnect=disconnect, timeout=args.timeout)
        record = {"t": start, "latency_s": time.monotonic() - start, "outcome": outcome, "prompt": pick,
                  "tokens": len(samples[pick].prompt), "chat": chat, "stream": stream,
                  "shared_prefix": pick in args.shared}
        if outcome == "completed":
            record["identical"] = text.split() == answers[pick]
            if not record["identical"]:
                record["answer"], record["expected"] = text, " ".join(answers[pick])
        elif outcome == "failed":
            record["error"] = text
        with lock:
            records.append(record)


def scheduler_rss(root_pid: int) -> int:
    """RSS bytes of the server's scheduler process (the largest process of the server's tree)."""
    import psutil

    try:
        tree = psutil.Process(root_pid).children(recursive=True)
    except psutil.Error:
        return 0
    sizes = []
    for process in tree:
        try:
            sizes.append(process.memory_info().rss)
        except psutil.Error:
            pass
    return max(sizes, default=0)


def server_args(args, clients: int) -> tuple[str, ...]:
    return ("--attention-backend", "scout", "--dtype", "float32", "--max-total-tokens", str(args.max_total_tokens),
            "--max-running-requests", str(clients), "--page-size", str(BLOCK), "--enable-metrics")


def prompts_and_answers(args) -> tuple[list, list]:
    lengths = [int(x) for x in args.lengths.split(",")]
    samples, args.shared = with_shared_prefix(prompt_pool(args.prompts, lengths, seed=5150), args.shared_prefix, 5151)
    log(f"reference answers for {len(samples)} prompts of {sorted(set(lengths))} tokens ({len(args.shared)} of them "
        f"after a common {PREAMBLE_TOKENS}-token preamble)")
    return samples, reference_answers(samples, SCOUT_ENV)


def load_ramp(args, samples, answers) -> dict:
    """soak_ramp.py: a resident-first server under a rising number of clients."""
    from soak_ramp import level_row, ramp_verdict, run_level

    from scout_sglang.retrieval import data
    from scout_sglang.retrieval.evaluate import bundled_model_dir
    from scout_sglang.server.client import scout_stats
    from scout_sglang.server.launch import launched_server

    full_answers = reference_answers(samples, SCOUT_ENV | {"SCOUT_MODE": "full"})
    texts = [" ".join(data.words(s.prompt)) for s in samples]
    env = SCOUT_ENV | {"SCOUT_RESIDENT_FIRST": "on", "SCOUT_RESIDENT_POOL_BLOCKS": str(args.ramp_pool)}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        with launched_server(bundled_model_dir(), *server_args(args, max(args.ramp_levels)), env=env,
                             log_path=Path(tmp) / "ramp.log") as base:
            for clients in args.ramp_levels:
                level = run_level(base, texts, clients, args.ramp_seconds, ask, scout_stats, args.timeout)
                rows.append(level_row(level, full_answers, answers))
                log(f"ramp: {clients} clients: {rows[-1]}")
    return {"pool_pages": args.ramp_pool, "seconds": args.ramp_seconds, "levels": rows,
            "verdict": ramp_verdict(rows)}


def soak(args) -> dict:
    from scout_sglang.retrieval.evaluate import bundled_model_dir
    from scout_sglang.server.client import scout_stats
    from scout_sglang.server.launch import launched_server

    samples, answers = prompts_and_answers(args)
    arguments = server_args(args, args.clients)
    with tempfile.TemporaryDirectory() as tmp:
        drop_env = SCOUT_ENV | {"SCOUT_TEST_FAULTS": DROP_FAULTS, "SCOUT_TEST_FAULTS_ALLOW": "1"}
        with launched_server(bundled_model_dir(), *arguments, env=drop_env,
                             log_path=Path(tmp) / "control.log") as base:
            control = negative_control(base, samples, answers, args)
    log(f"negative control ({DROP_FAULTS}): {control['differ']} of {control['completed']} answers differ from the "
        f"reference decoder's ({control['prompts']} prompts)")
    env = dict(SCOUT_ENV)
    if args.faults > 0:
        env.update(SCOUT_TEST_FAULTS=f"cpu_raise:{args.faults},seed:1", SCOUT_TEST_FAULTS_ALLOW="1")
    records, rss, lock = [], [], threading.Lock()
    with tempfile.TemporaryDirectory() as tmp:
        log_path = Path(tmp) / "server.log"
        with launched_server(bundled_model_dir(), *arguments, env=env, log_path=log_path) as base:
            start = time.monotonic()
            end = start + args.seconds
            log(f"{args.clients} clients for {args.seconds:.0f} s against {base} (env {env})")
            clients = [threading.Thread(target=client_loop, args=(i, base, samples, answers, args, end, records, lock),
                                        daemon=True) for i in range(args.clients)]
            for thread in clients:
                thread.start()
            next_report = start
            while any(thread.is_alive() for thread in clients):
                rss.append({"t": time.monotonic() - start, "rss_bytes": scheduler_rss(os.getpid())})
                if time.monotonic() >= next_report:
                    with lock:
                        done = len(records)
                    log(f"{time.monotonic() - start:5.0f} s: {done} requests, scheduler RSS "
                        f"{rss[-1]['rss_bytes'] / 2**20:.0f} MiB")
                    next_report += 30
                time.sleep(2)
            time.sleep(3)  # the last aborts and releases settle
            stats = scout_stats(base)
            health = _health(base)
    result = summarize(records, rss, stats, health, start, args, control=control)
    with_ramp(result, load_ramp(args, samples, answers))
    return result


def with_ramp(result: dict, ramp: dict) -> None:
    """The load ramp's section and verdict in the soak's result."""
    result["ramp"] = ramp
    result["verdict"] = {k: v for k, v in result["verdict"].items() if not k.startswith("ramp_")} | ramp["verdict"]
    result["passed"] = all(result["verdict"].values())


def _health(base: str) -> int:
    import urllib.request

    with urllib.request.urlopen(base + "/health", timeout=30) as response:
        return response.status


def percentiles(values: list[float]) -> dict:
    if not values:
        return {}
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"p50": round(pick(0.5), 3), "p90": round(pick(0.9), 3), "p99": round(pick(0.99), 3), "n": len(values)}


def summarize(records, rss, stats, health, start, args, *, control: dict | None) -> dict:
    """The report's numbers and verdict; control is negative_control's result (None: it did not run, so the
    soak shows no power)."""
    count = lambda outcome: sum(r["outcome"] == outcome for r in records)  # noqa: E731
    completed = [r for r in records if r["outcome"] == "completed"]
    bucket = max(10, args.seconds // 10)
    buckets = {}
    for r in completed:
        buckets.setdefault(int((r["t"] - start) // bucket), []).append(r["latency_s"])
    # RSS swings with each prefill's buffers: the median of the last fifth of the run against the median of the
    # fifth after warm-up (the first fifth)
    window = lambda lo, hi: [s["rss_bytes"] for s in rss if lo <= s["t"] / args.seconds < hi and s["rss_bytes"]]  # noqa: E731
    early, late = window(0.2, 0.4), window(0.8, 1.01)
    growth = (statistics.median(late) / statistics.median(early) - 1) if early and late else None
    usage = (stats or {}).get("usage", {})
    pages = sum(v for k, v in usage.items() if k.endswith("pages"))
    result = {
        "setting": SCOUT_ENV, "control": control,
        "seconds": args.seconds, "clients": args.clients, "disconnect_share": args.disconnect,
        "cpu_fault_share": args.faults, "prompts": args.prompts, "lengths": args.lengths,
        "requests": len(records), "completed": len(completed), "disconnected": count("disconnected"),
        "failed": count("failed"), "identical": sum(r["identical"] for r in completed),
        "latency_s": percentiles([r["latency_s"] for r in completed]),
        "latency_over_time": [{"from_s": k * bucket, **percentiles(v)} for k, v in sorted(buckets.items())],
        "rss_over_time": [{"t": round(s["t"], 1), "mib": round(s["rss_bytes"] / 2**20, 1)} for s in rss],
        "rss_growth_after_warmup": None if growth is None else round(growth, 4),
        "idle_usage": usage, "idle_pages": pages, "health": health,
        "shared_prefix_share": getattr(args, "shared_prefix", 0.0),
        "shared_prefix_completed": sum(bool(r.get("shared_prefix")) for r in completed),
        "shared_prefix_identical": sum(bool(r.get("shared_prefix")) and r["identical"] for r in completed),
        "prefix": (stats or {}).get("prefix"),
        "cpu_fallbacks": (stats or {}).get("cpu_fallbacks"), "decode_steps": (stats or {}).get("decode_steps"),
        "failures": [r for r in records if r["outcome"] == "failed"][:5],
        "mismatches": [r for r in completed if not r["identical"]][:5],
        "slowest": sorted(completed, key=lambda r: -r["latency_s"])[:5],
    }
    result["verdict"] = {
        "zero_failed": result["failed"] == 0, "all_identical": result["identical"] == result["completed"] > 0,
        "rss_growth_under_5pct": growth is not None and growth < 0.05, "no_pages_idle": pages == 0,
        "prefix_reused": not result["shared_prefix_share"] or ((stats or {}).get("prefix") or {}).get("hits", 0) > 0,
        "healthy": health == 200,
        "cpu_part_decides": bool(control) and control["differ"] >= CONTROL_SHARE * control["prompts"]}
    result["passed"] = all(result["verdict"].values())
    return result


def write_report(result: dict) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "soak.json").write_text(json.dumps(result, indent=1) + "\n")
    lat = result["latency_s"]
    lines = ["# Soak: a scout server under mixed OpenAI traffic", "",
             f"{result['seconds'] / 60:.0f} minutes, {result['clients']} concurrent clients on the bundled needle "
             f"model (CPU, fp32, tiny preset), {result['prompts']} needle prompts of {result['lengths']} tokens, chat "
             f"and completions, streamed and not; {100 * result['disconnect_share']:.0f}% of the streams disconnect "
             f"after the first event; {100 * result['cpu_fault_share']:.0f}% of the CPU attention tasks raise on "
             f"purpose; {100 * result['shared_prefix_share']:.0f}% of the prompts start with a common "
             f"{PREAMBLE_TOKENS}-token preamble, which the radix cache shares ({result['shared_prefix_completed']} "
             f"such answers, {result['shared_prefix_identical']} identical; prefix hits: {result['prefix']}). "
             "Every completed answer is compared with the reference decoder's greedy answer. Host: "
             f"{result['host']['cpus']} CPUs, load average at the end {result['host']['load_average_at_end']} (other "
             "work on the host shows there).", "",
             f"Setting: `{' '.join(f'{k}={v}' for k, v in result['setting'].items())}`: no resident buffer and no "
             "recall, so every selected block past the sink and the local window is attended on the CPU, and the "
             "CPU part decides the answers. " + control_sentence(result["control"]), "",
             "| requests | completed | disconnected | failed | identical to the reference | latency p50 / p90 / p99 s "
             "| RSS growth after warm-up | pages in use when idle | CPU fallbacks |",
             "|---:|---:|---:|---:|---:|---|---:|---:|---|",
             f"| {result['requests']} | {result['completed']} | {result['disconnected']} | {result['failed']} | "
             f"{result['identical']} | {lat.get('p50')} / {lat.get('p90')} / {lat.get('p99')} | "
             f"{result['rss_growth_after_warmup']} | {result['idle_pages']} | {result['cpu_fallbacks']} |", "",
             "Verdict: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in result["verdict"].items()), "",
             "![latency and RSS over time](soak.png)"]
    if result.get("ramp"):
        from soak_ramp import ramp_lines

        lines += ["", *ramp_lines(result["ramp"])]
    if result["mismatches"] or result["failures"]:
        lines += ["", "First mismatches and failures:", ""]
        lines += [f"- `{json.dumps(r)}`" for r in result["mismatches"] + result["failures"]]
    (RESULTS / "soak.md").write_text("\n".join(lines) + "\n")
    plot(result, RESULTS / "soak.png")


def control_sentence(control: dict | None) -> str:
    if not control:
        return "The negative control did not run."
    return (f"Negative control: a server at the same setting whose worker throws every CPU part away "
            f"(`SCOUT_TEST_FAULTS={control['fault']}`), asked each of the {control['prompts']} prompts once, "
            f"answered {control['differ']} of {control['completed']} differently from the reference decoder "
            f"(the verdict asks for at least {100 * CONTROL_SHARE:.0f}% of the prompts): an answer that lost its "
            "CPU part would not be identical.")


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    rows = result["latency_over_time"]
    for key in ("p50", "p90", "p99"):
        left.plot([r["from_s"] for r in rows], [r[key] for r in rows], marker="o", label=key)
    left.set(xlabel="seconds into the soak", ylabel="latency (s)", title="completed requests")
    left.legend()
    right.plot([s["t"] for s in result["rss_over_time"]], [s["mib"] for s in result["rss_over_time"]])
    right.set(xlabel="seconds into the soak", ylabel="MiB", title="scheduler RSS")
    for ax in (left, right):
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--disconnect", type=float, default=0.10, help="share of streams closed mid-answer")
    parser.add_argument("--faults", type=float, default=0.0, help="share of CPU attention tasks that raise")
    parser.add_argument("--prompts", type=int, default=40, help="distinct needle prompts in the pool")
    parser.add_argument("--lengths", default="256,512,1024,2048,4096", help="prompt lengths (tokens) of the pool")
    parser.add_argument("--max-total-tokens", type=int, default=131072)
    parser.add_argument("--shared-prefix", type=float, default=0.25,
                        help="share of the pool's prompts that start with a common preamble (radix-cache hits)")
    parser.add_argument("--timeout", type=float, default=300.0, help="per request, seconds")
    parser.add_argument("--ramp-levels", default="1,4,16,64", help="concurrent clients of the load ramp's levels")
    parser.add_argument("--ramp-seconds", type=float, default=40.0, help="seconds per level of the load ramp")
    parser.add_argument("--ramp-pool", type=int, default=400, help="the load ramp's resident pool, pages")
    parser.add_argument("--only-ramp", action="store_true",
                        help="run the load ramp alone and put it in the last soak's report")
    parser.add_argument("--quick", action="store_true",
                        help="about 3 minutes: 16 clients, 30 s, shorter prompts; a two-level ramp")
    args = parser.parse_args(argv)
    if args.quick:
        args.minutes, args.clients, args.prompts, args.lengths = 0.5, 16, 12, "256,512,1024"
        args.ramp_levels, args.ramp_seconds, args.ramp_pool = "1,8", 12.0, 160
    args.seconds = args.minutes * 60
    args.ramp_levels = [int(x) for x in args.ramp_levels.split(",")]
    if args.only_ramp:
        return only_ramp(args)
    started = time.monotonic()
    result = soak(args)
    result["run_seconds"] = round(time.monotonic() - started, 1)
    result["host"] = {"cpus": len(os.sched_getaffinity(0)), "load_average_at_end": [round(x, 2) for x in os.getloadavg()]}
    if not args.quick:
        write_report(result)
    log(f"{result['requests']} requests: {result['completed']} completed ({result['identical']} identical), "
        f"{result['disconnected']} disconnected, {result['failed']} failed; RSS growth "
        f"{result['rss_growth_after_warmup']}; pages idle {result['idle_pages']}; passed {result['passed']}")
    print(json.dumps({k: result[k] for k in ("passed", "verdict", "requests", "completed", "identical",
                                             "disconnected", "failed", "latency_s", "rss_growth_after_warmup",
                                             "idle_pages", "cpu_fallbacks", "control", "run_seconds")}))
    return 0 if result["passed"] else 1


def only_ramp(args) -> int:
    """The load ramp alone, its section put in the last soak's report (benchmarks/results/soak.json)."""
    last = RESULTS / "soak.json"
    if not last.exists() and not args.quick:
        print(f"error: --only-ramp adds to the last soak's report, and {last} does not exist: run the soak",
              file=sys.stderr)
        return 2
    samples, answers = prompts_and_answers(args)
    ramp = load_ramp(args, samples, answers)
    if not args.quick:
        result = json.loads(last.read_text())
        with_ramp(result, ramp)
        write_report(result)
    print(json.dumps({"passed": all(ramp["verdict"].values()), "ramp": ramp}))
    return 0 if all(ramp["verdict"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
