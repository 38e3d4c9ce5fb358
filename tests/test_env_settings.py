"""The SCOUT_* variables outside ScoutConfig do what they say: SCOUT_NATIVE_BUILD_DIR
is where the native CPU kernel is built, SCOUT_LOG_LEVEL is the level of the
`scout_sglang` loggers, and a bad value of either is refused by name."""

import logging

import pytest

from scout_sglang.cpu_worker import native_kernel
from scout_sglang.env import log_level, native_build_dir
from scout_sglang.sglang_adapter import plugin

# A module that needs no torch headers, so that a real build takes seconds, not a minute.
TINY_SOURCE = """#include <pybind11/pybind11.h>
int answer() { return 42; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("answer", &answer); }
"""


def test_the_build_dir_is_unset_by_default_and_resolved_when_set(tmp_path):
    assert native_build_dir({}) is None and native_build_dir({"SCOUT_NATIVE_BUILD_DIR": " "}) is None
    assert native_build_dir({"SCOUT_NATIVE_BUILD_DIR": str(tmp_path / "new" / "dir")}) == tmp_path / "new" / "dir"


def test_a_build_dir_that_is_a_file_is_refused_by_name(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for value in (blocker, blocker / "below"):
        with pytest.raises(ValueError, match=r"SCOUT_NATIVE_BUILD_DIR=.* is not a directory; expected a directory"):
            native_build_dir({"SCOUT_NATIVE_BUILD_DIR": str(value)})


def test_the_kernel_is_built_in_the_given_directory(tmp_path):
    source = tmp_path / "tiny.cpp"
    source.write_text(TINY_SOURCE)
    build = native_kernel.build_native(name="scout_build_dir_test", sources=(source,), extra_cflags=("-O0",),
                                       build_dir=tmp_path / "builds")
    assert build.module is not None, build.error
    assert build.module.answer() == 42
    assert (tmp_path / "builds" / "scout_build_dir_test") in [p.parent for p in (tmp_path / "builds").rglob("*.so")]


def test_load_native_passes_the_variable_on_and_refuses_a_bad_one(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(native_kernel, "build_native",
                        lambda build_dir: seen.append(build_dir) or native_kernel.NativeBuild(None, "x", "test"))
    monkeypatch.setenv("SCOUT_NATIVE_BUILD_DIR", str(tmp_path / "kernels"))
    native_kernel.load_native()
    assert seen == [tmp_path / "kernels"]
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("SCOUT_NATIVE_BUILD_DIR", str(tmp_path / "file"))
    with pytest.raises(ValueError, match="SCOUT_NATIVE_BUILD_DIR"):
        native_kernel.load_native()


@pytest.mark.parametrize("text, level", [("", None), ("debug", logging.DEBUG), (" WARNING ", logging.WARNING)])
def test_log_levels_are_names_in_any_case(text, level):
    assert log_level({"SCOUT_LOG_LEVEL": text}) == level


def test_a_bad_log_level_is_refused_with_the_accepted_values():
    with pytest.raises(ValueError) as error:
        log_level({"SCOUT_LOG_LEVEL": "verbose"})
    assert str(error.value) == ("SCOUT_LOG_LEVEL='verbose' is not accepted; accepted values: "
                                "DEBUG, INFO, WARNING, ERROR, CRITICAL")


@pytest.fixture
def scout_logger():
    logger = logging.getLogger("scout_sglang")
    before = logger.level
    yield logger
    logger.setLevel(before)


def test_the_plugin_applies_the_level_to_every_scout_logger(monkeypatch, scout_logger):
    monkeypatch.setenv("SCOUT_LOG_LEVEL", "debug")
    assert plugin.apply_log_level() is None
    assert scout_logger.level == logging.DEBUG
    assert logging.getLogger("scout_sglang.sglang_adapter").getEffectiveLevel() == logging.DEBUG
    monkeypatch.setenv("SCOUT_LOG_LEVEL", "error")
    plugin.apply_log_level()
    assert logging.getLogger("scout_sglang.cpu_worker").getEffectiveLevel() == logging.ERROR


def test_a_bad_log_level_stops_a_server_that_selects_scout(monkeypatch, scout_logger):
    monkeypatch.setenv("SCOUT_LOG_LEVEL", "loud")
    problem = plugin.apply_log_level()
    assert problem and "SCOUT_LOG_LEVEL='loud'" in problem
    monkeypatch.setattr(plugin, "_settings_problem", problem)
    monkeypatch.setattr(plugin, "version_problem", lambda: None)
    with pytest.raises(RuntimeError, match="SCOUT_LOG_LEVEL='loud' is not accepted; accepted values: DEBUG"):
        plugin.create_backend(model_runner=None)
