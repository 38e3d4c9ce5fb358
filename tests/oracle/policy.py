"""Scout's policy, written a second time to be read in one sitting.

The rules every mode of the engine follows, over plain Python lists and the
fp32 references (scout_sglang.reference), sharing no code with
scout_sglang.core. Block indices are logical (block j holds tokens
[j*S, (j+1)*S) of a request); EMPTY marks a free resident slot.

Where the engine is free to choose, the rule is fixed here and in recall.py:
- selection: forced blocks (sink, last `local` full blocks) first, then by
  Quest score, ties to the lower block index;
- the resident buffer fills at a request's first selection of a layer with the
  selected blocks (best first) that the window does not hold;
- a block leaving the local window enters the first free resident slot, never
  evicting anything;
- recall brings candidates in best first; victims are free slots first (lowest
  slot first), then resident blocks outside the current selection, lowest
  score first, ties to the lower slot (without scores: lowest slot first).
"""

from __future__ import annotations

import torch

from scout_sglang import reference

EMPTY = -1


def window_blocks(num_tokens: int, block_size: int, sink: int, local: int) -> list[int]:
    """Blocks the device window holds: sink, the last `local` full blocks, the partial tail; ascending."""
    num_full, tail = divmod(num_tokens, block_size)
    num_blocks = num_full + (1 if tail else 0)
    return sorted(set(range(min(sink, num_blocks))) | set(range(max(sink, num_full - local), num_blocks)))


def forced_blocks(num_tokens: int, block_size: int, sink: int, local: int) -> list[int]:
    """The full blocks of the window: always attended on the device, never resident, never on the CPU."""
    return [j for j in window_blocks(num_tokens, block_size, sink, local) if j < num_tokens // block_size]


def leaving_block(num_tokens: int, block_size: int, sink: int, local: int) -> int | None:
    """The block that leaves the local window when the request reaches num_tokens, if one does."""
    block = num_tokens // block_size - 1 - local
    return block if num_tokens % block_size == 0 and block >= sink else None


def block_scores(q: torch.Tensor, keys: torch.Tensor, num_full: int, block_size: int) -> torch.Tensor:
    """Quest scores [Hkv, num_full] of one request's full blocks; q [Hq, D], keys [N, Hkv, D].

    A block whose keys are not all there yet (it fills in this very step) scores
    0: it is a local block, forced whatever its score.
    """
    num_kv_heads, head_dim = keys.shape[1], keys.shape[2]
    kmin = torch.zeros(num_full, num_kv_heads, head_dim)
    kmax = torch.zeros(num_full, num_kv_heads, head_dim)
    for j in range(num_full):
        block = keys[j * block_size:(j + 1) * block_size].float()
        if block.shape[0] == block_size:
            kmin[j], kmax[j] = block.amin(dim=0), block.amax(dim=0)
    return reference.quest_scores(q, kmin, kmax)


def top_k(scores: torch.Tensor, num_full: int, k: int, sink: int, local: int) -> list[int]:
    """Selected blocks of one KV head, best first (forced blocks first)."""
    return reference.select_topk(scores[:num_full], topk=k, num_sink_blocks=sink, num_local_blocks=local)


def bring_in(row: list[int], candidates: list[int], selected: set[int], scores: torch.Tensor | None) -> list[int]:
    """A resident row after copying candidates (best first) in; see the module docstring for victims."""
    row = list(row)
    free = [r for r, block in enumerate(row) if block == EMPTY]
    unused = [r for r, block in enumerate(row) if block != EMPTY and block not in selected]
    if scores is not None:
        unused.sort(key=lambda r: (float(scores[row[r]]), r))
    wanted = [block for block in candidates if block not in row]
    for block, slot in zip(wanted, free + unused):
        row[slot] = block
    return row


def admit_leaving(row: list[int], block: int) -> list[int]:
    """A block leaving the window takes the first free slot of a resident row (nothing is evicted)."""
    row = list(row)
    if block not in row and EMPTY in row:
        row[row.index(EMPTY)] = block
    return row


def cpu_list(selected: list[int], device: set[int], capacity: int) -> list[int]:
    """The selected blocks the device does not hold, best first, capped."""
    return [j for j in selected if j not in device][:capacity]


def recall_due(config, layer: int, steps_done: int, cpu_counts: list[int], selected_counts: list[int]) -> bool:
    """Whether a request's recall runs after this layer's attention (counts summed over KV heads)."""
    if config.recall_policy == "off":
        return False
    if config.recall_policy == "interval":
        return (steps_done + 1) % config.interval_for_layer(layer) == 0
    selected = sum(selected_counts)
    return selected > 0 and sum(cpu_counts) / selected > config.recall_beta


def tokens_of(blocks: list[int], tensor: torch.Tensor, head: int, block_size: int) -> torch.Tensor:
    """[n, 1, D] tokens of one KV head over blocks (in list order) of a request's [N, Hkv, D] K or V."""
    parts = [tensor[j * block_size:(j + 1) * block_size, head] for j in blocks]
    if not parts:
        return torch.zeros(0, 1, tensor.shape[2])
    return torch.cat(parts).float().unsqueeze(1)


def attend_blocks(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, blocks_per_head: list[list[int]], *,
                  block_size: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One request's attention over per-KV-head block lists: q [Hq, D] -> (o [Hq, D], lse [Hq] natural log)."""
    num_kv_heads = keys.shape[1]
    group = q.shape[0] // num_kv_heads
    outs, lses = [], []
    for h, blocks in enumerate(blocks_per_head):
        k, v = tokens_of(blocks, keys, h, block_size), tokens_of(blocks, values, h, block_size)
        o, lse = reference.dense_decode(q[h * group:(h + 1) * group], k, v, scale=scale)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)
