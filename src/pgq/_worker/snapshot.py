"""A worker's snapshot for operators: what ``Worker.stats()`` returns, read off its parts."""

from __future__ import annotations

import dataclasses
import time
import uuid
from typing import Any

from pgq._worker.assembly import Parts


def worker_stats(
    worker_id: uuid.UUID, name: str, p: Parts | None, job_log_suppressed: int
) -> dict[str, Any]:
    """The snapshot :meth:`pgq.Worker.stats` describes (``p``: None before the worker
    runs)."""
    return {
        "worker_id": str(worker_id),
        "worker_name": name,
        "time": time.time(),
        "leader": p is not None and p.elector.is_leader,
        "leader_terms": p.elector.terms if p else 0,
        "rescued": p.rescuer.rescued if p else 0,
        "reaped": p.reaper.reaped if p else 0,
        "retention_deleted": p.retention.deleted if p else 0,
        "periodic_enqueued": p.periodic.enqueued if p and p.periodic else 0,
        "leader_services": ({n: st.snapshot() for n, st in p.leader.status.items()} if p else {}),
        "heartbeats": p.heartbeater.beats if p else 0,
        "heartbeat_failures": p.heartbeater.failures if p else 0,
        "job_log_suppressed": job_log_suppressed,
        "predecessor_rescued": p.successor.rescued if p and p.successor else 0,
        "duplicate_names": len(p.successor.duplicates) if p and p.successor else 0,
        "reregistrations": p.heartbeater.reregistrations if p else 0,
        "strays_handed_back": p.strays.handed_back if p else 0,
        "rescue_events_waiting": p.reports.waiting if p else 0,
        "cancelled_on_request": p.control.cancelled if p else 0,
        "listen_reconnects": p.control.listen_reconnects if p else 0,
        "outcomes_pending": p.completer.pending if p else 0,
        "outcomes_held": p.completer.held if p else 0,
        "outcomes_salvaged": p.completer.salvaged if p else 0,
        "outcomes_waiting_on_locks": p.completer.waiting_on_locks if p else 0,
        "resource_failures": sum(pr.resources.total for pr in p.producers) if p else 0,
        "unrunnable": (
            [dataclasses.asdict(u) for u in p.unrunnable.found] if p and p.elector.is_leader else []
        ),
        "producers": [producer.stats() for producer in p.producers] if p else [],
    }
