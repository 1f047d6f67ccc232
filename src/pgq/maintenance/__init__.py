"""Work only the leader does: promote due jobs, enqueue periodic jobs, rescue jobs of dead or
hung producers, reap producer rows long gone silent, delete old finished jobs."""

from pgq.maintenance.periodic import Periodic
from pgq.maintenance.runner import LeaderService, LeaderServices
from pgq.maintenance.services import Promoter, Reaper, Rescuer, RescueResult, Retention

__all__ = (
    "LeaderService",
    "LeaderServices",
    "Periodic",
    "Promoter",
    "Reaper",
    "RescueResult",
    "Rescuer",
    "Retention",
)
