"""docs/migrations.md shows the env.py a test runs in a project of its own."""

from __future__ import annotations

import ast
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_migrations_md_shows_the_tested_env_py() -> None:
    example = (DOCS / "examples" / "alembic" / "env.py").read_text()
    docstring = ast.get_docstring(ast.parse(example))
    assert docstring is not None
    body = example.split('"""', 2)[2].lstrip("\n")  # the code after the module docstring
    page = (DOCS / "migrations.md").read_text()
    assert f"```python\n# alembic/env.py\n{body}```" in page
