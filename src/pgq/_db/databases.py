"""Databases for tests (pgq.testing): created from a template, dropped by force."""

from __future__ import annotations

from pgq._db import sql
from pgq._db.connections import Connection


async def create_database(conn: Connection, name: str, template: str | None = None) -> None:
    """Create database ``name`` (a copy of ``template`` when given). Runs outside a
    transaction, as CREATE DATABASE must; the server quotes the names."""
    statement: str = await conn.fetchval(sql.CREATE_DATABASE, name, template)
    await conn.execute(statement)


async def drop_database(conn: Connection, name: str) -> None:
    """Drop database ``name`` if it exists, disconnecting whoever is still on it."""
    statement: str = await conn.fetchval(sql.DROP_DATABASE, name)
    await conn.execute(statement)
