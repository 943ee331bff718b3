"""The KV cache's books, HMT's integers: block ids, refcounts, prefix hashes and which tier
(`tier.Tier`) each block lies in (`block_space`, `block_pool`, `block_groups`), and A2CR, the
attention-aware policy that ranks cached blocks for eviction (`policy`). They return move plans
and never touch bytes (wicore.kv does), and import nothing else of WiCore (import-linter)."""
