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


ROOT = DOCS.parent
#: The pages whose relative links are checked: every doc, and the two READMEs.
LINKING = sorted({*DOCS.glob("**/*.md"), ROOT / "README.md", ROOT / "benchmarks" / "README.md"})


def unfenced(text: str) -> list[str]:
    """The lines of ``text`` outside fenced code blocks (no heading or link there)."""
    kept: list[str] = []
    fenced = False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            kept.append(line)
    return kept


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text as rendered (links by their text, no code
    marks), lowercased, without punctuation but hyphens and underscores, spaces as hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor on ``page``; a repeated one gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for line in unfenced(page.read_text()):
        heading = re.match(r"#{1,6} +(.*?)(?: +#+)? *$", line)
        if heading:
            name = slug(heading.group(1))
            count = seen.get(name, 0)
            found.add(f"{name}-{count}" if count else name)
            seen[name] = count + 1
    return found


def test_anchors_follow_githubs_rules() -> None:
    assert slug("Committing without waiting for the disk (`async_commit`)") == (
        "committing-without-waiting-for-the-disk-async_commit"
    )
    assert slug("What is guaranteed, exactly: three levels") == (
        "what-is-guaranteed-exactly-three-levels"
    )
    assert slug("`make bench`: pgq beside PgQueuer") == "make-bench-pgq-beside-pgqueuer"
    assert slug("What happens when…") == "what-happens-when"
    assert slug("A killed worker's jobs") == "a-killed-workers-jobs"


def test_links_between_docs_resolve() -> None:
    """Every relative link of the docs and READMEs names a file that exists, and every
    ``#anchor`` into a markdown page names one of its headings."""
    broken: list[str] = []
    for page in LINKING:
        text = re.sub(r"`[^`\n]*`", "", "\n".join(unfenced(page.read_text())))
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)} links to {target}"
            if not linked.exists():
                broken.append(f"{where}: no such file")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append(f"{where}: no such heading in {linked.name}")
    assert not broken, "\n".join(broken)


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
