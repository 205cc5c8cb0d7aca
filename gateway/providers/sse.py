"""Server-sent events as the providers send them, relayed to the client event by event."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass


@dataclass
class SSEEvent:
    raw: bytes  # the event as sent, without the blank line that ends it
    data: bytes  # its data field


async def sse_events(lines: AsyncIterator[str]) -> AsyncIterator[SSEEvent]:
    buf: list[str] = []
    async for line in lines:
        if line == "":
            if buf:
                yield _event(buf)
                buf = []
            continue
        buf.append(line)
    if buf:
        yield _event(buf)


def _event(lines: list[str]) -> SSEEvent:
    data = "\n".join(line[5:].lstrip(" ") for line in lines if line.startswith("data:"))
    return SSEEvent(raw="\n".join(lines).encode(), data=data.encode())
