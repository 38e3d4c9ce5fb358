"""Train the suite model (`ruler-llama`): eight layers, the four tasks of tasks.py, residual-dominated.

It starts from the bundled needle model (3 layers that already match keys; a deep model trained from
scratch here never forms that circuit), extends its vocabulary to the suite's, and grows it to eight layers
with silent new layers (grow.py) at --insert-layers, so every old layer is preceded by a quiet one. Then all
four tasks train together: 256 tokens first (weighted to the tasks that need new circuits), lengths ramping
to 2048, and the last 30% of the steps at 2k-8k. `--resume` trains a saved model on, on data the earlier runs
did not see: `--mix weak` at 512-4096 tokens weighted to values, common and niah, `--mix values` with half the
sequences `values`, mostly at 2048 (`make train-suite` runs one first run and eight resumed ones). It trains
on a GPU when torch sees one (--device; the same steps and data): 0.11-0.15 s a step on one H100 shared by two
or three runs, against 1.45 s on 2 CPU cores.

Every sequence asks all its questions (tasks.make_batch(all_questions=True): after the answer, every other key
or chain of the same context), so a long context carries 3-8 answers instead of one; each task weighs the same
in the answer loss however many it asks. Set answers are taught in ascending id (tasks.py), and a term weighted
by --repeat-penalty pushes down the words a set answer already gave.

Residual-dominated: in real models each layer changes the residual stream little, so a layer's query
computed from the previous layer's input is close to its own (cosine 0.93-0.97), which is what layer-ahead
selection relies on. A small model trained only for its tasks does not do that by itself (the needle
model's layer 1 is at 0.3). So the loss adds a consistency term: for every layer i >= 1, how far the mean of
cos(q_i(x_{i-1}), q_i(x_i)) falls below COSINE_FLOOR, over every 16th position and over the answer positions,
x the normalized layer inputs, weighted by --consistency. Above the floor it costs nothing, so it leaves the
queries free to read what the tasks need once the prediction is good enough.
The report gives, per layer, that cosine at the answer positions and the update norm over the residual norm.

    python -P -m scout_sglang.retrieval.train_suite --out DIR                # about 40 minutes
    python -P -m scout_sglang.retrieval.train_suite --resume DIR --out DIR2  # on from DIR
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from scout_sglang.retrieval import grow, tasks

TRAIN_SEED = 20_000_000
COSINE_FLOOR = 0.92  # the consistency term pushes a layer's mean query cosine up to here, not beyond
EVAL_SEED = 30_000_000


def log(message: str) -> None:
    print(f"[train-suite] {message}", file=sys.stderr, flush=True)


def extend_vocabulary(model, vocab_size: int, seed: int):
    """The model with `vocab_size` rows of embedding and output (old ids keep their rows; new rows are random)."""
    old = model.get_input_embeddings().weight.shape[0]
    if vocab_size < old:
        raise ValueError(f"the suite's vocabulary ({vocab_size}) is smaller than the model's ({old})")
    torch.manual_seed(seed)
    embed, head = model.get_input_embeddings().weight.data, model.lm_head.weight.data
    new_embed = torch.randn(vocab_size, embed.shape[1]) * embed.std()
    new_head = torch.randn(vocab_size, head.shape[1]) * head.std()
    new_embed[:old], new_head[:old] = embed, head
    model.resize_token_embeddings(vocab_size)
    model.get_input_embeddings().weight.data.copy_(new_embed)
    model.lm_head.weight.data.copy_(new_head)
    model.config.vocab_size = vocab_size
    return model


def length_for(step: int, steps: int, generator: torch.Generator) -> int:
    """256 for the first 35% (many sequences per step: the answers are the only supervised tokens), geometric
    to 2048 by 70%, then one of 2048, 4096, 8192."""
    progress = step / steps
    if progress < 0.35:
        return 256
    if progress < 0.7:
        return int(256 * 8 ** ((progress - 0.35) / 0.35)) // 64 * 64
    return (2048, 2048, 4096, 8192)[int(torch.randint(4, (1,), generator=generator))]


RESUME_SEED_OFFSET = 5_000_000  # a resumed run draws other sequences than the first
EARLY_MIX = ("values", "common", "values", "common", "values", "common", "chain", "niah")  # the new circuits first
RESUME_MIXES = {  # a resumed run's (tasks in turn, lengths drawn from)
    "weak": (("values", "common", "niah", "values", "common", "niah", "common", "chain"),  # a first run's weak ones
             (512, 1024, 1024, 2048, 2048, 4096)),
    "values": (("values", "values", "common", "values", "niah", "values", "common", "chain"),  # half the sequences
               (1024, 2048, 2048, 2048, 4096)),  # mostly the length the bar is set at
}


def step_samples(step: int, steps: int, tokens_per_step: int, resumed: bool = False,
                 first_step: int = 0, resume_mix: str = "weak") -> list[tasks.TaskSample]:
    """One step's sequences: the four tasks in turn (weighted to the slow learners during the short phase and
    in a resumed run, whose tasks and lengths are RESUME_MIXES[resume_mix]). first_step: the resumed steps run
    before this run (a resumed run goes on where the last one's data ended, never repeating it)."""
    step_seed = TRAIN_SEED + (RESUME_SEED_OFFSET if resumed else 0) + first_step + step
    generator = torch.Generator().manual_seed(step_seed)
    if resumed:
        mix, lengths = RESUME_MIXES[resume_mix]
        length = lengths[int(torch.randint(len(lengths), (1,), generator=generator))]
    else:
        length = length_for(step, steps, generator)
        mix = EARLY_MIX if length == 256 else tasks.TASKS
    count = max(1, tokens_per_step // length)
    offset = int(torch.randint(len(mix), (1,), generator=generator))
    return [tasks.make_batch(mix[(offset + i) % len(mix)], 1, length, seed=step_seed * 64 + i,
                             all_questions=True)[0] for i in range(count)]


def layer_queries(model, hidden: tuple, layer: int, positions: torch.Tensor):
    """Layer `layer`'s query (before RoPE) from its own input and from the previous layer's, at `positions`."""
    attn, norm = model.model.layers[layer].self_attn, model.model.layers[layer].input_layernorm
    real = attn.q_proj(norm(hidden[layer][:, positions]))
    ahead = attn.q_proj(norm(hidden[layer - 1][:, positions]))
    return ahead, real


def repeat_mask(samples: list[tasks.TaskSample], targets: list, vocab_size: int) -> torch.Tensor:
    """Per supervised position, the set-answer tokens already given before it (a right answer never repeats one)."""
    mask = torch.zeros(len(targets), vocab_size, dtype=torch.bool)
    for i, (b, position, _) in enumerate(targets):
        sample = samples[b]
        index = position - (len(sample.prompt) - 1)
        mask[i, sample.answer[sample.unordered_from:index]] = True
    return mask


def losses(model, samples: list[tasks.TaskSample], repeat_penalty: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(answer loss, consistency loss, per-task teacher-forced accuracy) of one batch. The answer loss is the
    allowed tokens' negative log-likelihood plus, weighted by `repeat_penalty`, -log(1 - p(a token the set answer
    already gave)): teacher forcing alone teaches greedy decoding to name the likeliest word again."""
    device = model.device
    inputs, targets = tasks.training_tensors(samples)
    out = model.model(input_ids=inputs.to(device), output_hidden_states=True)
    rows = torch.tensor([b for b, _, _ in targets], device=device)
    cols = torch.tensor([p for _, p, _ in targets], device=device)
    logits = model.lm_head(out.last_hidden_state[rows, cols]).float()
    mask = torch.zeros(logits.shape, dtype=torch.bool)
    for i, (_, _, allowed) in enumerate(targets):
        mask[i, allowed] = True
    mask = mask.to(device)
    per_target = logits.logsumexp(-1) - logits.masked_fill(~mask, -math.inf).logsumexp(-1)
    task_of = [samples[b].task for b, _, _ in targets]  # each task weighs the same, however many questions it asks
    answer = torch.stack([per_target[[t == task for t in task_of]].mean() for task in sorted(set(task_of))]).mean()
    repeats = repeat_mask(samples, targets, logits.shape[-1]).to(device)
    if repeat_penalty and repeats.any():
        given = repeats.any(-1)
        log_repeat = (logits.masked_fill(~repeats, -math.inf).logsumexp(-1) - logits.logsumexp(-1))[given]
        answer = answer + repeat_penalty * -torch.log1p(-log_repeat.exp().clamp(max=1 - 1e-6)).mean()
    right = mask[torch.arange(len(targets), device=device), logits.argmax(-1)]
    per_task: dict[str, list[bool]] = {}
    for (b, _, _), ok in zip(targets, right.tolist()):
        per_task.setdefault(samples[b].task, []).append(ok)
    hidden, strided = out.hidden_states, torch.arange(0, inputs.shape[1], 16, device=device)
    gaps = []
    for i in range(1, model.config.num_hidden_layers):
        for positions in (strided, torch.unique(cols)):
            cosine = F.cosine_similarity(*layer_queries(model, hidden, i, positions), dim=-1).mean()
            gaps.append(torch.relu(COSINE_FLOOR - cosine))
    return answer, torch.stack(gaps).mean(), per_task


@torch.no_grad()
def greedy_accuracy(model, task: str, length: int, count: int) -> float:
    """Greedy decoding with full attention (transformers' cache): the share of samples answered right."""
    from scout_sglang.hf.reference_decoder import dense_generate

    samples = tasks.make_batch(task, count, length, seed=EVAL_SEED + length)
    result = dense_generate(model, [s.prompt for s in samples], max(len(s.answer) for s in samples))
    return sum(s.is_correct(t) for s, t in zip(samples, result.tokens)) / count


@torch.no_grad()
def residual_profile(model, length: int = 2048, count: int = 2) -> dict:
    """Per layer i >= 1 at the answer positions: the cosine of q_i from layer i-1's input against q_i from its own,
    and the norm of layer i-1's update over the norm of its input."""
    cosines, ratios = {}, {}
    for task in tasks.TASKS:
        samples = tasks.make_batch(task, count, length, seed=EVAL_SEED + 1)
        inputs, targets = tasks.training_tensors(samples)
        hidden = model.model(input_ids=inputs.to(model.device), output_hidden_states=True).hidden_states
        positions = torch.unique(torch.tensor([p for _, p, _ in targets], device=model.device))
        for i in range(1, model.config.num_hidden_layers):
            ahead, real = layer_queries(model, hidden, i, positions)
            cosines.setdefault(i, []).append(F.cosine_similarity(ahead, real, dim=-1).mean().item())
            update = (hidden[i] - hidden[i - 1])[:, positions].norm(dim=-1)
            ratios.setdefault(i - 1, []).append((update / hidden[i - 1][:, positions].norm(dim=-1)).mean().item())
    def mean(values):
        return round(sum(values) / len(values), 4)

    return {"query_cosine": {i: mean(v) for i, v in cosines.items()},
            "update_over_residual": {i: mean(v) for i, v in ratios.items()}}


def device_name(device: str) -> str:
    """What trained: 'cpu' or the GPU's name (a report says where its seconds were spent)."""
    return torch.cuda.get_device_name(device) if torch.device(device).type == "cuda" else "cpu"


def train(out: Path, *, base: Path, insert_layers: list[int], steps: int, tokens_per_step: int, lr: float,
          consistency: float, seed: int, eval_every: int, resume: Path | None = None,
          repeat_penalty: float = 0.0, resume_mix: str = "weak", device: str = "cpu") -> dict:
    """Grow `base` and train it, or (resume) train a saved suite model on, on `device`; save to `out` with the
    report."""
    from transformers import AutoModelForCausalLM

    start = time.perf_counter()
    earlier = json.loads((resume / "training_report.json").read_text()) if resume else None
    first_step = 0
    if resume:
        model = AutoModelForCausalLM.from_pretrained(resume, dtype=torch.float32)
        log(f"resuming {resume} ({earlier['steps']} steps, {earlier['train_seconds']} s so far)")
        first_step = earlier.get("resumed_steps", earlier["steps"] if "earlier" in earlier else 0)
    else:
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        model = grow.grow(extend_vocabulary(model, len(tasks.VOCAB), seed), insert_layers, seed=seed)
        log(f"from {base}: {model.config.num_hidden_layers} layers (new at {insert_layers}), "
            f"vocabulary {len(tasks.VOCAB)}")
    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    warmup = max(1, steps // 50)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps))))
    history, tally = [], {}
    model.train()
    for step in range(steps):
        samples = step_samples(step, steps, tokens_per_step, resumed=resume is not None,
                               first_step=first_step, resume_mix=resume_mix)
        answer, gap, per_task = losses(model, samples, repeat_penalty)
        loss = answer + consistency * gap
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        for task, oks in per_task.items():
            tally.setdefault(task, []).extend(oks)
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            accuracy = {task: round(sum(v) / len(v), 3) for task, v in sorted(tally.items())}
            history.append({"step": step + 1, "length": len(samples[0].prompt), "answer_loss": round(answer.item(), 4),
                            "query_gap": round(gap.item(), 4), "train_token_accuracy": accuracy,
                            "seconds": round(time.perf_counter() - start, 1)})
            log(f"step {step + 1}/{steps}: length {len(samples[0].prompt)}, answer loss {answer.item():.3f}, "
                f"1-cos {gap.item():.3f}, token accuracy {accuracy}, {time.perf_counter() - start:.0f} s")
            tally = {}
    model.eval()
    train_seconds = time.perf_counter() - start
    final = {task: {length: greedy_accuracy(model, task, length, 32) for length in (2048, 4096)} for task in tasks.TASKS}
    profile = residual_profile(model)
    log(f"greedy accuracy with full attention: {final}; {profile}")
    out.mkdir(parents=True, exist_ok=True)
    model.to("cpu").save_pretrained(out)
    tasks.build_tokenizer().save_pretrained(out)
    report = {"base": base.name, "insert_layers": insert_layers, "steps": steps, "tokens_per_step": tokens_per_step,
              "lr": lr, "consistency": consistency, "repeat_penalty": repeat_penalty, "seed": seed,
              **({"resume_mix": resume_mix} if resume else {}), "train_seconds": round(train_seconds, 1),
              "torch_threads": torch.get_num_threads(), "device": device_name(device),
              "full_attention_greedy_accuracy": final, **profile,
              "history": history}
    if earlier:  # one report for the whole training: the first run's settings and history come along
        report["earlier"] = {k: v for k, v in earlier.items() if k not in ("full_attention_greedy_accuracy",
                                                                          "query_cosine", "update_over_residual")}
        report["total_train_seconds"] = round(earlier.get("total_train_seconds", earlier["train_seconds"])
                                              + train_seconds, 1)
        report["resumed_steps"] = first_step + steps
    (out / "training_report.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def main(argv=None) -> int:
    from scout_sglang.retrieval.evaluate import bundled_model_dir

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--base", type=Path, default=bundled_model_dir(), help="the trained needle model to grow")
    parser.add_argument("--insert-layers", type=int, nargs="+", default=[1, 2, 4, 6, 7])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--tokens-per-step", type=int, default=8192)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--consistency", type=float, default=1.0, help="weight of the layer-ahead query term")
    parser.add_argument("--repeat-penalty", type=float, default=1.0,
                        help="weight of the term against repeating a word a set answer already gave")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--resume", type=Path, default=None,
                        help="train this saved suite model on, on sequences the earlier runs did not see")
    parser.add_argument("--mix", choices=sorted(RESUME_MIXES), default="weak",
                        help="a resumed run's tasks and lengths: weak (values, common, niah at 512-4096) or values "
                             "(half values, mostly at 2048)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="where to train (default: a GPU if there is one; the same steps and data either way)")
    args = parser.parse_args(argv)
    if args.mix != "weak" and args.resume is None:
        parser.error("--mix applies to a resumed run (--resume)")
    report = train(args.out, base=args.base, insert_layers=args.insert_layers, steps=args.steps,
                   tokens_per_step=args.tokens_per_step, lr=args.lr, consistency=args.consistency, seed=args.seed,
                   eval_every=args.eval_every, resume=args.resume, repeat_penalty=args.repeat_penalty,
                   resume_mix=args.mix, device=args.device)
    print(json.dumps({k: report[k] for k in ("full_attention_greedy_accuracy", "query_cosine", "train_seconds")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
