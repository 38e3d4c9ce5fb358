"""Deepen a trained retrieval model (progressive stacking), then train it on.

A 3-layer model trained from scratch on this machine never forms the
key-matching circuit (it plateaus at 34-59% on 64-token, 2-needle sequences,
where the 2-layer model reaches 94%). So depth is added afterwards: new
decoder layers are inserted with their output projections (o_proj,
down_proj) at zero, which leaves the model's function unchanged at insertion,
and training continues with lengths ramping to the final context. Every
inserted layer is a real attention layer that the sparse modes serve like any
other.
"""

from __future__ import annotations

import torch

from scout_sglang.retrieval import data

SILENT_OUTPUTS = ("self_attn.o_proj.weight", "mlp.down_proj.weight")  # zero: the new layer adds nothing at first


def grow(model, insert_at: list[int], seed: int = 0):
    """A deeper copy of `model` with freshly initialised layers at the given positions of the new stack.

    insert_at : indices in the grown model (e.g. [1]: a new layer between old layers 0 and 1)."""
    old_layers = model.config.num_hidden_layers
    new_layers = old_layers + len(insert_at)
    if len(set(insert_at)) != len(insert_at) or any(not 0 <= i < new_layers for i in insert_at):
        raise ValueError(f"insert_at must be distinct layer indices in 0..{new_layers - 1}, got {insert_at}")
    config = model.config.__class__.from_dict({**model.config.to_dict(), "num_hidden_layers": new_layers})
    torch.manual_seed(seed)
    grown = model.__class__(config).to(next(model.parameters()).dtype)
    source = iter(range(old_layers))
    old_state, state = model.state_dict(), grown.state_dict()
    for name, tensor in old_state.items():
        if not name.startswith("model.layers."):
            state[name] = tensor.clone()
    for index in range(new_layers):
        prefix = f"model.layers.{index}."
        if index in insert_at:
            for suffix in SILENT_OUTPUTS:
                state[prefix + suffix] = torch.zeros_like(state[prefix + suffix])
            continue
        old_prefix = f"model.layers.{next(source)}."
        for name, tensor in old_state.items():
            if name.startswith(old_prefix):
                state[prefix + name[len(old_prefix):]] = tensor.clone()
    grown.load_state_dict(state)
    return grown.eval()


def ramp(step: int, steps: int, start_length: int, max_length: int) -> int:
    """Length of a growth-stage step: geometric from start_length to max_length over the first 60%."""
    progress = min(1.0, step / (0.6 * steps))
    return max(32, int(start_length * (max_length / start_length) ** progress) // 32 * 32)


def train_grown(model, *, steps: int, max_length: int, lr: float, seed_base: int, eval_every: int, eval_count: int,
                start_length: int = 256, needles: int = 8) -> list[dict]:
    """Train the grown model on 8-needle sequences, lengths ramping to max_length; returns the history."""
    from scout_sglang.retrieval.train import batch_size, run_steps

    def batch_for(step):
        length = ramp(step, steps, min(start_length, max_length), max_length)
        samples = data.make_batch(batch_size(length, 16), length, needles, seed=seed_base + step, all_queries=True)
        return length, needles, samples

    return run_steps(model, batch_for, steps=steps, lr=lr, warmup=max(1, steps // 20), eval_every=eval_every,
                     eval_count=eval_count, label="grow step")
