"""A served stream closed early from another context still ends the behaviour's work (tandem.serving)."""
from __future__ import annotations

import asyncio

from tandem.serving import _serve
from tandem.sessions import CALLER


class Context:
    def peer(self) -> str:
        return "ipv4:127.0.0.1:5"

    async def abort(self, code, details):
        raise AssertionError(f"aborted: {code} {details}")


def test_a_stream_closed_from_another_context_runs_the_behaviours_cleanup():
    """grpc may close a cancelled stream's handler from a task other than the one that iterated it: the
    guard's CALLER.reset then fails (a token of another context). Before, that ValueError escaped, the
    behaviour's generator was left open, and its request slot and sessions leaked (the load test's "active
    requests 1" after the run)."""
    cleaned, seen = [], []

    async def behaviour(request, context):
        try:
            for i in range(100):
                seen.append(CALLER.get())
                yield i
        finally:
            cleaned.append(True)

    async def main():
        handler = _serve(behaviour, "Generate", streaming=True)
        replies = handler(object(), Context())
        first = await asyncio.create_task(replies.__anext__())          # iterated in one task (its context)
        await asyncio.create_task(replies.aclose())                      # closed from another
        return first

    assert asyncio.run(main()) == 0
    assert seen == ["ipv4:127.0.0.1:5"]
    assert cleaned == [True]
