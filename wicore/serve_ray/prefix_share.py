"""Prefix routing knowledge shared by several ingress replicas (`--ingress-replicas N`).

Each ingress routes through its own DeploymentHandle, whose PrefixAwareRouter keeps its own
PrefixTable (wicore.serve_ray.router). With one ingress that table sees every request; with N,
Ray's proxy spreads requests over the ingresses, so a conversation's next turn often reaches an
ingress that never routed its earlier turns and would miss the replica holding them. So each
router also posts what it records to the application's prefix board, a named actor, and takes
from it what the other ingresses recorded:

    router A ─ exchange(A, cursor, [(names, replica), ...]) ─► PrefixBoard ─► records since cursor
                                                                             that A did not post

A router exchanges every SHARE_PERIOD_S at most, from its routing loop, never waiting on the
board while it routes: a record reaches the other ingresses within about that period, well before
a conversation's next turn. The board keeps the last MAX_RECORDS records; a router that falls
further behind (its cursor before the oldest kept) takes what is kept and carries on.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import Sequence
from typing import Any

import ray

from wicore.serve_ray.routing import PrefixTable

log = logging.getLogger("wicore.serve_ray")

SHARE_PERIOD_S = 0.1
MAX_RECORDS = 100_000

Record = tuple[tuple[int, ...], str]  # a prompt's prefix names, and the replica that holds them


class PrefixLog:
    """The board's state: records in the order posted, numbered from 1, the last `max_records` kept."""

    def __init__(self, max_records: int = MAX_RECORDS) -> None:
        if max_records < 1:
            raise ValueError("max_records must be >= 1")
        self._records: deque[tuple[int, str, Record]] = deque(maxlen=max_records)  # (number, sender, record)
        self._count = itertools.count(1)
        self.last = 0  # the number of the last record posted

    def exchange(self, sender: str, cursor: int, records: Sequence[Record]) -> tuple[int, list[Record]]:
        """Append `sender`'s records; return the new cursor and the records after `cursor` that
        others posted (sender's own are left out: its table has them). A cursor past the last record
        is a board made again after its owner died: the sender takes all that this one keeps."""
        if cursor > self.last:
            cursor = 0
        for record in records:
            self.last = next(self._count)
            self._records.append((self.last, sender, (tuple(record[0]), record[1])))
        news = [record for number, who, record in self._records if number > cursor and who != sender]
        return self.last, news


@ray.remote(num_cpus=0, max_restarts=0)
class PrefixBoard:
    def __init__(self) -> None:
        self._log = PrefixLog()

    def exchange(self, sender: str, cursor: int, records: list[Record]) -> tuple[int, list[Record]]:
        return self._log.exchange(sender, cursor, records)


def board_name(app_name: str) -> str:
    return f"wicore-prefix-board:{app_name}"


def prefix_board(app_name: str) -> Any:
    """The application's prefix board (an actor handle), made if nobody has yet."""
    return PrefixBoard.options(name=board_name(app_name), get_if_exists=True).remote()  # type: ignore[attr-defined]  # an actor class


class PrefixSharing:
    """One router's side of the exchange: what it recorded since the last exchange, and its cursor."""

    def __init__(self, app_name: str, sender: str, table: PrefixTable) -> None:
        self.app_name = app_name
        self.sender = sender
        self.table = table
        self.cursor = 0
        self._outbox: list[Record] = []
        self._task: asyncio.Task | None = None
        self.board: Any = None  # the board's handle, kept: a named actor with no handle left is collected

    async def exchange(self) -> None:
        """Post what was recorded since the last exchange; take what the others posted."""
        if self.board is None:
            self.board = prefix_board(self.app_name)
        outbox, self._outbox = self._outbox, []
        try:
            cursor, news = await self.board.exchange.remote(self.sender, self.cursor, outbox)
        except Exception:  # the board died with its owner and is being made again: post these next time
            self.board = None
            self._outbox[:0] = outbox
            del self._outbox[:-MAX_RECORDS]
            raise
        self.merge(cursor, news)

    def record(self, names: Sequence[int], replica: str) -> None:
        """`replica` holds these names (recorded in the table by the router): post them next time."""
        self._outbox.append((tuple(names), replica))

    def merge(self, cursor: int, records: Sequence[Record]) -> None:
        """Take what the other ingresses recorded into the table."""
        self.cursor = cursor
        for names, replica in records:
            self.table.record(names, replica)

    def start(self) -> None:
        """Exchange every SHARE_PERIOD_S on the running loop (the router's), once."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(SHARE_PERIOD_S)
            try:
                await self.exchange()
            except Exception:
                log.debug("could not exchange prefixes with the board", exc_info=True)
