# Two entry points, each sets up .venv first:  make train  |  make test
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# CUDA kernel tests run on numba's CUDA simulator unless a real GPU is visible.
CUDASIM ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo 0 || echo 1)

.PHONY: venv train test bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned, so that nothing pulls the CUDA build
	$(PY) -m pip install -q -c constraints.txt torch
	$(PY) -m pip install -q -c constraints.txt -e ".[test,exp]"  # test brings numba-cuda for the CUDA simulator
	touch $(STAMP)

train: $(STAMP)
	$(PY) experiments/train.py

test: $(STAMP)
	NUMBA_ENABLE_CUDASIM=$(CUDASIM) $(PY) -m pytest -q tests

bench: $(STAMP)
	$(PY) benchmarks/quantize.py

clean:
	rm -rf $(VENV) build *.egg-info
