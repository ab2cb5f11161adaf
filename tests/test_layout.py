"""The layout's rules (docs/architecture.md): folders by role, the import contracts, the old paths.

``lint-imports`` (import-linter, run by ``.ci/run`` on the installed layout) checks the runtime
import rules written in ``[tool.importlinter]``; these tests check that it really fails on a
violation, the rules it leaves out (type-only imports, module names), and that every module
path of 0.2 still imports.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import shutil
import subprocess
import sys
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


@pytest.mark.parametrize(
    ("where", "line", "broken"),
    [
        ("engine/loop.py", "import loopwarden.traffic.replay", "the engine runs no demo"),
        ("store/sqlite.py", "import loopwarden.engine.loop", "the store imports nothing"),
        ("../plugins/max_steps.py", "import loopwarden.engine.dispatch", "plugins import only"),
        ("events.py", "import loopwarden.engine.loop", "no import cycles"),
    ],
)
def test_lint_imports_passes_and_fails_on_a_deliberate_violation(
    tmp_path: Path, where: str, line: str, broken: str
) -> None:
    site = _layout_copy(tmp_path)
    kept = _lint_imports(site)
    assert kept.returncode == 0, kept.stdout + kept.stderr
    target = (site / "loopwarden" / where).resolve()
    if where.startswith("../plugins/"):
        target = site / "loopwarden" / "plugins" / Path(where).name
    target.write_text(target.read_text() + f"\n{line}  # a deliberate violation\n")
    failed = _lint_imports(site)
    assert failed.returncode != 0
    assert broken in failed.stdout
    assert "BROKEN" in failed.stdout


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
