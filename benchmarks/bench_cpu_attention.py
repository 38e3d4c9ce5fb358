"""CPU part benchmark: native kernel and torch path in GB/s of K+V read, against
the machine's memory read bandwidth measured in the same run.

Qwen3-8B-like decode: Hq 32, Hkv 8, D 128, bf16, block 32, batch 8, 64 random
blocks per sequence and KV head, in a host cache much larger than the last-level
cache (4 GiB in full mode, backed by transparent huge pages where the OS allows:
cpu_worker/host_memory.py; full mode also runs native on a 4 KiB-page copy and, with a GPU, on a copy
page-locked in place on 2 MiB pages as a GPU server's store is, to
show what the huge pages are worth). For 1..all threads: read bandwidth (best of a torch and a numpy sum over
a large buffer, one chunk per thread); the standalone kernel, native and torch path, called from N Python
threads that each attend whole sequences (plan.measure.KernelThreads; the kernel releases the GIL), and native
over 16 pages that stay in the CPU caches (its compute ceiling, which no prefetching can pass); the engine's
hand-off ("embedded": doorbell words, the native worker pool, outputs) against the standalone kernel at batch 32
with 45% of a 2048-token budget on the CPU; and four host store layouts read side by side with no compute
(cpu_attention/layouts.py). Earlier runs also had "1 group of N threads" (one sequence split over the
threads); that layout went with the submit/wait pool that had it, and how the serving worker splits a part over
its threads is what the embedded column measures. Every figure is the best of several rounds, taken interleaved
(the host is shared and noisy). No asserts. Progress goes to stderr; the last stdout line is one JSON object.
Full mode (no --quick) writes benchmarks/results/cpu_attention.{md,json,png}, keeping the results of other CPU
models (and ISA paths) in the same files: one entry per CPU model, this run replacing its own.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from scout_sglang.cpu_worker.dispatch import make_kernel
from scout_sglang.cpu_worker.host_memory import alloc_host_buffer, alloc_host_tensor, anon_huge_kib, thp_state
from scout_sglang.cpu_worker.native_kernel import load_native
from scout_sglang.plan.measure import KernelThreads, read_bandwidth_gbs

# `python -P` (and running from another directory) leaves the script's own directory off sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_attention.layouts import LAYOUTS, make_store  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
HOT_PAGES = 16  # the cache-resident run: 16 pages of K and V, 2 MiB together
SHAPE = dict(num_qo_heads=32, num_kv_heads=8, head_dim=128, block_size=32, batch_size=8, blocks_per_head=64)
BLOCK_BYTES = 2 * SHAPE["block_size"] * SHAPE["head_dim"] * 2  # K and V of one block, bf16
# The engine's hand-off is measured where the engine runs it: batch 32, 45% of a 2048-token budget on the CPU.
EMBEDDED_SHAPE = dict(batch_size=32, blocks_per_head=round(0.45 * 2048 / SHAPE["block_size"]))
FLAGS_OF_INTEREST = ("avx2", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile")


def log(message: str) -> None:
    print(f"[bench_cpu_attention] {message}", file=sys.stderr, flush=True)


def hardware() -> dict:
    """lscpu model name, CPUs this process may use, and the vector flags that matter here."""
    model, flags = "unknown", []
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Model name":
                model = value.strip()
            elif key.strip() == "Flags":
                flags = value.split()
    except (OSError, subprocess.CalledProcessError):
        pass
    module = load_native().module
    group_size = SHAPE["num_qo_heads"] // SHAPE["num_kv_heads"]
    return dict(
        model=model,
        cpus=len(os.sched_getaffinity(0)),
        flags=[f for f in FLAGS_OF_INTEREST if f in flags],
        native_isa=(module.isa() if module is not None else None),
        # The compute path of this benchmark's shape (amx, bf16dot, bf16split or fp32).
        native_path=(
            module.bf16_path(group_size, SHAPE["block_size"], SHAPE["head_dim"])
            if module is not None and hasattr(module, "bf16_path") else None
        ),
        torch=torch.__version__,
    )


# -- memory read bandwidth: read_bandwidth_gbs, and the standalone kernel's threads: KernelThreads, both shared
# with the planner (scout_sglang.plan.measure) --


# -- attention ------------------------------------------------------------------


def make_cache(num_pages: int, huge_pages: bool = True, locked: bool = False) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """K and V [P, Hkv, S, D] bf16, random values tiled from a small random set (fast to fill), and
    their page state: the THP mode, the page kind asked for, and the share of K actually on huge pages.
    locked: page-locked for the GPU in place, as a GPU server's host store (CUDA only)."""
    shape = (num_pages, SHAPE["num_kv_heads"], SHAPE["block_size"], SHAPE["head_dim"])
    gen = torch.Generator().manual_seed(0)
    caches, kind = [], "4k"
    for _ in range(2):
        seed_pages = torch.randn((64,) + shape[1:], generator=gen).to(torch.bfloat16)
        if locked:
            cache, buffer = alloc_host_buffer(shape, torch.bfloat16, device="cuda", what="benchmark K/V store")
            kind = buffer.kind
        else:
            cache, kind = alloc_host_tensor(shape, torch.bfloat16, huge_pages=huge_pages)
        for start in range(0, num_pages, 64):
            n = min(64, num_pages - start)
            cache[start : start + n].copy_(seed_pages[:n])
        caches.append(cache)
    nbytes = caches[0].numel() * 2
    huge_kib = anon_huge_kib([(c.data_ptr(), nbytes) for c in caches])
    pages = dict(
        thp_mode=thp_state(), kind=kind,
        huge_fraction=None if huge_kib is None else round(min(1.0, huge_kib * 1024 / (2 * nbytes)), 3),
    )
    return caches[0], caches[1], pages


def make_tables(num_sets: int, num_pages: int, *, batch_size: int | None = None,
                blocks_per_head: int | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Random block lists of `blocks_per_head` blocks per batch; distinct pages within each list when the cache
    has enough (a smaller cache is walked in random orders, one after another)."""
    b, h = batch_size or SHAPE["batch_size"], SHAPE["num_kv_heads"]
    n = blocks_per_head or SHAPE["blocks_per_head"]
    gen = torch.Generator().manual_seed(1)
    repeats = -(-n // num_pages)

    def one_list():
        return torch.cat([torch.randperm(num_pages, generator=gen) for _ in range(repeats)])[:n]

    tables = []
    for _ in range(num_sets):
        table = torch.stack([one_list() for _ in range(b * h)]).view(b, h, n)
        tables.append((table.to(torch.int32).contiguous(), torch.full((b, h), n, dtype=torch.int32)))
    return tables


class EmbeddedPool:
    """The engine's hand-off, measured as the engine uses it: the native worker pool (C++ threads, no Python)
    driven by its control words. Each block list is a layer's part, registered once with the pool (its staging
    is the list itself); a submit rings the layer's doorbell, a wait waits for its DONE word."""

    def __init__(self, threads: int):
        from scout_sglang.cpu_worker.native_pool import NativeWorkerPool

        self.pool, self._parts, self._seq = NativeWorkerPool(threads=threads), {}, 0

    def submit(self, q, k_cache, v_cache, table, counts, *, scale, out_o, out_lse):
        from scout_sglang.cpu_worker.flag_worker import LayerPart
        from scout_sglang.handoff_words import DOORBELL, ROWS, WORDS_PER_LAYER

        key = id(table)
        if key not in self._parts:
            words = torch.zeros(WORDS_PER_LAYER, dtype=torch.int32)
            self._parts[key] = (len(self._parts), words)
            self.pool.register_layer(len(self._parts) - 1, LayerPart(q, table, counts, out_o, out_lse, k_cache,
                                                                     v_cache, words, scale))
        index, words = self._parts[key]
        self._seq += 1
        words[ROWS], words[DOORBELL] = q.shape[0], self._seq
        self.pool.kick()
        return index, self._seq

    def wait(self, handle, timeout=None):
        from scout_sglang.handoff_words import STATUS_OK

        if self.pool.wait_done(*handle, timeout_s=60.0) != STATUS_OK:
            raise RuntimeError("an embedded part failed or timed out")

    def shutdown(self):
        self.pool.shutdown()


def attention_gbs(pool, k_cache, v_cache, tables, q, out_o, out_lse) -> float:
    """GB/s of K+V bytes read over one pass of `tables` (one submit each, waited in order); `pool` is a
    KernelThreads (the standalone kernel) or an EmbeddedPool (the engine's hand-off)."""
    d = SHAPE
    bytes_per_batch = int(tables[0][1].sum()) * BLOCK_BYTES  # the tables of one run list as many blocks
    start = time.perf_counter()
    handles = []
    for table, counts in tables:
        handles.append(
            pool.submit(q, k_cache, v_cache, table, counts, scale=d["head_dim"] ** -0.5, out_o=out_o, out_lse=out_lse)
        )
        if len(handles) == 2:  # two batches in flight, like layer-ahead use
            pool.wait(handles.pop(0))
    for handle in handles:
        pool.wait(handle)
    return bytes_per_batch * len(tables) / (time.perf_counter() - start) / 1e9


def block_read_gbs(executor: ThreadPoolExecutor, num_threads: int, k_cache, v_cache, tables,
                   block_bytes: int = BLOCK_BYTES) -> float:
    """GB/s of reading the K/V blocks of `tables` as the kernel walks them (same lists, order and prefetch) without
    computing anything: what the memory system gives this access pattern of random blocks. `num_threads` threads
    split each batch by sequence, as the standalone kernel's threads do, and each walks its share of every batch with no
    wait between batches (a wait per batch cost 10-15% at two threads on a 2-core host: time the memory was idle,
    which a ceiling must not count). The heads walked are the tables' (a layout with K and V adjacent lists 2 x
    Hkv of them: cpu_attention/layouts.py)."""
    module = load_native().module
    b, h = tables[0][1].shape
    group_size = SHAPE["num_qo_heads"] // SHAPE["num_kv_heads"]

    def part(t):
        for table, counts in tables:
            for i in range(t, b, num_threads):
                module.read_blocks(k_cache, v_cache, table, counts, i, group_size, 0, h)

    start = time.perf_counter()
    for future in [executor.submit(part, t) for t in range(num_threads)]:
        future.result()
    return sum(int(counts.sum()) for _, counts in tables) * block_bytes / (time.perf_counter() - start) / 1e9


def run(quick: bool) -> dict:
    torch.set_num_threads(1)  # every measurement thread is single-threaded; parallelism is ours
    load_before = os.getloadavg()[0]  # the host is shared: other work shows here
    cpus = len(os.sched_getaffinity(0))
    thread_counts = list(range(1, cpus + 1))
    num_pages = 8192 if quick else 32768  # 128 KiB of K+V per page: 1 GiB / 4 GiB
    rounds = 3 if quick else 8
    log(f"building/loading the native kernel; host cache {num_pages * 128 // 1024} MiB, {rounds} rounds")
    native_ok = load_native().module is not None
    k_cache, v_cache, pages = make_cache(num_pages)
    log(f"host cache pages: {pages}")
    # Full mode: the same cache on 4 KiB pages, to measure what the huge pages give (TLB reach); with a GPU, on
    # 2 MiB pages page-locked in place as a GPU server's host store is (cpu_worker/host_memory.py).
    small_pages = None if quick else make_cache(num_pages, huge_pages=False)
    locked_pages = None if quick or not torch.cuda.is_available() else make_cache(num_pages, locked=True)
    tables = make_tables(4 if quick else 6, num_pages)
    hot_k, hot_v, _ = make_cache(HOT_PAGES)  # 2 MiB of K+V: stays in the CPU caches
    hot_tables = make_tables(4 if quick else 6, HOT_PAGES)  # as many blocks per call, from 16 pages
    q = torch.randn(SHAPE["batch_size"], SHAPE["num_qo_heads"], SHAPE["head_dim"]).to(torch.bfloat16)
    out_o = torch.empty(q.shape, dtype=torch.float32)
    out_lse = torch.empty(q.shape[:2], dtype=torch.float32)
    embedded_tables = make_tables(4 if quick else 6, num_pages, **EMBEDDED_SHAPE)
    q32 = torch.randn(EMBEDDED_SHAPE["batch_size"], SHAPE["num_qo_heads"], SHAPE["head_dim"]).to(torch.bfloat16)
    inputs32 = (q32, torch.empty(q32.shape, dtype=torch.float32), torch.empty(q32.shape[:2], dtype=torch.float32))
    layout_bytes = (256 if quick else 1024) << 20
    stores = [make_store(layout, store_bytes=layout_bytes, num_kv_heads=SHAPE["num_kv_heads"],
                         head_dim=SHAPE["head_dim"], batch_size=SHAPE["batch_size"],
                         tokens_per_list=SHAPE["blocks_per_head"] * SHAPE["block_size"], num_sets=4 if quick else 6)
              for layout in LAYOUTS] if native_ok else []
    log(f"store layouts, {layout_bytes >> 20} MiB each: {', '.join(store.layout.name for store in stores)}")
    bw_buf = torch.ones((1 if quick else 2) << 28, dtype=torch.float32)  # 1 / 2 GiB

    # The standalone kernel: one set of N threads per path and thread count, shared by the configurations of
    # that path (they run one after another).
    standalone = {(impl, n): KernelThreads(make_kernel(impl), n)
                  for impl in (("torch", "native") if native_ok else ("torch",)) for n in thread_counts}
    configs = {"torch": lambda n: standalone[("torch", n)]}
    if native_ok:
        configs["native"] = lambda n: standalone[("native", n)]
        configs["native_hot"] = lambda n: standalone[("native", n)]
        # The engine's hand-off (descriptor, native pool, outputs) and the standalone kernel on the same lists.
        configs["native_b32"] = lambda n: standalone[("native", n)]
        configs["embedded"] = EmbeddedPool
        if small_pages is not None and pages["kind"] == "thp":
            configs["native_4k_pages"] = lambda n: standalone[("native", n)]
        if locked_pages is not None:
            configs["native_locked"] = lambda n: standalone[("native", n)]
    caches = {name: (k_cache, v_cache) for name in configs}
    if "native_4k_pages" in configs:
        caches["native_4k_pages"] = small_pages[:2]
    if "native_locked" in configs:
        caches["native_locked"] = locked_pages[:2]
    caches["native_hot"] = (hot_k, hot_v)
    tables_of = {name: hot_tables if name == "native_hot" else tables for name in configs}
    inputs_of = {name: (q, out_o, out_lse) for name in configs}
    for name in ("native_b32", "embedded"):
        tables_of[name], inputs_of[name] = embedded_tables, inputs32
    pools = {(name, n): make(n) for name, make in configs.items() for n in thread_counts}
    readers = {n: ThreadPoolExecutor(max_workers=n) for n in thread_counts} if native_ok else {}
    best: dict = {}
    paired: dict = {}  # (name, n) -> per-round ratio to that round's read bandwidth
    try:
        for (name, n), pool in pools.items():  # warm-up: thread-local scratch, page faults
            attention_gbs(pool, *caches[name], tables_of[name][:1], *inputs_of[name])
        for r in range(rounds):
            for n in thread_counts:
                round_bw = 0.0
                for method, gbs in read_bandwidth_gbs(bw_buf, n).items():
                    best[(method, n)] = max(best.get((method, n), 0.0), gbs)
                    round_bw = max(round_bw, gbs)
                if n in readers:
                    gbs = block_read_gbs(readers[n], n, k_cache, v_cache, tables)
                    best[("block_read", n)] = max(best.get(("block_read", n), 0.0), gbs)
                    for store in stores:
                        gbs = block_read_gbs(readers[n], n, store.k_view, store.v_view, store.tables,
                                             store.block_bytes)
                        key = ("layout_" + store.layout.name, n)
                        best[key] = max(best.get(key, 0.0), gbs)
                for name in configs:
                    gbs = attention_gbs(pools[(name, n)], *caches[name], tables_of[name], *inputs_of[name])
                    best[(name, n)] = max(best.get((name, n), 0.0), gbs)
                    paired.setdefault((name, n), []).append(gbs / round_bw)
            log(f"round {r + 1}/{rounds}: " + ", ".join(f"{k[0]}@{k[1]}={v:.1f}" for k, v in sorted(best.items())))
    finally:
        for pool in [*pools.values(), *standalone.values()]:
            pool.shutdown()  # a shared KernelThreads is shut down more than once: idempotent
        for reader in readers.values():
            reader.shutdown()

    def series(name):
        return [round(best[(name, n)], 2) if (name, n) in best else None for n in thread_counts]

    def paired_median(name):
        return [round(float(np.median(paired[(name, n)])), 3) if (name, n) in paired else None for n in thread_counts]

    read_bw = [round(max(best[("torch_sum", n)], best[("numpy_sum", n)]), 2) for n in thread_counts]
    native = series("native")
    torch_path = series("torch")
    top = thread_counts[-1]
    result = dict(
        threads=top,
        read_bw_gbs=read_bw[-1],
        native_gbs=native[-1],
        torch_gbs=torch_path[-1],
        native_frac_of_bw=round(native[-1] / read_bw[-1], 3) if native_ok else None,
        native_vs_torch=round(native[-1] / torch_path[-1], 2) if native_ok else None,
        threads_list=thread_counts,
        read_bw_gbs_per_threads=read_bw,
        read_bw_torch_sum_gbs_per_threads=series("torch_sum"),
        read_bw_numpy_sum_gbs_per_threads=series("numpy_sum"),
        native_gbs_per_threads=native,
        torch_gbs_per_threads=torch_path,
        native_4k_pages_gbs_per_threads=series("native_4k_pages") if "native_4k_pages" in configs else None,
        native_locked_gbs_per_threads=series("native_locked") if "native_locked" in configs else None,
        locked_cache_pages=None if locked_pages is None else locked_pages[2],
        # The same kernel with every block in the CPU caches: what its compute allows, memory aside.
        native_hot_gbs_per_threads=series("native_hot"),
        # The engine's hand-off (doorbell words, native pool, outputs) against the standalone kernel (N threads
        # attending whole sequences) on the same lists: batch 32, 45% of a 2048-token budget per list.
        embedded_shape=EMBEDDED_SHAPE,
        embedded_gbs_per_threads=series("embedded"),
        native_b32_gbs_per_threads=series("native_b32"),
        embedded_frac_of_native_per_threads=[round(a / b, 3) if a and b else None
                                             for a, b in zip(series("embedded"), series("native_b32"))],
        # Host store layouts read with no compute, side by side (cpu_attention/layouts.py), and as a share of
        # the read bandwidth.
        layouts={store.layout.name: dict(
            what=store.layout.what, store_gib=round(store.nbytes / 2**30, 2),
            gbs_per_threads=series("layout_" + store.layout.name),
            frac_of_bw_per_threads=[round(a / b, 3) if a else None
                                    for a, b in zip(series("layout_" + store.layout.name), read_bw)])
            for store in stores},
        native_hot_frac_of_bw_per_threads=[round(a / b, 3) if a else None
                                           for a, b in zip(series("native_hot"), read_bw)],
        native_frac_of_bw_per_threads=[round(a / b, 3) if a else None for a, b in zip(native, read_bw)],
        # The kernel's random K/V blocks read without compute, and what share of it the kernel reaches.
        block_read_gbs_per_threads=series("block_read"),
        block_read_frac_of_bw_per_threads=[round(a / b, 3) if a else None
                                           for a, b in zip(series("block_read"), read_bw)],
        native_frac_of_block_read_per_threads=[round(a / b, 3) if a and b else None
                                               for a, b in zip(native, series("block_read"))],
        # Median over rounds of native / read bandwidth measured seconds before it
        # (the host's bandwidth drifts between rounds; this pairs like with like).
        native_frac_of_bw_paired_median_per_threads=paired_median("native"),
        native_vs_torch_per_threads=[round(a / b, 2) if a else None for a, b in zip(native, torch_path)],
        shape=SHAPE,
        dtype="bfloat16",
        host_cache_gib=round(2 * k_cache.numel() * 2 / 2**30, 2),
        host_cache_pages=pages,
        rounds=rounds,
        quick=quick,
        load_average_1min_before_after=[round(load_before, 2), round(os.getloadavg()[0], 2)],
        hardware=hardware(),
    )
    return result


def run_key(result: dict) -> str:
    """One entry per CPU model and vector ISA: hosts sold under one model name differ (AVX2 or AVX-512)."""
    hw = result["hardware"]
    return f"{hw['model']} / {hw['native_isa']}"


def load_runs(path: Path) -> dict:
    """Earlier results by CPU model and ISA; a file of the one-run format (before models were kept) becomes one
    entry."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    runs = data["runs"].values() if "runs" in data else ([data] if "hardware" in data else [])
    return {run_key(run): run for run in runs}


def run_rows(result: dict) -> list[str]:
    """Table rows (one per thread count) of one run."""
    hw = result["hardware"]
    pages = result.get("host_cache_pages")
    path = hw.get("native_path") or "not recorded"
    page_text = "not recorded"
    if pages:
        share = pages["huge_fraction"] if pages["huge_fraction"] is not None else "?"
        page_text = f"{pages['thp_mode']}: {pages['kind']} ({share} huge)"
    rows = []
    for i, n in enumerate(result["threads_list"]):
        small = result.get("native_4k_pages_gbs_per_threads")
        locked = result.get("native_locked_gbs_per_threads")
        hot = result.get("native_hot_gbs_per_threads")
        block_read = result.get("block_read_gbs_per_threads") or [None] * len(result["threads_list"])
        of_block_read = result.get("native_frac_of_block_read_per_threads") or [None] * len(result["threads_list"])
        rows.append(
            f"| {hw['model']} | {hw['native_isa']} / {path} | {page_text} "
            f"| {result['host_cache_gib']} | {n} | {result['read_bw_gbs_per_threads'][i]} "
            f"| {block_read[i] or '-'} "
            f"| {result['native_gbs_per_threads'][i]} "
            f"| {small[i] if small else '-'} | {locked[i] if locked else '-'} | {hot[i] if hot else '-'} "
            f"| {result['torch_gbs_per_threads'][i]} "
            f"| {result['native_frac_of_bw_per_threads'][i]} "
            f"| {result['native_frac_of_bw_paired_median_per_threads'][i]} | {of_block_read[i] or '-'} "
            f"| {result['native_vs_torch_per_threads'][i]} |"
        )
    return rows


def embedded_and_layout_text(result: dict) -> str:
    """The latest run's hand-off and store-layout tables (empty for a run that measured neither)."""
    threads, read_bw = result["threads_list"], result["read_bw_gbs_per_threads"]
    text = []
    if result.get("embedded_gbs_per_threads"):
        shape = result["embedded_shape"]
        text += ["## The engine's hand-off (embedded) against the standalone kernel", "",
                 f"Batch {shape['batch_size']}, {shape['blocks_per_head']} blocks per list (45% of a 2048-token "
                 "budget on the CPU), Qwen3-8B's heads. Standalone: the kernel called from N Python threads, "
                 "each attending whole sequences. Embedded: what the engine runs, the layer's doorbell rung in its "
                 "control words, the native worker pool's C++ threads, DONE waited for. Target: embedded at least 0.9 "
                 "of standalone at every thread count.", "",
                 "| threads | read bw GB/s | standalone GB/s | embedded GB/s | embedded / standalone |",
                 "|---:|---:|---:|---:|---:|"]
        for i, n in enumerate(threads):
            text.append(f"| {n} | {read_bw[i]} | {result['native_b32_gbs_per_threads'][i]} | "
                        f"{result['embedded_gbs_per_threads'][i]} | {result['embedded_frac_of_native_per_threads'][i]} |")
        text.append("")
    if result.get("layouts"):
        layouts = result["layouts"]
        text += ["## Host store layouts, read side by side (no compute)", "",
                 "The same tokens per list (" f"{result['shape']['blocks_per_head'] * result['shape']['block_size']}"
                 ") at random pages of a store of each layout, walked by the kernel's own read loop "
                 "(`cpu_attention/layouts.py`); GB/s and, in brackets, the share of the read bandwidth measured in "
                 "the same round set. Target: the adopted layout at least 0.8 of the read bandwidth at every "
                 "thread count.", "",
                 "| threads | read bw GB/s | " + " | ".join(f"{name}: {v['what']}" for name, v in layouts.items())
                 + " |", "|---:|---:|" + "---:|" * len(layouts)]
        for i, n in enumerate(threads):
            cells = " | ".join(f"{v['gbs_per_threads'][i]} ({v['frac_of_bw_per_threads'][i]})" for v in layouts.values())
            text.append(f"| {n} | {read_bw[i]} | {cells} |")
        text.append("")
    return "\n".join(text)


def write_results(result: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    runs = load_runs(RESULTS / "cpu_attention.json")
    runs[run_key(result)] = result  # this run replaces its own model's (and ISA's) entry only
    (RESULTS / "cpu_attention.json").write_text(json.dumps({"latest": run_key(result), "runs": runs},
                                                           indent=2) + "\n")
    hw = result["hardware"]
    d = result["shape"]
    rows = [
        "| CPU model | ISA / bf16 path | huge pages (THP mode: kind) | host cache GiB | threads | read bw GB/s "
        "| the random blocks read, no compute GB/s | native GB/s | native, 4 KiB pages "
        "| native, 2 MiB pages page-locked (GPU host) | native, K/V in cache (compute ceiling) | torch path GB/s "
        "| native / read bw | same, paired per round (median) | native / blocks read | native / torch |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for model in sorted(runs):
        rows += run_rows(runs[model])
    hosts = "\n".join(
        f"- {m}: {r['hardware']['cpus']} CPUs usable; flags: {', '.join(r['hardware']['flags'])}; "
        f"torch {r['hardware']['torch']}; {r['rounds']} rounds; load average (1 min) before / after: "
        f"{' / '.join(map(str, r.get('load_average_1min_before_after') or ['not recorded']))}."
        for m, r in sorted(runs.items())
    )
    text = f"""# CPU attention: native kernel vs torch path vs memory read bandwidth

Written by `benchmarks/bench_cpu_attention.py` (full mode), one entry per CPU model and vector ISA: a run
replaces the entry of its own and keeps the others. Ratios compare numbers of one run only (one row group);
numbers of different hosts were taken on different days and loads.

{hosts}
- Workload: Hq {d["num_qo_heads"]}, Hkv {d["num_kv_heads"]}, D {d["head_dim"]}, bf16, block {d["block_size"]}, batch {d["batch_size"]},
  {d["blocks_per_head"]} random blocks per sequence and KV head, random page ids in the host cache.
- native and torch path: the kernel alone, called from N Python threads that each attend whole sequences
  taken from one queue (the kernel releases the GIL). The "1 group x N threads" column of earlier runs (one
  sequence split across the threads; its numbers stay in cpu_attention.json) went with the submit/wait pool
  that had that layout; how the serving worker splits a part across its threads is the native worker pool's,
  measured in the hand-off table below.
- GB/s = K+V bytes read / wall time, two batches in flight. Read bandwidth = best of a torch and a numpy
  sum over a 2 GiB fp32 buffer, one chunk per thread. Best of the interleaved rounds (the hosts are shared).
- bf16 path: amx (AMX tiles), bf16dot (AVX512_BF16), bf16split (fp32 FMA on bf16 rows widened in registers:
  AVX2, AVX-512F without BF16), fp32 (rows converted to fp32). Huge pages: the transparent huge page mode,
  what the store asked for (thp = madvised) and the share of the K store the kernel backed with 2 MiB pages;
  "native, 4 KiB pages" is the same kernel on a copy of the store without huge pages; "native, 2 MiB pages
  page-locked" on a copy mapped, pre-faulted and page-locked in place for the GPU as a GPU server's host store
  is (runs with a GPU only; "-" elsewhere).
- "native, K/V in cache": the same kernel, batch and block lists over a cache of {HOT_PAGES} pages (2 MiB of
  K+V) that stays in the CPU caches, so memory costs nothing: the kernel's compute ceiling. Where it is below
  the read bandwidth, the kernel is compute-bound on that host and native / read bw cannot pass ceiling /
  read bw however blocks are prefetched ("-": not measured in that run).
- "the random blocks read, no compute": the kernel's own walk over the same block lists (same order, same
  prefetch trickle, `read_blocks` in the native module), reading every K and V line and computing nothing,
  N threads splitting each batch by sequence. It is what the memory system gives 8 KiB blocks at random
  addresses; where it is below the read bandwidth, no kernel that reads these blocks can reach the read
  bandwidth, and native / blocks read says how close the kernel comes to its memory limit.

{chr(10).join(rows)}

{embedded_and_layout_text(result)}
The torch path gathers the listed blocks (index_select into a preallocated buffer) and runs
`_scaled_dot_product_flash_attention_for_cpu` with the G query heads folded into the query axis.
The plot shows the latest run ({hw["model"]}).
"""
    (RESULTS / "cpu_attention.md").write_text(text)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    threads = result["threads_list"]
    fig, ax = plt.subplots(figsize=(7, 5))
    ax.plot(threads, result["read_bw_gbs_per_threads"], "k--", marker="o", label="memory read bandwidth")
    ax.plot(threads, result["native_gbs_per_threads"], marker="o", label="native (N threads, whole sequences)")
    ax.plot(threads, result["torch_gbs_per_threads"], marker="^", label="torch path (N threads)")
    if result.get("native_hot_gbs_per_threads"):
        ax.plot(threads, result["native_hot_gbs_per_threads"], ":", marker="D",
                label="native, K/V in cache (compute ceiling)")
    if result.get("native_4k_pages_gbs_per_threads"):
        ax.plot(threads, result["native_4k_pages_gbs_per_threads"], marker="v", label="native, 4 KiB pages")
    if result.get("native_locked_gbs_per_threads"):
        ax.plot(threads, result["native_locked_gbs_per_threads"], marker="^", label="native, 2 MiB page-locked")
    if result.get("embedded_gbs_per_threads"):
        ax.plot(threads, result["embedded_gbs_per_threads"], marker="*", label="embedded (engine hand-off, b32)")
    for name, layout in (result.get("layouts") or {}).items():
        ax.plot(threads, layout["gbs_per_threads"], ":", marker=".", label=f"blocks read, no compute: {name}")
    ax.set_xlabel("threads")
    ax.set_ylabel("GB/s of K+V read")
    ax.set_xticks(threads)
    ax.set_ylim(bottom=0)
    ax.set_title(f"CPU sparse decode, bf16, {hw['model']} ({hw['native_isa']} / {hw.get('native_path')})",
                 fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(RESULTS / "cpu_attention.png", dpi=120)
    log(f"wrote {RESULTS / 'cpu_attention.md'}, .json, .png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 GiB cache, 3 rounds, no files (about a minute)")
    args = parser.parse_args()
    result = run(args.quick)
    if not args.quick:
        write_results(result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
