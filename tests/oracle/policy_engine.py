"""PolicyEngine: the engine's driver protocol over policy.py, one request and head at a time.

The obviously-right second implementation: every request keeps its whole K/V
per layer as a tensor, the resident buffer is a list of block indices (no
pages, no copies), and attention is the fp32 reference over the tokens of the
listed blocks. It follows the same protocol as CoAttentionEngine (add_request,
prefill, begin_step, wants_prediction, predict, attend, end_step,
release_request, close), so the reference decoder can run either.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from oracle import policy

from scout_sglang import reference

RESIDENT_MODES = ("scout", "infinigen")


@dataclass
class Decision:
    """One layer of one step for the whole batch: selection, its scores, the CPU part."""

    selected: list  # [B][Hkv] blocks, best first ([] when no block is full)
    scores: list  # [B] tensors [Hkv, num_full]
    cpu_blocks: list  # [B][Hkv]
    cpu_out: list  # [B] (o [Hq, D], lse [Hq]) of the CPU part


class PolicyEngine:
    def __init__(self, config, shape, *, element_size: int = 4):
        """element_size: bytes per K/V element of the engine it stands beside (the recall cap counts bytes)."""
        self.config, self.shape = config, shape
        self.block_bytes = 2 * config.block_size * shape.head_dim * element_size
        offloaded = config.mode in ("scout", "infinigen", "hgca")
        self.offloaded = {l for l in range(shape.num_layers) if offloaded and l not in config.dense_layers}
        self.keys, self.values = {}, {}  # (rid, layer) -> [N, Hkv, D] fp32
        self.resident = {}  # (rid, layer) -> [Hkv][R]
        self.filled = set()  # (rid, layer) whose resident buffer had its first fill
        self.steps = {}  # rid -> decode steps done
        self.runs, self.brakes = {}, {}  # (rid, layer, head) -> {block: (position, run)} / policy.Brake
        self.step_index, self.caps = 0, []  # steps planned so far; this step's recall caps [B][Hkv]
        self.batch, self.ahead, self.after = [], {}, {}

    # -- requests ----------------------------------------------------------------
    def add_request(self, rid):
        capacity = self.config.resident_capacity if self.config.mode in RESIDENT_MODES else 0
        for layer in range(self.shape.num_layers):
            self.resident[(rid, layer)] = [[policy.EMPTY] * capacity for _ in range(self.shape.num_kv_heads)]
            self.keys[(rid, layer)] = torch.zeros(0, self.shape.num_kv_heads, self.shape.head_dim)
            self.values[(rid, layer)] = torch.zeros(0, self.shape.num_kv_heads, self.shape.head_dim)
            for h in range(self.shape.num_kv_heads):
                self.runs[(rid, layer, h)], self.brakes[(rid, layer, h)] = {}, policy.Brake()
        self.steps[rid] = 0

    def prefill(self, rid, layer, k, v):
        self.keys[(rid, layer)] = k.float().cpu().clone()
        self.values[(rid, layer)] = v.float().cpu().clone()

    def release_request(self, rid):
        for key in [key for key in self.keys if key[0] == rid]:
            del self.keys[key], self.values[key], self.resident[key]
            self.filled.discard(key)
        for key in [key for key in self.runs if key[0] == rid]:
            del self.runs[key], self.brakes[key]
        self.steps.pop(rid, None)

    def close(self):
        pass

    # -- a decode step -------------------------------------------------------------
    def begin_step(self, rids):
        c = self.config
        self.batch, self.ahead = list(rids), {}
        self.after = {rid: self.keys[(rid, 0)].shape[0] + 1 for rid in rids}  # tokens once this step's is in
        self.caps = policy.recall_caps(c, block_bytes=self.block_bytes, num_layers=max(len(self.offloaded), 1),
                                       batch_size=len(rids), num_kv_heads=self.shape.num_kv_heads,
                                       step=self.step_index)
        for rid in rids:
            after = self.after[rid]
            block = policy.leaving_block(after, c.block_size, c.sink_blocks, c.local_blocks)
            if block is None or c.mode not in RESIDENT_MODES:
                continue
            for layer in self.offloaded:
                rows = self.resident[(rid, layer)]
                self.resident[(rid, layer)] = [policy.admit_leaving(row, block) for row in rows]

    def wants_prediction(self, layer):
        c = self.config
        return c.layer_ahead and c.mode in RESIDENT_MODES and layer >= 1 and layer in self.offloaded

    def predict(self, layer, q_pred):
        if self.wants_prediction(layer):
            self.ahead[layer] = self._decide(layer, q_pred.float().cpu())

    def attend(self, layer, q, k_new, v_new):
        q = q.float().cpu()
        for b, rid in enumerate(self.batch):
            key = (rid, layer)
            self.keys[key] = torch.cat([self.keys[key], k_new[b:b + 1].float().cpu()])
            self.values[key] = torch.cat([self.values[key], v_new[b:b + 1].float().cpu()])
        if layer not in self.offloaded:
            return torch.stack([self._attend_device_full(layer, b, rid, q[b]) for b, rid in enumerate(self.batch)])
        decision = self.ahead.pop(layer, None) or self._decide(layer, q)
        outputs = []
        for b, rid in enumerate(self.batch):
            device = self._device_blocks(layer, b, rid, decision)
            o, lse = policy.attend_blocks(q[b], self.keys[(rid, layer)], self.values[(rid, layer)], device,
                                          block_size=self.config.block_size, scale=self.shape.softmax_scale)
            if any(decision.cpu_blocks[b]):
                o, lse = reference.merge_states(o, lse, *decision.cpu_out[b])
            attended = [set(decision.selected[b][h]) | set(device[h]) for h in range(self.shape.num_kv_heads)]
            o, _ = self._with_estimate(layer, rid, q[b], o, lse, attended)
            outputs.append(o)
            self._maybe_recall(layer, b, rid, decision)
        return torch.stack(outputs)

    def end_step(self):
        for rid in self.batch:
            self.steps[rid] += 1
        self.batch = []
        self.step_index += 1

    # -- the rules -------------------------------------------------------------------
    def _window(self, rid, layer):
        c = self.config
        n = self.keys[(rid, layer)].shape[0]
        return policy.window_blocks(n, c.block_size, c.sink_blocks, c.local_blocks)

    def _attend_device_full(self, layer, b, rid, q):
        c, key = self.config, (rid, layer)
        n = self.keys[key].shape[0]
        num_full, tail = divmod(n, c.block_size)
        if c.mode == "quest" and layer not in c.dense_layers:
            scores = policy.block_scores(q, self.keys[key], num_full, c.block_size)
            heads = [policy.top_k(scores[h], num_full, c.topk_blocks, c.sink_blocks, c.local_blocks)
                     + ([num_full] if tail else []) for h in range(self.shape.num_kv_heads)]
        else:
            heads = [list(range(num_full + (1 if tail else 0)))] * self.shape.num_kv_heads
        o, lse = policy.attend_blocks(q, self.keys[key], self.values[key], heads, block_size=c.block_size,
                                      scale=self.shape.softmax_scale)
        return self._with_estimate(layer, rid, q, o, lse, [set(blocks) for blocks in heads])[0]

    def _with_estimate(self, layer, rid, q, o, lse, attended):
        """(o, lse) merged with the estimate of the full blocks outside `attended` ([Hkv] sets), when it is on."""
        c, key = self.config, (rid, layer)
        if not c.estimate or c.mode == "full":
            return o, lse
        num_full = self.keys[key].shape[0] // c.block_size
        blocks = [policy.unattended(num_full, held) for held in attended]
        return reference.merge_states(o, lse, *policy.estimate(q, self.keys[key], self.values[key], blocks,
                                                               block_size=c.block_size,
                                                               scale=self.shape.softmax_scale))

    def _decide(self, layer, q) -> Decision:
        """Selection with q; first fill or infinigen recall; the CPU part with q (same query)."""
        c, heads = self.config, range(self.shape.num_kv_heads)
        decision = Decision([], [], [], [])
        for b, rid in enumerate(self.batch):
            key = (rid, layer)
            after = self.after[rid]
            num_full = after // c.block_size
            forced = set(policy.forced_blocks(after, c.block_size, c.sink_blocks, c.local_blocks))
            scores = policy.block_scores(q[b], self.keys[key], num_full, c.block_size)
            selected = [policy.top_k(scores[h], num_full, c.topk_blocks, c.sink_blocks, c.local_blocks) if num_full
                        else [] for h in heads]
            if c.mode in RESIDENT_MODES and num_full and key not in self.filled:
                self.resident[key] = [policy.bring_in(self.resident[key][h], [j for j in selected[h] if j not in forced],
                                                      set(selected[h]), None) for h in heads]
                self.filled.add(key)
            if c.mode == "infinigen" and num_full:
                self.resident[key] = [policy.bring_in(self.resident[key][h], [j for j in selected[h] if j not in forced],
                                                      set(selected[h]), scores[h]) for h in heads]
            held = [forced | set(self.resident[key][h]) if c.mode == "scout" else forced for h in heads]
            cpu = [policy.cpu_list(selected[h], held[h], c.cpu_capacity) if c.mode in ("scout", "hgca") else []
                   for h in heads]
            decision.selected.append(selected)
            decision.scores.append(scores)
            decision.cpu_blocks.append(cpu)
            decision.cpu_out.append(self._off_device_part(q[b], key, cpu))
        return decision

    def _off_device_part(self, q, key, cpu):
        """(o, lse) of the CPU list: the workers' part; with a fixed CPU split, the workers' share (the list's first
        round(share x capacity) entries) merged with the device's zero-copy share (the rest)."""
        c, size, scale = self.config, self.config.block_size, self.shape.softmax_scale
        share = c.cpu_split_share
        if share is None:
            return policy.attend_blocks(q, self.keys[key], self.values[key], cpu, block_size=size, scale=scale)
        shares = [reference.split_shares(blocks, round(share * c.cpu_capacity)) for blocks in cpu]
        workers = policy.attend_blocks(q, self.keys[key], self.values[key], [w for w, _ in shares], block_size=size,
                                       scale=scale)
        zero_copy = policy.attend_blocks(q, self.keys[key], self.values[key], [z for _, z in shares], block_size=size,
                                         scale=scale)
        return reference.merge_states(*workers, *zero_copy)

    def _device_blocks(self, layer, b, rid, decision):
        """[Hkv] blocks the device part attends: the resident ones (infinigen: those selected), then the window."""
        key, c = (rid, layer), self.config
        window = self._window(rid, layer)
        heads = []
        for h in range(self.shape.num_kv_heads):
            resident = [j for j in self.resident[key][h] if j != policy.EMPTY]
            if c.mode == "infinigen":
                resident = [j for j in resident if j in decision.selected[b][h]]
            heads.append(resident + window)
        return heads

    def _maybe_recall(self, layer, b, rid, decision):
        c, key = self.config, (rid, layer)
        if c.mode != "scout" or c.recall_policy == "off" or not c.resident_capacity:
            return
        for h in range(self.shape.num_kv_heads):
            selected, cpu = decision.selected[b][h], decision.cpu_blocks[b][h]
            due = bool(selected) and policy.recall_due(c, layer, self.steps[rid], len(cpu), len(selected))
            self.resident[key][h], _, _ = policy.scout_recall(
                self.resident[key][h], config=c, brake=self.brakes[(rid, layer, h)], runs=self.runs[(rid, layer, h)],
                selected=selected, cpu=cpu, scores=decision.scores[b][h],
                due=due, cap=self.caps[b][h], position=self.after[rid])
