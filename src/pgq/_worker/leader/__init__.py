"""What only the leader does: the lease (``elector``), and the services started while it
leads (``promoter``, ``periodic``, ``rescuer``, ``reaper``, ``retention``), each with a
``run_once()`` and a loop of its own in ``services``."""
