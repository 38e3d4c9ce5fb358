"""The co-attention statistics and memory usage on SGLang's Prometheus endpoint.

With --enable-metrics, SGLang serves /metrics from the HTTP process and
collects the other processes' metrics through prometheus_client's
multiprocess directory; gauges made here, in the scheduler process, appear
there as scout_* next to sglang:*.
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
    "scout_full_attention_kv_bytes": ("device bytes full attention would need for the tokens held",
                                      ("memory", "full_attention_bytes")),
    "scout_running_requests": ("requests held by the engine", ("usage", "requests")),
    "scout_decode_steps": ("decode steps since start-up", ("decode_steps",)),
    "scout_cpu_ratio": ("fraction of the selected blocks attended on the CPU", ("cpu_ratio",)),
    "scout_recalled_blocks": ("blocks recalled into resident buffers since start-up", ("recalled_blocks",)),
    "scout_cpu_wait_ms": ("milliseconds the device waited for CPU attention since start-up", ("cpu_wait_ms",)),
    "scout_predicted_query_cosine": ("mean cosine of predicted and real queries", ("predicted_query_cosine",)),
}


_GAUGES: dict = {}  # one set per process: prometheus refuses a second gauge of the same name


class ScoutMetrics:
    def __init__(self, gauges: dict):
        self.gauges = gauges

    @classmethod
    def create(cls, server_args) -> "ScoutMetrics | None":
        """Gauges when the server runs with --enable-metrics, else None."""
        if not getattr(server_args, "enable_metrics", False):
            return None
        from prometheus_client import Gauge

        if not _GAUGES:
            _GAUGES.update({name: Gauge(name, text, multiprocess_mode="mostrecent") for name, (text, _) in GAUGES.items()})
        return cls(_GAUGES)

    def update(self, report: dict) -> None:
        for name, (_, path) in GAUGES.items():
            value = report
            for key in path:
                value = value.get(key) if isinstance(value, dict) else None
            if value is not None:
                self.gauges[name].set(value)
