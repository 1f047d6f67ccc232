"""What a queue may be named."""

import pytest

from pgq._core.names import check_queue_name
from pgq.errors import ConfigError


@pytest.mark.parametrize("name", ["", "with space", "semi;colon", "-dash", "x" * 129, "é", None])
def test_odd_queue_names_are_refused(name: object) -> None:
    with pytest.raises(ConfigError, match="invalid queue name"):
        check_queue_name(name)
