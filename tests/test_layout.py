"""The package layout's rules: no two modules of ``emunum``, ``emunum.kernels`` or ``experiments`` import each
other, even lazily (through a chain of any length); ``emunum.formats`` imports nothing above it; and the library
(``emunum``, its kernels) never imports the ``experiments`` harness that is built on it."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _modules() -> dict[str, Path]:
    mods = {}
    for base, pkg in ((ROOT / "emunum", "emunum"), (ROOT / "kernels", "emunum.kernels"),
                      (ROOT / "experiments", "experiments")):
        for p in base.rglob("*.py"):
            if p.is_symlink() or any(part.startswith(".") for part in p.parts):
                continue
            rel = p.relative_to(base).with_suffix("")
            parts = [pkg, *rel.parts]
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join(parts)
            if name.startswith("emunum.kernels") and base.name == "emunum":
                continue  # a development symlink emunum/kernels -> ../kernels
            mods[name] = p
    return mods


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every emunum module that ``name`` imports anywhere in its file (function-level imports included)."""
    is_pkg = path.name == "__init__.py"
    package = name if is_pkg else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def _graph():
    mods = _modules()
    known = set(mods)
    return {m: {t for t in _imports(m, p, known) if not m.startswith(t + ".") and t != m} for m, p in mods.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_two_modules_import_each_other_even_lazily():
    assert _cycles(_graph()) == []


def test_cycle_finder_finds_a_planted_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("low", ["emunum.formats", "emunum.rng"])
def test_lower_layers_import_nothing_above_them(low):
    graph = _graph()
    allowed = ("emunum.formats", "emunum.rng", "emunum.kernels.abi")  # the ABI imports nothing from emunum
    for mod, deps in graph.items():
        if mod == low or mod.startswith(low + "."):
            assert all(d.startswith(allowed) for d in deps), (mod, sorted(deps))


def test_the_library_never_imports_the_harness():
    graph = _graph()
    for mod, deps in graph.items():
        if not mod.startswith("experiments"):
            assert not any(d.startswith("experiments") for d in deps), (mod, sorted(deps))


def _imports_by_name(path: Path) -> list[int]:
    """Lines calling ``importlib.import_module`` or ``__import__``: imports this graph cannot see."""
    return [n.lineno for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call) and (
        (isinstance(n.func, ast.Attribute) and n.func.attr == "import_module")
        or (isinstance(n.func, ast.Name) and n.func.id in ("__import__", "import_module")))]


def test_the_library_imports_no_module_by_a_computed_name():
    # The package root is exempt: it sits above every layer, and its PEP 562 __getattr__ loads its own
    # submodules on first use (``import emunum`` stays lean); no layer below imports by name.
    found = {m: lines for m, p in _modules().items() if not m.startswith("experiments") and m != "emunum"
             for lines in [_imports_by_name(p)] if lines}
    assert found == {}


def test_imports_by_name_are_found(tmp_path):
    (tmp_path / "m.py").write_text("import importlib\nx = importlib.import_module('experiments.models')\n")
    assert _imports_by_name(tmp_path / "m.py") == [2]


def test_layout_covers_the_harness_and_finds_a_planted_harness_cycle(tmp_path):
    mods = _modules()
    assert {"experiments.data", "experiments.text_data", "experiments.loop"} <= set(mods)
    (tmp_path / "a.py").write_text("from . import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from . import a\n")
    known = {"experiments.a", "experiments.b"}
    graph = {m: _imports(m, tmp_path / (m.split(".")[1] + ".py"), known) for m in known}
    assert _cycles(graph) == [["experiments.a", "experiments.b"]]
