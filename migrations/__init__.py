"""The repository's alembic environment (alembic.ini): env.py and the template of new
revisions. The revisions themselves ship in the package, in ``pgq/migrations/versions``,
and ``pgq migrate`` runs them without this environment (:mod:`pgq.migrate`)."""
