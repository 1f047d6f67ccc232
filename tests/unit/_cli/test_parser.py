"""The command line's usage errors (argparse's) never show a password: every argument shaped
like a DSN is masked before one is printed, whatever its shape and wherever it stands."""

from __future__ import annotations

import pytest

from pgq._cli import main
from tests.unit._core.test_dsn import SECRET_SHAPES


@pytest.mark.parametrize(
    "usage",
    [
        ["DSN"],  # taken for the command
        ["DSN", "stats"],
        ["--dsn", "DSN", "stats", "DSN"],  # an extra argument
        ["stats", "--pooler", "DSN"],  # not a choice
        ["jobs", "show", "DSN"],  # not a job id
        ["worker", "app:app", "--health-port", "DSN"],  # not a port
        ["--dsn=DSN", "nope"],  # an unknown command, the DSN glued to its flag
        ["stats", "--dsn=DSN", "--limit", "3"],  # an unknown option
        ["queues", "pause"],  # a missing argument, the DSN given well
    ],
)
@pytest.mark.parametrize(("dsn", "pieces"), SECRET_SHAPES)
def test_no_usage_error_shows_a_password(
    capsys: pytest.CaptureFixture[str], usage: list[str], dsn: str, pieces: list[str]
) -> None:
    args = [a.replace("DSN", dsn) for a in usage]
    if "DSN" not in " ".join(usage):
        args = ["--dsn", dsn, *args]
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 2
    out = capsys.readouterr()
    assert "error: " in out.err
    for piece in pieces:
        assert piece not in out.err + out.out, (args, out.err)


def test_the_password_of_auth_is_masked_too(capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["stats", "--auth", "ops:hunter22"], ["stats", "--auth=ops:hunter22"]):
        with pytest.raises(SystemExit):
            main(args)
        err = capsys.readouterr().err
        assert "unrecognized arguments: --auth" in err and "hunter22" not in err, err


def test_a_message_without_a_dsn_is_left_as_argparse_wrote_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["stats", "--queue", "work:2"])
    assert "unrecognized arguments: --queue work:2" in capsys.readouterr().err
