"""The example application's test set-up: importable from its tests (a project has its own
way), and its own alembic migrations run once per session into pgq's template database."""

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


@pytest.fixture(scope="session")
def pgq_template_setup() -> Callable[[str], None]:
    """pgq's plugin runs this once, on the template every test's database is copied from."""

    def upgrade(dsn: str) -> None:
        config = Config()
        config.set_main_option("script_location", str(HERE / "migrations"))
        config.set_main_option("sqlalchemy.url", dsn.replace("postgresql:", "postgresql+asyncpg:"))
        command.upgrade(config, "head")

    return upgrade
