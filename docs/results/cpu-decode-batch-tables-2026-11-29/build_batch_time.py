import time, sys
from dataclasses import dataclass
from wicore.executor.batch import build_batch
@dataclass
class R:
    token_ids: list
    start: int
    num_logits: int
    block_table: list
    window_table: list
    window_first: int
for rows_n, ctx in ((1, 512), (64, 4096), (256, 512), (8, 32768)):
    bs = 16
    nb = ctx // bs + 1
    first = max(0, nb - 64)
    rows = [R([5], ctx, 1, list(range(i * nb, (i + 1) * nb)), list(range(i * nb + first, (i + 1) * nb)), first) for i in range(rows_n)]
    build_batch(rows, bs)
    t = time.perf_counter(); n = 20
    for _ in range(n): build_batch(rows, bs)
    print(sys.argv[1], rows_n, ctx, f"{(time.perf_counter() - t) / n * 1e3:.3f} ms")
