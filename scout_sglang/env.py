"""The one module that reads SCOUT_* environment variables.

SCOUT_CONFIG names a preset (a YAML file in scout_sglang.configs, without the
extension) or a path to a YAML file; SCOUT_<FIELD> overrides one field of
ScoutConfig (SCOUT_TOKEN_BUDGET=1024, SCOUT_DENSE_LAYERS=0,1, SCOUT_KERNEL_IMPL=none).
The others (OTHER_VARIABLES) are read here too, by the part that uses them:
SCOUT_KV_POOL and SCOUT_HOST_KV_GIB (the server's KV pool), SCOUT_NATIVE_BUILD_DIR
(where the native CPU kernel is built), SCOUT_LOG_LEVEL (the level of the
`scout_sglang` loggers), SCOUT_CPU_DEADLINE_MS (when a layer stops waiting for its
CPU part), the server's guards SCOUT_MAX_N (sequences one HTTP request may start) and
SCOUT_DRAIN_S (how long SIGTERM lets requests finish) and, for tests only,
SCOUT_TEST_FAULTS with SCOUT_TEST_FAULTS_ALLOW.
Unknown SCOUT_* names and unparsable values are errors that name the variable
and what it accepts: a typo must stop the server, not be ignored.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from pathlib import Path

import yaml

from scout_sglang.config import CPU_IMPLS, KERNEL_IMPLS, MODES, RECALL_POLICIES, ScoutConfig

PREFIX = "SCOUT_"
CONFIG_VARIABLE = "SCOUT_CONFIG"
DEFAULT_PRESET = "default"
CHOICES = {"mode": MODES, "recall_policy": RECALL_POLICIES, "cpu_impl": CPU_IMPLS, "kernel_impl": KERNEL_IMPLS}
FIELD_TYPES = {f.name: f.type for f in dataclasses.fields(ScoutConfig) if f.name != "extra"}
# Variables of this prefix that belong to other parts of the project, not to ScoutConfig.
OTHER_VARIABLES = frozenset({"SCOUT_CONFIG", "SCOUT_NATIVE_BUILD_DIR", "SCOUT_LOG_LEVEL", "SCOUT_KV_POOL",
                             "SCOUT_HOST_KV_GIB", "SCOUT_CPU_DEADLINE_MS", "SCOUT_MAX_N", "SCOUT_DRAIN_S",
                             "SCOUT_TEST_FAULTS", "SCOUT_TEST_FAULTS_ALLOW"})
KV_POOLS = ("scout", "stock")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def presets_dir() -> Path:
    import scout_sglang.configs

    return Path(scout_sglang.configs.__file__).resolve().parent


def available_presets() -> list[str]:
    return sorted(p.stem for p in presets_dir().glob("*.yaml"))


def load_preset(name_or_path: str) -> dict:
    """Fields of a preset name or YAML path, checked against ScoutConfig's fields."""
    path = Path(name_or_path)
    if not (path.suffix in (".yaml", ".yml") and path.exists()):
        path = presets_dir() / f"{name_or_path}.yaml"
    if not path.exists():
        raise ValueError(
            f"{CONFIG_VARIABLE}={name_or_path!r} is neither a preset ({', '.join(available_presets())}) "
            "nor an existing .yaml file"
        )
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"preset {path} must be a mapping of setting: value, got {type(data).__name__}")
    unknown = sorted(set(data) - set(FIELD_TYPES) - {"extra"})
    if unknown:
        raise ValueError(f"preset {path} has unknown settings {unknown}; accepted: {sorted(FIELD_TYPES)}")
    for key in ("dense_layers", "recall_intervals"):
        if key in data:
            data[key] = tuple(data[key])
    return data


def parse_value(name: str, text: str):
    """Parse the text of SCOUT_<NAME> into the type of ScoutConfig.<name>."""
    variable = PREFIX + name.upper()
    annotation = FIELD_TYPES[name]
    optional = "None" in annotation
    if optional and text.strip().lower() in ("", "none", "auto"):
        return None
    try:
        if annotation.startswith("tuple"):
            return tuple(int(part) for part in text.replace(" ", "").split(",") if part)
        if annotation.startswith("bool"):
            lowered = text.strip().lower()
            if lowered not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise ValueError
            return lowered in ("1", "true", "yes", "on")
        if annotation.startswith("int"):
            return int(text)
        if annotation.startswith("float"):
            return float(text)
    except ValueError:
        kind = annotation.split(" ")[0].split("[")[0]
        raise ValueError(f"{variable}={text!r} is not a valid {kind}") from None
    value = text.strip()
    if name in CHOICES and value not in CHOICES[name]:
        accepted = ", ".join("none" if c is None else c for c in CHOICES[name])
        raise ValueError(f"{variable}={text!r} is not accepted; accepted values: {accepted}")
    return value


def config_from_env(environ: Mapping[str, str] | None = None) -> ScoutConfig:
    """ScoutConfig from SCOUT_CONFIG (default preset) and SCOUT_<FIELD> overrides."""
    environ = os.environ if environ is None else environ
    fields = load_preset(environ.get(CONFIG_VARIABLE, DEFAULT_PRESET))
    problems = []
    for variable, text in sorted(environ.items()):
        if not variable.startswith(PREFIX) or variable in OTHER_VARIABLES:
            continue
        name = variable[len(PREFIX) :].lower()
        if name not in FIELD_TYPES:
            accepted = ", ".join(sorted(PREFIX + n.upper() for n in FIELD_TYPES) + sorted(OTHER_VARIABLES))
            problems.append(f"unknown setting {variable}; accepted: {accepted}")
            continue
        try:
            fields[name] = parse_value(name, text)
        except ValueError as error:
            problems.append(str(error))
    if problems:
        raise ValueError("invalid SCOUT_* settings:\n  - " + "\n  - ".join(problems))
    try:
        return ScoutConfig(**fields)
    except ValueError as error:
        raise ValueError(f"{error}\n(each setting NAME comes from the preset or from SCOUT_<NAME>)") from None



@dataclasses.dataclass(frozen=True)
class PoolSettings:
    """How the server's KV pool is built (sglang_adapter/kv_pool.py).

    kv_pool : SCOUT_KV_POOL, "scout" (default: a logical capacity held in host memory, the device holds
        only what co-attention needs) or "stock" (SGLang's own device pool, every token on the device)
    host_kv_gib : SCOUT_HOST_KV_GIB, the host memory for K/V in GiB (the whole server's: tensor-parallel ranks
        on a host split it); sets the logical capacity instead of --max-total-tokens
    """

    kv_pool: str = "scout"
    host_kv_gib: float | None = None


def pool_settings_from_env(environ: Mapping[str, str] | None = None) -> PoolSettings:
    environ = os.environ if environ is None else environ
    kv_pool = environ.get("SCOUT_KV_POOL", "scout").strip()
    if kv_pool not in KV_POOLS:
        raise ValueError(f"SCOUT_KV_POOL={kv_pool!r} is not accepted; accepted values: {', '.join(KV_POOLS)}")
    host_kv_gib = _number(environ, "SCOUT_HOST_KV_GIB", None, float, "a number of GiB", lambda v: v > 0,
                          "must be positive")
    return PoolSettings(kv_pool, host_kv_gib)


def _number(environ: Mapping[str, str], name: str, default, parse, unit: str, valid, rule: str):
    """A numeric setting: `default` when unset; refused, naming the variable, when `parse` fails
    ("is not <unit>") or `valid` does not hold ("<rule>")."""
    text = environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = parse(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} is not {unit}") from None
    if not valid(value):
        raise ValueError(f"{name}={text!r} {rule}")
    return value


def native_build_dir(environ: Mapping[str, str] | None = None) -> Path | None:
    """SCOUT_NATIVE_BUILD_DIR: where the native CPU attention kernel is built and cached (created when
    missing); None when unset, and torch's extension cache (TORCH_EXTENSIONS_DIR) is used."""
    environ = os.environ if environ is None else environ
    text = environ.get("SCOUT_NATIVE_BUILD_DIR", "").strip()
    if not text:
        return None
    path = Path(text).expanduser().resolve()
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is None or not existing.is_dir():
        raise ValueError(f"SCOUT_NATIVE_BUILD_DIR={text!r} is not accepted: {existing} is not a directory; expected "
                         "a directory (existing, or one that can be created) for the native CPU kernel's build")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"SCOUT_NATIVE_BUILD_DIR={text!r} is not accepted: {existing} is not writable; expected a "
                         "writable directory for the native CPU kernel's build")
    return path


def log_level(environ: Mapping[str, str] | None = None) -> int | None:
    """SCOUT_LOG_LEVEL: the level of the `scout_sglang` loggers (a name, any case); None when unset."""
    environ = os.environ if environ is None else environ
    text = environ.get("SCOUT_LOG_LEVEL", "").strip()
    if not text:
        return None
    if text.upper() not in LOG_LEVELS:
        raise ValueError(f"SCOUT_LOG_LEVEL={text!r} is not accepted; accepted values: {', '.join(LOG_LEVELS)}")
    return getattr(logging, text.upper())


# A layer's CPU part at the default preset reads at most 64 requests x 8 KV heads x 64 blocks of 32 tokens
# x 128 dims of bf16 K and V (512 MiB): ~80 ms at the 7 GB/s the native kernel reaches on a 2-core host
# (benchmarks/results/cpu_attention.md). The default deadline is ten times that: a task later than this
# is stuck or starved, and the layer computing the part itself costs less than waiting on.
DEFAULT_CPU_DEADLINE_MS = 1000.0


def cpu_deadline_ms(environ: Mapping[str, str] | None = None) -> float:
    """SCOUT_CPU_DEADLINE_MS: milliseconds after its submit that a layer waits for its CPU part before
    computing it itself from the host store (default DEFAULT_CPU_DEADLINE_MS)."""
    return _number(os.environ if environ is None else environ, "SCOUT_CPU_DEADLINE_MS", DEFAULT_CPU_DEADLINE_MS,
                   float, "a number of milliseconds", lambda v: v > 0, "must be positive")


# A request asking for n sequences costs n times the decode slots and host K/V of one; past this many, one
# client could fill the server's request slots (--max-running-requests, 64 by default) by itself.
DEFAULT_MAX_N = 16
# Kubernetes sends SIGKILL 30 s after SIGTERM by default; 25 s of drain leaves the rest for the shutdown.
DEFAULT_DRAIN_S = 25.0


def max_n(environ: Mapping[str, str] | None = None) -> int:
    """SCOUT_MAX_N: the most sequences one HTTP request may start (its `n` times its prompts); beyond it
    the request gets HTTP 400 (default DEFAULT_MAX_N)."""
    return _number(os.environ if environ is None else environ, "SCOUT_MAX_N", DEFAULT_MAX_N, int,
                   "a whole number of sequences", lambda v: v >= 1, "must be at least 1")


def drain_seconds(environ: Mapping[str, str] | None = None) -> float:
    """SCOUT_DRAIN_S: seconds after SIGTERM that unfinished requests may still finish before they are
    aborted and the server exits (default DEFAULT_DRAIN_S)."""
    return _number(os.environ if environ is None else environ, "SCOUT_DRAIN_S", DEFAULT_DRAIN_S, float,
                   "a number of seconds", lambda v: v >= 0, "must be 0 or more")


def injected_faults(environ: Mapping[str, str] | None = None):
    """SCOUT_TEST_FAULTS (tests only): faults the CPU worker threads inject into their own work, e.g.
    `cpu_raise:0.1,cpu_delay_ms:300,cpu_delay:0.1,seed:1`, and requests whose engine state the backend drops,
    `request_state:victim` (cpu_worker/faults.py) -> FaultPlan, or None
    when unset. Refused unless running under pytest (PYTEST_CURRENT_TEST is set) or SCOUT_TEST_FAULTS_ALLOW=1."""
    from scout_sglang.cpu_worker.faults import FaultPlan

    environ = os.environ if environ is None else environ
    text = environ.get("SCOUT_TEST_FAULTS", "").strip()
    if not text:
        return None
    if "PYTEST_CURRENT_TEST" not in environ and environ.get("SCOUT_TEST_FAULTS_ALLOW", "").strip() != "1":
        raise ValueError(f"SCOUT_TEST_FAULTS={text!r} is for tests: it is refused outside pytest unless "
                         "SCOUT_TEST_FAULTS_ALLOW=1 is set as well")
    try:
        return FaultPlan.parse(text)
    except ValueError as error:
        raise ValueError(f"SCOUT_TEST_FAULTS={text!r} is not accepted: {error}") from None


def triton_interpreter_enabled() -> bool:
    """Whether Triton kernels run in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"
