"""Task cancellation at awkward points of the async store: a cancelled ``open_async_store`` leaves nothing open
(the store its worker thread opened anyway is closed), and a store whose calls were cancelled stays usable."""

from __future__ import annotations

import asyncio
import os
import time
from datetime import timedelta
from pathlib import Path

from threadloom.domain.values import ClaimRequest
from threadloom.persistence.aio import open_async_store


def _open_files(path: Path) -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith(str(path)):
                count += 1
        except OSError:
            pass
    return count


def test_a_cancelled_open_leaves_no_store_open(tmp_path):
    path = tmp_path / "a.db"
    url = f"sqlite:///{path}"

    async def main() -> int:
        async with await open_async_store(url):
            pass  # the file exists and is migrated: the cancelled opens below race only the open itself
        for _ in range(5):
            opening = asyncio.ensure_future(open_async_store(url))
            await asyncio.sleep(0)  # the open is on its worker thread now
            opening.cancel()
            try:
                await opening
            except asyncio.CancelledError:
                pass
        deadline = time.monotonic() + 10
        while _open_files(path) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return _open_files(path)

    assert asyncio.run(main()) == 0


def test_cancelled_calls_and_waits_leave_the_store_usable(tmp_path):
    url = f"sqlite:///{tmp_path / 'b.db'}"

    async def main() -> None:
        async with await open_async_store(url, max_workers=2) as store:
            waits = [
                asyncio.ensure_future(store.await_events_after("t", 0, 10, timedelta(seconds=30))) for _ in range(20)
            ]
            claims = [
                asyncio.ensure_future(store.claim(f"c{i}", ClaimRequest(holder="h", ttl=timedelta(seconds=5))))
                for i in range(20)
            ]
            await asyncio.sleep(0.05)
            for task in (*waits, *claims):
                task.cancel()
            await asyncio.gather(*waits, *claims, return_exceptions=True)
            claim = await asyncio.wait_for(
                store.claim("after", ClaimRequest(holder="h", ttl=timedelta(seconds=5))), 10
            )
            assert (await store.current_claim("after")) == claim
            assert await asyncio.wait_for(store.await_events_after("t", 0, 10, timedelta(0)), 10) == []

    asyncio.run(main())
