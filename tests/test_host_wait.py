"""The host waits for a GPU by sleeping on a blocking-sync event, never by spinning (core/host_wait.py): checked
with a stand-in for torch's CUDA event here, and no waiting path of the engine calls a spinning wait."""

import ast
from pathlib import Path

import torch

from scout_sglang.core import host_wait

ROOT = Path(__file__).resolve().parents[1]


class FakeEvent:
    made = []

    def __init__(self, blocking=False, **kwargs):
        self.blocking, self.recorded, self.waited = blocking, None, False
        FakeEvent.made.append(self)

    def record(self, stream=None):
        self.recorded = stream

    def synchronize(self):
        self.waited = True


def test_waiting_for_a_gpu_sleeps_on_a_blocking_event(monkeypatch):
    FakeEvent.made = []
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: f"stream of {device}")
    host_wait.wait_for_device("cuda:1")
    [event] = FakeEvent.made
    assert event.blocking and event.waited and event.recorded == "stream of cuda:1"
    host_wait.wait_for_device("cpu")  # a CPU device: nothing to wait for
    assert len(FakeEvent.made) == 1


def test_no_engine_path_waits_for_the_gpu_by_spinning():
    """torch.cuda.synchronize, a stream's synchronize and a default (spinning) CUDA event are not used in the
    engine, its stores or the adapter: their waits go through host_wait."""
    spinning = []
    for folder in ("scout_sglang/core", "scout_sglang/sglang_adapter"):
        for path in sorted((ROOT / folder).glob("*.py")):
            if path.name == "host_wait.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.Call):
                    continue
                name = ast.unparse(node.func)
                if name.endswith("cuda.synchronize") or name.endswith("stream(self.device).synchronize") or (
                        name.endswith("cuda.Event") and not any(k.arg == "blocking" for k in node.keywords)):
                    spinning.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
    assert not spinning, spinning
