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
  score first, ties to the lower slot (without scores: lowest slot first);
- scout's recall moves a CPU block only once it was selected in
  recall_min_selected consecutive steps, at most the row's share of the
  per-step cap, and a row backs off (Brake) when less than half of what its
  last recall brought in is selected again;
- with the estimate on, every full block that is neither selected nor attended
  (device or CPU) enters as its digest's midpoint and value summary, with the
  layer's real query, merged last.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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


def bring_in(row: list[int], candidates: list[int], selected: set[int], scores: torch.Tensor | None,
             quota: int | None = None) -> list[int]:
    """A resident row after copying candidates (best first, at most `quota` of them) in; see the module
    docstring for victims."""
    row = list(row)
    free = [r for r, block in enumerate(row) if block == EMPTY]
    unused = [r for r, block in enumerate(row) if block != EMPTY and block not in selected]
    if scores is not None:
        unused.sort(key=lambda r: (float(scores[row[r]]), r))
    wanted = [block for block in candidates if block not in row][:quota]
    for block, slot in zip(wanted, free + unused):
        row[slot] = block
    return row


def update_runs(runs: dict, selected: list[int], position: int) -> None:
    """Hysteresis: runs maps a block to (the last position it was selected at, its run of consecutive
    selections, at most 255); each selected block's run grows when it was selected at position - 1, else is 1."""
    for block in selected:
        last, run = runs.get(block, (None, 0))
        runs[block] = (position, min(run + 1, 255) if last == position - 1 else 1)


@dataclass
class Brake:
    """Back-off of one (request, layer, KV head) row's recall."""

    level: int = 0
    wait: int = 0  # steps before it may recall again
    fresh: set = field(default_factory=set)  # the blocks its last recall brought in (empty: nothing to judge)

    def judge(self, selected: set, max_level: int) -> None:
        """Judge the last step's recall: it paid when at least half of what it brought in is selected again."""
        if self.fresh:
            paid = 2 * len(self.fresh & selected) >= len(self.fresh)
            self.level = 0 if paid else min(self.level + 1, max_level)
            self.wait = 2 ** self.level - 1
            self.fresh = set()
        elif self.wait:
            self.wait -= 1

    def quota(self, cap: int) -> int:
        """Blocks it may recall: cap / 2^level, at least 1 when the cap is not 0."""
        return max(cap >> self.level, 1) if self.level and cap else cap


def scout_recall(row: list[int], *, config, brake: Brake, runs: dict, selected: list[int], cpu: list[int],
                 scores: torch.Tensor, due: bool, cap: int, position: int) -> tuple[list[int], int, int]:
    """Scout's recall of one row in one step (run after its attention) -> (the resident row after it, the
    candidates the hysteresis withheld, those left out for lack of cap or of victims). The brake judges the last recall, the
    selection's runs grow, and the CPU blocks that have lasted are brought in while the row may recall (due,
    not waiting), at most its cap (halved per brake level)."""
    if config.recall_brake:
        brake.judge(set(selected), config.recall_max_backoff)
        cap = brake.quota(cap)
    update_runs(runs, selected, position)
    candidates = cpu if due and not (config.recall_brake and brake.wait) else []
    lasting = [j for j in candidates if runs[j][1] >= config.recall_min_selected]
    after = bring_in(row, lasting, set(selected), scores, cap)
    moved = {block for block in after if block not in row}
    brake.fresh = moved
    return after, len(candidates) - len(lasting), len([j for j in lasting if j not in row]) - len(moved)


def recall_caps(config, *, block_bytes: int, num_layers: int, batch_size: int, num_kv_heads: int,
                step: int) -> list[list[int]]:
    """[B][Hkv] blocks each row may recall in step number `step`: recall_bytes_per_step over the layers, then the
    rows; every row the floor, one more for the remainder's rows from (step mod rows) on; at most the recall
    quota. Without a fixed cap (the engine then measures its step time): the quota."""
    if config.recall_bytes_per_step is None:
        return [[config.recall_quota] * num_kv_heads for _ in range(batch_size)]
    rows = batch_size * num_kv_heads
    blocks = config.recall_bytes_per_step // (block_bytes * num_layers)
    caps = [blocks // rows + (1 if (r - step) % rows < blocks % rows else 0) for r in range(rows)]
    caps = [min(cap, config.recall_quota) for cap in caps]
    return [caps[b * num_kv_heads:(b + 1) * num_kv_heads] for b in range(batch_size)]


def compact(row: list[int], last_selected: list[int], quota: int, *, newest: bool = False) -> list[int]:
    """Resident-first: a row whose quota falls to `quota` columns keeps the blocks of its last selection it holds,
    in that order (best first), then its other blocks newest first; the columns past the quota are emptied.
    newest: a row exact in a step since its last sparse one keeps its newest blocks (its selection is stale)."""
    held = [j for j in row if j != EMPTY]
    selected = [] if newest else [j for j in last_selected if j in held]
    kept = selected + sorted((j for j in held if j not in set(selected)), reverse=True)
    kept = kept[:quota]
    return kept + [EMPTY] * (len(row) - len(kept))


def admit_leaving(row: list[int], block: int) -> list[int]:
    """A block leaving the window takes the first free slot of a resident row (nothing is evicted)."""
    row = list(row)
    if block not in row and EMPTY in row:
        row[row.index(EMPTY)] = block
    return row


def cpu_list(selected: list[int], device: set[int], capacity: int) -> list[int]:
    """The selected blocks the device does not hold, best first, capped."""
    return [j for j in selected if j not in device][:capacity]


def recall_due(config, layer: int, steps_done: int, cpu_count: int, selected_count: int) -> bool:
    """Whether one (request, KV head) row's recall runs after this layer's attention."""
    if config.recall_policy == "off":
        return False
    if config.recall_policy == "interval":
        return (steps_done + 1) % config.interval_for_layer(layer) == 0
    return selected_count > 0 and cpu_count / selected_count > config.recall_beta


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


def unattended(num_full: int, attended: set[int]) -> list[int]:
    """The full blocks a layer's estimate covers: those attended nowhere (and not selected)."""
    return [j for j in range(num_full) if j not in attended]


def estimate(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, blocks_per_head: list[list[int]], *,
             block_size: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The estimate of one request's blocks per KV head from its own K/V: (o [Hq, D], lse [Hq] natural log)."""
    key_summary, value_summary = reference.block_summaries(keys, values, block_size)
    return reference.estimate_blocks(q, key_summary, value_summary, blocks_per_head, block_size=block_size, scale=scale)
