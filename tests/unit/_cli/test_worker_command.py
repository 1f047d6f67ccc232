"""`pgq worker`'s queue flags."""

import pytest

from pgq._cli.worker_command import parse_queues
from pgq.errors import ConfigError


def test_cli_queue_flags() -> None:
    assert parse_queues(["emails:20", "reports"], 4) == {"emails": 20, "reports": 4}
    assert parse_queues([], 4) is None
    with pytest.raises(ConfigError, match="whole number"):
        parse_queues(["emails:x"], None)
