"""Transactional enqueue: the job exists if, and only if, the caller's transaction commits."""

from __future__ import annotations

import asyncpg
import psycopg
from sqlalchemy import Column, Integer, MetaData, Table, Text, insert
from sqlalchemy.ext.asyncio import AsyncSession

import pgq

users = Table("users", MetaData(), Column("id", Integer, primary_key=True), Column("email", Text))


async def signup_asyncpg(pool: asyncpg.Pool[asyncpg.Record], client: pgq.Client, email: str) -> int:
    """Insert a user and enqueue their welcome email in one asyncpg transaction."""
    async with pool.acquire() as conn, conn.transaction():
        user_id: int = await conn.fetchval(
            "INSERT INTO users (email) VALUES ($1) RETURNING id", email
        )
        await client.enqueue("send_welcome", {"user_id": user_id}, connection=conn)
    return user_id


async def signup_psycopg(conn: psycopg.AsyncConnection, client: pgq.Client, email: str) -> int:
    """The same on psycopg's async connection."""
    async with conn.transaction():
        cursor = await conn.execute("INSERT INTO users (email) VALUES (%s) RETURNING id", [email])
        row = await cursor.fetchone()
        assert row is not None
        user_id: int = row[0]
        await client.enqueue("send_welcome", {"user_id": user_id}, connection=conn)
    return user_id


async def signup_sqlalchemy(session: AsyncSession, client: pgq.Client, email: str) -> int:
    """The same with a SQLAlchemy AsyncSession (on postgresql+asyncpg or
    postgresql+psycopg): commit or roll back both."""
    async with session.begin():
        result = await session.execute(insert(users).values(email=email).returning(users.c.id))
        user_id: int = result.scalar_one()
        await client.enqueue("send_welcome", {"user_id": user_id}, connection=session)
    return user_id
