"""HMT, hierarchical memory tiers: the paged KV cache across device memory, host memory and NVMe.

Integers and bytes kept apart: block_pool / block_space / block_groups keep the books (ids,
refcounts, prefix hashes, which tier each block is in) and return move plans; tiers.py's stores
hold the bytes; pager.py executes plans; policy.py holds A2CR (attention-aware cache
replacement), which ranks cached blocks for eviction; kv_cache.py puts them together. Nothing
here knows an execution provider: the runtime hands in the tier-0 stores.
"""
