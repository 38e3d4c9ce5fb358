"""Plugin registration: idempotent, adds `scout`, and a wrong sglang version
stops only a server that selects `scout`, with the version it needs."""

import pytest
from support import requires_sglang

from scout_sglang.sglang_adapter import plugin, version

pytestmark = requires_sglang


def test_registration_is_idempotent_and_adds_the_backend():
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    plugin.register()
    plugin.register()
    assert ATTENTION_BACKEND_CHOICES.count("scout") == 1
    assert ATTENTION_BACKENDS["scout"] is plugin.create_backend


def test_the_pinned_version_is_installed_here():
    assert version.version_problem() is None and version.SGLANG_VERSION == "0.5.23"


def test_another_version_is_refused_with_the_version_it_needs(monkeypatch):
    monkeypatch.setattr(version, "installed_sglang_version", lambda: "0.6.0")
    monkeypatch.setattr(plugin, "version_problem", version.version_problem)
    with pytest.raises(RuntimeError, match=r"needs sglang==0\.5\.23, found 0\.6\.0"):
        plugin.create_backend(model_runner=None)
