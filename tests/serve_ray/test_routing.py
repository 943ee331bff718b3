"""The prefix-aware routing policy alone (wicore.serve_ray.routing): exact choices, no Ray."""

from __future__ import annotations

import pytest

from wicore.serve_ray.routing import Choice, PrefixTable, choose_replica, prefix_names

BS = 4  # tokens a block


def test_prefix_names_chain_over_full_blocks_only():
    ids = list(range(10))  # two full blocks and a tail of two tokens
    names = prefix_names(ids, BS, max_blocks=8)
    assert len(names) == 2
    assert names[0] == hash((0, (0, 1, 2, 3)))
    assert names[1] == hash((names[0], (4, 5, 6, 7)))
    assert prefix_names(ids[:8] + [99, 98], BS, 8) == names  # the tail never counts
    assert prefix_names(ids, BS, max_blocks=1) == names[:1]
    assert prefix_names(ids[:3], BS, 8) == []


def test_a_block_is_named_by_everything_before_it():
    # The same second block after a different first block is another prefix.
    a = prefix_names([1, 1, 1, 1, 7, 7, 7, 7], BS, 8)
    b = prefix_names([2, 2, 2, 2, 7, 7, 7, 7], BS, 8)
    assert a[1] != b[1]


def test_no_known_prefix_goes_to_the_least_loaded_replica_ties_by_name():
    table = PrefixTable()
    names = prefix_names(list(range(8)), BS, 8)
    assert choose_replica(names, table, {"b": 1, "a": 3, "c": 1}, max_imbalance=8) == Choice("b", 0, "least_loaded")
    assert choose_replica([], table, {"b": 0, "a": 0}, max_imbalance=8) == Choice("a", 0, "least_loaded")


def test_the_least_loaded_holder_of_the_longest_prefix_wins_while_not_overloaded():
    table = PrefixTable()
    conversation = list(range(12))  # three blocks
    table.record(prefix_names(conversation[:4], BS, 8), "a")  # a ran the first block
    table.record(prefix_names(conversation[:8], BS, 8), "b")  # b ran the first two
    names = prefix_names(conversation, BS, 8)
    loads = {"a": 0, "b": 5, "c": 0}
    assert choose_replica(names, table, loads, max_imbalance=5) == Choice("b", 2, "prefix")
    assert choose_replica(names, table, loads, max_imbalance=4) == Choice("a", 0, "overloaded")
    # Only the first block in the prompt: both hold it, the less loaded gets it.
    assert choose_replica(names[:1], table, {"a": 3, "b": 2, "c": 0}, max_imbalance=4) == Choice("b", 1, "prefix")


def test_a_shared_prefix_spreads_once_its_holder_is_busier_than_max_imbalance():
    table = PrefixTable()
    system = list(range(8))  # every user's prompt starts with these two blocks
    loads = {"a": 0, "b": 0}
    chosen = []
    for user in range(4):  # four first turns arrive while none has finished
        names = prefix_names(system + [100 + user] * 4, BS, 8)
        choice = choose_replica(names, table, loads, max_imbalance=2)
        table.record(names, choice.replica)
        loads[choice.replica] += 1
        chosen.append(choice)
    assert [c.replica for c in chosen] == ["a", "a", "a", "b"]
    assert [c.reason for c in chosen] == ["least_loaded", "prefix", "prefix", "overloaded"]
    assert table.holders(prefix_names(system, BS, 8)[1]) == {"a", "b"}


def test_a_holder_that_is_not_a_candidate_is_skipped_for_the_shorter_prefix_of_a_live_one():
    table = PrefixTable()
    ids = list(range(8))
    table.record(prefix_names(ids[:4], BS, 8), "a")
    table.record(prefix_names(ids, BS, 8)[1:], "gone")  # block 1 only: a replica no longer there
    names = prefix_names(ids, BS, 8)
    assert choose_replica(names, table, {"a": 2, "c": 0}, max_imbalance=8) == Choice("a", 1, "prefix")


def test_the_walk_stops_at_the_first_unknown_block():
    table = PrefixTable()
    names = prefix_names(list(range(12)), BS, 8)
    table.record([names[0], names[2]], "a")  # block 2 known without block 1: cannot be cached
    table.record([names[2]], "b")
    assert choose_replica(names, table, {"a": 0, "b": 0}, max_imbalance=8) == Choice("a", 1, "prefix")


def test_the_table_forgets_the_least_recently_used_and_dead_replicas():
    table = PrefixTable(max_names=3)
    table.record([1, 2, 3], "a")
    table.record([1], "b")  # 1 is now the most recent
    table.record([4], "b")  # 2 goes
    assert [table.holders(n) for n in (1, 2, 3, 4)] == [{"a", "b"}, None, {"a"}, {"b"}]
    table.forget_replica("b")
    assert len(table) == 2 and table.holders(1) == {"a"} and table.holders(4) is None


def test_choosing_among_no_replicas_is_an_error():
    with pytest.raises(ValueError, match="no replica"):
        choose_replica([], PrefixTable(), {}, max_imbalance=0)
