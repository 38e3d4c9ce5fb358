"""SGLang plugin entry point (group `sglang.srt.plugins`): registers `scout`.

SGLang calls register() in every process, and only logs a plugin that raises,
so registration is cheap, idempotent and never raises: on a wrong sglang
version `scout` is still registered, with a factory that stops the server with
the version message when (and only when) `scout` is selected; a bad
SCOUT_LOG_LEVEL (applied to the `scout_sglang` loggers here) stops it the same
way. This is the one
module that patches SGLang, written against sglang 0.5.23: a BEFORE hook on
request release (finish, abort, retraction), an AFTER hook on a running request's checkpoint into the
radix tree (prefix_pages.py), an AFTER hook that gives the decode graph runner
scout's two graphs per batch size under resident-first (graph_variants.py), an AFTER hook that adds the
co-attention statistics to the scheduler's internal state (GET /server_info,
"internal_states"[i]["scout"], and every tensor-parallel rank's in
"scout_ranks"), an AFTER hook on the scheduler's release of host
resources at a graceful exit (each backend's engine closed: its CPU worker
threads joined), an AFTER hook on the scheduler's run_batch that aborts the
requests a backend gave up on in that forward (request_failures.py), AFTER
hooks that give a decode batch and a decode graph's replay view the
scheduler's host copy of their request slots, so that planning a step reads no
device value (host_batch.py), and the HTTP front's guards (guards.py).
"""

from __future__ import annotations

import logging
import weakref

from scout_sglang.sglang_adapter.version import SGLANG_VERSION, version_problem

logger = logging.getLogger("scout_sglang.sglang_adapter")
BACKEND_NAME = "scout"
RELEASE_TARGET = "sglang.srt.mem_cache.common.release_kv_cache"
CHECKPOINT_TARGET = "sglang.srt.mem_cache.common.checkpoint_kv_cache"
STATE_TARGET = ("sglang.srt.managers.scheduler_components.internal_state."
                "SchedulerInternalStateController.get_internal_state")
EXIT_TARGET = "sglang.srt.managers.scheduler.Scheduler.release_host_resources"
RUN_BATCH_TARGET = "sglang.srt.managers.scheduler.Scheduler.run_batch"
LIVE_BACKENDS: weakref.WeakSet = weakref.WeakSet()  # backends of this process, freed on request release
_registered = False
_settings_problem: str | None = None  # a bad setting seen by register(), raised when `scout` is selected


def apply_log_level() -> str | None:
    """Set the level of the `scout_sglang` loggers from SCOUT_LOG_LEVEL; the problem with its value, or None."""
    from scout_sglang.env import log_level

    try:
        level = log_level()
    except ValueError as error:
        return str(error)
    if level is not None:
        logging.getLogger("scout_sglang").setLevel(level)
    return None


def register() -> None:
    global _registered, _settings_problem
    if _registered:
        return
    _registered = True
    _settings_problem = apply_log_level()
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES, add_attention_backend_choices
    from sglang.srt.layers.attention.attention_registry import register_attention_backend

    if BACKEND_NAME not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([BACKEND_NAME])
    register_attention_backend(BACKEND_NAME)(create_backend)
    if version_problem() is None:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        from scout_sglang.sglang_adapter import graph_variants, guards, host_batch, kv_pool

        HookRegistry.register(kv_pool.TARGET, kv_pool.configure_around, HookType.AROUND)
        HookRegistry.register(RELEASE_TARGET, _before_release, HookType.BEFORE)
        HookRegistry.register(CHECKPOINT_TARGET, _after_checkpoint, HookType.AFTER)
        HookRegistry.register(STATE_TARGET, _add_statistics, HookType.AFTER)
        HookRegistry.register(EXIT_TARGET, _close_backends, HookType.AFTER)
        HookRegistry.register(RUN_BATCH_TARGET, _abort_failed_requests, HookType.AFTER)
        HookRegistry.register(graph_variants.TARGET, graph_variants.install_variants, HookType.AFTER)
        HookRegistry.register(host_batch.INIT_TARGET, host_batch.add_host_slots, HookType.AFTER)
        HookRegistry.register(host_batch.REPLAY_VIEW_TARGET, host_batch.add_host_view_fields, HookType.AFTER)
        HookRegistry.register(guards.CHAT_VALIDATE_TARGET, guards.check_chat, HookType.AFTER)
        HookRegistry.register(guards.COMPLETION_VALIDATE_TARGET, guards.check_completion, HookType.AFTER)
        HookRegistry.register(guards.GENERATE_TARGET, guards.check_generate, HookType.AROUND)
        HookRegistry.register(guards.DRAIN_TARGET, guards.bounded_drain, HookType.AROUND)


def create_backend(model_runner):
    """Factory SGLang calls for `--attention-backend scout`."""
    problem = version_problem() or _settings_problem
    if problem:
        raise RuntimeError(problem)
    from scout_sglang.sglang_adapter.backend import _as_attention_backend

    backend = _as_attention_backend()(model_runner)
    LIVE_BACKENDS.add(backend)
    return backend


def _before_release(*args, **kwargs):
    """Request finished, aborted or retracted: free its engine state in every backend."""
    req = args[0] if args else kwargs.get("req")
    index = getattr(getattr(req, "kv", None), "req_pool_idx", None)
    if index is not None:
        for backend in list(LIVE_BACKENDS):
            backend.release(int(index))
    return None


def _after_checkpoint(result, *args, **kwargs):
    """A running request's tokens went into the radix tree (checkpoint_kv_cache(req, tree_cache)): its pages may
    now be the tree's; every backend's engine follows (prefix_pages.py)."""
    req = args[0] if args else kwargs.get("req")
    kv = getattr(req, "kv", None)
    index = getattr(kv, "req_pool_idx", None)
    if index is not None:
        for backend in list(LIVE_BACKENDS):
            backend.rebind_from_pool(int(index), int(getattr(kv, "cache_protected_len", 0) or 0))
    return None


def _abort_failed_requests(result, scheduler, *args, **kwargs):
    """After a forward (Scheduler.run_batch(batch, ...)): the requests a backend of this process gave up on
    finish with an abort."""
    batch = args[0] if args else kwargs.get("batch")
    failures = {}
    for backend in list(LIVE_BACKENDS):
        failures.update(backend.failures.take())
    if failures:
        from scout_sglang.sglang_adapter.request_failures import abort_failed_requests

        abort_failed_requests(scheduler, batch.reqs, failures)
    return None


def _close_backends(result, *args, **kwargs):
    """The scheduler exits gracefully: close every backend's engine (its CPU worker threads finish their
    queue and are joined) before the process ends."""
    for backend in list(LIVE_BACKENDS):
        backend.close()
    return None


def _add_statistics(result, *args, **kwargs):
    """Scheduler internal state -> plus "scout": this process's co-attention statistics, and "scout_ranks": every
    tensor-parallel rank's, in rank order (each labelled with its `tp_rank`). SGLang hands the request to every
    rank of the TP group, so every rank reaches this hook and joins the gather; rank 0's state is the one
    served."""
    backends = list(LIVE_BACKENDS)
    if not backends:  # not a scout server (the same on every rank)
        return None
    try:
        report = backends[0].report() if len(backends) == 1 else [b.report() for b in backends]
    except Exception as error:  # noqa: BLE001 - the other ranks wait in the gather below
        logger.exception("scout: statistics could not be read")
        report = {"error": f"{type(error).__name__}: {error}"}
    from scout_sglang.sglang_adapter.tensor_parallel import tp_gather

    ranks = tp_gather(report)
    state = getattr(result, "internal_state", None)
    if isinstance(state, dict):
        state["scout"], state["scout_ranks"] = report, ranks
    return None


__all__ = ["BACKEND_NAME", "SGLANG_VERSION", "create_backend", "register"]
