"""Fixtures for the training-loop tests: Hydra composition of experiments/conf and a fast default run.

Every run goes into ``tmp_path``; MNIST-1D is generated once per session into a temporary cache.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CONF = ROOT / "experiments" / "conf"

# a few quick iterations; no checkpoints unless a test asks
FAST = ["max_iters=4", "eval_every=2", "checkpoint_every=0", "log=quiet", "batch_size=32", "threads=1"]


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("emunum-cache")


@pytest.fixture
def compose(data_cache):
    """compose(*overrides) -> the composed DictConfig (fast defaults first; the data cache in tmp)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from experiments.schema import register

    register()

    def _compose(*overrides, fast: bool = True):
        ov = (FAST if fast else []) + list(overrides)
        mnist1d = not any(o.startswith("data=") for o in ov) or "data=mnist1d" in ov
        if mnist1d and not any(o.startswith("data.cache_dir=") for o in ov):
            ov.append(f"data.cache_dir={data_cache}")
        if mnist1d and fast and not any(o.startswith("data.num_samples=") for o in ov):
            ov.append("data.num_samples=5000")  # the paper's 4000/1000 split: cheaper evaluations
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return hydra_compose("train", overrides=ov)

    return _compose
