import subprocess
import sys

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
