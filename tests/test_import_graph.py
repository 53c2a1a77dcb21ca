"""The package's import graph: no cycle, and every import points down the layers.

Every ``import`` statement of the product code counts, those inside functions included; only imports under
``if TYPE_CHECKING:`` (never run) are left out. Layers, lowest first: ``domain``; ``persistence``; ``actors``;
``langgraph``, ``simulations`` and ``testing``; ``cli``. The root package (its lazy public API) may be imported
from anywhere.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import threadloom

ROOT = Path(threadloom.__file__).parent
LAYERS = {"domain": 0, "persistence": 1, "actors": 2, "langgraph": 3, "simulations": 3, "testing": 3, "cli": 4}
SKIPPED = {"tests", "benchmarks", "__pycache__"}


def _modules() -> dict[str, Path]:
    modules = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if SKIPPED & set(parts) or any(part.startswith(".") or part.endswith(".egg-info") for part in parts):
            continue
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        modules[".".join(("threadloom", *parts))] = path
    return modules


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules ``name`` imports (``from a import b`` counts as ``a.b`` when that is a module)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for statement in block.body
        for node in ast.walk(statement)
    }
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                kept = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(kept + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target.startswith("threadloom") and target != name:
                found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
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
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.get(parts[1]) if len(parts) > 1 else None


def test_the_graph_sees_imports_inside_functions() -> None:
    graph = _graph()
    # open_store imports the SQLite store only inside the function
    assert "threadloom.persistence.sqlite.store" in graph["threadloom.persistence.opening"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_in_the_package() -> None:
    assert _cycles(_graph()) == []


def test_imports_point_down_the_layers() -> None:
    upward = [
        f"{module} -> {target}"
        for module, targets in sorted(_graph().items())
        for target in sorted(targets)
        if (low := _layer(module)) is not None and (high := _layer(target)) is not None and high > low
    ]
    assert upward == []


def _imports_langgraph(path: Path) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else (
            [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        if any(name == "langgraph" or name.startswith(("langgraph.", "langchain_core")) for name in names):
            return True
    return False


def test_only_threadloom_langgraph_imports_langgraph() -> None:
    outside = [
        name for name, path in _modules().items()
        if not name.startswith("threadloom.langgraph") and _imports_langgraph(path)
    ]
    assert outside == []
    assert _imports_langgraph(ROOT / "langgraph" / "saver.py")


def test_import_threadloom_does_not_import_langgraph(tmp_path) -> None:
    import subprocess
    import sys

    code = (
        "import sys, threadloom\n"
        "for name in threadloom.__all__: getattr(threadloom, name)\n"
        "import threadloom.cli.main, threadloom.persistence.sqlite.store, threadloom.actors.runtime\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('langgraph', 'langchain_core'))\n"
        "print(loaded)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# Without LangGraph (hidden by an importer that refuses its top-level package, as if it were not installed).
_WITHOUT_LANGGRAPH = textwrap.dedent(
    """
    import sys

    class HideLangGraph:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] == "langgraph":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, HideLangGraph())
    import threadloom.cli.main  # the rest of threadloom imports without it
    try:
        import threadloom.langgraph
    except ImportError as error:
        print(type(error).__name__, error.name)
        print(error)
    else:
        print("imported")
    """
)


def test_without_langgraph_its_subpackage_names_the_install_command(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", _WITHOUT_LANGGRAPH], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert result.returncode == 0, result.stderr
    kind, message = result.stdout.strip().split("\n", 1)
    assert kind.startswith("ModuleNotFoundError langgraph"), result.stdout
    assert "pip install 'threadloom[langgraph]'" in message
