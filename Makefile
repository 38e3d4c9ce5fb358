# One entry point for set-up, tests, benchmarks and the main job.
# Every target builds the virtual environment first if it is missing, so each
# command works on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.scout-installed

.PHONY: setup test bench-quick bench demo clean

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py constraints.txt scripts/setup_env.sh scripts/setup_serving_env.sh scripts/serving-requirements.txt $(wildcard cpu_serving/*.py cpu_serving/sgl_kernel/*.py)
	PYTHON=$(PYTHON) VENV=$(VENV) bash scripts/setup_env.sh
	VENV=$(VENV) bash scripts/setup_serving_env.sh
	touch $(STAMP)

test: $(STAMP)
	$(PY) -P -m pytest -q tests

bench-quick: $(STAMP)
	$(PY) -P benchmarks/bench_cpu_attention.py --quick

bench: $(STAMP)
	$(PY) -P benchmarks/bench_cpu_attention.py
	$(PY) -P benchmarks/bench_kernels.py

# The main job: an SGLang server with --attention-backend scout on a small model
# built in place, asked through the OpenAI API; prints the answers and the
# co-attention statistics, then stops the server.
demo: $(STAMP)
	$(PY) -P -m scout_sglang.demo

clean:
	rm -rf $(VENV) build dist *.egg-info
