"""The KV cache's bytes: the device buffers bound to the graphs (`buffers`, `device_store`), the
host and NVMe tier stores (`tiers`), the pager that executes the books' move plans (`pager`),
the cache that puts books and bytes together (`cache`), the layout of block groups (`layout`),
KV offload: host blocks staged into each step (`offload`) and capacity planning (`capacity`). The books
themselves (which block is where) are wicore.blocks."""
