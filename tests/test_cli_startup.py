"""The ``threadloom`` command's module structure: no import cycles, commands loaded only when they run, and a
``--help`` / ``--version`` that import none of the heavy parts (rich, structlog, the stores, the runtime).

Start-up is asserted by what gets imported (``python -X importtime``), never by wall-clock time; the figures are
in ``benchmarks/bench_startup.py``.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import threadloom
from threadloom.cli.main import LAZY_COMMANDS, cli

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "threadloom"

HEAVY = ("structlog", "rich", "pykka", "psycopg", "psycopg_pool", "threadloom.persistence", "threadloom.actors",
         "threadloom.domain")
"""What ``threadloom --help`` and ``--version`` must not import (a name and everything under it)."""


# -- the import graph, read from the source ----------------------------------------------------------------------------


def _module_file(name: str) -> Path | None:
    """The source file of the package's module ``name`` (``threadloom.cli.main``), or None if it is not one."""
    base = ROOT.joinpath(*name.split(".")[1:])
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


def _cli_modules() -> list[str]:
    names = []
    for path in sorted((ROOT / "cli").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names.append(".".join((PACKAGE, *(parts[:-1] if parts[-1] == "__init__" else parts))))
    return names


def _imports(name: str, *, in_functions: bool) -> set[str]:
    """The package's modules that module ``name`` imports: at module level, and with ``in_functions`` also inside
    functions (imports under ``if TYPE_CHECKING:`` never run, so they are not counted).

    ``from a.b import c`` counts as importing ``a.b.c`` when that is a module, else ``a.b``.
    """
    path = _module_file(name)
    assert path is not None, name
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for other in child.orelse:
                    visit_node(other)
                continue
            visit_node(child)

    def visit_node(node: ast.AST) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and not in_functions:
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            for alias in node.names:
                child = f"{module}.{alias.name}"
                found.add(child if _module_file(child) is not None else module)
        visit(node)

    visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
    return {module for module in found if module.split(".")[0] == PACKAGE and _module_file(module) is not None}


def _graph(starts: list[str], *, in_functions: bool) -> dict[str, set[str]]:
    """Every package module reachable from ``starts``, with the modules each imports."""
    graph: dict[str, set[str]] = {}
    pending = list(starts)
    while pending:
        name = pending.pop()
        if name not in graph:
            graph[name] = _imports(name, in_functions=in_functions)
            pending.extend(graph[name])
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` that hold a cycle (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
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
                    if len(component) > 1 or node in graph[node]:
                        cycles.append(sorted(component))
    return cycles


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}, "f": set()}
    assert sorted(_cycles(graph)) == [["a", "b", "c"], ["e"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_import_reader_sees_imports_in_functions_but_not_type_checking_ones():
    module_level = _imports("threadloom.cli.output", in_functions=False)
    everywhere = _imports("threadloom.cli.output", in_functions=True)
    assert "threadloom.persistence" not in module_level  # imported inside CliState's methods only
    assert {"threadloom.persistence", "threadloom.domain.errors"} <= everywhere
    assert "threadloom.domain.values" not in everywhere  # only under TYPE_CHECKING


def test_no_module_of_the_command_imports_the_group():
    """Only ``__main__`` and the console script import ``threadloom.cli.main``; commands import ``cli.output``."""
    offenders = {
        name
        for name in _cli_modules()
        if name != "threadloom.cli.main" and "threadloom.cli.main" in _imports(name, in_functions=True)
    }
    assert offenders == set()
    outside = {"threadloom.simulations." + path.stem for path in (ROOT / "simulations").glob("*.py")}
    assert not any(
        module.startswith("threadloom.cli") for name in outside for module in _imports(name, in_functions=True)
    ), "simulations/ must not import the command"


def test_no_import_cycle_is_reachable_from_the_command():
    starts = _cli_modules()
    graph = _graph(starts, in_functions=False)
    assert set(starts) <= set(graph)
    assert {"threadloom.persistence.base", "threadloom.domain.values"} <= set(graph)  # the walk reaches the rest
    assert _cycles(graph) == []
    # Imports inside functions run later, but a command module must not be part of a circle through them either.
    lazy = _graph(starts, in_functions=True)
    assert [cycle for cycle in _cycles(lazy) if any(name.startswith("threadloom.cli") for name in cycle)] == []


def test_every_command_module_imports_alone_without_the_group():
    """Each module imports on its own, as the first of the package's modules (so an import circle would fail
    whichever module it is entered from), and never loads the group."""
    script = (
        "import importlib, sys\n"
        f"for name in {[name for name in _cli_modules() if name != 'threadloom.cli.main']!r}:\n"
        "    for loaded in [m for m in sys.modules if m == 'threadloom' or m.startswith('threadloom.')]:\n"
        "        del sys.modules[loaded]\n"
        "    importlib.import_module(name)\n"
        "    print(name, 'threadloom.cli.main' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    loaded_group = dict(line.split() for line in done.stdout.splitlines())
    assert len(loaded_group) == len(_cli_modules()) - 1
    assert {name for name, loaded in loaded_group.items() if loaded == "True"} == set()


# -- start-up --------------------------------------------------------------------------------------------------------


def _importtime(*args: str, cwd: Path) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Runs ``python -X importtime -m threadloom ARGS``; returns the run and the names of the modules it imported."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "threadloom", *args],
        capture_output=True, text=True, timeout=120, cwd=cwd,
    )
    return done, _imported(done.stderr)


def _imported(importtime: str) -> set[str]:
    """The module names in ``python -X importtime``'s report."""
    imported = set()
    for line in importtime.splitlines():
        if line.startswith("import time:") and line.count("|") == 2:
            name = line.rsplit("|", 1)[1].strip()
            if name != "imported package":  # the header line
                imported.add(name)
    return imported


def _heavy(imported: set[str]) -> list[str]:
    return sorted(name for name in imported if any(name == h or name.startswith(h + ".") for h in HEAVY))


def test_help_imports_nothing_heavy_and_lists_every_command(tmp_path):
    done, imported = _importtime("--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert {"click", "threadloom.cli.main", "threadloom.cli.output"} <= imported  # the parse worked
    assert _heavy(imported) == []
    commands = done.stdout.partition("\nCommands:\n")[2].splitlines()
    listed = {line.split()[0]: " ".join(line.split()[1:]) for line in commands if line.strip()}
    assert sorted(listed) == sorted(name for name, entry in LAZY_COMMANDS.items() if not entry.hidden)
    assert "demo-worker" not in listed
    for name, summary in listed.items():
        assert summary and LAZY_COMMANDS[name].help.startswith(summary.removesuffix("...")), name
    assert not any(name.startswith("threadloom.cli.") and name not in ("threadloom.cli.main", "threadloom.cli.output")
                   for name in imported), "a command module was imported to list it"
    assert not (tmp_path / "threadloom.db").exists()


@pytest.mark.parametrize("option", ["--version", "-h"])
def test_version_and_short_help_import_nothing_heavy(tmp_path, option):
    done, imported = _importtime(option, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert _heavy(imported) == []
    if option == "--version":
        assert done.stdout == f"threadloom, version {importlib.metadata.version('threadloom')}\n"
        assert threadloom.__version__ == importlib.metadata.version("threadloom")


def test_completing_a_command_name_imports_nothing_heavy(tmp_path):
    env = {**os.environ, "_THREADLOOM_COMPLETE": "zsh_complete", "COMP_WORDS": "threadloom s", "COMP_CWORD": "1"}
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "threadloom"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env,
    )
    assert done.returncode == 0, done.stderr
    assert _heavy(_imported(done.stderr)) == []
    items = done.stdout.splitlines()  # zsh: type, value, help, per item
    offered = {items[index + 1]: items[index + 2] for index in range(0, len(items), 3)}
    assert sorted(offered) == ["serve", "show", "simulate", "stats", "sweep"]
    assert offered["sweep"].startswith("Apply a retention policy")
    # Completing a command's own options loads that command.
    env["COMP_WORDS"], env["COMP_CWORD"] = "threadloom sweep --max-c", "2"
    done = subprocess.run([sys.executable, "-m", "threadloom"], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env=env)
    assert "--max-checkpoints" in done.stdout.splitlines()


def test_a_command_still_loads_what_it_needs(tmp_path):
    """The other side of lazy loading: running a command imports its module (and the stores) on use."""
    done, imported = _importtime("--store", "memory://", "--json", "threads", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert {"threadloom.cli.read", "threadloom.persistence", "structlog", "rich"} <= imported
    assert "threadloom.cli.demo.coordinator" not in imported and "threadloom.actors" not in imported


# -- the table of commands ---------------------------------------------------------------------------------------------


def _load(name: str) -> click.Command:
    module, _, attribute = LAZY_COMMANDS[name].target.partition(":")
    return getattr(importlib.import_module(module), attribute)


@pytest.mark.parametrize("name", sorted(LAZY_COMMANDS))
def test_the_table_matches_each_command(name):
    command = _load(name)
    entry = LAZY_COMMANDS[name]
    assert isinstance(command, click.Command)
    assert command.name == name
    assert command.hidden == entry.hidden
    assert entry.help == " ".join(command.help.split("\n\n")[0].split())  # the first paragraph, on one line
    stand_in = click.Command(name, help=entry.help)
    for limit in (20, 45, 60, 200):
        assert stand_in.get_short_help_str(limit) == command.get_short_help_str(limit)


def test_help_is_what_click_prints_with_every_command_loaded():
    eager = click.Group(
        name="threadloom",
        commands={name: _load(name) for name in LAZY_COMMANDS},
        params=cli.params,
        help=cli.help,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    runner = CliRunner()
    lazy_help = runner.invoke(cli, ["--help"], prog_name="threadloom")
    eager_help = runner.invoke(eager, ["--help"], prog_name="threadloom")
    assert lazy_help.exit_code == 0 and eager_help.exit_code == 0
    assert lazy_help.output == eager_help.output


def test_the_default_store_is_the_stores_default_file():
    """The group spells the default out (its help must not import the stores): it must stay the stores' own."""
    from threadloom.cli.output import DEFAULT_SQLITE_PATH, DEFAULT_STORE_URL
    from threadloom.persistence import DEFAULT_SQLITE_PATH as STORES_DEFAULT
    from threadloom.persistence import sqlite_file

    assert DEFAULT_SQLITE_PATH == STORES_DEFAULT
    assert sqlite_file(DEFAULT_STORE_URL) == STORES_DEFAULT


def test_a_command_runs_through_the_group_once_loaded():
    result = CliRunner().invoke(cli, ["--store", "memory://", "--json", "threads"], prog_name="threadloom")
    assert result.exit_code == 0, result.output
    assert '"threads": []' in result.output
