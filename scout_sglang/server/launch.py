"""Launch a real SGLang server the way users do (python -m sglang.launch_server),
on a free loopback port, and stop it with its whole process group.

On the CPU it adds `--device cpu --sleep-on-idle` and SGLANG_USE_CPU_ENGINE=1
(SGLang's CPU server path); on CUDA it adds nothing: decode CUDA graphs stay on
(SGLang's default full graphs capture the scout backend's whole step).

A scout server stops on SIGTERM within SCOUT_DRAIN_S (default 25 s) plus its
shutdown (sglang_adapter/guards.py): the stop below waits that long, plus
STOP_MARGIN_S, before it kills the process group."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

STARTUP_TIMEOUT_S = 240
STOP_MARGIN_S = 10
DEVICE_ARGS = {"cpu": ("--device", "cpu", "--sleep-on-idle"), "cuda": ()}  # CUDA: decode graphs on (full)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def launched_server(model_path, *args: str, env: dict | None = None, log_path=None, device: str = "cpu"):
    """Yields the base URL of a running server; raises with the log tail if it fails to start."""
    with launched_server_process(model_path, *args, env=env, log_path=log_path, device=device) as (base, _):
        yield base


@contextlib.contextmanager
def launched_server_process(model_path, *args: str, env: dict | None = None, log_path=None, device: str = "cpu"):
    """Yields (base URL, the server's main process: the leader of its own process group)."""
    from scout_sglang.env import drain_seconds

    port = free_port()
    command = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model_path),
               "--host", "127.0.0.1", "--port", str(port), *DEVICE_ARGS[device], *args]
    environment = dict(os.environ, **(env or {}))
    if device == "cpu":
        environment["SGLANG_USE_CPU_ENGINE"] = "1"
    base = f"http://127.0.0.1:{port}"
    with launched_process(command, base + "/health", env=environment, log_path=log_path, what="server",
                          stop_timeout=drain_seconds(environment) + STOP_MARGIN_S) as process:
        yield base, process


@contextlib.contextmanager
def launched_process(command: list[str], health_url: str, *, env: dict, log_path=None, what: str = "server",
                     stop_timeout: float = 30):
    """Starts `command` in its own process group, waits until `health_url` answers 200, and on exit stops the
    whole group (SIGTERM, then SIGKILL after `stop_timeout` s), so no child process outlives it."""
    log = open(log_path, "w+") if log_path else open(os.devnull, "w+")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{what} exited with {process.returncode} during start-up:\n{tail(log_path)}")
            try:
                with urllib.request.urlopen(health_url, timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} not healthy after {STARTUP_TIMEOUT_S} s:\n{tail(log_path)}")
            time.sleep(1)
        yield process
    finally:
        stop_group(process, stop_timeout)
        log.close()


def stop_group(process: subprocess.Popen, timeout: float = 30) -> None:
    """SIGTERM to the process group, SIGKILL to what is left of it after `timeout` s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):  # children that outlived the leader
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def tail(log_path, lines: int = 40) -> str:
    if not log_path:
        return "(no log)"
    with open(log_path) as handle:
        return "".join(handle.readlines()[-lines:])
