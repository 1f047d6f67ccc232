"""The only code that talks to Postgres.

``sql`` holds every statement; ``connections`` opens pools and connections and classifies
errors; ``boundary`` raises the drivers' errors as pgq's at the public calls; ``codec`` maps
job rows to :class:`~pgq.Job`; ``revision`` checks the schema; the other modules hold one
function per operation (``jobs.cancel``, ``claims.claim``, ``producers.heartbeat``,
``maintenance.rescue``, ...). Every function takes the connection or pool to run on first,
so a caller chooses the transaction; the enqueue's plans (``enqueue``) run on any driver
(``drivers``: asyncpg and a caller's connection; ``psycopg_drivers``: psycopg's two).
"""
