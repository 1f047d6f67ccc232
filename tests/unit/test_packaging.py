"""The wheel ships what a user needs: the migrations inside the package, the statements
(``.sql`` files), and py.typed."""

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_contains_the_migrations(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("pgq_async-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for expected in (
        "pgq/py.typed",
        "pgq/migrations/env.py",
        "pgq/migrations/versions/pgq_0001_schema.py",
        "pgq/migrations/versions/pgq_0002_lifecycle.py",
        "pgq/migrations/versions/pgq_0003_attempt_token.py",
        "pgq/migrations/versions/pgq_0004_operator.py",
        "pgq/_store/sql/claims.sql",
        "pgq/_store/sql/outcomes.sql",
    ):
        assert expected in names
