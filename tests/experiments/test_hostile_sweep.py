"""A result folder is data, never code: ``emunum tta --hardware`` on a sweep whose Hydra files
point at someone else's ``experiments`` package and data cache neither imports that code nor writes there."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[2]


def test_tta_hardware_never_imports_code_or_writes_where_a_sweep_points(compose, tmp_path, data_cache):
    evil = tmp_path / "evil"
    marker = tmp_path / "PWNED"
    (evil / "experiments" / "conf").mkdir(parents=True)
    (evil / "experiments" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    (evil / "experiments" / "models.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    evil_cache = tmp_path / "evil-cache"

    run = tmp_path / "sweep" / "0"
    (run / ".hydra").mkdir(parents=True)
    cfg = yaml.safe_load(OmegaConf.to_yaml(compose("model=mlp", "batch_size=8"), resolve=True))
    cfg["data"]["cache_dir"] = str(evil_cache)
    (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
    hydra = {"hydra": {"runtime": {"config_sources": [
        {"path": str(evil / "experiments" / "conf"), "schema": "file", "provider": "main"}]}}}
    (run / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump(hydra))
    (run / "results.json").write_text(json.dumps({
        "format": "fp32", "status": "reached", "iterations_to_accuracy": 100, "target_accuracy": 0.9,
        "best_accuracy": 0.91, "final_accuracy": 0.91, "iterations_run": 100, "seconds_per_iteration": 0.01,
        "seed": 0}))

    env = {**os.environ, "PYTHONPATH": str(ROOT), "EMUNUM_CACHE_DIR": str(data_cache)}
    r = subprocess.run([sys.executable, "-m", "emunum.cli", "tta", str(run.parent), "--hardware", "h100_like"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert not marker.exists(), "code from the result folder ran"
    assert not evil_cache.exists(), "the sweep's data.cache_dir was created"
