"""``pgq worker --processes``: the flag's values, the supervisor's verdict on its children
and the children's metrics gathered into one scrape (no processes here: see
tests/faults/test_processes.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest

from pgq._cli import main
from pgq._cli.parser import build_parser
from pgq._cli.supervisor import (
    MAX_DELAY,
    MAX_START_FAILURES,
    RESET_AFTER,
    SILENT_AFTER_S,
    FleetHealth,
    RestartPolicy,
    merge_metrics,
    usable_cpus,
)


@pytest.mark.parametrize("value", ["0", "-1", "abc", "1.5", ""])
def test_a_bad_processes_value_is_refused_naming_the_flag(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit:
        main(["worker", "tasks:app", "--processes", value])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert "argument --processes" in err and "whole number of processes >= 1, or auto" in err


def test_a_bad_processes_variable_is_refused_naming_the_flag(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PGQ_PROCESSES", "none")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["worker", "tasks:app"])
    assert "argument --processes" in capsys.readouterr().err


def test_processes_auto_counts_the_cpus_this_process_may_use() -> None:
    args = build_parser().parse_args(["worker", "tasks:app", "--processes", "auto"])
    assert args.processes == usable_cpus() >= 1
    assert build_parser().parse_args(["worker", "tasks:app"]).processes == 1
    assert build_parser().parse_args(["worker", "a:b", "--processes", "3"]).processes == 3


@dataclass
class FakeChild:
    index: int
    name: str
    running: bool = True
    started: bool = True
    pid: int | None = 10
    health_port: int | None = None
    spawned_at: float = 0.0
    restarts: int = 0
    last_status: int | None = None


def test_the_fleet_is_healthy_only_while_every_child_runs_and_answers() -> None:
    now = time.monotonic()
    well = FakeChild(1, "w-1", spawned_at=now)
    fleet = FleetHealth([well, FakeChild(2, "w-2", spawned_at=now)], startup_grace_s=30)
    ok, body = fleet.check()
    assert ok and [w["status"] for w in body["workers"]] == ["ok", "ok"]

    dead = FakeChild(2, "w-2", running=False, last_status=137, spawned_at=now)
    ok, body = FleetHealth([well, dead], 30).check()
    assert not ok and body["reason"] == "w-2: down (killed by SIGKILL)"

    silent = FakeChild(2, "w-2", spawned_at=now - SILENT_AFTER_S - 1)
    ok, body = FleetHealth([well, silent], 30).check()
    assert not ok and body["reason"].startswith("w-2: its health endpoint has not answered")

    late = FakeChild(2, "w-2", started=False, spawned_at=now - 31)
    ok, body = FleetHealth([well, late], 30).check()
    assert not ok and "w-2: not started after 31s" in body["reason"]
    starting = FakeChild(2, "w-2", started=False, spawned_at=now)
    assert FleetHealth([well, starting], 30).check()[0]


def test_the_childrens_metrics_become_one_scrape_labelled_by_worker() -> None:
    one = (
        "# HELP pgq_jobs_total Attempts\n# TYPE pgq_jobs_total counter\n"
        'pgq_jobs_total{queue="q",task="t",outcome="completed"} 3.0\n'
        "# HELP pgq_worker_leader Leads\n# TYPE pgq_worker_leader gauge\n"
        "pgq_worker_leader 1.0\n"
    )
    two = one.replace("3.0", "4.0").replace("leader 1.0", "leader 0.0")
    text = merge_metrics([("a-1", one), ('a"2', two), ("a-3", None)])
    lines = text.splitlines()
    assert lines.count("# TYPE pgq_jobs_total counter") == 1
    assert lines[lines.index("# TYPE pgq_jobs_total counter") + 1 :][:2] == [
        'pgq_jobs_total{worker="a-1",queue="q",task="t",outcome="completed"} 3.0',
        'pgq_jobs_total{worker="a\\"2",queue="q",task="t",outcome="completed"} 4.0',
    ]
    assert 'pgq_worker_leader{worker="a-1"} 1.0' in lines
    assert 'pgq_worker_leader{worker="a\\"2"} 0.0' in lines
    assert 'pgq_worker_up{worker="a-3"} 0' in lines and 'pgq_worker_up{worker="a-1"} 1' in lines


def test_a_crash_loop_backs_off_and_a_child_that_cannot_start_is_given_up() -> None:
    policy = RestartPolicy()
    delays = [policy.after_exit(started=True, ran_s=1.0) for _ in range(9)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0] and MAX_DELAY == 30
    assert policy.after_exit(started=True, ran_s=RESET_AFTER) == 0.5, "a long run resets"
    # Once it has started, failures to start again are retried, up to a bound.
    retried = [policy.after_exit(started=False, ran_s=0.1) for _ in range(MAX_START_FAILURES)]
    assert None not in retried[:-1] and retried[-1] is None
    # Never started at all (an import error): no restart.
    assert RestartPolicy().after_exit(started=False, ran_s=2.0) is None
