"""What a queue or task may be named: checked wherever a name enters (registration, enqueue,
the CLI, the dashboard's forms), so one rule holds everywhere; and what a host name looks
like, for the addresses and Host names the CLI and the dashboard are given."""

from __future__ import annotations

import re

from pgq.errors import ConfigError

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")
_TASK_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:\-]*")
#: A host name's label (RFC 1123, and the underscores of container names): letters, digits,
#: '_' and inner hyphens, at most 63 characters.
_LABEL = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)")


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


def is_host_name(text: str) -> bool:
    """Whether ``text`` is a host name (``localhost``, ``dash.example.com``, a final dot
    allowed): labels of letters, digits, '_' and inner hyphens, at most 253 characters."""
    labels = text.removesuffix(".").split(".")
    return len(text) <= 253 and all(_LABEL.fullmatch(label) for label in labels)
