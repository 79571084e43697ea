"""Child process of the NATS crash test: lead a replicated log and append forever.

Run as ``python nats_crash_child.py URL NAME``.  After each ``flush``
(everything appended so far acked by JetStream) it prints the log's
``durable_pos`` (unbuffered): the parent treats every number it reads as
acknowledged, which must survive the SIGKILL it sends.
"""

from __future__ import annotations

import asyncio
import sys

from omnix.events.natslog import NatsLog
from tests.events.conftest import request_events


async def main(url: str, name: str) -> None:
    log = await NatsLog.open(url, name=name)
    k = 0
    while True:
        for _ in range(10):
            for ev in request_events(f"crash-{k}", chunks=5):
                log.append(ev)
            k += 1
        print(await log.flush(), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
