"""BlockAttention alone at Gemma 3 270M's prefill shape: CPU seconds per call, 1 thread."""
import hashlib
import sys, time
import numpy as np, onnxruntime as ort
from onnx import TensorProto, helper
from wicore.kernels.library import DOMAIN, library
lib = str(library(cuda=False))
nh, nkv, hd, bs, T, start = 4, 1, 256, 16, int(sys.argv[1]), int(sys.argv[2])
ctx = start + T
nblocks = (ctx + bs - 1) // bs + 1
names = ["q", "k", "v", "tables", "positions", "lens"]
node = helper.make_node("BlockAttention", names, ["out"], domain=DOMAIN, num_heads=nh, num_kv_heads=nkv, window=0, softcap=0.0)
F, I = TensorProto.FLOAT, TensorProto.INT64
inputs = [helper.make_tensor_value_info(n, F if n in "qkv" else I, None) for n in names]
g = helper.make_graph([node], "a", inputs, [helper.make_tensor_value_info("out", F, None)])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])
so = ort.SessionOptions(); so.register_custom_ops_library(lib); so.intra_op_num_threads = 1
s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
rng = np.random.default_rng(0)
feeds = {"q": (rng.normal(0, 1, (1, T, nh * hd)) * 0.1).astype(np.float32),
         "k": rng.normal(0, 1, (nblocks, bs, nkv, hd)).astype(np.float32),
         "v": rng.normal(0, 1, (nblocks, bs, nkv, hd)).astype(np.float32),
         "tables": np.arange(nblocks - 1, dtype=np.int64)[None], "positions": np.arange(start, ctx, dtype=np.int64)[None],
         "lens": np.array([ctx], np.int64)}
out = s.run(None, feeds)[0]
ts = []
for _ in range(7):
    c = time.thread_time(); s.run(None, feeds); ts.append(time.thread_time() - c)
digest = hashlib.sha256(out.tobytes()).hexdigest()[:12]
print(f"{sys.argv[3]} T={T} start={start}: cpu ms min {min(ts)*1e3:.1f} median {sorted(ts)[3]*1e3:.1f}  sum {float(out.astype(np.float64).sum()):.6f} sha {digest}")
