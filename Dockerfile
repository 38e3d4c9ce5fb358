# GPU serving image: the official SGLang image at the pinned version, plus this plugin.
# SGLang finds the plugin through its `sglang.srt.plugins` entry point and serves it
# as `--attention-backend scout`. tests/test_dockerfile.py checks this file.
#
#   docker build -t scout-sglang .
#   docker run --gpus all -p 30000:30000 -v /path/to/model:/models/model scout-sglang

# Must equal pyproject.toml's `sglang==` pin and scout_sglang/sglang_adapter/version.py.
ARG SGLANG_VERSION=0.5.23
FROM lmsysorg/sglang:v${SGLANG_VERSION}

WORKDIR /opt/scout-sglang

# Only what the wheel is built from: setup.py maps kernels/, cpu_worker/ and configs/
# into scout_sglang.*. cpu_serving/ (CPU-only test stand-ins) must never be copied here.
COPY pyproject.toml setup.py README.md ./
COPY scout_sglang/ scout_sglang/
COPY kernels/ kernels/
COPY cpu_worker/ cpu_worker/
COPY configs/ configs/

# --no-deps keeps the image's CUDA torch and its sglang; numpy, pyyaml and triton are
# already in the image, and the import below fails the build if one is not.
RUN pip install --no-cache-dir --no-deps . \
    && python3 -c "import numpy, yaml, scout_sglang.sglang_adapter.plugin"

# SCOUT_CONFIG: a preset (default, tiny, qwen3-8b, llama-3.1-8b) or a YAML path;
# SCOUT_<FIELD> variables override single settings. SCOUT_HOST_KV_GIB: host memory for the
# K/V the scout pool holds (its logical capacity); start-up refuses a value above 90% of
# the host memory free, so set it to what your host can give (`docker run -e`).
ENV SCOUT_CONFIG=default
ENV SCOUT_HOST_KV_GIB=64
ENV MODEL_PATH=/models/model

EXPOSE 30000

# Decode CUDA graphs stay on: the backend switches them to SGLang's breakable graphs (not yet run
# on a GPU). --page-size 32 (the default preset's block size) keeps SGLang's radix cache: shared prompt
# prefixes are reused and held once (docs/deployment.md, "Prefix reuse").
# `sh -c` expands $MODEL_PATH; `exec` lets the server receive docker's signals.
CMD ["sh", "-c", "exec python3 -m sglang.launch_server --model-path \"$MODEL_PATH\" --attention-backend scout --page-size 32 --host 0.0.0.0 --port 30000"]
