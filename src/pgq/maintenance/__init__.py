"""Work only the leader does: promote due jobs, rescue jobs of dead or hung producers, reap
producer rows long gone silent."""

from pgq.maintenance.runner import Maintenance

__all__ = ("Maintenance",)
