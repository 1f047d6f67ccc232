"""A small application whose tasks the example test suite (test_signup.py) exercises."""

from __future__ import annotations

import pgq

app = pgq.App()
sent: list[str] = []
attempts: dict[str, int] = {}


@app.task(queue="emails", max_attempts=3, backoff=pgq.Backoff(base_s=3600))
async def send_welcome(ctx: pgq.JobContext, to: str) -> str:
    """Flaky on purpose: fails the first time for each address, then sends."""
    attempts[to] = attempts.get(to, 0) + 1
    if attempts[to] == 1:
        raise ConnectionError("mail server busy")
    sent.append(to)
    return f"welcomed {to}"


@app.task
def count_words(ctx: pgq.JobContext, text: str) -> int:
    return len(text.split())


async def signup(client: pgq.Client, email: str) -> pgq.Job[str]:
    """What the application does on a signup: a welcome e-mail, an hour from now."""
    return await client.enqueue(send_welcome.spec(to=email), delay=3600)
