"""The co-attention statistics and memory usage on SGLang's Prometheus endpoint.

With --enable-metrics, SGLang serves /metrics from the HTTP process and
collects the other processes' metrics through prometheus_client's
multiprocess directory; gauges made here, in the scheduler process, appear
there as scout_* next to sglang:*. `scout_cpu_fallbacks_total{cause}` is a
counter: the layers whose CPU part was computed by the layer itself, because
the CPU task raised ("error") or missed its deadline ("deadline"), or the
worker, failing too often, was given no task ("device_only", cpu_health.py);
`scout_request_failures_total{stage}` counts the requests aborted alone because
their state was inconsistent, found in their "prefill" or "decode"
(request_failures.py). Every series carries the label `tp_rank`, as SGLang's own
do: with tensor parallelism each rank's scheduler process reports its own engine
(its heads, its host store, its CPU worker) as its own series.
"""

from __future__ import annotations

GAUGES = {
    "scout_tokens": ("tokens held by the scout engine (all requests)", ("memory", "tokens")),
    "scout_device_kv_bytes": ("device bytes of K/V in use: digests, windows, resident buffers",
                              ("memory", "device_bytes_used")),
    "scout_device_kv_bytes_allocated": ("device bytes allocated for K/V", ("memory", "device_bytes_allocated")),
    "scout_device_kv_token_slots": ("device token slots in use (windows and resident buffers)",
                                    ("memory", "device_token_slots_used")),
    "scout_host_kv_bytes": ("host bytes of K/V in use", ("memory", "host_bytes_used")),
    "scout_host_kv_bytes_allocated": ("host bytes allocated for K/V", ("memory", "host_bytes_allocated")),
    "scout_host_kv_shared_bytes": ("host bytes of K/V blocks that running requests share (a cached prefix)",
                                   ("memory", "host_bytes_shared")),
    "scout_host_kv_private_bytes": ("host bytes of K/V blocks held by one running request",
                                    ("memory", "host_bytes_private")),
    "scout_host_kv_cached_bytes": ("host bytes of K/V blocks only the radix cache holds (evictable)",
                                   ("memory", "host_bytes_cached")),
    "scout_host_kv_huge_page_share": ("share of the host store's bytes on 2 MiB pages (smaps, at most 30 s old)",
                                      ("host_store_pages", "huge_page_share")),
    "scout_prefix_hits": ("requests admitted with a cached prefix since start-up", ("prefix", "hits")),
    "scout_prefill_tokens_saved": ("prompt tokens not prefilled thanks to a cached prefix since start-up",
                                   ("prefix", "prefill_tokens_saved")),
    "scout_full_attention_kv_bytes": ("device bytes full attention would need for the tokens held",
                                      ("memory", "full_attention_bytes")),
    "scout_running_requests": ("requests held by the engine", ("usage", "requests")),
    "scout_decode_steps": ("decode steps since start-up", ("decode_steps",)),
    "scout_cpu_ratio": ("blocks attended on the CPU over the token budget's blocks, since start-up", ("cpu_ratio",)),
    "scout_recalled_blocks": ("blocks recalled into resident buffers since start-up", ("recalled_blocks",)),
    "scout_recent_cpu_ratio": ("blocks attended on the CPU over the budget's blocks, over the recent steps",
                               ("recall", "recent_cpu_ratio")),
    "scout_recall_bytes_per_step": ("bytes recall moved host -> device per decode step, over the recent steps",
                                    ("recall", "bytes_per_step")),
    "scout_recall_cap_bytes_per_step": ("the recall cap per decode step, over the recent steps",
                                        ("recall", "cap_bytes_per_step")),
    "scout_recall_backed_off_fraction": ("share of (request, layer, KV head) rows whose recall the brake holds "
                                         "back, over the recent steps", ("recall", "backed_off_fraction")),
    "scout_cpu_wait_ms": ("milliseconds the device waited for CPU attention since start-up", ("cpu_wait_ms",)),
    "scout_cpu_bytes_per_step": ("K/V bytes the CPU workers read per decode step, over the recent steps",
                                 ("cpu_split", "cpu_bytes_per_step")),
    "scout_zero_copy_bytes_per_step": ("K/V bytes the device read from the host store over PCIe per decode step "
                                       "(the CPU split's device share), over the recent steps",
                                       ("cpu_split", "zero_copy_bytes_per_step")),
    "scout_pcie_bytes_per_step": ("bytes over PCIe per decode step: zero-copy reads and recall, over the recent steps",
                                  ("cpu_split", "pcie_bytes_per_step")),
    "scout_cpu_wait_ms_per_step": ("milliseconds the device waited for the CPU part per decode step, over the "
                                   "recent steps", ("cpu_split", "cpu_wait_ms_per_step")),
    "scout_zero_copy_ms_per_step": ("milliseconds of the device's zero-copy reads per decode step (on their own "
                                    "stream, beside the layers' work), over the recent steps",
                                    ("cpu_split", "zero_copy_ms_per_step")),
    "scout_resident_pool_pages": ("pages of the resident-first pool (one block of every offloaded layer each)",
                                  ("resident_pool", "pages")),
    "scout_resident_pool_pages_used": ("pages of the resident-first pool held by requests now",
                                       ("resident_pool", "used")),
    "scout_exact_requests": ("requests attended exactly now (resident-first: all their blocks fit their quota)",
                             ("resident_pool", "exact_requests")),
    "scout_recent_exact_share": ("share of the recent steps' decoded tokens attended exactly (resident-first)",
                                 ("resident_pool", "recent_exact_share")),
    "scout_recent_exact_path_share": ("share of the recent decode steps that ran the exact path: every request "
                                      "exact and settled, no selection (resident-first)",
                                      ("resident_pool", "recent_exact_path_share")),
    "scout_resident_evicted_columns": ("resident columns given back by shrinking quotas since start-up "
                                       "(resident-first)", ("resident_pool", "evicted_columns")),
    "scout_resident_shared_pages": ("pages of the resident-first pool that hold a cached prefix's blocks for the "
                                    "requests that share it, each kept once", ("resident_pool", "shared_pages")),
    "scout_resident_saved_pages": ("pages of the resident-first pool that sharing cached prefixes saves now: "
                                   "the requests' columns pointing at shared pages less those pages",
                                   ("resident_pool", "saved_pages")),
    "scout_predicted_query_cosine": ("mean cosine of predicted and real queries", ("predicted_query_cosine",)),
    "scout_cpu_device_only": ("1 while the CPU worker is given no work (it kept failing) and each layer computes "
                              "its CPU part itself, else 0", ("cpu_worker", "device_only")),
    "scout_cpu_device_only_switches": ("times decoding went device-only since start-up",
                                       ("cpu_worker", "device_only_switches")),
    "scout_cpu_worker_replaced_threads": ("CPU worker threads replaced after one ended",
                                          ("cpu_worker", "replaced_threads")),
}
# Counters by label: name -> (help, label, path in the report to a {label value: running total} dict).
COUNTERS = {
    "scout_cpu_fallbacks": ("layers whose CPU part the layer computed itself, by cause (error, deadline, "
                            "device_only)", "cause",
                            ("cpu_fallbacks",)),
    "scout_request_failures": ("requests aborted alone because their state was inconsistent, by stage (prefill, "
                               "decode)", "stage", ("request_failures",)),
}

_GAUGES: dict = {}  # one set per process: prometheus refuses a second metric of the same name


class ScoutMetrics:
    def __init__(self, gauges: dict, tp_rank: int = 0):
        self.gauges = gauges
        self.tp_rank = str(tp_rank)
        self._counted: dict[tuple[str, str], float] = {}  # (counter, label value) -> total already added

    @classmethod
    def create(cls, server_args, tp_rank: int = 0) -> "ScoutMetrics | None":
        """Gauges of this tensor-parallel rank when the server runs with --enable-metrics, else None."""
        if not getattr(server_args, "enable_metrics", False):
            return None
        from prometheus_client import Gauge

        if not _GAUGES:
            from prometheus_client import Counter

            _GAUGES.update({name: Gauge(name, text, ("tp_rank",), multiprocess_mode="mostrecent")
                            for name, (text, _) in GAUGES.items()})
            # prometheus_client exposes a Counter named X as X_total
            _GAUGES.update({name: Counter(name, text, (label, "tp_rank"))
                            for name, (text, label, _) in COUNTERS.items()})
        return cls(_GAUGES, tp_rank)

    def update(self, report: dict) -> None:
        for name, (_, path) in GAUGES.items():
            value = _lookup(report, path)
            if value is not None:
                self.gauges[name].labels(self.tp_rank).set(value)
        for name, (_, _, path) in COUNTERS.items():
            totals = _lookup(report, path) or {}
            for label, total in totals.items():
                added = self._counted.get((name, label), 0)
                child = self.gauges[name].labels(label, self.tp_rank)  # served from the first update, at 0
                if total > added:  # the report holds running totals; a counter takes increments
                    child.inc(total - added)
                    self._counted[(name, label)] = total


def _lookup(report: dict, path: tuple):
    value = report
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value
