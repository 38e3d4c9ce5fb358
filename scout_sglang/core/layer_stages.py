"""The decode step of one layer as a fixed sequence of fused stages, over the step plan and static buffers.

digest -> select -> split -> device part / CPU part -> merge -> recall. An
offloaded layer (scout shown; the other modes drop stages):

    front (one layer ahead, from the predicted query; in the layer itself without a prediction)
      score     Quest scores of every full block                               kernels.score_blocks
      select    top-k, sink and local forced, the change count                 kernels.stage_select
      admit+fill  the block leaving the window; a row's first selection        kernels.stage_recall
                (infinigen: + the recall of its selection)
      split     device list; CPU list and query into the hand-off's staging    kernels.stage_split
      ring      the worker may start                                           kernels.cpu_part / cpu_handoff
      zero-copy (the CPU split) the device's share of the CPU list, read from  kernels.sparse_decode
                the host store: on CUDA on a side stream, joined before attend
    attend (the layer's own query)
      append    the token; a completed block's digest and host copy            kernels.stage_append
      decode    resident blocks + window -> (o, lse)                           kernels.sparse_decode
      resolve   wait (deadline), fallback if the worker failed, merge          cpu_handoff
                (with the split, of the zero-copy share too: one launch still)
                (with the estimate on, the merge also estimates the blocks     kernels.estimate
                attended nowhere: one launch still; infinigen: one more)
      recall    CPU-list blocks into the resident buffer, when due, braked     kernels.stage_recall

A device-full layer (dense layers; modes full and quest) appends, (quest)
scores and selects with the page list, decodes, and (quest with the
estimate on) merges the estimate of the blocks it left out. Every call passes
validate=False: the buffers are the engine's static ones, checked when they
were made. On CUDA each stage is one Triton launch (two for a split decode);
on the CPU a fixed sequence of torch ops. Nothing reads a device value back.
"""

from __future__ import annotations

import time

import torch

from scout_sglang import kernels
from scout_sglang.core.cpu_fallback import attend_listed_host_blocks
from scout_sglang.core.host_wait import blocking_event
from scout_sglang.core.launch_program import LaunchPrograms
from scout_sglang.kernels.estimate import UnattendedBlocks, merge_with_estimate
from scout_sglang.kernels.recall_brake import STATE_WORDS, RecallBrake
from scout_sglang.kernels.stage_append import append_token
from scout_sglang.kernels.stage_recall import bring_in
from scout_sglang.kernels.stage_select import select_blocks
from scout_sglang.kernels.stage_split import split_lists
from scout_sglang.layout import PAD_BLOCK

RESIDENT_MODES = ("scout", "infinigen")
# Programs of the CPU split's zero-copy decode, each walking (row, KV head) lists in turn: its reads wait on PCIe,
# so a few programs keep the link busy while the layer's own kernels keep the other SMs (not yet tuned on a GPU:
# bench_zero_copy.py measures the rate at this bound).
ZERO_COPY_PROGRAMS = 32
CPU_MODES = ("scout", "hgca")


class LayerStages:
    """The stage calls of one layer (module docstring), bound to an engine's stores, buffers and hand-off."""

    def __init__(self, engine):
        config = engine.config
        self.engine = engine
        self.config, self.shape = config, engine.shape
        self.offloaded, self.full_store, self.buffers = engine.offloaded, engine.full_store, engine.buffers
        self.handoff = engine.handoff
        self.scale = engine.shape.softmax_scale
        self.resident = config.mode in RESIDENT_MODES and self.offloaded.resident_width > 0
        self.cpu_part = config.mode in CPU_MODES
        self.recalls = engine.recall_budget is not None  # scout, recall on, a resident buffer
        self.splits = engine.cpu_split is not None  # the CPU split: the device reads a share of the CPU list itself
        self.estimates = engine.estimates  # the estimate of the unattended blocks, merged with the attended parts
        self.stage_impl = engine.stage_impl
        self.decode_impl = engine.decode_impl
        self.offloaded_index = {layer: i for i, layer in enumerate(engine.offloaded_layers)}  # plan columns per layer
        self.on_cuda = engine.device.type == "cuda"
        # The Triton path replays each layer's recorded launches (launch_program.py); the torch path runs its ops.
        triton = self.stage_impl == "triton" or (self.on_cuda and self.stage_impl is None)
        self.programs = LaunchPrograms() if triton and engine.replay_launches else None
        if self.resident and engine.pool is not None:  # the exact path's split: an empty selection, no CPU part
            self.no_selection = torch.full((engine.max_requests, self.shape.num_kv_heads, 1), PAD_BLOCK,
                                           dtype=torch.int32, device=engine.device)
            self.no_counts = torch.zeros(engine.max_requests, self.shape.num_kv_heads, dtype=torch.int32,
                                         device=engine.device)
        if self.splits and self.on_cuda:  # the zero-copy share's stream, and its end per layer parity
            self.side_stream = torch.cuda.Stream(device=engine.device)
            self.zero_copy_done = [blocking_event(), blocking_event()]  # waited on by the device, never the host

    # -- offloaded layers ----------------------------------------------------------------
    def front(self, layer: int, q: torch.Tensor, *, trace=None) -> None:
        """Select, fill, split and ring for `layer` from query q [rows, Hq, D] (predicted or real)."""
        if self.programs is None or trace is not None:
            self._front(layer, q, trace=trace)
        else:
            self.programs.run("front", self._step_key(layer), lambda q: self._front(layer, q), q=q)
        if self.splits:
            self.zero_copy(layer)

    def _front(self, layer: int, q: torch.Tensor, *, trace=None) -> None:
        self.select_split(layer, q, trace=trace)
        if self.handoff is not None:
            self.handoff.ring(layer, self.engine.plan)

    def zero_copy(self, layer: int) -> None:
        """The CPU split's device share of `layer`: its blocks attended from the page-locked host store with the
        staged query -> the set's zero_copy_o, zero_copy_lse. On CUDA on the side stream, forked after the ring and
        joined after the layer's device part, before its merge (a captured graph keeps the fork and the join)."""
        if not self.on_cuda:  # synchronous: the engine's thread times it
            start = time.perf_counter()
            self._run_zero_copy(layer)
            self.handoff.add_zero_copy_time(layer, time.perf_counter() - start)
            return
        self.side_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side_stream):
            self._run_zero_copy(layer)
            self.zero_copy_done[layer % 2].record(self.side_stream)

    def _run_zero_copy(self, layer: int) -> None:
        if self.programs is None:
            self._zero_copy(layer)
        else:
            self.programs.run("zero_copy", self._step_key(layer), lambda: self._zero_copy(layer))

    def _zero_copy(self, layer: int) -> None:
        plan, chosen, handoff = self.engine.plan, self.buffers.of(layer), self.handoff
        rows = plan.rows
        q, pages, counts = handoff.q[layer][:rows], chosen.zero_copy_pages[:rows], chosen.zero_copy_counts[:rows]
        host_k, host_v = self.offloaded.host_k[layer], self.offloaded.host_v[layer]
        if handoff.kernels:  # one split (no workspace, apart from the main stream's) on a bounded number of SMs
            from scout_sglang.kernels.triton.decode import sparse_decode_triton

            sparse_decode_triton(q, host_k, host_v, pages, counts, None, chosen.zero_copy_o[:rows],
                                 chosen.zero_copy_lse[:rows], scale=self.scale, num_splits=1,
                                 programs=ZERO_COPY_PROGRAMS,
                                 clock_ns=handoff.zero_copy_clock(layer) if self.on_cuda else None)
            return
        o, lse = attend_listed_host_blocks(q, host_k, host_v, pages, counts, scale=self.scale,
                                           device=self.engine.device, impl=handoff.impl)
        chosen.zero_copy_o[:rows].copy_(o)
        chosen.zero_copy_lse[:rows].copy_(lse)

    def _step_key(self, layer: int) -> tuple:
        """What the recorded launches of a layer depend on besides the call's tensors: the plan's layout."""
        plan = self.engine.plan
        return (layer, plan.rows, plan.host_table.shape[1] if plan.host_table is not None else 0,
                plan.full_table.shape[1] if plan.full_table is not None else 0,
                plan.resident_pages.shape[1] if plan.resident_pages is not None else 0)

    def _resident_rows(self, layer: int) -> torch.Tensor:
        """The layer's resident map [slots + 1, Hkv, R'] for the step: R' is the plan's resident width (with
        resident-first, the bucket of the batch's largest quota: every column past it is empty in the step's rows;
        else the buffer's)."""
        return self.offloaded.resident_map[layer][:, :, : self.engine.plan.resident_pages.shape[1]]

    def _device_pages(self, layer: int) -> torch.Tensor:
        """The device part's page lists of the step [rows, Hkv, R' + W]."""
        plan = self.engine.plan
        width = plan.resident_pages.shape[1] + plan.window_pages.shape[1] if self.resident else None
        return self.buffers.of(layer).device_pages[: plan.rows, :, :width]

    def select_split(self, layer: int, q: torch.Tensor, *, trace=None) -> None:
        """The front's tensor program: score, select, admit and fill (infinigen: recall), split."""
        plan, store, chosen = self.engine.plan, self.offloaded, self.buffers.of(layer)
        rows, impl, config = plan.rows, self.stage_impl, self.config
        scores = chosen.scores[:rows, :, : plan.host_table.shape[1]]
        self.score(layer, q, store, plan.host_table, scores)
        select_blocks(scores, plan.num_full, topk=self.engine.select_width, num_sink_blocks=config.sink_blocks,
                      num_local_blocks=config.local_blocks, out_selected=chosen.selected[:rows],
                      out_counts=chosen.counts[:rows], previous=self.engine.previous.get(layer), slots=plan.slots,
                      counters=self.buffers.counters[layer], row_topk=plan.row_topk, impl=impl, validate=False)
        if self.resident:
            recall = "selected" if config.mode == "infinigen" else None
            if trace is None:
                self._bring_in(layer, scores, admit=True, fill=True, recall=recall)
            else:  # tests: the rows between admission and fill, for the oracle
                self._bring_in(layer, scores, admit=True)
                trace.resident_start[layer] = store.resident_map[layer][plan.slots_long].tolist()
                self._bring_in(layer, scores, fill=True, recall=recall)
        cpu = self.handoff is not None
        split_lists(chosen.selected[:rows], chosen.counts[:rows], forced_blocks=plan.forced_blocks,
                    window_pages=plan.window_pages, out_device_pages=self._device_pages(layer),
                    out_device_counts=chosen.device_counts[:rows],
                    resident=self._resident_rows(layer) if self.resident else None,
                    slots=plan.slots if self.resident else None,
                    resident_pages=plan.resident_pages if self.resident else None,
                    only_selected_resident=config.mode == "infinigen",
                    host_table=plan.host_table if cpu else None, capacity=config.cpu_capacity,
                    out_cpu_blocks=chosen.cpu_blocks[:rows] if cpu else None,
                    out_cpu_pages=self.handoff.pages[layer][:rows] if cpu else None,
                    out_cpu_counts=self.handoff.counts[layer][:rows] if cpu else None,
                    q=q if cpu else None, out_q=self.handoff.q[layer][:rows] if cpu else None,
                    cpu_cap=plan.cpu_cap[:, self.offloaded_index[layer]] if self.splits else None,
                    out_zero_copy_pages=chosen.zero_copy_pages[:rows] if self.splits else None,
                    out_zero_copy_counts=chosen.zero_copy_counts[:rows] if self.splits else None,
                    out_listed_counts=chosen.listed_counts[:rows] if self.splits else None,
                    num_host_pages=store.host_k[layer].shape[0] if cpu else None,
                    counters=self.buffers.counters[layer], impl=impl, validate=False)

    def score(self, layer: int, q: torch.Tensor, store, table: torch.Tensor, scores: torch.Tensor) -> None:
        """The selection's key of every full block of the step's rows -> scores [rows, Hkv, NB]: Quest's score from
        the digests of `store` (the offloaded store, or quest's device-full one) through the page table `table`."""
        kernels.score_blocks(q, store.digest_min[layer], store.digest_max[layer], table, self.engine.plan.num_full,
                             out=scores, impl=self.stage_impl, validate=False)

    def attend_offloaded(self, layer: int, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                         out: torch.Tensor) -> None:
        """Append, the device part, the CPU part's merge and recall of a layer whose front ran -> out [rows, Hq, D].
        With the CPU split on CUDA, the zero-copy share (side stream) is joined after the device part, before the
        merge that reads it: it overlaps the device part too."""
        merges = self.cpu_part or self.estimates
        if self.programs is None:
            self._attend_device(layer, q, k_new, v_new, out, merges)
        else:
            self.programs.run("attend", self._step_key(layer),
                              lambda q, k, v, out: self._attend_device(layer, q, k, v, out, merges),
                              q=q, k=k_new, v=v_new, out=out)
        if self.splits and self.on_cuda:  # the zero-copy share is in
            torch.cuda.current_stream().wait_event(self.zero_copy_done[layer % 2])
        if self.programs is None:
            self._merge(layer, q, out)
        else:
            self.programs.run("merge", self._step_key(layer), lambda q, out: self._merge(layer, q, out), q=q, out=out)

    def attend_exact(self, layer: int, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                     out: torch.Tensor, *, trace=None) -> None:
        """Resident-first's exact path, for a step whose every row is exact and settled (its resident row holds
        every block outside its window): admit the block leaving the window, list the row's and the window's
        pages, append, decode -> out [rows, Hq, D]. Dense attention's work: no score, selection, CPU part, merge
        or recall."""
        if self.programs is None or trace is not None:
            self._exact(layer, q, k_new, v_new, out, trace=trace)
        else:
            self.programs.run("exact", self._step_key(layer),
                              lambda q, k, v, out: self._exact(layer, q, k, v, out), q=q, k=k_new, v=v_new, out=out)

    def _exact(self, layer: int, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, out: torch.Tensor, *,
               trace=None) -> None:
        plan, chosen, rows = self.engine.plan, self.buffers.of(layer), self.engine.plan.rows
        self._bring_in(layer, None, admit=True, selection=(self.no_selection[:rows], self.no_counts[:rows]))
        if trace is not None:  # tests: the rows after admission, for the oracle
            trace.resident_start[layer] = self.offloaded.resident_map[layer][plan.slots_long].tolist()
        split_lists(self.no_selection[:rows], self.no_counts[:rows], forced_blocks=plan.forced_blocks,
                    window_pages=plan.window_pages, out_device_pages=self._device_pages(layer),
                    out_device_counts=chosen.device_counts[:rows], resident=self._resident_rows(layer),
                    slots=plan.slots, resident_pages=plan.resident_pages, impl=self.stage_impl, validate=False)
        self.device_part(layer, q, k_new, v_new, out)

    def _attend_device(self, layer: int, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                       out: torch.Tensor, merges: bool) -> None:
        o = self.buffers.o[: self.engine.plan.rows] if merges else out  # merged later: the device part's own (o, lse)
        self.device_part(layer, q, k_new, v_new, o)

    def _merge(self, layer: int, q: torch.Tensor, out: torch.Tensor) -> None:
        """The device part's (o, lse) merged with the CPU part (and its zero-copy share) and the estimate -> out;
        then recall."""
        rows = self.engine.plan.rows
        o = self.buffers.o[:rows]
        blocks = self.unattended(layer, offloaded=True) if self.estimates else None
        if self.cpu_part:
            chosen = self.buffers.of(layer)
            zero_copy = (chosen.zero_copy_o[:rows], chosen.zero_copy_lse[:rows]) if self.splits else None
            self.handoff.resolve(layer, self.engine.plan, o, self.buffers.lse[:rows], out,
                                 estimate=None if blocks is None else (q, blocks), zero_copy=zero_copy)
        elif blocks is not None:
            merge_with_estimate(q, o, self.buffers.lse[:rows], out, blocks=blocks, impl=self.stage_impl,
                                validate=False)
        if self.recalls:
            self.recall(layer)

    def device_part(self, layer: int, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                    o: torch.Tensor) -> None:
        """Append the token (a completed block: digest, host copy), then attend the device list -> o, buffers.lse."""
        plan, store, chosen, rows = self.engine.plan, self.offloaded, self.buffers.of(layer), self.engine.plan.rows
        append_token(k_new, v_new, store.dev_k[layer], store.dev_v[layer], plan.window_append_page,
                     plan.append_offset, digest_min=store.digest_min[layer], digest_max=store.digest_max[layer],
                     digest_rows=plan.fill_host_row, value_summary=store.value_summary.get(layer),
                     host_k=store.host_k[layer], host_v=store.host_v[layer], host_rows=plan.fill_host_row,
                     host_scratch=store.host_scratch_page,
                     impl=self.stage_impl, validate=False)
        kernels.sparse_decode(q, store.dev_k[layer], store.dev_v[layer], self._device_pages(layer),
                              chosen.device_counts[:rows], scale=self.scale, last_block_len=plan.last_len_heads,
                              out=o, out_lse=self.buffers.lse[:rows], impl=self.decode_impl, validate=False,
                              workspace=self.buffers.workspace)

    def unattended(self, layer: int, *, offloaded: bool) -> UnattendedBlocks:
        """What the estimate of `layer` reads (kernels/estimate.py): its block summaries, the step's page table and
        what the layer attends exactly: the selection and, in scout (whose device part attends every resident
        block), the resident buffer. Infinigen attends only its selected resident blocks: the rest are estimated."""
        plan, chosen, rows = self.engine.plan, self.buffers.of(layer), self.engine.plan.rows
        store, table = (self.offloaded, plan.host_table) if offloaded else (self.full_store, plan.full_table)
        resident = offloaded and self.resident and self.config.mode == "scout"
        return UnattendedBlocks(store.digest_min[layer], store.digest_max[layer], store.value_summary[layer], table,
                                plan.num_full, chosen.selected[:rows], chosen.counts[:rows],
                                self._resident_rows(layer) if resident else None, plan.slots if resident else None,
                                block_size=self.config.block_size, scale=self.scale,
                                workspace=self.buffers.estimate_workspace)

    def recall(self, layer: int) -> None:
        """Scout's recall after the layer's attention: CPU-list blocks into the resident buffer, when due."""
        plan, rows = self.engine.plan, self.engine.plan.rows
        self._bring_in(layer, self.buffers.of(layer).scores[:rows, :, : plan.host_table.shape[1]], recall="cpu")

    def _bring_in(self, layer: int, scores: torch.Tensor, *, admit=False, fill=False, recall=None,
                  selection=None) -> None:
        """The resident stage's phases; selection: (selected, counts) in place of the layer's (the exact path's
        empty one: a narrow row for the stage to read)."""
        plan, store, chosen, rows = self.engine.plan, self.offloaded, self.buffers.of(layer), self.engine.plan.rows
        selected, counts = selection or (chosen.selected[:rows], chosen.counts[:rows])
        cpu = recall == "cpu"
        state = store.recall_state.get(layer)
        if state is not None:  # its FRESH words: one per resident column of the step
            state = state[:, :, : STATE_WORDS + plan.resident_pages.shape[1]]
        brake = RecallBrake(store.recall_runs.get(layer), state, plan.num_tokens,
                            min_selected=self.config.recall_min_selected,
                            max_backoff=self.config.recall_max_backoff) if cpu else None
        bring_in(self._resident_rows(layer), plan.slots, resident_pages=plan.resident_pages, host_table=plan.host_table,
                 host_k=store.host_k[layer], host_v=store.host_v[layer], dev_k=store.dev_k[layer],
                 dev_v=store.dev_v[layer], selected=selected, counts=counts,
                 num_full=plan.num_full, forced_blocks=plan.forced_blocks,
                 quota=plan.recall_cap if cpu else plan.recall_quota, admit=admit,
                 leaving_block=plan.leaving_block, leaving_page=plan.leaving_page, fill=fill,
                 ready=store.resident_ready[layer], recall=recall, scores=scores,
                 cpu_blocks=chosen.cpu_blocks[:rows] if cpu else None,
                 cpu_counts=(chosen.listed_counts if self.splits else self.handoff.counts[layer])[:rows] if cpu else None,
                 recall_due=plan.recall_due[:, self.offloaded_index[layer]] if cpu and plan.recall_due is not None else None,
                 recall_beta=self.config.recall_beta, brake=brake, counters=self.buffers.counters[layer],
                 impl=self.stage_impl, validate=False)

    # -- device-full layers ------------------------------------------------------------
    def attend_full(self, layer: int, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                    out: torch.Tensor, *, selects: bool) -> None:
        """A dense layer, or (selects) a quest layer: append, select with the page list, decode -> out."""
        if self.programs is None:
            self.full_layer(layer, q, k_new, v_new, out, selects=selects)
        else:
            self.programs.run("full", self._step_key(layer),
                              lambda q, k, v, out: self.full_layer(layer, q, k, v, out, selects=selects), q=q, k=k_new,
                              v=v_new, out=out)

    def full_layer(self, layer: int, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                   out: torch.Tensor, *, selects: bool) -> None:
        """attend_full's stages."""
        plan, store, rows, config = self.engine.plan, self.full_store, self.engine.plan.rows, self.config
        digests = layer in store.digest_min
        append_token(k_new, v_new, store.k[layer], store.v[layer], plan.full_append_page, plan.append_offset,
                     digest_min=store.digest_min[layer] if digests else None,
                     digest_max=store.digest_max[layer] if digests else None,
                     digest_rows=plan.fill_full_row if digests else None, value_summary=store.value_summary.get(layer),
                     impl=self.stage_impl, validate=False)
        table, counts = plan.full_lists, plan.full_counts
        if selects:
            chosen = self.buffers.of(layer)
            scores = chosen.scores[:rows, :, : plan.full_table.shape[1]]
            self.score(layer, q, store, plan.full_table, scores)
            select_blocks(scores, plan.num_full, topk=config.topk_blocks, num_sink_blocks=config.sink_blocks,
                          num_local_blocks=config.local_blocks, out_selected=chosen.selected[:rows],
                          out_counts=chosen.counts[:rows], previous=self.engine.previous.get(layer), slots=plan.slots,
                          counters=self.buffers.counters[layer], page_table=plan.full_table,
                          num_tokens=plan.num_tokens, block_size=config.block_size,
                          out_pages=chosen.quest_pages[:rows], out_page_counts=chosen.quest_counts[:rows],
                          impl=self.stage_impl, validate=False)
            table, counts = chosen.quest_pages[:rows], chosen.quest_counts[:rows]
        estimates = selects and self.estimates
        o = self.buffers.o[:rows] if estimates else out  # merged with the estimate: the selection's own (o, lse)
        kernels.sparse_decode(q, store.k[layer], store.v[layer], table, counts, scale=self.scale,
                              last_block_len=plan.last_len_heads, out=o, out_lse=self.buffers.lse[:rows],
                              impl=self.decode_impl, validate=False, workspace=self.buffers.workspace)
        if estimates:
            merge_with_estimate(q, o, self.buffers.lse[:rows], out, blocks=self.unattended(layer, offloaded=False),
                                impl=self.stage_impl, validate=False)
