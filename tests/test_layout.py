"""The package layout's rules: no two modules import each other, even lazily (through a chain
of any length), and ``emunum.formats`` imports nothing above it."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _modules() -> dict[str, Path]:
    mods = {}
    for base, pkg in ((ROOT / "emunum", "emunum"), (ROOT / "kernels", "emunum.kernels")):
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
