"""How the command line sets up logging: pgq's own loggers (``pgq.*``) at ``--log-level``,
every other library's at ``--library-log-level`` (WARNING: an HTTP client a task uses does
not log a line per request), as pgq's text or JSON lines on stderr; or, with
``--log-config``, a logging configuration file instead (docs/observability.md)."""

from __future__ import annotations

import argparse
import json
import logging
import logging.config
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pgq.errors import ConfigError
from pgq.logs import JsonFormatter, TextFormatter

LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR"]
FORMATS = ["text", "json"]


def add_flags(p: argparse.ArgumentParser, *, default: Any) -> None:
    """--log-level, --library-log-level, --log-format and --log-config, on the top-level
    parser (``default`` None) and on each command's (SUPPRESS: the one after the command
    wins). Their variables are read by :func:`settings`."""
    p.add_argument(
        "--log-level",
        default=default,
        type=str.upper,
        choices=LEVELS,
        help="the level of pgq's own loggers (default: PGQ_LOG_LEVEL, else INFO)",
    )
    p.add_argument(
        "--library-log-level",
        default=default,
        type=str.upper,
        choices=LEVELS,
        help="the level of every other library's loggers: httpx, asyncpg, uvicorn... "
        "(default: PGQ_LIBRARY_LOG_LEVEL, else WARNING)",
    )
    p.add_argument(
        "--log-format",
        default=default,
        type=str.lower,
        choices=FORMATS,
        help="text, or json: one object per line with the job's fields (default: "
        "PGQ_LOG_FORMAT, else text)",
    )
    p.add_argument(
        "--log-config",
        default=default,
        metavar="PATH",
        help="a logging configuration file: a dictConfig in .json, else a fileConfig .ini; it "
        "replaces pgq's set-up, and --log-level and --library-log-level, when given, still "
        "set their levels after it (default: PGQ_LOG_CONFIG)",
    )


@dataclass(frozen=True, slots=True)
class LogSettings:
    """What the flags and variables ask for. ``level`` and ``library_level`` are None where
    neither says (then INFO and WARNING, unless a config file sets them)."""

    level: str | None
    library_level: str | None
    format: str | None
    config: Path | None


def settings(args: argparse.Namespace) -> LogSettings:
    """The logging flags, else their variables (``PGQ_LOG_LEVEL``, ``PGQ_LIBRARY_LOG_LEVEL``,
    ``PGQ_LOG_FORMAT``, ``PGQ_LOG_CONFIG``), checked: argparse checks flags, not variables."""
    config = args.log_config or os.environ.get("PGQ_LOG_CONFIG") or None
    found = LogSettings(
        _given(args.log_level, "--log-level", "PGQ_LOG_LEVEL", LEVELS, str.upper),
        _given(
            args.library_log_level,
            "--library-log-level",
            "PGQ_LIBRARY_LOG_LEVEL",
            LEVELS,
            str.upper,
        ),
        _given(args.log_format, "--log-format", "PGQ_LOG_FORMAT", FORMATS, str.lower),
        Path(config) if config is not None else None,
    )
    if found.config is not None and found.format is not None:
        raise ConfigError(
            "--log-format (or PGQ_LOG_FORMAT) and --log-config do not go together: the "
            "file's formatters decide the format (pgq.logs.JsonFormatter writes pgq's JSON "
            "lines); drop one"
        )
    return found


def _given(
    flag: str | None, name: str, variable: str, choices: list[str], case: Callable[[str], str]
) -> str | None:
    if flag is not None:
        return flag  # argparse checked it
    value = case(os.environ.get(variable, "").strip())
    if not value:
        return None
    if value not in choices:
        allowed = " or ".join(choices) if len(choices) == 2 else "one of " + ", ".join(choices)
        raise ConfigError(
            f"{name.removeprefix('--').replace('-', ' ')} must be {allowed}, not {value!r} "
            f"({variable})"
        )
    return value


def configure(found: LogSettings) -> None:
    """Set logging up as ``found`` says, once, at the start of a command."""
    if found.config is not None:
        _apply_file(found.config)
    else:
        handler = logging.StreamHandler()
        handler.setFormatter(JsonFormatter() if found.format == "json" else TextFormatter())
        logging.basicConfig(level=found.library_level or "WARNING", handlers=[handler])
        logging.getLogger("pgq").setLevel(found.level or "INFO")
        return
    # After a file, only what was asked for: its levels stand otherwise.
    if found.library_level is not None:
        logging.getLogger().setLevel(found.library_level)
    if found.level is not None:
        logging.getLogger("pgq").setLevel(found.level)


def _apply_file(path: Path) -> None:
    """A dictConfig (``.json``) or a fileConfig (any other suffix). Loggers made before it
    (pgq's own, at import) stay enabled unless the file says otherwise."""
    where = f"--log-config {str(path)!r}"
    try:
        if path.suffix.lower() == ".json":
            config = json.loads(path.read_text())
            if not isinstance(config, dict):
                raise ConfigError(f"{where}: expected a JSON object (a logging dictConfig)")
            config.setdefault("disable_existing_loggers", False)
            logging.config.dictConfig(config)
        else:
            if not path.is_file():  # fileConfig's own error says only "it is empty"
                raise FileNotFoundError(f"no such file: {str(path)!r}")
            logging.config.fileConfig(path, disable_existing_loggers=False)
    except ConfigError:
        raise
    except Exception as exc:
        # json's errors, dictConfig's naming the bad part, configparser's, and whatever a
        # handler the file names raised as it was made: the file is not usable as it is.
        cause = f" ({type(exc.__cause__).__name__}: {exc.__cause__})" if exc.__cause__ else ""
        detail = " ".join(f"{type(exc).__name__}: {exc}{cause}".split())
        raise ConfigError(
            f"{where} cannot be used: {detail}; it takes a logging dictConfig as JSON (a file "
            "ending in .json) or a logging fileConfig (an .ini)"
        ) from exc
