"""What a serving process does with its heap once the engine is up.

Python's cyclic garbage collector walks every tracked object on each generation-2 pass. After an
engine is built the heap holds tens of thousands of long-lived objects (the model's manifest, the
sessions' bindings, the block pools, the tokenizer; 46,918 tracked after a tiny model's core), and
each such pass stalled the engine thread 19-37 ms while collecting nothing (docs/PERFORMANCE.md,
"the scheduler's host work at 256 rows"): a token's latency spike at every pass. Collecting once and
moving what survives to the permanent generation (`gc.freeze`) takes it out of those walks, as vLLM
does after its server starts. Only for processes that serve until they exit: frozen objects are never
collected, so a process that builds many engines (the tests) must not call this."""

from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Collect, then exclude every object alive now from later collections; the objects frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
