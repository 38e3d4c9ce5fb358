# One entry point for set-up, tests, benchmarks and the main job.
# Every target builds the virtual environment first if it is missing, so each
# command works on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.scout-installed

.PHONY: setup test bench-quick bench demo clean

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py constraints.txt scripts/setup_env.sh
	PYTHON=$(PYTHON) VENV=$(VENV) bash scripts/setup_env.sh
	touch $(STAMP)

test: $(STAMP)
	$(PY) -P -m pytest -q tests

bench-quick: $(STAMP)
	$(PY) -P benchmarks/bench_cpu_attention.py --quick

bench: $(STAMP)
	$(PY) -P benchmarks/bench_cpu_attention.py
	$(PY) -P benchmarks/bench_kernels.py

# The main job. Until the SGLang plugin lands this is the CPU co-attention
# benchmark in quick mode; it becomes the served demo with the plugin issue.
demo: bench-quick

clean:
	rm -rf $(VENV) build dist *.egg-info
