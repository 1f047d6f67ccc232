"""Docs stay true: every setting is documented, every docs link resolves."""

import re
from pathlib import Path

from pgq.settings import env_name, setting_help

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_every_worker_setting_is_in_the_configuration_reference() -> None:
    text = (DOCS / "configuration.md").read_text()
    for name, (default, _help) in setting_help().items():
        row = next((line for line in text.splitlines() if line.startswith(f"| `{name}` |")), None)
        assert row is not None, name
        assert f"`--{name.replace('_', '-')}`" in row and f"`{env_name(name)}`" in row
        assert f"| {default} |" in row, f"{name}: documented default differs from {default}"


def test_links_between_docs_resolve() -> None:
    for page in [*DOCS.glob("*.md"), DOCS.parent / "README.md"]:
        for target in re.findall(r"\]\(([^)#]+\.(?:md|py|png))(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


def test_every_liveness_setting_is_explained_with_its_default() -> None:
    text = (DOCS / "liveness.md").read_text()
    for name in (
        "heartbeat_interval",
        "heartbeat_timeout",
        "max_heartbeat_failures",
        "stale_after",
        "rescue_interval",
        "rescue_grace",
        "leader_ttl",
        "reap_after",
    ):
        default = setting_help()[name][0]
        row = next(line for line in text.splitlines() if line.startswith(f"| `{name}` |"))
        shown = row.split("|")[2].strip().removesuffix(" s")
        assert float(shown) == float(default), name


def test_retention_defaults_in_the_lifecycle_page() -> None:
    text = (DOCS / "lifecycle.md").read_text()
    for name in ("retention_completed", "retention_cancelled", "retention_discarded"):
        default = setting_help()[name][0]
        row = next(line for line in text.splitlines() if line.startswith(f"| `{name}` |"))
        assert float(row.split("|")[2].split()[0]) == float(default), name


def test_the_uvicorn_logging_config_shown_is_the_one_tested() -> None:
    """docs/embedding.md shows the config inline (users copy it; the wheel does not ship
    docs/); the suite runs uvicorn with the file, so the two must be the same."""
    import json

    text = (DOCS / "embedding.md").read_text()
    shown = re.search(r"```json\n(.*?)```", text, re.S)
    assert shown is not None
    tested = (DOCS / "examples" / "uvicorn_logging.json").read_text()
    assert json.loads(shown.group(1)) == json.loads(tested)


def test_the_readme_example_is_the_file_the_suite_runs() -> None:
    """The README shows docs/examples/quickstart.py (tests/integration runs it): every
    line of its Python block is in that file, in the same order."""
    readme = (DOCS.parent / "README.md").read_text()
    shown = re.search(r"```python\n(.*?)```", readme, re.S)
    assert shown is not None
    example = (DOCS / "examples" / "quickstart.py").read_text()
    position = 0
    for line in filter(None, shown.group(1).splitlines()):
        found = example.find(line + "\n", position)
        assert found >= 0, f"README line not in quickstart.py (or out of order): {line}"
        position = found + len(line)
