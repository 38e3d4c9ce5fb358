# One entry point for set-up, tests, benchmarks and the main job.
# Every target builds the virtual environment first if it is missing, so each
# command works on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.scout-installed

.PHONY: setup test mutants bench-quick bench bench-gpu bench-capacity bench-prefix validate-plan soak demo harness-setup train-retrieval train-suite bench-accuracy clean

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py constraints.txt scripts/setup_env.sh scripts/setup_serving_env.sh scripts/serving-requirements.txt benchmarks/requirements.txt $(wildcard cpu_serving/*.py cpu_serving/sgl_kernel/*.py)
	PYTHON=$(PYTHON) VENV=$(VENV) bash scripts/setup_env.sh
	VENV=$(VENV) bash scripts/setup_serving_env.sh
	touch $(STAMP)

test: $(STAMP)
	$(PY) -P -m pytest -q --durations=25 tests

# Each patch in tests/mutants breaks one thing that matters (the CPU part not
# merged, the window off by one, ...); the fast engine tests must fail on every
# one. Runs on temporary copies; the checkout is never changed.
mutants: $(STAMP)
	$(PY) -P scripts/run_mutants.py $(MUTANT_FLAGS)

bench-quick: $(STAMP)
	$(PY) -P benchmarks/bench_cpu_attention.py --quick

bench: $(STAMP)
	$(PY) -P benchmarks/bench_cpu_attention.py
	$(PY) -P benchmarks/bench_kernels.py

# The five modes on the long-context suite (ruler-llama), engine and server, with the prediction-noise
# sweep -> benchmarks/results/accuracy.{json,md,png} (about 20 minutes on 2 CPU cores).
bench-accuracy: $(STAMP)
	$(PY) -P benchmarks/bench_accuracy.py

# On a lent GPU machine (a CUDA torch and Triton already installed; no sglang, no network needed), in one call of
# at most 8 minutes (--budget-s): the headline first (decode tokens/s at equal device memory at 64k on the whole
# Qwen3-8B stack), equal batch, host overhead, whole-step graph capture, recall, the CUDA tests, the kernels
# -> benchmarks/results/gpu_<device>.{json,md,png}, written as each part finishes.
bench-gpu:
	python3 -m pip install -q --no-deps --no-build-isolation -e .
	python3 -P benchmarks/bench_gpu.py

# The scout KV pool against SGLang's stock pool at one device KV budget, measured
# with SGLang's own bench_serving (which needs the datasets package).
bench-capacity: $(STAMP)
	$(VENV)/bin/pip install -q -c constraints.txt -r benchmarks/requirements.txt
	$(PY) -P benchmarks/bench_capacity.py

# Prefix reuse: scout with SGLang's radix cache against scout without it and the stock backend with it, on
# SGLang's generated-shared-prefix workload (bench_serving) -> benchmarks/results/prefix.{json,md,png}.
bench-prefix: $(STAMP)
	$(PY) -P benchmarks/bench_prefix.py

# A real scout server under 10 minutes of mixed OpenAI traffic (64 clients, chat and
# completions, streamed and not, 10% disconnects, 5% of CPU tasks failing on purpose);
# every completed answer checked against the reference decoder; then a load ramp of a resident-first server
# (benchmarks/results/soak.*).
soak: $(STAMP)
	$(PY) -P benchmarks/soak.py --faults 0.05

# The planner (python -m scout_sglang.plan) against real CPU servers: capacity exact,
# step time within 30% with one CPU core as the device (benchmarks/results/plan_validation.md; about 8 minutes).
validate-plan: $(STAMP)
	$(VENV)/bin/pip install -q -c constraints.txt -r benchmarks/requirements.txt
	$(PY) -P benchmarks/validate_plan.py

# The main job: an SGLang server with --attention-backend scout on a small model
# built in place, asked through the OpenAI API; prints the answers and the
# co-attention statistics, then stops the server.
demo: $(STAMP)
	$(PY) -P -m scout_sglang.demo

# Retrains the bundled retrieval model (about 10 minutes on 2 CPU cores).
train-retrieval: $(STAMP)
	$(PY) -P -m scout_sglang.retrieval.train --out scout_sglang/assets/needle-llama

# Retrains the bundled suite model (8 layers, four long-context tasks) from the bundled
# needle model: a first run, then eight resumed runs, those with --mix values weighted to `values`.
# The first six take about 40 + 35 + 30 + 7 + 38 + 20 minutes on 2 CPU cores, the last three
# about 100 more there; they ran on one H100 (train_suite trains on a GPU when torch sees one),
# in 5.5 + 2 + 2.5 minutes with two or three runs sharing it.
SUITE = $(PY) -P -m scout_sglang.retrieval.train_suite
train-suite: $(STAMP)
	$(SUITE) --out build/suite-stage1
	$(SUITE) --resume build/suite-stage1 --steps 1500 --lr 7e-4 --out build/suite-stage2
	$(SUITE) --resume build/suite-stage2 --steps 1200 --lr 5e-4 --out build/suite-stage3
	$(SUITE) --resume build/suite-stage3 --mix values --steps 300 --lr 5e-4 --out build/suite-stage4
	$(SUITE) --resume build/suite-stage4 --mix values --steps 1500 --lr 5e-4 --out build/suite-stage5
	$(SUITE) --resume build/suite-stage5 --steps 800 --lr 3e-4 --out build/suite-stage6
	$(SUITE) --resume build/suite-stage6 --mix values --steps 2050 --lr 3e-4 --out build/suite-stage7
	$(SUITE) --resume build/suite-stage7 --steps 800 --lr 2e-4 --out build/suite-stage8
	$(SUITE) --resume build/suite-stage8 --mix values --steps 1300 --lr 2e-4 --out scout_sglang/assets/ruler-llama

# lm-evaluation-harness in its own environment, for benchmarks/harness/ruler_lm_eval.py.
harness-setup: .venv-harness/.installed

.venv-harness/.installed: benchmarks/harness/requirements.txt
	$(PYTHON) -m venv .venv-harness
	.venv-harness/bin/pip install -q -r benchmarks/harness/requirements.txt
	touch $@

clean:
	rm -rf $(VENV) .venv-harness build dist *.egg-info
