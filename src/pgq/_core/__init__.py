"""Pure Python, no I/O: what every layer above shares (checks before anything is written,
serialization, names, cron, backoff, DSNs, hooks, the lifespan, observability). Nothing
here imports the database, the worker or the command line."""
