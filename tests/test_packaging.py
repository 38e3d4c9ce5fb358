"""The built wheel carries every subpackage and the native sources, and imports."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_ROOTS = {"scout_sglang": "scout_sglang", "scout_sglang.kernels": "kernels", "scout_sglang.cpu_worker": "cpu_worker", "scout_sglang.configs": "configs"}


def expected_modules():
    """Every .py under the mapped folders, as its path inside the wheel."""
    names = set()
    for package, folder in PACKAGE_ROOTS.items():
        for path in (ROOT / folder).rglob("*.py"):
            relative = path.relative_to(ROOT / folder)
            if "__pycache__" in relative.parts:
                continue
            names.add("/".join([*package.split("."), *relative.parts]))
    return names


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
        check=True,
        cwd=out,
    )
    (path,) = out.glob("scout_sglang-*.whl")
    return path


def test_wheel_contains_every_module_and_native_source(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = expected_modules() - names
    assert not missing, f"missing from the wheel: {sorted(missing)}"
    native = {str(p.relative_to(ROOT / "cpu_worker")) for p in (ROOT / "cpu_worker" / "native").iterdir()}
    assert any(n.endswith(".h") for n in native) and any(n.endswith(".cpp") for n in native)
    missing_native = sorted(n for n in native if f"scout_sglang/cpu_worker/{n}" not in names)
    assert not missing_native, f"native sources missing from the wheel: {missing_native}"
    presets = {p.name for p in (ROOT / "configs").glob("*.yaml")}
    assert presets and all(f"scout_sglang/configs/{p}" in names for p in presets)
    for model in ("needle-llama", "ruler-llama"):
        model_files = {p.name for p in (ROOT / "scout_sglang" / "assets" / model).iterdir()}
        assert "model.safetensors" in model_files and "tokenizer.json" in model_files
        assert all(f"scout_sglang/assets/{model}/{f}" in names for f in model_files)
    assert not any(n.startswith(("kernels/", "cpu_worker/", "configs/", "tests/", "cpu_serving/", "sgl_kernel/")) for n in names), "top-level folder leaked"


def test_installed_wheel_imports_outside_the_repository(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)], check=True)
    code = "import scout_sglang.kernels, scout_sglang.cpu_worker, scout_sglang.reference; print(scout_sglang.kernels.__file__)"
    env = dict(os.environ, PYTHONPATH=str(target))
    result = subprocess.run([sys.executable, "-P", "-c", code], check=True, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert result.stdout.strip().startswith(str(target))
