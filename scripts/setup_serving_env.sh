#!/usr/bin/env bash
# Installs a real SGLang 0.5.23 CPU server into the project's virtual environment
# sglang and the packages its CPU server path imports,
# without letting pip replace the CPU torch (constraints.txt). On a machine
# without an NVIDIA GPU it also installs the test-only stand-ins of cpu_serving/
# (a pure-torch sgl_kernel and the torchvision op schemas); a GPU deployment
# uses the official SGLang image instead (see Dockerfile) and never gets them.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY="$VENV/bin/python"
export PIP_CONSTRAINT="$PWD/constraints.txt"
PIP=("$PY" -m pip install -q)

echo "[serving] installing sglang 0.5.23 (no dependencies) and its CPU server imports"
"${PIP[@]}" --no-deps sglang==0.5.23 torchvision==0.28.0 xgrammar==0.2.7
"${PIP[@]}" -r scripts/serving-requirements.txt
# SGLang's bench_serving (benchmarks/bench_prefix.py and bench_capacity.py; bench_prefix --quick runs in the tests)
"${PIP[@]}" -r benchmarks/requirements.txt

# The Mooncake transfer engine (PD disaggregation) loads libibverbs even when it moves K/V over TCP.
if ldconfig -p 2>/dev/null | grep -q 'libibverbs\.so\.1'; then
  echo "[serving] libibverbs1 present"
elif command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "[serving] installing libibverbs1 (Mooncake transfer engine, PD disaggregation)"
  apt-get install -y -q libibverbs1 >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q libibverbs1 >/dev/null; }
else
  echo "[serving] WARNING: libibverbs1 is missing and cannot be installed here (needs apt-get as root):"
  echo "[serving]   install it with your system's package manager, or the PD test (tests/test_sglang_pd.py) is skipped"
fi

if command -v nvidia-smi >/dev/null 2>&1; then
  echo "[serving] NVIDIA GPU present: not installing the CPU stand-ins"
else
  site=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  echo "[serving] CPU-only machine: installing the test stand-ins into $site"
  rm -rf "$site/sgl_kernel"
  cp -r cpu_serving/sgl_kernel "$site/"
  cp cpu_serving/scout_cpu_serving_shims.py cpu_serving/scout_cpu_serving_shims.pth "$site/"
  cp cpu_serving/scout_cpu_serving_pd.py cpu_serving/scout_cpu_serving_pd.pth "$site/"
  echo "[serving] CPU-only machine: installing the non-CUDA Mooncake transfer engine (PD over TCP)"
  "${PIP[@]}" mooncake-transfer-engine-non-cuda==0.3.13.post1
fi
SGLANG_USE_CPU_ENGINE=1 "$PY" -P -c "import sglang; from sglang.srt.entrypoints import http_server; print('[serving] sglang', sglang.__version__, 'imports')" 2>&1 | grep '^\[serving\]'
