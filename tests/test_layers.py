"""The packages of ``statebackend`` form layers, and no module imports in a cycle.

Every module under ``statebackend/`` is parsed with :mod:`ast` and *all* of its imports
count: top-level ones, those under ``if TYPE_CHECKING:`` and those inside functions. A
type-only import is still a dependency of the design (and the next edit turns it into a
runtime one), so a type needed from above is named with a ``typing.Protocol`` below.

Importing ``statebackend.a.b`` runs ``statebackend/a/__init__.py`` first, so an import
from outside package ``a`` also depends on ``a``'s ``__init__``; that is how a package
``__init__`` that re-exports its modules closes a cycle.

Run as a script, ``python tests/test_layers.py --print [ROOT]`` prints the package
dependency graph (package -> packages it imports, with the number of import statements)
of the tree at ROOT (default: this checkout).
"""

from __future__ import annotations

import ast
import sys
from collections import Counter, defaultdict
from pathlib import Path

PACKAGE = "statebackend"
# compiled from native/ by setup.py: not parsed, imports nothing of the project
NATIVE = {"statebackend._native"}

# Lowest layer first. A unit is a subpackage or a top-level module of statebackend; it may
# import units of its own layer or of a lower one, never one of a higher layer. Units of
# one layer do not depend on each other by rule, only the cycle check binds them.
LAYERS: list[list[str]] = [
    ["errors", "redact", "progress"],  # leaves: errors, credential redaction, progress lines
    ["model", "options"],  # pure values: manifests, records, paths, schemas; the options
    ["keys"],  # key bytes: key groups, grouping keys, layouts, value codecs, kernels
    ["rocksdb", "storage"],  # the only packages that touch rocksdict / fsspec
    ["state", "local"],  # keyed state over one instance; local disk, kept-open instances
    ["checkpoint"],  # one partition's checkpoint and restore
    ["coordinator", "savepoint", "metrics", "metrics_store"],  # the driver; savepoints; checkpoint metrics
    ["restore"],  # restores across checkpoints (rescale)
    ["task", "read"],  # executor side: one partition's task; readers of stored state
    ["spark"],  # driver side: session adapters, plans, completion; the only session API user
    ["restart", "supervisor", "verify"],
    ["backend"],
    ["__init__"],  # the public names
    ["cli", "demo"],
    ["__main__"],  # python -m statebackend: the cli
]

def _root(argv_root: str | None = None) -> Path:
    if argv_root:
        return Path(argv_root)
    return Path(__file__).resolve().parent.parent


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> source file, for every module of the package under ``root``."""
    out: dict[str, Path] = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _is_package(name: str, files: dict[str, Path]) -> bool:
    return name in files and files[name].name == "__init__.py"


def _resolve_relative(module: str, is_pkg: bool, level: int, target: str | None) -> str:
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def imports_of(module: str, files: dict[str, Path]) -> list[str]:
    """Every project module ``module`` imports (one entry per imported name's module)."""
    tree = ast.parse(files[module].read_text(), filename=str(files[module]))
    is_pkg = _is_package(module, files)
    found: list[str] = []

    def add(name: str) -> None:
        # the longest prefix of ``name`` that is a module of the project
        parts = name.split(".")
        while parts and ".".join(parts) not in files:
            parts.pop()
        if parts:
            found.append(".".join(parts))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                    if alias.name not in NATIVE:
                        add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                source = _resolve_relative(module, is_pkg, node.level, node.module)
            else:
                source = node.module or ""
                if source != PACKAGE and not source.startswith(PACKAGE + "."):
                    continue
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                if sub not in NATIVE:
                    add(sub if sub in files else source)
    return found


def module_graph(root: Path) -> dict[str, set[str]]:
    """Module -> modules it imports, with the ``__init__`` of every package it enters."""
    files = module_files(root)
    graph: dict[str, set[str]] = {}
    for module in files:
        own = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 2)}
        edges: set[str] = set()
        for target in imports_of(module, files):
            if target != module:
                edges.add(target)
            parts = target.split(".")
            for i in range(2, len(parts)):
                ancestor = ".".join(parts[:i])
                if ancestor not in own and ancestor in files:
                    edges.add(ancestor)
        graph[module] = edges
    return graph


def unit_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def package_graph(root: Path) -> dict[str, Counter[str]]:
    """Unit -> Counter of the units it imports (one count per import statement name)."""
    files = module_files(root)
    out: dict[str, Counter[str]] = defaultdict(Counter)
    for module in files:
        src = unit_of(module)
        out[src]  # noqa: B018 - every unit is listed, even one that imports nothing
        for target in imports_of(module, files):
            dst = unit_of(target)
            if dst != src:
                out[src][dst] += 1
    return dict(out)


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    result: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        # iterative, so a deep chain of modules cannot overflow the recursion limit
        work = [(v, iter(sorted(graph.get(v, ()))))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        while work:
            node, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    advanced = True
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == node:
                        break
                if len(component) > 1:
                    result.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return result


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    rank = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}
    out = []
    for module, targets in sorted(graph.items()):
        src = unit_of(module)
        for target in sorted(targets):
            dst = unit_of(target)
            if src not in rank or dst not in rank:
                continue
            if rank[dst] > rank[src]:
                out.append(f"{module} (layer {rank[src]}) imports {target} (layer {rank[dst]})")
    return out


def test_every_unit_has_a_layer() -> None:
    known = {unit for layer in LAYERS for unit in layer}
    units = {unit_of(m) for m in module_files(_root())}
    assert units - known == set(), "add these packages or modules to LAYERS in tests/test_layers.py"


def test_no_import_from_a_lower_layer_to_a_higher_one() -> None:
    assert layer_violations(module_graph(_root())) == []


def test_no_import_cycle() -> None:
    assert find_cycles(module_graph(_root())) == []


def test_spark_tasks_do_not_import_the_driver_coordinator() -> None:
    # The executor's side (task/) and the readers read records through storage.records;
    # the driver's coordinator (completion, retention, deletion) is only ever the driver's.
    graph = module_graph(_root())
    offenders = {m: sorted(d for d in deps if d.startswith("statebackend.coordinator"))
                 for m, deps in graph.items()
                 if m.startswith(("statebackend.task", "statebackend.read"))}
    assert {m: d for m, d in offenders.items() if d} == {}


def test_the_checker_sees_type_checking_and_function_imports(tmp_path: Path) -> None:
    pkg = tmp_path / PACKAGE
    (pkg / "model").mkdir(parents=True)
    (pkg / "spark").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "model" / "__init__.py").write_text("")
    (pkg / "spark" / "__init__.py").write_text("")
    (pkg / "model" / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n"
        "def f():\n    from ..spark import run\n")
    (pkg / "model" / "b.py").write_text("from . import a\n")
    (pkg / "spark" / "run.py").write_text("")
    graph = module_graph(tmp_path)
    assert find_cycles(graph) == [[f"{PACKAGE}.model.a", f"{PACKAGE}.model.b"]]
    assert layer_violations(graph) == [  # the package's __init__ runs first, then run.py
        f"{PACKAGE}.model.a (layer 1) imports {PACKAGE}.spark (layer 9)",
        f"{PACKAGE}.model.a (layer 1) imports {PACKAGE}.spark.run (layer 9)"]


# The driver side: the only units that may reach a Spark session (the executor's task, the
# readers and everything below them run where no session exists, and on Spark Connect the
# client has no JVM: DESIGN.md invariant 14).
DRIVER_UNITS = {"spark", "backend", "demo"}
# Modules, and names imported from a module, that are a session's API: a session, its
# DataFrames and Columns, functions building plans, the JVM gateway, RDDs, listeners.
SESSION_MODULES = ("py4j", "pyspark.java_gateway", "pyspark.core", "pyspark.context",
                   "pyspark.rdd", "pyspark.sql.session", "pyspark.sql.dataframe",
                   "pyspark.sql.column", "pyspark.sql.functions", "pyspark.sql.group",
                   "pyspark.sql.readwriter", "pyspark.sql.connect", "pyspark.sql.observation",
                   "pyspark.sql.streaming.query", "pyspark.sql.streaming.readwriter",
                   "pyspark.sql.streaming.listener", "pyspark.sql.window")
SESSION_NAMES = {"SparkSession", "DataFrame", "Column", "GroupedData", "functions",
                 "SparkContext", "SparkConf", "Observation", "Window", "StreamingQuery",
                 "StreamingQueryListener", "DataStreamReader", "DataStreamWriter", "RDD"}


def _is_session_module(name: str) -> bool:
    return any(name == m or name.startswith(m + ".") for m in SESSION_MODULES)


def session_api_imports(root: Path) -> list[str]:
    """``module: imported name`` for every session API imported outside the driver side."""
    out = []
    for module, path in module_files(root).items():
        if unit_of(module) in DRIVER_UNITS:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                out += [f"{module}: {a.name}" for a in node.names if _is_session_module(a.name)]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module and (
                    node.module == "pyspark" or node.module.startswith("pyspark.")):
                out += [f"{module}: {node.module}.{a.name}" for a in node.names
                        if _is_session_module(node.module)
                        or _is_session_module(f"{node.module}.{a.name}")
                        or a.name in SESSION_NAMES]
    return sorted(out)


def test_session_apis_only_on_the_driver_side() -> None:
    assert session_api_imports(_root()) == []


def test_the_session_rule_sees_every_form_of_import(tmp_path: Path) -> None:
    pkg = tmp_path / PACKAGE
    for sub in ("task", "spark", "read"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "task" / "a.py").write_text(
        "from pyspark import TaskContext\nfrom pyspark.sql.types import StructType\n"
        "def f():\n    from pyspark.sql import functions as F, Row\n"
        "    import py4j.java_gateway\n")
    (pkg / "read" / "b.py").write_text("from pyspark.sql import SparkSession\n")
    (pkg / "spark" / "c.py").write_text("from pyspark.sql import SparkSession, DataFrame\n")
    assert session_api_imports(tmp_path) == [
        f"{PACKAGE}.read.b: pyspark.sql.SparkSession",
        f"{PACKAGE}.task.a: py4j.java_gateway",
        f"{PACKAGE}.task.a: pyspark.sql.functions"]


def format_package_graph(root: Path) -> str:
    graph = package_graph(root)
    lines = []
    for unit in sorted(graph):
        deps = ", ".join(f"{d} {n}" for d, n in sorted(graph[unit].items()))
        lines.append(f"{unit} -> {deps}" if deps else f"{unit} -> (nothing)")
    cycles = find_cycles(module_graph(root))
    lines.append(f"module import cycles: {len(cycles)}")
    for c in cycles:
        lines.append("  " + " <-> ".join(c))
    return "\n".join(lines)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--print"]
    print(format_package_graph(_root(args[0] if args else None)))
