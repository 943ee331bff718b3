"""build_batch timed: batch_old.py is main's wicore/executor/batch.py, wicore the tree with the two-array _decode_batch variant (since reverted); see decode-batch.txt."""
import timeit, sys
sys.path.insert(0, "/work/cache-small37/scr")
import batch_old as O
import wicore.executor.batch as B
from types import SimpleNamespace
import numpy as np
for n in (1, 8):
    rows = [SimpleNamespace(token_ids=[123 + i], start=146 + i, block_table=list(range(1 + 20 * i, 11 + 20 * i)), window_table=list(range(1 + 20 * i, 11 + 20 * i)), window_first=0, num_logits=1) for i in range(n)]
    a, b = O.build_batch(rows, 16), B.build_batch(rows, 16)
    for x, y, name in zip(vars(a).values(), vars(b).values(), vars(a)):
        assert x.dtype == y.dtype and x.shape == y.shape and (x == y).all() and y.flags.c_contiguous, name
    for r in range(3):
        print(n, "old", f"{1e6*min(timeit.repeat(lambda: O.build_batch(rows, 16), number=20000, repeat=3))/20000:.2f}", "new", f"{1e6*min(timeit.repeat(lambda: B.build_batch(rows, 16), number=20000, repeat=3))/20000:.2f}")
