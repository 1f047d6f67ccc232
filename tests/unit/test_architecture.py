"""The shape of the package holds: no import cycles (type-only ones included), the layers
(public API, _core, _db, _worker, then _cli and the dashboard) each importing only from
those before it, one name per module, SQL only in _db, internals private, one definition
of the job states, and docs/architecture.md's module map true to the tree."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import pgq
from pgq.job import FINAL_STATES, JobState

SRC = Path(pgq.__file__).resolve().parent
#: Public modules besides the package itself; every other module is an internal.
PUBLIC_MODULES = {
    "app", "client", "dashboard", "errors", "job", "logs", "migrate", "schema", "settings",
    "sync", "testing",
}  # fmt: skip


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {
        _module_name(p): p
        for p in SRC.rglob("*.py")
        if "migrations" not in p.relative_to(SRC).parts
    }


def _imports(path: Path, modules: set[str]) -> set[str]:
    """Every pgq module ``path`` imports, wherever the import sits (type-only ones too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("pgq"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pgq"):
            for alias in node.names:
                # `from pgq._core import serde` imports the module pgq._core.serde.
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
    return found & modules


def test_no_import_cycles() -> None:
    modules = _modules()
    # The package's __init__ only re-exports: an edge into it from a submodule would be a
    # cycle by construction, so each submodule must import what it needs from its home.
    graph = {name: _imports(path, set(modules)) - {name} for name, path in modules.items()}
    for name, deps in graph.items():
        if name != "pgq":
            assert "pgq" not in deps, f"{name} imports the package itself"
    cycles: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycles.append([*trail[trail.index(dep) :], dep])
            elif dep not in state:
                visit(dep, [*trail, dep])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == []


#: What each private package may not import, directly or through the modules it imports:
#: the core does no I/O and knows no layer above it; the database layer knows no worker.
LAYERS = {
    "pgq._core": ("pgq._db", "pgq._worker", "pgq._cli", "pgq.dashboard", "pgq.client"),
    "pgq._db": ("pgq._worker", "pgq._cli", "pgq.dashboard"),
    "pgq._worker": ("pgq._cli", "pgq.dashboard"),
}


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_each_layer_imports_only_from_the_layers_before_it(package: str) -> None:
    modules = _modules()
    graph = {name: _imports(path, set(modules)) - {name} for name, path in modules.items()}
    crossings = []
    for name in sorted(n for n in graph if _within(n, package)):
        seen, todo = {name}, [(name, [name])]
        while todo:  # every module it reaches, and through which imports
            current, trail = todo.pop()
            for dep in sorted(graph[current] - seen):
                seen.add(dep)
                if any(_within(dep, above) for above in LAYERS[package]):
                    crossings.append(" -> ".join([*trail, dep]))
                else:
                    todo.append((dep, [*trail, dep]))
    assert crossings == []


#: The private packages: a module name means one thing across them.
PRIVATE_PACKAGES = ("_core", "_db", "_worker", "_cli")
#: Private modules outside the private packages, each for a reason of its own.
PRIVATE_ELSEWHERE = {
    # pytest finds pgq's fixtures through this entry point (pyproject.toml's pytest11).
    "pgq._pytest_plugin",
}


def test_no_module_name_is_in_two_private_packages() -> None:
    homes: dict[str, set[str]] = {}
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC).parts
        if parts[0] in PRIVATE_PACKAGES and path.stem != "__init__":
            homes.setdefault(path.stem, set()).add(parts[0])
    assert {stem: sorted(p) for stem, p in homes.items() if len(p) > 1} == {}


def test_private_modules_live_in_the_private_packages() -> None:
    outside = {
        name
        for name in _modules()
        if name.count(".") == 1 and name.split(".")[1].startswith("_")
        and name.split(".")[1] not in PRIVATE_PACKAGES and name != "pgq.__main__"
    }  # fmt: skip
    assert outside == PRIVATE_ELSEWHERE


ARCHITECTURE = SRC.parents[1] / "docs" / "architecture.md"
#: A line of the module map that names a module or a folder: its indent, then its name.
_ENTRY = re.compile(r"^( *)([\w.]+\.py|\w+/)(?:\s|$)")


def _module_map() -> set[str]:
    """The paths docs/architecture.md's module map names, relative to src/pgq."""
    text = ARCHITECTURE.read_text()
    block = text.split("## The modules", 1)[1].split("```", 2)[1]
    lines = block.splitlines()
    root = next(i for i, line in enumerate(lines) if line.strip() == "src/pgq/")
    names: set[str] = set()
    folders: list[str] = []  # the folder at each depth
    for line in lines[root + 1 :]:
        match = _ENTRY.match(line)
        if match is None:
            continue
        depth = len(match.group(1)) // 2 - 1
        if depth > len(folders):
            continue  # a description's continuation that starts with a name
        del folders[depth:]
        name = match.group(2)
        path = "/".join([*folders, name.rstrip("/")])
        names.add(path + "/" if name.endswith("/") else path)
        if name.endswith("/"):
            folders.append(name.rstrip("/"))
    return names


def test_the_architecture_module_map_matches_the_tree() -> None:
    """Every module is in docs/architecture.md's map (a package's __init__ may be left
    out, and so may the migrations' revisions), and every module or folder it names is
    there."""
    mapped = _module_map()
    tree = {
        str(p.relative_to(SRC))
        for p in SRC.rglob("*.py")
        if "migrations" not in p.relative_to(SRC).parts
        and not (p.name == "__init__.py" and p.parent != SRC)
    }
    assert sorted(tree - mapped) == [], "modules missing from docs/architecture.md's map"
    missing = [m for m in mapped if not (SRC / m.rstrip("/")).exists()]
    assert sorted(missing) == [], "docs/architecture.md's map names what is not in the tree"


def test_only_the_database_layer_holds_sql() -> None:
    statement = re.compile(r"\b(SELECT|INSERT INTO|UPDATE pgq_|DELETE FROM)\b")
    offenders = []
    for name, path in _modules().items():
        if name.startswith("pgq._db") or name in ("pgq.schema",):
            continue
        tree = ast.parse(path.read_text())
        docstrings = {
            id(n.body[0].value)
            for n in ast.walk(tree)
            if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and n.body
            and isinstance(n.body[0], ast.Expr)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docstrings
                and statement.search(node.value)
                and "pgq_" in node.value
            ):
                offenders.append(f"{name}: {node.value.strip()[:60]!r}")
    assert offenders == []


def test_internal_modules_are_private() -> None:
    for name in _modules():
        parts = name.split(".")
        if len(parts) == 1:
            continue
        assert parts[1] in PUBLIC_MODULES or parts[1].startswith("_"), name


def test_the_states_have_one_definition() -> None:
    from pgq.schema import STATES, UNIQUE_ACTIVE_FUNCTION, job_state

    assert tuple(s.value for s in JobState) == STATES
    assert tuple(job_state.enums) == STATES
    for state in JobState:
        assert f"WHEN '{state.value}' THEN {state.bit}" in UNIQUE_ACTIVE_FUNCTION
    assert {s for s in JobState if s.is_final} == FINAL_STATES


#: Worker classes that are records, not parts: the batch runner fills in an Execution's
#: per-job fields (its task, whether it started, why it ended) as the attempt goes.
RECORDS = {"Execution"}
#: The names the worker's modules give a producer and the liveness parts it holds: none of
#: their fields is assigned from outside, whatever a record may call a field of its own.
PART_NAMES = ("producer", "identity", "health")


def _is_dataclass(node: ast.ClassDef) -> bool:
    return any(
        "dataclass" in ast.unparse(d.func if isinstance(d, ast.Call) else d)
        for d in node.decorator_list
    )


def _worker_fields() -> tuple[set[str], set[str]]:
    """The fields of the worker's parts (set by ``self.x = ...`` in a class's own methods,
    or read through a property), and those of its records (dataclasses, RECORDS)."""
    parts: set[str] = set()
    records: set[str] = set()
    for name, path in _modules().items():
        if not name.startswith("pgq._worker"):
            continue
        for cls in ast.walk(ast.parse(path.read_text())):
            if not isinstance(cls, ast.ClassDef):
                continue
            record = cls.name in RECORDS or _is_dataclass(cls)
            owned = records if record else parts
            for stmt in cls.body:  # fields declared in the class body (dataclasses)
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    owned.add(stmt.target.id)
            for node in ast.walk(cls):
                if (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.ctx, ast.Store)
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "self"
                ):
                    owned.add(node.attr)
                elif isinstance(node, ast.FunctionDef) and any(
                    isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list
                ):
                    owned.add(node.name)
    return parts, records


def _foreign_assignments(source: str, parts: set[str], records: set[str]) -> list[str]:
    """Assignments in ``source`` to another object's part field: through a chain
    (``self.health.healthy = ...``), to a producer's or its liveness parts' (``producer.id
    = ...``), or to a field only parts have."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        for target in targets:
            for attr in ast.walk(target):
                if not isinstance(attr, ast.Attribute) or not isinstance(attr.ctx, ast.Store):
                    continue
                base = attr.value
                if isinstance(base, ast.Name) and base.id in ("self", "cls"):
                    continue  # its own
                if (
                    isinstance(base, ast.Attribute)
                    or (isinstance(base, ast.Name) and base.id.endswith(PART_NAMES))
                    or (attr.attr in parts and attr.attr not in records)
                ):
                    found.append(f"line {node.lineno}: {ast.unparse(attr)}")
    return found


def test_no_part_of_the_worker_assigns_another_parts_fields() -> None:
    """One part never assigns another's fields: it calls a method the owner exposes
    (liveness re-registers a producer through its ProducerIdentity, the claim loop asks the
    batch runner to wait for room)."""
    parts, records = _worker_fields()
    # The check catches what it is for.
    reaching_in = "producer.id = new_id\nself.health.on_fenced = f\np.former_ids = []"
    assert len(_foreign_assignments(reaching_in, parts, records)) == 3
    assert _foreign_assignments("execution.reason = FENCED", parts, records) == []
    offenders = [
        f"{name} {found}"
        for name, path in _modules().items()
        if name.startswith("pgq._worker") or name in ("pgq.testing", "pgq.client")
        for found in _foreign_assignments(path.read_text(), parts, records)
    ]
    assert offenders == []


def test_no_statement_is_assembled_from_fragments() -> None:
    """Every statement exists whole in a ``.sql`` file: the module reading them joins no
    text (no ``+``, f-string, ``%`` or ``.format``/``.join``/``.replace``), and no code
    edits or joins a named statement."""
    from pgq._db import sql

    assert all(type(s) is str for s in sql.STATEMENTS.values())
    loader = SRC / "_db" / "sql" / "__init__.py"
    for node in ast.walk(ast.parse(loader.read_text())):
        assert not isinstance(node, ast.JoinedStr), node.lineno
        if isinstance(node, ast.BinOp):
            assert not isinstance(node.op, ast.Add | ast.Mod), node.lineno
        if isinstance(node, ast.Attribute):
            assert node.attr not in ("format", "join", "replace"), node.lineno

    def is_statement(node: ast.AST) -> bool:
        return (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "sql"
            and node.attr in sql.STATEMENTS
        )

    glued = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.BinOp)
                and (is_statement(node.left) or is_statement(node.right))
            ) or (isinstance(node, ast.FormattedValue) and is_statement(node.value)):
                glued.append(f"{name}:{node.lineno}")
            elif isinstance(node, ast.Attribute) and is_statement(node.value):
                glued.append(f"{name}:{node.lineno}")  # sql.X.replace(...), sql.X.format(...)
    assert glued == []


#: Modules that build a Job not from a row, each for a reason of its own.
JOB_BUILDERS_ELSEWHERE = {
    # A rescue's report to the hooks: the job as far as the rescue knows it, not re-read.
    "pgq._worker.recovery",
    # pgq.testing runs a task in memory, without a database: the job is made up.
    "pgq.testing",
}


def test_one_module_builds_jobs_from_rows() -> None:
    """Every Job the store returns is made in pgq._db.codec (rows, claims, enqueues)."""
    builders = set()
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "Job"
            ):
                builders.add(name)
    assert builders == {"pgq._db.codec", *JOB_BUILDERS_ELSEWHERE}
