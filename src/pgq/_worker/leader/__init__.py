"""What only the leader does: the lease (``elector``), and the services started while it
leads, each with a ``run_once()`` and a loop of its own (``services``): the rescuer, periodic
jobs and retention in modules of their own, the promoter, the reaper, the throughput rollup,
the table's statistics and the unrunnable-jobs report in ``services``."""
