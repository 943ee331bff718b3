"""Several ingress replicas share their prefix routing (wicore.serve_ray.prefix_share): the board's
log, a router's merge, and one real exchange through the board actor on a local Ray."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("ray.serve", reason="the Ray Serve tests need the wicore[ray] extra")

from wicore.serve_ray.prefix_share import PrefixLog, PrefixSharing
from wicore.serve_ray.routing import PrefixTable, choose_replica


def test_a_sender_gets_the_others_records_since_its_cursor_never_its_own():
    log = PrefixLog()
    assert log.exchange("a", 0, [((1, 2), "r1"), ((3,), "r2")]) == (2, [])
    assert log.exchange("b", 0, [((4,), "r1")]) == (3, [((1, 2), "r1"), ((3,), "r2")])
    assert log.exchange("a", 2, []) == (3, [((4,), "r1")])
    assert log.exchange("a", 3, []) == (3, [])


def test_the_log_keeps_the_last_records_and_a_cursor_past_its_end_starts_over():
    log = PrefixLog(max_records=2)
    log.exchange("a", 0, [((1,), "r1"), ((2,), "r1"), ((3,), "r2")])
    assert log.exchange("b", 0, []) == (3, [((2,), "r1"), ((3,), "r2")])
    # A board made again (its owner died) numbers from 1: a router's old cursor 40 takes all it keeps.
    fresh = PrefixLog()
    fresh.exchange("a", 0, [((5,), "r2")])
    assert fresh.exchange("b", 40, []) == (1, [((5,), "r2")])
    with pytest.raises(ValueError, match="max_records"):
        PrefixLog(max_records=0)


def test_what_another_ingress_recorded_routes_a_conversation_here_too():
    names = [11, 12, 13]
    here = PrefixTable()
    loads = {"r1": 1, "r2": 0}
    assert choose_replica(names, here, loads, max_imbalance=2).replica == "r2"  # nothing known: least loaded
    sharing = PrefixSharing("app", "router-b", here)
    sharing.merge(7, [(tuple(names[:2]), "r1")])  # ingress A ran the conversation's first turn on r1
    choice = choose_replica(names, here, loads, max_imbalance=2)
    assert (choice.replica, choice.num_matched_blocks, choice.reason, sharing.cursor) == ("r1", 2, "prefix", 7)


def test_two_routers_exchange_through_the_board_actor():
    import ray

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        a, b = PrefixTable(), PrefixTable()
        share_a, share_b = PrefixSharing("t", "a", a), PrefixSharing("t", "b", b)

        async def run() -> None:
            a.record([1, 2], "r1")
            share_a.record([1, 2], "r1")
            await share_a.exchange()
            await share_b.exchange()
            b.record([9], "r2")
            share_b.record([9], "r2")
            await share_b.exchange()
            await share_a.exchange()

        asyncio.run(run())
        assert (b.holders(1), b.holders(2), a.holders(9)) == ({"r1"}, {"r1"}, {"r2"})
        assert (share_a.cursor, share_b.cursor) == (2, 2)  # one record each, numbered 1 and 2
    finally:
        ray.shutdown()
