"""One MatMulQ node at the tiny head's shape (Q6_K as 8-bit codes, float16 x int8 scales, residual; or Q8_0),
µs a call (median of REPS runs), at several N: whether it is bound by the cache or by the instructions.
usage: headbench.py LIB [THREADS] ; env KIND=q6k|q8_0, NS=49152,4096,1024"""
import os, sys, time
import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper
sys.path.insert(0, "tests/kernels")
from wicore.graph.matmul_q import attributes, inputs, pack
from wicore.kernels.library import DOMAIN
from wicore.model.quant import BlockQuant
lib, threads = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1
kind = os.environ.get("KIND", "q6k")
narrow_codes = os.environ.get("NARROW", "0") == "1"
rng = np.random.default_rng(0)
k = 256
def weight(n):
    if kind == "q6k":
        codes = rng.integers(-32, 32, (n, k)).astype(np.int8)
        sup = rng.uniform(1e-4, 1e-3, (n, 1)).astype(np.float16).astype(np.float32)
        ints = rng.integers(-127, 128, (n, 16)).astype(np.float32)
        return BlockQuant(codes, (sup * ints).astype(np.float32), None, 8, 16)
    codes = rng.integers(-127, 128, (n, k)).astype(np.int8)
    return BlockQuant(codes, rng.uniform(1e-3, 2e-2, (n, 8)).astype(np.float16).astype(np.float32), None, 8, 32)
def sess(w):
    packed = pack(w, True, True, narrow_codes)
    names, inits = ["x"], []
    for entry in inputs(packed):
        names.append("" if entry is None else entry[0])
        if entry is not None:
            role, a = entry
            inits.append(helper.make_tensor(role, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape), a.tobytes(), raw=True))
    while names[-1] == "": names.pop()
    node = helper.make_node("MatMulQ", names, ["y"], domain=DOMAIN, **attributes(packed, w, True, None))
    g = helper.make_graph([node], "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])
    o = ort.SessionOptions(); o.register_custom_ops_library(lib); o.intra_op_num_threads = threads
    return ort.InferenceSession(m.SerializeToString(), o, providers=["CPUExecutionProvider"]), packed
x = rng.normal(0, 1, (1, 1, k)).astype(np.float32)
for n in [int(v) for v in os.environ.get("NS", "49152,8192,1024").split(",")]:
    s, packed = sess(weight(n))
    b = s.io_binding(); b.bind_cpu_input("x", x); b.bind_output("y", "cpu")
    reps = int(os.environ.get("REPS", max(20, int(2e6 // n))))
    for _ in range(5): s.run_with_iobinding(b)
    ts = []
    for _ in range(reps):
        t = time.perf_counter(); s.run_with_iobinding(b); ts.append(time.perf_counter() - t)
    med = float(np.median(ts)) * 1e6
    print(f"{kind} n {n} threads {threads} bits {packed.bits if hasattr(packed,'bits') else '?'}: {med:.1f} us a call, {1e3*med/n:.2f} ns a row, p10 {np.percentile(ts,10)*1e6:.1f}", flush=True)
