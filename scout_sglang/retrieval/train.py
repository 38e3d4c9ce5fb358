"""Train the retrieval model on this machine's CPU, deterministically.

Stage 1: a 2-layer Llama learns the needle task (data.py) with a length
curriculum up to --max-length; the loss is on the answer tokens only.
Stage 2 (grow.py, skipped with --grow-steps 0): new layers are inserted at
--insert-layers with silent outputs and the deeper model trains on with
lengths ramping to --grow-max-length. Every `--eval-every` steps it reports
the exact-match accuracy on held-out sequences; at the end it evaluates at the
final lengths and saves model + tokenizer with save_pretrained, plus
training_report.json. The defaults reproduce the bundled model (20-30 minutes
on 2 cores):

    python -P -m scout_sglang.retrieval.train --out scout_sglang/assets/needle-llama
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

from scout_sglang.retrieval import data

MODEL = dict(num_layers=2, hidden=128, num_heads=4, num_kv_heads=2, head_dim=32)
HELD_OUT_SEED = 0  # evaluation seeds count up from here; training seeds from TRAIN_SEED
TRAIN_SEED = 10_000_000


def log(message: str) -> None:
    print(f"[train] {message}", file=sys.stderr, flush=True)


def build_model(seed: int = 0, **shape):
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = {**MODEL, **shape}
    config = LlamaConfig(vocab_size=len(data.VOCAB), hidden_size=shape["hidden"], intermediate_size=2 * shape["hidden"],
                         num_hidden_layers=shape["num_layers"], num_attention_heads=shape["num_heads"],
                         num_key_value_heads=shape["num_kv_heads"], head_dim=shape["head_dim"],
                         max_position_embeddings=8192, tie_word_embeddings=False,
                         bos_token_id=data.TOKEN_ID["<bos>"], eos_token_id=data.TOKEN_ID["<eos>"],
                         pad_token_id=data.TOKEN_ID["<pad>"])
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def curriculum(step: int, steps: int, max_length: int) -> tuple[int, int]:
    """(length, needles) for a step. 64 tokens with two needles for the first 55% of training:
    the key-matching circuit forms there, after a plateau (with a single needle the model learns
    a shortcut that does not match keys). Then lengths grow geometrically to max_length and
    needles to 8 by 85%; then max_length."""
    progress = min(1.0, max(0.0, (step / steps - 0.55) / 0.3))
    length = int(64 * (max_length / 64) ** progress) // 32 * 32
    needles = 2 + round(progress * 6)
    return length, needles


def batch_size(length: int, batch: int) -> int:
    """Fewer sequences per step at long lengths (a bounded number of tokens per step)."""
    return max(4, min(batch, 8192 // length))


@torch.no_grad()
def exact_match(model, samples: list[data.Sample], batch_size: int = 16) -> float:
    """Greedy exact match of the two values: teacher-forced argmax at every answer position up to the values
    (greedy decoding produces the answer exactly when each of those argmaxes is right)."""
    model.eval()
    correct = 0
    for start in range(0, len(samples), batch_size):
        chunk = samples[start:start + batch_size]
        inputs, targets = data.training_tensors(chunk)
        logits = model(input_ids=inputs).logits
        for b, sample in enumerate(chunk):
            first = len(sample.prompt) - 1
            predicted = logits[b, first:first + 3].argmax(-1)
            correct += bool((predicted == targets[b, first:first + 3]).all())
    model.train()
    return correct / len(samples)


def held_out(count: int, length: int, needles: int, offset: int = 0) -> list[data.Sample]:
    return data.make_batch(count, length, needles, seed=HELD_OUT_SEED + 1000 * length + needles + offset)


def train(out: Path, *, steps: int, batch: int, max_length: int, eval_lengths: list[int], lr: float,
          seed: int, eval_every: int, eval_count: int, num_layers: int = MODEL["num_layers"],
          insert_layers: tuple[int, ...] = (), grow_steps: int = 0, grow_max_length: int = 2048,
          grow_lr: float = 3e-4, grow_from: Path | None = None) -> dict:
    """Stage 1 (unless grow_from names a trained model), then stage 2 when grow_steps > 0; saves to out."""
    start = time.perf_counter()
    if grow_from is not None:
        from transformers import AutoModelForCausalLM

        model, history = AutoModelForCausalLM.from_pretrained(grow_from, dtype=torch.float32), []
    else:
        model, history = train_from_scratch(steps=steps, batch=batch, max_length=max_length, lr=lr, seed=seed,
                                            eval_every=eval_every, eval_count=eval_count, num_layers=num_layers)
    grow_history = []
    if grow_steps > 0:
        from scout_sglang.retrieval import grow

        model = grow.grow(model, list(insert_layers), seed=seed)
        log(f"grown to {model.config.num_hidden_layers} layers (new at {list(insert_layers)})")
        grow_history = grow.train_grown(model, steps=grow_steps, max_length=grow_max_length, lr=grow_lr,
                                        seed_base=TRAIN_SEED + 100_000, eval_every=eval_every, eval_count=eval_count)
    final = {length: exact_match(model, held_out(4 * eval_count, length, 8, offset=7)) for length in eval_lengths}
    log(f"final held-out accuracy (8 needles): {final}")
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    data.build_tokenizer().save_pretrained(out)
    config = model.config
    shape = dict(num_layers=config.num_hidden_layers, hidden=config.hidden_size, num_heads=config.num_attention_heads,
                 num_kv_heads=config.num_key_value_heads, head_dim=config.head_dim)
    report = {"model": shape, "steps": steps, "batch": batch, "max_length": max_length, "lr": lr, "seed": seed,
              "grow": {"insert_layers": list(insert_layers), "steps": grow_steps, "max_length": grow_max_length,
                       "lr": grow_lr, "from": str(grow_from) if grow_from else None, "history": grow_history},
              "train_seconds": round(time.perf_counter() - start, 1), "final_accuracy": final, "history": history,
              "torch_threads": torch.get_num_threads()}
    (out / "training_report.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def train_from_scratch(*, steps, batch, max_length, lr, seed, eval_every, eval_count, num_layers):
    """Stage 1: the curriculum on a fresh model; returns (model, history)."""
    torch.manual_seed(seed)
    model = build_model(seed, **{**MODEL, "num_layers": num_layers})

    def batch_for(step):
        length, needles = curriculum(step, steps, max_length)
        samples = data.make_batch(batch_size(length, batch), length, needles, seed=TRAIN_SEED + step, all_queries=True)
        return length, needles, samples

    history = run_steps(model, batch_for, steps=steps, lr=lr, warmup=max(1, steps // 50), eval_every=eval_every,
                        eval_count=eval_count, label="step")
    return model, history


def run_steps(model, batch_for, *, steps: int, lr: float, warmup: int, eval_every: int, eval_count: int,
              label: str) -> list[dict]:
    """AdamW with linear warm-up and cosine decay over `steps`, on batch_for(step) -> (length, needles, samples); every
    eval_every steps, held-out exact match at that step's length and needles. Returns the history."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps))))
    history, start = [], time.perf_counter()
    model.train()
    for step in range(steps):
        length, needles, samples = batch_for(step)
        inputs, targets = data.training_tensors(samples)
        logits = model(input_ids=inputs).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            accuracy = exact_match(model, held_out(eval_count, length, needles))
            history.append({"step": step + 1, "length": length, "needles": needles, "loss": round(loss.item(), 4),
                            "accuracy": accuracy, "seconds": round(time.perf_counter() - start, 1)})
            log(f"{label} {step + 1}/{steps}: length {length}, {needles} needles, loss {loss.item():.4f}, "
                f"held-out accuracy {accuracy:.3f}, {time.perf_counter() - start:.0f} s")
    model.eval()
    return history


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=1024)
    parser.add_argument("--eval-lengths", type=int, nargs="+", default=[512, 1024, 2048])
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-layers", type=int, default=MODEL["num_layers"])
    parser.add_argument("--insert-layers", type=int, nargs="+", default=[1],
                        help="stage 2: where new layers go in the grown stack")
    parser.add_argument("--grow-steps", type=int, default=1500, help="stage 2 steps; 0 skips stage 2")
    parser.add_argument("--grow-max-length", type=int, default=2048)
    parser.add_argument("--grow-lr", type=float, default=3e-4)
    parser.add_argument("--grow-from", type=Path, default=None, help="skip stage 1: grow this saved model")
    parser.add_argument("--eval-every", type=int, default=250)
    parser.add_argument("--eval-count", type=int, default=32)
    args = parser.parse_args(argv)
    report = train(args.out, steps=args.steps, batch=args.batch, max_length=args.max_length,
                   eval_lengths=args.eval_lengths, lr=args.lr, seed=args.seed, eval_every=args.eval_every,
                   eval_count=args.eval_count, num_layers=args.num_layers, insert_layers=tuple(args.insert_layers),
                   grow_steps=args.grow_steps, grow_max_length=args.grow_max_length, grow_lr=args.grow_lr,
                   grow_from=args.grow_from)
    print(json.dumps({"final_accuracy": report["final_accuracy"], "train_seconds": report["train_seconds"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
