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
