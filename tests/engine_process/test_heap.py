"""freeze_startup_heap in a process of its own (it freezes the caller's heap for good, so never in the
test process): what is alive is frozen, what comes after is collected as before."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import gc
from wicore.engine_process.heap import freeze_startup_heap

class Node:
    pass

kept = [Node() for _ in range(1000)]
frozen = freeze_startup_heap()
assert frozen == gc.get_freeze_count() and frozen >= 1000, frozen
a, b = Node(), Node()
a.other, b.other = b, a  # a cycle made after the freeze: still garbage the collector finds
del a, b
print(frozen, gc.collect())
"""


def test_what_lives_at_startup_is_frozen_and_later_cycles_are_still_collected():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True).stdout.split()
    frozen, collected = int(out[0]), int(out[1])
    assert frozen >= 1000
    assert collected >= 2  # the two nodes of the cycle (and their __dict__s)
