"""The launcher's port handling, with a real uvicorn server: a port that free_port found free can be taken by
another process before the server binds it (in CI, a PD pair's prefill server lost its port to the decode
server's start-up and hung for 240 s). The launcher sees the bind error in the log and starts again elsewhere."""

import socket
import sys
import time

import pytest

from scout_sglang.server import launch

APP = '''
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})
'''


@pytest.fixture
def taken_port():
    """A port held by a listening socket for the test's duration."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def uvicorn_command(app_dir):
    return lambda port: [sys.executable, "-m", "uvicorn", "--app-dir", str(app_dir), "health_app:app",
                         "--host", "127.0.0.1", "--port", str(port)]


def ports(monkeypatch, first: int):
    """free_port answers `first` once, then truly free ports; returns the list of ports it answered."""
    answered = []
    real = launch.free_port

    def free_port():
        answered.append(first if not answered else real())
        return answered[-1]

    monkeypatch.setattr(launch, "free_port", free_port)
    return answered


def test_a_server_that_loses_its_port_starts_again_on_another(tmp_path, taken_port, monkeypatch):
    (tmp_path / "health_app.py").write_text(APP)
    answered = ports(monkeypatch, taken_port)
    with launch.launched_on_free_port(uvicorn_command(tmp_path), "/", env={}, log_path=tmp_path / "log") as (
            port, process):
        assert answered[0] == taken_port and port == answered[1] != taken_port
        assert process.poll() is None


def test_a_port_taken_on_every_attempt_is_a_clear_error_not_a_start_up_timeout(tmp_path, taken_port, monkeypatch):
    (tmp_path / "health_app.py").write_text(APP)
    monkeypatch.setattr(launch, "free_port", lambda: taken_port)
    started = time.monotonic()
    with pytest.raises(launch.PortTaken, match=f"could not bind port {taken_port}"):
        with launch.launched_on_free_port(uvicorn_command(tmp_path), "/", env={}):
            pass
    assert time.monotonic() - started < launch.STARTUP_TIMEOUT_S  # seen in the log, not waited out


def test_the_bind_error_counts_only_for_the_port_the_process_was_given(tmp_path):
    log = tmp_path / "log"
    log.write_text("ERROR: [Errno 98] error while attempting to bind on address ('127.0.0.1', 4242): "
                   "address already in use\n")
    assert launch.port_taken(log, 4242)
    assert not launch.port_taken(log, 4243)
