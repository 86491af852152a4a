"""A script of ``benchmarks/`` (not a package) loaded as a module, for the tests of its helpers."""
from __future__ import annotations

import importlib.util
import os
from types import ModuleType

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load(name: str) -> ModuleType:
    """``benchmarks/<name>.py``, executed as the module ``name``."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "benchmarks", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
