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
import tempfile
import time
import urllib.request

STARTUP_TIMEOUT_S = 240
STOP_MARGIN_S = 10
PORT_ATTEMPTS = 3  # a port found free can be taken before the server binds it (another process's random port)
DEVICE_ARGS = {"cpu": ("--device", "cpu", "--sleep-on-idle"), "cuda": ()}  # CUDA: decode graphs on (full)


class PortTaken(RuntimeError):
    """The process could not bind the port it was given: another process took it after free_port found it free."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def launched_on_free_port(command_for, health_path: str, *, env: dict, log_path=None, what: str = "server",
                          stop_timeout: float = 30):
    """launched_process(command_for(port), its health URL) on a free loopback port; if another process takes that
    port before the command binds it, starts again on a new one (PORT_ATTEMPTS in all).
    Yields (port, process)."""
    with contextlib.ExitStack() as stack:
        for attempt in range(1, PORT_ATTEMPTS + 1):
            port = free_port()
            try:
                process = stack.enter_context(launched_process(
                    command_for(port), f"http://127.0.0.1:{port}{health_path}", env=env, log_path=log_path,
                    what=what, stop_timeout=stop_timeout, port=port))
                break
            except PortTaken:
                if attempt == PORT_ATTEMPTS:
                    raise
        yield port, process


@contextlib.contextmanager
def launched_server(model_path, *args: str, env: dict | None = None, log_path=None, device: str = "cpu"):
    """Yields the base URL of a running server; raises with the log tail if it fails to start."""
    with launched_server_process(model_path, *args, env=env, log_path=log_path, device=device) as (base, _):
        yield base


@contextlib.contextmanager
def launched_server_process(model_path, *args: str, env: dict | None = None, log_path=None, device: str = "cpu"):
    """Yields (base URL, the server's main process: the leader of its own process group)."""
    from scout_sglang.env import drain_seconds

    def command(port):
        return [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model_path),
                "--host", "127.0.0.1", "--port", str(port), *DEVICE_ARGS[device], *args]

    environment = dict(os.environ, **(env or {}))
    if device == "cpu":
        environment["SGLANG_USE_CPU_ENGINE"] = "1"
    with launched_on_free_port(command, "/health", env=environment, log_path=log_path, what="server",
                               stop_timeout=drain_seconds(environment) + STOP_MARGIN_S) as (port, process):
        yield f"http://127.0.0.1:{port}", process


@contextlib.contextmanager
def launched_process(command: list[str], health_url: str, *, env: dict, log_path=None, what: str = "server",
                     stop_timeout: float = 30, port: int | None = None):
    """Starts `command` in its own process group, waits until `health_url` answers 200, and on exit stops the
    whole group (SIGTERM, then SIGKILL after `stop_timeout` s), so no child process outlives it.
    Raises PortTaken as soon as the log says `port` is already in use (uvicorn logs it and does not exit)."""
    with contextlib.ExitStack() as stack:
        if log_path is None:  # a log to read the bind error and the tail from, removed on exit
            log_path = os.path.join(stack.enter_context(tempfile.TemporaryDirectory()), "process.log")
        with _started(command, health_url, env, log_path, what, stop_timeout, port) as process:
            yield process


@contextlib.contextmanager
def _started(command, health_url, env, log_path, what, stop_timeout, port):
    log = open(log_path, "w+")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            exited = process.poll() is not None
            if port is not None and port_taken(log_path, port):
                raise PortTaken(f"{what} could not bind port {port}:\n{tail(log_path)}")
            if exited:
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


def port_taken(log_path, port: int) -> bool:
    """Whether the log has a bind error that names `port` (uvicorn: "... ('127.0.0.1', PORT): address already in
    use"; Python: "[Errno 98] Address already in use")."""
    with open(log_path, errors="replace") as handle:
        return any("address already in use" in line.lower() and str(port) in line for line in handle)


def tail(log_path, lines: int = 40) -> str:
    if not log_path:
        return "(no log)"
    with open(log_path) as handle:
        return "".join(handle.readlines()[-lines:])
