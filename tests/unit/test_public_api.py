import dataclasses
import enum
import importlib
import inspect
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pgq


def test_all_is_exactly_the_public_names() -> None:
    public = {name for name in dir(pgq) if not name.startswith("_")}
    modules = {name for name in public if type(getattr(pgq, name)).__name__ == "module"}
    assert isinstance(pgq.__all__, tuple)
    assert set(pgq.__all__) == public - modules
    assert len(pgq.__all__) == len(set(pgq.__all__))


def test_every_public_name_has_a_docstring() -> None:
    for name in pgq.__all__:
        assert getattr(pgq, name).__doc__, name


def test_importing_pgq_leaves_sqlalchemy_and_alembic_unloaded() -> None:
    """Clients and workers run on asyncpg alone; SQLAlchemy (migrations, connection= with a
    session) loads only when used, keeping their import and their heap small."""
    code = "import sys, pgq, pgq._cli; print(sorted(m for m in ('sqlalchemy', 'alembic') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------- the snapshot

#: The public surface as it stands: every name of ``pgq.__all__`` and of the public modules,
#: with its signature. Regenerate after a deliberate change of the surface with
#: ``.venv/bin/python -m tests.unit.test_public_api``, and say why in the commit.
SNAPSHOT = Path(__file__).with_name("public_api.json")
#: The public modules whose own names (classes and functions defined there) are surface too.
PUBLIC_MODULES = (
    "pgq.app", "pgq.client", "pgq.dashboard", "pgq.errors", "pgq.job", "pgq.logs",
    "pgq.migrate", "pgq.schema", "pgq.settings", "pgq.testing",
)  # fmt: skip


def _signature(obj: Any) -> str:
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(no signature)"


def _member(cls: type, name: str) -> str | None:
    """How ``cls`` exposes ``name``, or None when it comes from outside pgq (``object``,
    ``Exception``, ``str``)."""
    for owner in cls.__mro__:
        if name in vars(owner):
            if not owner.__module__.startswith("pgq"):
                return None
            raw = vars(owner)[name]
            break
    else:  # pragma: no cover - dir() lists only what the MRO holds
        return None
    if isinstance(raw, property):
        return f"property -> {raw.fget.__annotations__.get('return') if raw.fget else None}"
    if isinstance(raw, classmethod | staticmethod):
        return f"{type(raw).__name__} {_signature(getattr(cls, name))}"
    if inspect.isfunction(raw):
        kind = "async def" if inspect.iscoroutinefunction(raw) else "def"
        return f"{kind} {_signature(raw)}"
    if isinstance(raw, enum.Enum):
        return f"member {raw.value!r}"
    return f"attribute {type(raw).__name__}"


def _describe(obj: Any) -> dict[str, Any]:
    if inspect.isclass(obj):
        entry: dict[str, Any] = {
            "kind": "class",
            "bases": [b.__qualname__ for b in obj.__bases__],
            "init": _signature(obj),
        }
        if dataclasses.is_dataclass(obj):
            entry["fields"] = [f"{f.name}: {f.type}" for f in dataclasses.fields(obj)]
        members = {}
        for name in sorted(dir(obj)):
            if name.startswith("_"):
                continue
            described = _member(obj, name)
            if described is not None:
                members[name] = described
        entry["members"] = members
        return entry
    if callable(obj):
        kind = "async def" if inspect.iscoroutinefunction(obj) else "def"
        return {"kind": kind, "signature": _signature(obj)}
    return {"kind": type(obj).__name__}


def public_surface() -> dict[str, Any]:
    """``pgq.__all__`` in order, each public name described, and the public modules' own
    names."""
    modules: dict[str, Any] = {}
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        own = {}
        for name, obj in sorted(vars(module).items()):
            if name.startswith("_") or getattr(obj, "__module__", None) != module_name:
                continue
            if inspect.isclass(obj) or inspect.isfunction(obj):
                own[name] = _describe(obj)
        modules[module_name] = own
    return {
        "__all__": list(pgq.__all__),
        "names": {name: _describe(getattr(pgq, name)) for name in pgq.__all__},
        "modules": modules,
    }


def test_the_public_surface_matches_its_snapshot() -> None:
    """No public name, signature or dataclass field changes by accident (a move of the
    internals, a refactor): a deliberate change regenerates the snapshot (see SNAPSHOT)."""
    expected = json.loads(SNAPSHOT.read_text())
    assert public_surface() == expected, (
        "the public surface changed; if on purpose, regenerate tests/unit/public_api.json "
        "with `python -m tests.unit.test_public_api` and say why in the commit"
    )


if __name__ == "__main__":
    SNAPSHOT.write_text(json.dumps(public_surface(), indent=1) + "\n")
    print(f"wrote {SNAPSHOT}")
