"""The layout's rules (docs/architecture.md): folders by role, the import contracts, the old paths.

``lint-imports`` (import-linter, run by ``.ci/run`` on the installed layout) checks the runtime
import rules written in ``[tool.importlinter]``; these tests check that each contract really
fails on a violation planted in a copy, the rules it leaves out (type-only imports, the names
imported, cycles through type-only imports), and that every module path of 0.2 still imports.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import loopwarden

ROOT = Path(__file__).resolve().parent.parent
#: source folder -> the package it installs as (pyproject.toml's package-dir)
SOURCES = {"core": "loopwarden", "plugins": "loopwarden.plugins", "tools": "loopwarden.tools"}


def _module_name(path: Path) -> str:
    for folder, package in SOURCES.items():
        try:
            rel = path.relative_to(ROOT / folder)
        except ValueError:
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        return ".".join([package, *parts])
    raise AssertionError(path)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for folder in SOURCES for p in sorted((ROOT / folder).rglob("*.py"))}


def _sibling(module: str) -> str:
    """The part of the package a module belongs to: ``loopwarden.X``."""
    return ".".join(module.split(".")[:2])


def test_the_top_of_the_package_is_the_public_vocabulary_and_folders_by_role() -> None:
    top = sorted(p.stem for p in (ROOT / "core").glob("*.py"))
    assert len(top) <= 21, top
    folders = {p.name for p in (ROOT / "core").iterdir() if (p / "__init__.py").is_file()}
    assert {"engine", "store", "traffic", "report", "testing", "models"} <= folders
    for folder in folders:  # each says what it is and what it may import
        doc = ast.get_docstring(ast.parse((ROOT / "core" / folder / "__init__.py").read_text()))
        assert doc and "import" in doc, f"core/{folder}/__init__.py: say what it may import"


def test_no_module_shares_a_name_prefix_with_a_sibling() -> None:
    """A shared prefix (``_store_sqlite`` beside ``_store_redis``) is a folder trying to get out."""
    folders = {p.parent for p in _modules().values() if p.is_relative_to(ROOT / "core")}
    clashes = []
    for folder in sorted(folders):
        names = [p.stem.lstrip("_") for p in folder.glob("*.py") if p.stem != "__init__"]
        names += [p.name for p in folder.iterdir() if (p / "__init__.py").is_file()]
        for name in names:
            head = name.split("_")[0]
            if "_" in name and any(o != name and o.split("_")[0] == head for o in names):
                clashes.append(f"{folder.relative_to(ROOT)}/{name}")
    assert clashes == []


_EDGES = """
import json, grimp
graph = grimp.build_graph("loopwarden", exclude_type_checking_imports=True)
part = lambda m: ".".join(m.split(".")[:2])
edges = {}
for module in graph.modules:
    for imported in graph.find_modules_directly_imported_by(module):
        if part(module) != part(imported):
            edges.setdefault(part(module), set()).add(part(imported))
print(json.dumps({k: sorted(v) for k, v in edges.items()}))
"""


def _runtime_graph(site: Path) -> dict[str, set[str]]:
    """Runtime imports between the ``loopwarden.X`` parts of the layout copy at ``site``
    (type-only imports left out), read by grimp as import-linter reads them."""
    out = subprocess.run(
        [sys.executable, "-c", _EDGES],
        env={**os.environ, "PYTHONPATH": str(site)},
        cwd=site,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return {k: set(v) for k, v in json.loads(out.stdout).items()}


def _reaches(edges: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = {start}, [start]
    while todo:
        for nxt in edges.get(todo.pop(), ()):
            if nxt == goal:
                return True
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return False


def _type_only_imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in ast.walk(node):
                if isinstance(sub, ast.ImportFrom) and (sub.module or "").startswith("loopwarden"):
                    out.append(str(sub.module))
    return out


def test_type_only_imports_close_circles_only_towards_the_public_vocabulary(
    tmp_path: Path,
) -> None:
    """A type-only import against the runtime direction (its target imports, at run time, the
    importer's part) is allowed only to the public vocabulary: a module at the top of the
    package, or a package's own ``__init__``."""
    modules = _modules()
    public = {m for m in modules if m.count(".") == 1} | {
        m for m, p in modules.items() if p.name == "__init__.py"
    }
    edges = _runtime_graph(_layout_copy(tmp_path))
    assert "loopwarden.engine" in edges and "loopwarden.plugins" in edges
    wrong = []
    for module, path in modules.items():
        for target in _type_only_imports(path):
            a, b = _sibling(module), _sibling(target)
            if a != b and _reaches(edges, b, a) and target not in public:
                wrong.append(f"{module} -> {target}")
    assert wrong == []


def _layout_copy(tmp_path: Path) -> Path:
    """The installed layout (pyproject's package-dir) as plain folders: what grimp reads."""
    site = tmp_path / "site"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "core", site / "loopwarden", ignore=ignore)
    shutil.copytree(ROOT / "plugins", site / "loopwarden" / "plugins", ignore=ignore)
    shutil.copytree(ROOT / "tools", site / "loopwarden" / "tools", ignore=ignore)
    return site


def _lint_imports(site: Path) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert exe, "import-linter is a dev dependency (pip install -e '.[dev]')"
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run(
        [exe, "--no-cache", str(ROOT / "pyproject.toml")],
        cwd=site,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

#: contract name -> (a module of the installed layout, a line that breaks that contract there):
#: every contract in [tool.importlinter] has one (checked), so a new contract comes with proof
#: that it bites
PLANTS: dict[str, tuple[str, str]] = {
    "the public vocabulary imports nothing of the machinery above it": (
        "verdicts.py",
        "import loopwarden.store",
    ),
    "the config reads nothing above it": ("config/values.py", "import loopwarden.plugin"),
    "the engine runs no plugin, deployment, demo, adapter, command, recorded-traffic, report, "
    "docs or test-kit code": ("engine/outcomes.py", "import loopwarden.plugins.max_steps"),
    "the plugin host imports the public vocabulary only, never the engine, a plugin or the "
    "deployment": ("host/find.py", "import loopwarden.engine.loop"),
    "plugins import only the public vocabulary, the store, the models and the tools": (
        "plugins/max_steps.py",
        "import loopwarden.mcp.client",
    ),
    "the store imports nothing of the engine": ("store/breakers.py", "import loopwarden.run"),
    "the models import only the lowest layer": ("models/catalog.py", "import loopwarden.config"),
    "the tools import only the lowest layer": ("tools/recorded.py", "import loopwarden.run"),
    "the MCP servers' tools import only the public vocabulary and the tools": (
        "mcp/schema.py",
        "import loopwarden.store",
    ),
    "the reports read run-record files, never a live run": (
        "report/fields.py",
        "import loopwarden.engine.loop",
    ),
    "recorded traffic imports no command, demo, adapter, report or test kit": (
        "traffic/figures.py",
        "import loopwarden.commands.cli",
    ),
    "the adapters, the gateway, the demo and the test kit import no command, docs or each other": (
        "testing/faults.py",
        "import loopwarden.demo.shop",
    ),
    "only the docs generator imports the commands": (
        "testing/harness.py",
        "import loopwarden.commands.cli",
    ),
    "no import cycles between siblings (type-only imports aside)": (
        "events.py",
        "import loopwarden.engine.loop",
    ),
}


def _contracts() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return [c["name"] for c in config["tool"]["importlinter"]["contracts"]]


def _plant(site: Path, where: str, line: str) -> None:
    target = site / "loopwarden" / where
    target.write_text(target.read_text() + f"\n{line}  # a deliberate violation\n")


def _verdicts(out: str) -> dict[str, str]:
    """Each contract's KEPT / BROKEN from lint-imports' report (long names wrap)."""
    text = " ".join(out.split())
    return {
        name: m.group(1)
        for name in _contracts()
        if (m := re.search(re.escape(name) + r" (KEPT|BROKEN)", text))
    }


def test_every_contract_has_a_planted_violation_and_the_package_keeps_them_all(
    tmp_path: Path,
) -> None:
    assert sorted(PLANTS) == sorted(_contracts())
    kept = _lint_imports(_layout_copy(tmp_path))
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert set(_verdicts(kept.stdout).values()) == {"KEPT"}
    assert len(_verdicts(kept.stdout)) == len(PLANTS)


@pytest.mark.parametrize("contract", sorted(PLANTS))
def test_lint_imports_fails_on_a_violation_planted_against_each_contract(
    tmp_path: Path, contract: str
) -> None:
    site = _layout_copy(tmp_path)
    _plant(site, *PLANTS[contract])
    failed = _lint_imports(site)
    assert failed.returncode != 0
    assert _verdicts(failed.stdout)[contract] == "BROKEN", failed.stdout


def test_an_indirect_import_breaks_a_contract_too(tmp_path: Path) -> None:
    """Plugins may import the store; a store that imported the engine would let every plugin
    reach it: the plugins' contract fails as well as the store's."""
    site = _layout_copy(tmp_path)
    _plant(site, "store/breakers.py", "import loopwarden.engine.outcomes")
    verdicts = _verdicts(_lint_imports(site).stdout)
    assert verdicts["the store imports nothing of the engine"] == "BROKEN"
    plugins = "plugins import only the public vocabulary, the store, the models and the tools"
    assert verdicts[plugins] == "BROKEN"


# -- what import-linter cannot see: the names imported, and type-only imports ----------------

#: the parts below the deployment: they name ``loopwarden.run.DeploymentView``, never the
#: ``Deployment`` class -- not even type-only, not through ``from loopwarden import Deployment``
BELOW_THE_DEPLOYMENT = (
    "loopwarden.clock",
    "loopwarden.config",
    "loopwarden.engine",
    "loopwarden.events",
    "loopwarden.exceptions",
    "loopwarden.fingerprint",
    "loopwarden.hookspecs",
    "loopwarden.mcp",
    "loopwarden.models",
    "loopwarden.notes",
    "loopwarden.paths",
    "loopwarden.plugin",
    "loopwarden.plugins",
    "loopwarden.reasons",
    "loopwarden.redaction",
    "loopwarden.run",
    "loopwarden.sanitize",
    "loopwarden.signals",
    "loopwarden.stash",
    "loopwarden.store",
    "loopwarden.tools",
    "loopwarden.verdicts",
)


def _site_modules(site: Path) -> dict[str, Path]:
    """The modules of an installed-layout copy (``site/loopwarden/...``), by name."""
    out = {}
    for path in sorted((site / "loopwarden").rglob("*.py")):
        parts = list(path.relative_to(site).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(module: str, path: Path, modules: dict[str, Path]) -> Iterator[tuple[str, str]]:
    """(imported module, name) for every import of the package in ``path`` -- at run time,
    type-only or inside a function alike; ``name`` is what a ``from`` import takes ("" for a
    plain import).  A name that is a submodule counts as an import of that submodule."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, ""
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield (sub, "") if sub in modules else (base, alias.name)


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the package's modules it imports, type-only and function-level imports
    included (grimp's view with ``exclude_type_checking_imports = false``)."""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for target, _ in _imports(module, path, modules):
            owner = _owner(target, modules) if target.startswith("loopwarden") else None
            if owner is not None and owner != module:
                graph[module].add(owner)
    return graph


def _names_the_deployment(modules: dict[str, Path]) -> list[str]:
    """Modules below the deployment that import it, or ``Deployment`` from the package."""
    wrong = []
    for module, path in modules.items():
        if not module.startswith(BELOW_THE_DEPLOYMENT):
            continue
        for target, name in _imports(module, path, modules):
            hit = target == "loopwarden.deployment" or (
                target == "loopwarden" and name == "Deployment"
            )
            if hit:
                named = "loopwarden.Deployment" if target == "loopwarden" else target
                wrong.append(f"{module} -> {named}")
    return wrong


def _knots(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def _longest_cycle(
    graph: dict[str, set[str]], knot: list[str], budget: int = 2_000_000
) -> list[str]:
    """The longest simple cycle inside one knot (depth-first from each member, visiting only
    later members, so each cycle is found from its first module); ``budget`` bounds the steps."""
    members = {m: i for i, m in enumerate(knot)}
    best: list[str] = []
    steps = 0
    for start in knot:
        path, on_path = [start], {start}
        work = [iter(sorted(graph[start]))]
        while work:
            steps += 1
            assert steps < budget, f"too tangled to measure: {knot}"
            nxt = next(work[-1], None)
            if nxt is None:
                work.pop()
                on_path.discard(path.pop())
                continue
            if nxt == start and len(path) > len(best):
                best = list(path)
            if nxt in members and members[nxt] > members[start] and nxt not in on_path:
                path.append(nxt)
                on_path.add(nxt)
                work.append(iter(sorted(graph[nxt])))
    return best


def _cycles(modules: dict[str, Path]) -> list[tuple[int, list[str], list[str]]]:
    """(longest cycle's length, that cycle, the knot) for each knot, longest first."""
    graph = _import_graph(modules)
    out = []
    for knot in _knots(graph):
        cycle = _longest_cycle(graph, knot)
        out.append((len(cycle), cycle, knot))
    return sorted(out, key=lambda c: (-c[0], c[1]))


def test_the_import_graph_with_type_only_imports_has_no_cycle_longer_than_three_modules() -> None:
    found = _cycles(_modules())
    for length, cycle, knot in found:
        print(f"cycle of {length}: {' -> '.join(cycle)}  (knot of {len(knot)})")
    assert found and found[0][0] <= 3, found[0]


def test_the_cycle_measure_finds_a_planted_knot(tmp_path: Path) -> None:
    site = _layout_copy(tmp_path)
    _plant(site, "events.py", "if False:\n    from loopwarden.engine.streaming import RunEnd")
    (length, cycle, _), *_ = _cycles(_site_modules(site))
    assert length > 3 and "loopwarden.events" in cycle


def test_nothing_below_the_deployment_names_it() -> None:
    assert _names_the_deployment(_modules()) == []


@pytest.mark.parametrize(
    "line",
    [
        "if TYPE_CHECKING:\n    from loopwarden import Deployment",
        "from loopwarden.deployment import Deployment",
        "def _f():\n    import loopwarden.deployment",
    ],
)
def test_a_plugin_naming_the_deployment_is_caught(tmp_path: Path, line: str) -> None:
    site = _layout_copy(tmp_path)
    _plant(site, "plugins/max_steps.py", line)
    assert _names_the_deployment(_site_modules(site)) == [
        "loopwarden.plugins.max_steps -> "
        + ("loopwarden.Deployment" if "from loopwarden import" in line else "loopwarden.deployment")
    ]


@pytest.mark.parametrize("old", sorted(loopwarden.MOVED))
def test_every_moved_module_path_of_0_2_still_imports(old: str) -> None:
    module = importlib.import_module(old)
    assert module is importlib.import_module(loopwarden.MOVED[old])
    assert sys.modules[old] is module


def test_python_dash_m_runs_an_old_path() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "loopwarden.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert loopwarden.__version__ in out.stdout


def test_an_old_path_gives_the_same_objects_and_patching_reaches_both() -> None:
    from loopwarden.engine import loop as new
    from loopwarden.loop import Engine

    assert Engine is new.Engine
    old = importlib.import_module("loopwarden.loop")
    saved = new.Engine
    try:
        old.Engine = "patched"  # type: ignore[attr-defined]
        assert new.Engine == "patched"
    finally:
        new.Engine = saved  # type: ignore[misc]


def test_the_old_paths_import_nothing_until_asked() -> None:
    code = (
        "import sys, loopwarden; "
        "print(sorted(m for m in sys.modules if m.startswith('loopwarden.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = ast.literal_eval(out.stdout.strip())
    assert not [m for m in loaded if m.startswith(("loopwarden.engine", "loopwarden.traffic"))]
