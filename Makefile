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

# The main job on the embedded default (MNIST-1D, the paper's CNN): the fp32 baseline and the Wang et al. fp8
# recipe, SEEDS seeds each, as one Hydra sweep run JOBS at a time, then the report: iterations-to-accuracy per
# format with 95% CIs, the fp8/fp32 ratio with its CI and the verdict (about 4-5 minutes on 2 quiet cores).
SEEDS ?= 0,1,2,3,4
JOBS  ?= $(shell nproc 2>/dev/null || echo 2)
train: $(STAMP)
	d=outputs/make_train/$$(date +%Y-%m-%d_%H-%M-%S); \
	$(PY) experiments/train.py -m format=fp32,fp8 seed=$(SEEDS) log=quiet checkpoint_every=0 \
	    hydra/launcher=joblib hydra.launcher.n_jobs=$(JOBS) hydra.sweep.dir=$$d && \
	$(PY) -m emunum.cli report $$d --baseline fp32

test: $(STAMP)
	NUMBA_ENABLE_CUDASIM=$(CUDASIM) $(PY) -m pytest -q tests

bench: $(STAMP)
	$(PY) benchmarks/quantize.py

clean:
	rm -rf $(VENV) build *.egg-info
