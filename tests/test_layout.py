"""The house's layout by concern (issue 22): every package sits on a layer and imports only its own layer and the
layers below it; no import circles anywhere; the mechanism and the policies import neither simpy nor torch; no
function in the package is longer than 80 lines. Read from the source (``ast``), so an import inside a function or
under ``TYPE_CHECKING`` counts as much as one at the top of a module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import dvasim

ROOT = Path(dvasim.__file__).parent

# lowest first; a module belongs to the longest prefix that names it
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundation", ("dvasim.errors", "dvasim.paths", "dvasim.schema", "dvasim.outputs", "dvasim.progress",
                    "dvasim.compiled")),
    ("mechanism", ("dvasim.core",)),
    ("policies", ("dvasim.policies",)),
    ("model data", ("dvasim.model",)),
    ("workloads", ("dvasim.workload",)),
    ("serving stacks", ("dvasim.server",)),
    ("config", ("dvasim.config",)),
    ("reporting", ("dvasim.reporting",)),
    ("engines", ("dvasim.engines",)),
    ("one run", ("dvasim.api",)),
    ("studies", ("dvasim.studies",)),
    ("fitting", ("dvasim.fitting",)),
    ("command line", ("dvasim.cli", "dvasim.__main__")),
    ("the package", ("dvasim",)),
)
NO_SIMPY_NO_TORCH = ("dvasim.core", "dvasim.policies")
MAX_FUNCTION_LINES = 80


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _imports(name: str) -> set[str]:
    """The modules ``name`` imports: dvasim modules by their full name, others by their top-level name."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for a in node.names:  # ``from pkg import module`` imports the module
                out.add(f"{target}.{a.name}" if f"{target}.{a.name}" in MODULES else target)
    return {m if m.startswith("dvasim") else m.split(".")[0] for m in out} - {name}


def layer_of(name: str) -> int:
    best, where = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (name == p or name.startswith(p + ".")) and len(p) > best:
                best, where = len(p), i
    assert where is not None, f"{name} is on no layer: add it to LAYERS and to the package docstrings"
    return where


GRAPH = {m: {i for i in _imports(m) if i.startswith("dvasim")} for m in MODULES}


def test_every_module_is_on_a_layer():
    for m in MODULES:
        layer_of(m)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_point_down(name):
    """A module imports its own layer and the layers below; never one above."""
    mine = layer_of(name)
    up = sorted(i for i in GRAPH[name] if layer_of(i) > mine)
    assert not up, (f"{name} ({LAYERS[mine][0]}) imports {up[0]} ({LAYERS[layer_of(up[0])][0]}), a layer above "
                     "it; move the shared piece down or pass it in")


def test_no_import_circles():
    """Tarjan's strongly connected components over every module's imports: each must be a single module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in MODULES:
                continue
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
                circles.append(sorted(comp))

    for m in sorted(MODULES):
        if m not in index:
            visit(m)
    # a package's __init__ that re-exports its modules imports them, and they may import siblings through it only
    # by their full names: that is not a circle of ideas, so a package with its own submodules is left out
    real = [c for c in circles if not all(any(o.startswith(m + ".") for o in c) or
                                          any(m.startswith(o + ".") for o in c) for m in c)]
    assert not real, f"import circles: {real}"


@pytest.mark.parametrize("prefix", NO_SIMPY_NO_TORCH)
def test_mechanism_and_policies_import_neither_simpy_nor_torch(prefix):
    for m in MODULES:
        if m == prefix or m.startswith(prefix + "."):
            bad = _imports(m) & {"simpy", "torch"}
            assert not bad, f"{m} imports {sorted(bad)[0]}: the mechanism and the policies are plain objects"


def test_no_function_longer_than_80_lines():
    long = []
    for m, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{m}.{node.name} ({n} lines)")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {', '.join(sorted(long))}"


@pytest.mark.parametrize("name", sorted(m for m in MODULES if MODULES[m].name == "__init__.py"))
def test_each_package_says_what_it_holds_and_may_import(name):
    doc = ast.get_docstring(ast.parse(MODULES[name].read_text(encoding="utf-8"))) or ""
    assert len(doc) > 40, f"{name} has no docstring saying what it holds"
    if name != "dvasim":
        assert "may import" in doc.lower(), f"{name}'s docstring does not say what it may import"


def test_layers_match_the_docs():
    """The documentation's "How it is built" (docs/concepts/architecture.md) names every layer, in order."""
    page = (ROOT.parent / "docs" / "concepts" / "architecture.md").read_text(encoding="utf-8")
    section = page.split("# How it is built", 1)[1].split("\n## ", 1)[0]
    pos = [section.find("\n" + prefixes[0].replace(".", "/")) for _, prefixes in LAYERS[1:-1]]
    assert all(p >= 0 for p in pos), [LAYERS[1 + i][1][0] for i, p in enumerate(pos) if p < 0]
    assert pos == sorted(pos), "the documentation lists the layers out of order"


def test_the_simulator_imports_without_torch_and_its_layers_load():
    """In a fresh interpreter where importing torch fails (as on a machine without it), the simulator, the one-run
    API, the studies and the command line import, and nothing pulled torch in."""
    import subprocess
    import sys

    code = """
import importlib, sys
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("No module named 'torch'")
sys.meta_path.insert(0, NoTorch())
for m in ("dvasim.engines.sim", "dvasim.api", "dvasim.studies.compare", "dvasim.studies.sweep", "dvasim.cli"):
    importlib.import_module(m)
print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]", r.stdout
