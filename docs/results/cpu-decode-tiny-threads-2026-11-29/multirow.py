"""Ad-hoc: main's export and this branch's (BlockAttentionQKV on the CPU graph's full layers) on several rows at
once: prompts of different lengths (padded prefill steps, rows decoding beside prefilling ones), greedy, the same
tokens expected."""
import sys
from pathlib import Path
import numpy as np
from wicore.engine.engine import Engine, EngineConfig
from wicore.types.sampling import SamplingParams
rng = np.random.default_rng(1)
prompts = [rng.integers(1000, 20000, n).tolist() for n in (5, 37, 130, 1, 64)]
out = {}
for d in sys.argv[1:]:
    with Engine(EngineConfig(model_dir=Path(d), num_threads=2, host_tier_gb=0)) as e:
        out[d] = [c.token_ids for c in e.generate(prompts, SamplingParams(max_tokens=40, ignore_eos=True))]
a, b = out.values()
print("same tokens on every row:", a == b, [sum(x == y for x, y in zip(r, s)) for r, s in zip(a, b)], [len(r) for r in a])
