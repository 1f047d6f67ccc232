"""What a queue or task may be named: checked wherever a name enters (registration, enqueue,
the CLI, the dashboard's forms), so one rule holds everywhere."""

from __future__ import annotations

import re

from pgq.errors import ConfigError

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")
_TASK_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:\-]*")


def check_queue_name(name: object) -> str:
    """Return ``name`` if it is a valid queue name, else raise :class:`ConfigError`."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or len(name) > 128:
        raise ConfigError(
            f"invalid queue name {name!r}: use 1 to 128 letters, digits, '_', '.' or '-', "
            "not starting with '.' or '-'"
        )
    return name


def check_task_name(name: object) -> str:
    """Return ``name`` if it is a valid task name, else raise :class:`ConfigError`."""
    if not isinstance(name, str) or not _TASK_NAME.fullmatch(name) or len(name) > 255:
        raise ConfigError(
            f"invalid task name {name!r}: use 1 to 255 letters, digits, '_', '.', ':' or '-'"
        )
    return name
