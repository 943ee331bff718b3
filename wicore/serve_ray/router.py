"""Ray Serve request routers for the engine deployment: prefix-aware, and round-robin to compare.

Ray Serve's own routing machinery does the rest: a router's `choose_replicas` returns ranks of
replicas, and Ray sends the request to the least loaded replica of the first rank that has room
(fewer than max_ongoing_requests), probing queue lengths, backing off and retrying when all are
full, and dropping replicas that die. So the prefix policy (wicore.serve_ray.routing) only has to
say which replica it prefers; that one is the first rank, every replica the second.

Why not Ray's PrefixCacheAffinityRouter (ray.serve.llm): it matches prompt *text* in a prefix
tree held by a separate actor, queried with a blocking ray.get on the routing path, and needs
request objects with `prompt` / `messages`. WiCore's prefix cache is keyed by token blocks, and
the engine call already carries the prompt's token ids, so the table here names the same blocks
the engine caches and lives in the router itself (one per DeploymentHandle: per ingress replica).
With several ingress replicas the routers also share what they record (wicore.serve_ray.prefix_share).
"""

from __future__ import annotations

import itertools
import uuid
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from wicore.serve_ray.prefix_share import PrefixSharing
from wicore.serve_ray.routing import PrefixTable, choose_replica, prefix_names

MAX_PENDING = 10_000  # routed requests whose prefixes wait for their completion to be recorded


def _prompt_ids(request: PendingRequest | None) -> list[int]:
    """The token ids of an engine call (EngineReplica.generate's argument); none for other methods."""
    if request is None or not request.args:
        return []
    return list(getattr(request.args[0], "prompt_ids", ()))


def _key(replica: RunningReplica | ReplicaID) -> str:
    replica_id = replica.replica_id if isinstance(replica, RunningReplica) else replica
    return replica_id.unique_id


class PrefixAwareRouter(RequestRouter):
    """Sends a prompt to the least loaded replica that ran its longest known prefix, unless that one
    runs more than `max_imbalance` requests beyond the least loaded replica (wicore.serve_ray.routing)."""

    def initialize_state(
        self,
        block_size: int = 16,
        max_blocks: int = 256,
        max_imbalance: int = 2,
        share_with: str | None = None,
        **_: Any,
    ) -> None:
        """`share_with`: the application's name, where other ingress replicas route too: the routers
        then share what they record through its prefix board."""
        self.block_size = block_size
        self.max_blocks = max_blocks
        self.max_imbalance = max_imbalance
        self.table = PrefixTable()
        self._names_of: dict[str, list[int]] = {}  # internal request id -> its prompt's prefix names
        self.sharing = None if share_with is None else PrefixSharing(share_with, f"router-{uuid.uuid4().hex[:12]}", self.table)

    def _record(self, names: list[int], replica: str) -> None:
        self.table.record(names, replica)
        if self.sharing is not None:
            self.sharing.record(names, replica)

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if self.sharing is not None:
            self.sharing.start()  # here: the loop the router runs on
        names = prefix_names(_prompt_ids(pending_request), self.block_size, self.max_blocks)
        if not names or pending_request is None:
            return [candidate_replicas]  # Ray's rule: the least loaded with room
        by_key = {_key(r): r for r in candidate_replicas}
        loads = {key: self.replica_queue_len_cache.get(r.replica_id) or 0 for key, r in by_key.items()}
        choice = choose_replica(names, self.table, loads, self.max_imbalance)
        # Recorded now, so that the next request with this prefix (often already on its way:
        # the turns of one conversation, n choices) follows it; corrected on completion if Ray
        # sent it elsewhere because the chosen replica was full.
        self._record(names, choice.replica)
        self._names_of[pending_request.metadata.internal_request_id] = names
        if len(self._names_of) > MAX_PENDING:  # requests cancelled before they were sent never complete
            del self._names_of[next(iter(self._names_of))]
        preferred = by_key[choice.replica]
        return [[preferred], [r for r in candidate_replicas if r is not preferred]]

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        names = self._names_of.pop(internal_request_id, None)
        if names:
            self._record(names, _key(replica_id))

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self.table.forget_replica(_key(replica_id))


class RoundRobinRouter(RequestRouter):
    """Each request to the next replica in turn (replicas ordered by id); the baseline that the
    prefix-aware router is measured against (tools/bench_ray.py)."""

    def initialize_state(self, **_: Any) -> None:
        self._turn = itertools.count()

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        ordered = sorted(candidate_replicas, key=_key)
        first = next(self._turn) % len(ordered)
        return [[ordered[first]], ordered[first + 1 :] + ordered[:first]]


ROUTERS = {"prefix": PrefixAwareRouter, "round-robin": RoundRobinRouter}
