"""HMT pager: paged KV blocks across device, host and NVMe tiers."""
