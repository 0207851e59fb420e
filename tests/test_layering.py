"""The library's layers point one way: engines < protocols (notebook parameters, shared protocols) <
runner < notebooks. An engine that imports the protocol layer, the runner or a notebook's parameter
class (even inside a function) fails here, and so does any import cycle."""

import ast
import sys
from pathlib import Path

import pytest

from copes_lib.config import REPO_ROOT

PACKAGE = REPO_ROOT / "copes_lib"
# The modules above the engines: the protocol layer and the runner (command line, reports of a run).
UPPER = ("copes_lib.protocols", "copes_lib.cli")
# Modules that are neither engine nor upper: the suite's own bookkeeping, read by the runner and by
# notebook 99 (paper numbers, claims, HTML reports); a package counts with its modules.
NOT_ENGINES = ("copes_lib.claims", "copes_lib.report")


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
ENGINES = sorted(m for m in MODULES if not m.startswith(UPPER)
                 and not any(m == n or m.startswith(n + ".") for n in NOT_ENGINES))


def _imports(module: str) -> list[tuple[str, list[str], int]]:
    """(imported module, imported names, line) for every import in ``module``, at any depth."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, [], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            found.append((base, [alias.name for alias in node.names], node.lineno))
    return found


def _internal_targets(module: str) -> set[str]:
    """The copes_lib modules ``module`` imports (``from pkg import sub`` counts as ``pkg.sub``)."""
    out = set()
    for base, names, _ in _imports(module):
        for target in [base] + [f"{base}.{n}" for n in names]:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != module:
                out.add(target)
    return out


def test_engines_are_found():
    assert {"copes_lib.es", "copes_lib.grpo", "copes_lib.substrate", "copes_lib.tasks", "copes_lib.budget",
            "copes_lib.molora.lm", "copes_lib.tools.sandbox", "copes_lib.config"} <= set(ENGINES)


@pytest.mark.parametrize("module", ENGINES)
def test_engine_imports_no_protocol_runner_or_notebook_parameters(module):
    for base, names, line in _imports(module):
        where = f"{MODULES[module].relative_to(REPO_ROOT)}:{line}"
        targets = [base] + [f"{base}.{n}" for n in names]
        assert not any(t.startswith(UPPER) for t in targets), f"{where}: an engine imports {base} (upper layer)"
        params = [n for n in names if n.endswith("Params")]
        assert not params, f"{where}: an engine imports the notebook parameter class(es) {params}"


def test_no_import_cycles():
    graph = {m: _internal_targets(m) for m in MODULES}

    def is_parent(a: str, b: str) -> bool:  # a package re-exporting its submodules is no cycle
        return b.startswith(a + ".") or a.startswith(b + ".")

    cycles, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if is_parent(node, nxt):
                continue
            if state.get(nxt) == "open":
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for module in MODULES:
        if module not in state:
            visit(module, [module])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_protocols_import_no_runner():
    for module in (m for m in MODULES if m.startswith("copes_lib.protocols")):
        assert "copes_lib.cli" not in _internal_targets(module), module


def test_the_check_would_catch_a_violation(tmp_path, monkeypatch):
    """The checker itself works: a function-level import of the protocol layer is found."""
    bad = tmp_path / "copes_lib" / "bad_engine.py"
    bad.parent.mkdir()
    bad.write_text("def f():\n    from copes_lib.protocols.params import GRPONotebookParams\n")
    monkeypatch.setitem(MODULES, "copes_lib.bad_engine", bad)
    monkeypatch.setattr(sys.modules[__name__], "REPO_ROOT", tmp_path)
    with pytest.raises(AssertionError, match="upper layer"):
        test_engine_imports_no_protocol_runner_or_notebook_parameters("copes_lib.bad_engine")
