"""What limits the estimate of the unattended blocks: its key summary, its mass or its value, measured on the suite.

The estimate (kernels/estimate.py) counts every unattended full block b as n_b copies of one key, the midpoint of
its digest, and one value, its mean value moved along the block's slope. Two things can be wrong: the block's mass
(sum_i exp(s q.k_i)) and the direction of its value (the attention-weighted mean of its values). This benchmark
swaps the torch path's estimate for variants that get one or both right, on the same sequences (paired), in Scout:

    plain         no estimate (SCOUT_ESTIMATE=off)
    shipped       the estimate as it ships: the digest's midpoint, the mean value and its slope (rank 1, by power
                  iteration: kernels/value_summary.py)
    midpoint      the digest's midpoint and the mean value alone (the estimate before the slope)
    mean-key      the block's mean key instead of the midpoint
    mean-key+var  the mean key plus the Gaussian second-order term 1/2 s^2 sum_c q_c^2 var_c (per-channel variance)
    true-mass     each block's exact mass, with the mean value
    true-value    the midpoint's mass, with each block's exact attention-weighted value
    halves        each block as two sub-blocks, each with its own digest midpoint and mean value (the cost of a
                  value summary that follows the query by splitting: twice the summaries)
    quarters      the same with four sub-blocks
    first-order   the midpoint's mass, and the mean value corrected to first order in the query by the block's
                  key-value cross-covariance C (D x D): vbar + s C q, the bound of any low-rank version of it
    first-order-rN  the same with C truncated to its N largest singular pairs (2N vectors per block to store)
    exact         both exact: attention over the unattended blocks as dense attention does it (no summary can do
                  better: with the same selection, this is what the estimate stands in for)

Every variant but `plain`, `shipped` and `midpoint` reads every key of the context (the raw pages of the host store): a
diagnosis, not a mode to serve. Writes benchmarks/results/estimate_diagnosis.{json,md}.

    python -P benchmarks/estimate_diagnosis.py                      # chain, common, values at 1/8 and 1/16, 64 each
    python -P benchmarks/estimate_diagnosis.py --tasks chain --fractions 16 --samples 16
    python -P benchmarks/estimate_diagnosis.py --quick               # a few minutes: the pipeline end to end
    python -P benchmarks/estimate_diagnosis.py --tasks chain common --variants midpoint halves quarters \
        --name estimate_diagnosis_subblocks
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_accuracy as suite  # noqa: E402  (the suite's sequences, settings and statistics)

from scout_sglang.kernels import estimate as shipped  # noqa: E402
from scout_sglang.layout import MEAN  # noqa: E402

VARIANTS = ("plain", "shipped", "midpoint", "mean-key", "mean-key+var", "true-mass", "true-value", "halves", "quarters",
            "first-order-r1", "first-order-r2", "first-order-r4", "first-order", "exact")
RANKS = {"first-order-r1": 1, "first-order-r2": 2, "first-order-r4": 4}  # C truncated to its top singular pairs
SUB_BLOCKS = {"halves": 2, "quarters": 4}  # variants that summarise each block as that many sub-blocks
RAW_PAGES: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # value_summary's data_ptr -> that layer's K, V pages


def variant_estimate(variant: str):
    """estimate_torch(q, blocks) of a variant: (o [B, Hq, D] fp32, lse [B, Hq] fp32) over the unattended blocks."""

    def estimate(q: torch.Tensor, blocks) -> tuple[torch.Tensor, torch.Tensor]:
        batch_size, num_qo_heads, head_dim = q.shape
        num_kv_heads = blocks.digest_min.shape[1]
        pages = blocks.block_table.clamp(min=0).long()  # [B, NB]; padding reads page 0, masked below
        k_pages, v_pages = RAW_PAGES[blocks.value_summary.data_ptr()]
        keys = k_pages[pages].float().transpose(1, 2)  # [B, Hkv, NB, S, D]
        values = v_pages[pages].float().transpose(1, 2)
        qf = q.float().view(batch_size, num_kv_heads, num_qo_heads // num_kv_heads, head_dim)
        token_logits = torch.einsum("bhgd,bhnsd->bhgns", qf, keys) * blocks.scale  # [B, Hkv, G, NB, S]
        midpoint = (blocks.digest_min[pages] + blocks.digest_max[pages]).float().transpose(1, 2) * 0.5
        mean_key = keys.mean(dim=3)
        key = midpoint if variant in ("midpoint", "true-value", "first-order", *RANKS) else mean_key
        summary_logits = torch.einsum("bhgd,bhnd->bhgn", qf, key) * blocks.scale + math.log(blocks.block_size)
        if variant == "mean-key+var":
            variance = keys.var(dim=3, unbiased=False)
            summary_logits = summary_logits + 0.5 * blocks.scale ** 2 * torch.einsum("bhgd,bhnd->bhgn", qf * qf,
                                                                                      variance)
        logits = torch.logsumexp(token_logits, dim=-1) if variant in ("true-mass", "exact") else summary_logits
        mean_value = blocks.value_summary[pages][:, :, :, MEAN].float().transpose(1, 2).unsqueeze(2)  # [B,Hkv,1,NB,D]
        block_value = torch.einsum("bhgns,bhnsd->bhgnd", torch.softmax(token_logits, dim=-1), values) \
            if variant in ("true-value", "exact") else mean_value
        if variant == "first-order" or variant in RANKS:
            cross = torch.einsum("bhnsd,bhnse->bhnde", values - values.mean(dim=3, keepdim=True),
                                 keys - mean_key.unsqueeze(3)) / keys.shape[3]  # [B, Hkv, NB, D(v), D(k)]
            if variant in RANKS:
                left, sigma, right = torch.linalg.svd(cross, full_matrices=False)
                rank = RANKS[variant]
                cross = (left[..., :rank] * sigma[..., None, :rank]) @ right[..., :rank, :]
            block_value = mean_value + blocks.scale * torch.einsum("bhnde,bhge->bhgnd", cross, qf)
        if variant in SUB_BLOCKS:
            logits, block_value = sub_block_estimate(qf, keys, values, SUB_BLOCKS[variant], blocks.scale)
        logits = logits.masked_fill(~shipped.unattended_mask(blocks).unsqueeze(2), float("-inf"))
        lse = torch.logsumexp(logits, dim=-1)  # [B, Hkv, G]
        finite = torch.isfinite(lse)
        weights = torch.where(finite.unsqueeze(-1), torch.exp(logits - torch.where(finite, lse, 0.0).unsqueeze(-1)),
                              0.0)
        o = torch.einsum("bhgn,bhgnd->bhgd", weights, block_value.expand(-1, -1, weights.shape[2], -1, -1))
        return o.reshape(batch_size, num_qo_heads, head_dim), lse.reshape(batch_size, num_qo_heads)

    return estimate


def sub_block_estimate(qf, keys, values, parts: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Each block as `parts` sub-blocks, each its digest's midpoint and its mean value -> the block's logit
    (log of its estimated mass) [B, Hkv, G, NB] and its value [B, Hkv, G, NB, D]."""
    batch_size, num_kv_heads, width, block_size, head_dim = keys.shape
    if block_size % parts:
        raise ValueError(f"blocks of {block_size} tokens do not split into {parts} sub-blocks")
    sub_keys = keys.view(batch_size, num_kv_heads, width, parts, block_size // parts, head_dim)
    midpoint = (sub_keys.amin(dim=4) + sub_keys.amax(dim=4)) * 0.5  # [B, Hkv, NB, parts, D]
    mean_value = values.view(sub_keys.shape).mean(dim=4)
    sub_logits = torch.einsum("bhgd,bhnmd->bhgnm", qf, midpoint) * scale + math.log(block_size // parts)
    block_value = torch.einsum("bhgnm,bhnmd->bhgnd", torch.softmax(sub_logits, dim=-1), mean_value)
    return torch.logsumexp(sub_logits, dim=-1), block_value


@contextlib.contextmanager
def estimated_as(variant: str):
    """The torch path's estimate replaced by `variant`'s for the block (shipped and plain: the shipped one)."""
    if variant in ("plain", "shipped"):
        yield
        return
    kept = shipped.estimate_torch
    shipped.estimate_torch = variant_estimate(variant)
    try:
        yield
    finally:
        shipped.estimate_torch = kept


def recording_engine(max_requests: int, max_tokens_per_request: int):
    """A factory engine(config, shape) for the reference decoder that records each layer's raw K/V pages by its
    value-summary store (the rows of the summaries are the pages of that store)."""
    from scout_sglang.core.engine import CoAttentionEngine

    def build(config, shape):
        engine = CoAttentionEngine(config, shape, dtype=torch.float32, max_requests=max_requests,
                                   max_tokens_per_request=max_tokens_per_request, track_changes=False)
        full, off = engine.full_store, engine.offloaded
        for store, k, v in ((full, getattr(full, "k", {}), getattr(full, "v", {})),
                            (off, getattr(off, "host_k", {}), getattr(off, "host_v", {}))):
            for layer, means in getattr(store, "value_summary", {}).items():
                RAW_PAGES[means.data_ptr()] = (k[layer], v[layer])
        return engine

    return build


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="chain at 1/16, 4 sequences, plain, shipped, midpoint and exact; writes no file, "
                             "JSON line last")
    parser.add_argument("--tasks", nargs="+", default=["chain", "common", "values"])
    parser.add_argument("--fractions", type=int, nargs="+", default=[8, 16], help="budget = 2048 / fraction")
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--out", type=Path, default=suite.RESULTS)
    parser.add_argument("--name", default="estimate_diagnosis", help="file stem of the results")
    args = parser.parse_args(argv)
    from scout_sglang.retrieval import tasks
    from scout_sglang.retrieval.evaluate import answer_length, bundled_model_dir, engine_generate, load_model

    if args.quick:
        args.tasks, args.fractions, args.samples = ["chain"], [16], 4
        args.variants = ["plain", "shipped", "midpoint", "exact"]
    if set(args.tasks) - set(tasks.TASKS) or any(f < 1 for f in args.fractions) or args.samples < 1:
        parser.error(f"tasks among {tasks.TASKS}, fractions >= 1, samples >= 1")
    context, started = 2048, time.perf_counter()
    model = load_model(bundled_model_dir("ruler-llama"))
    rows = []
    for task in args.tasks:
        samples = suite.suite_samples(task, args.samples, context)
        longest = max(len(s.prompt) + answer_length(s) for s in samples)
        full = engine_generate(model, samples, suite.engine_config("full", context), batch_size=suite.BATCH,
                               keep_prefills=True)
        full_correct, _ = suite.scored(samples, full.tokens)
        suite.log(f"diagnosis {task}: full {sum(full_correct)} of {len(samples)}")
        for fraction in args.fractions:
            correct = {"full": full_correct}
            for variant in args.variants:
                config = suite.engine_config("scout", context // fraction, estimate=variant != "plain")
                with estimated_as(variant):
                    run = engine_generate(model, samples, config, batch_size=suite.BATCH, prefills=full.prefills,
                                          engine=recording_engine(suite.BATCH, longest))
                RAW_PAGES.clear()
                correct[variant], _ = suite.scored(samples, run.tokens)
                suite.log(f"diagnosis {task} 1/{fraction} {variant:13s} {sum(correct[variant])} of {len(samples)} "
                          f"({time.perf_counter() - started:.0f} s)")
            for variant, bits in correct.items():
                row = suite.cell("engine", task, variant, context, fraction, bits)
                for base in ("full", "midpoint"):
                    if base in correct and base != variant:
                        row[f"drop_from_{base}"] = suite.paired_drop(correct[base], bits)  # positive: worse
                rows.append(row)
    meta = {"model": "ruler-llama", "samples": args.samples, "context": context, "mode": "scout",
            "seconds": round(time.perf_counter() - started, 1), "torch": torch.__version__}
    if args.quick:
        print(json.dumps({f"{r['task']}/1/{r['fraction']}/{r['mode']}": r["correct"].count("1") for r in rows}))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (args.out / f"{args.name}.md").write_text(markdown(rows, meta))
    suite.log(f"wrote {args.out}/{args.name}.{{json,md}} in {meta['seconds']:.0f} s")
    return 0


def markdown(rows: list[dict], meta: dict) -> str:
    variants = [v for v in ("full", *VARIANTS) if any(r["mode"] == v for r in rows)]
    lines = [f"# What limits the estimate ({meta['model']}, Scout, {meta['context']} tokens)", "",
             f"{meta['samples']} held-out sequences per task, every variant on the same sequences. Cells: correct "
             "sequences, and in brackets the paired change against `midpoint` (the digest's midpoint and the mean "
             "value), in sequences. Variants other than `plain`, `shipped` and `midpoint` read every key "
             "(benchmarks/estimate_diagnosis.py says what each gets right).", "",
             "| task | budget | " + " | ".join(variants) + " |", "|---|---:|" + "---:|" * len(variants)]
    cells = {(r["task"], r["fraction"], r["mode"]): r for r in rows}
    for task, fraction in dict.fromkeys((r["task"], r["fraction"]) for r in rows):
        shown = []
        for variant in variants:
            row, base = cells[(task, fraction, variant)], cells.get((task, fraction, "midpoint"))
            text = str(row["correct"].count("1"))
            if base is not None and variant not in ("midpoint", "full"):
                text += f" ({row['correct'].count('1') - base['correct'].count('1'):+d})"
            shown.append(text)
        lines.append(f"| {task} | 1/{fraction} | " + " | ".join(shown) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
