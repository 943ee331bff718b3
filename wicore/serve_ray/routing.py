"""Prefix-aware routing, the policy alone: which replica gets a prompt (no Ray here).

A prompt's token ids are cut into blocks of `block_size` tokens, as the engine's prefix
cache cuts them; block i is named by a hash chained over blocks 0..i, so a name stands for
the whole prefix up to the end of its block:

    prompt ids   [ b0 | b1 | b2 | b3 | tail ]     (the tail, less than a block, is never cached)
    names        h0   h1   h2   h3                h_i = hash((h_{i-1}, ids of block i))

`PrefixTable` remembers which replicas ran each name (a bounded LRU map). `choose_replica` walks
a prompt's names while the table knows them, to the deepest name a live replica holds: the least
loaded of its holders gets the request, unless it runs more than `max_imbalance` requests beyond
the least loaded replica; then, and when no prefix is known, the least loaded replica gets it.
That rule (SGLang's cache-aware router's, and Ray's PrefixCacheAffinityRouter's, on token blocks
instead of characters) also spreads a prefix every request shares (a system prompt): while one
replica holds it, the others are idle, and past `max_imbalance` one of them gets a request and
holds it too; from then on the conversations' own blocks decide.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


def prefix_names(prompt_ids: Sequence[int], block_size: int, max_blocks: int) -> list[int]:
    """The chained hashes of the prompt's first full blocks (at most `max_blocks` of them)."""
    names: list[int] = []
    parent = 0
    for start in range(0, min(len(prompt_ids) // block_size, max_blocks) * block_size, block_size):
        parent = hash((parent, tuple(prompt_ids[start : start + block_size])))
        names.append(parent)
    return names


class PrefixTable:
    """Which replicas ran each prefix name; forgets the least recently used past `max_names`."""

    def __init__(self, max_names: int = 200_000) -> None:
        if max_names < 1:
            raise ValueError("max_names must be >= 1")
        self.max_names = max_names
        self._holders: OrderedDict[int, set[str]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._holders)

    def holders(self, name: int) -> frozenset[str] | None:
        """The replicas known to hold the prefix `name`; None for a name never seen (or forgotten)."""
        holders = self._holders.get(name)
        return None if holders is None else frozenset(holders)

    def record(self, names: Iterable[int], replica: str) -> None:
        """`replica` now holds these prefixes (it ran, or is about to run, a prompt with them)."""
        for name in names:
            self._holders.setdefault(name, set()).add(replica)
            self._holders.move_to_end(name)
        while len(self._holders) > self.max_names:
            self._holders.popitem(last=False)

    def forget_replica(self, replica: str) -> None:
        """A replica that died holds nothing."""
        for name in list(self._holders):
            self._holders[name].discard(replica)
            if not self._holders[name]:
                del self._holders[name]


@dataclass(frozen=True)
class Choice:
    replica: str
    num_matched_blocks: int  # of the prompt's blocks, how many the chosen replica is known to hold
    reason: str  # "prefix", "least_loaded" (no known prefix) or "overloaded" (the holder is too busy)


def choose_replica(names: Sequence[int], table: PrefixTable, loads: Mapping[str, int], max_imbalance: int) -> Choice:
    """The replica for a prompt with prefix `names`, among the replicas of `loads` (name -> requests
    running or queued there). Ties go to the replica whose name sorts first, so a choice is exact."""
    if not loads:
        raise ValueError("no replica to choose from")

    def least_loaded(replicas: Iterable[str]) -> str:
        return min(replicas, key=lambda r: (loads[r], r))

    least = least_loaded(loads)
    live: frozenset[str] = frozenset()
    matched = 0
    for depth, name in enumerate(names, start=1):
        holders = table.holders(name)
        if holders is None:
            break  # a later block cannot be cached without this one
        if holders & loads.keys():
            live, matched = holders & loads.keys(), depth
    if not live:
        return Choice(least, 0, "least_loaded")
    holder = least_loaded(live)
    if loads[holder] - loads[least] > max_imbalance:
        return Choice(least, 0, "overloaded")
    return Choice(holder, matched, "prefix")
