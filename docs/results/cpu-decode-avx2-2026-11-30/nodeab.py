"""Ad-hoc (issue 37, 2026-11-30): MatMulQ nodes of an export alone (their real initializers, one-node ORT sessions),
one random row x, under several kernel libraries in one process: rounds of REPS calls alternating between the
libraries, µs a call (median and p10 over all rounds), and whether the libraries' outputs are the same bits.
usage: nodeab.py MODEL_DIR FILTER NAME=LIB[:widen|:narrow]... (env THREADS 1, REPS 200, ROUNDS 5; widen / narrow:
WICORE_MATMULQ_WIDEN=1 / 0 while its session is made)"""
import os, sys, time
import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper, TensorProto
d, filt, specs = sys.argv[1], sys.argv[2], [s.split("=", 1) for s in sys.argv[3:]]
th, reps, rounds = int(os.environ.get("THREADS", "1")), int(os.environ.get("REPS", "200")), int(os.environ.get("ROUNDS", "5"))
m = onnx.load(f"{d}/part-00.onnx", load_external_data=False)
inits = {i.name: i for i in m.graph.initializer}
shapes = {}
rng = np.random.default_rng(0)
print(f"{time.strftime('%H:%M:%S', time.gmtime())} load {os.getloadavg()[0]:.2f} threads {th}", flush=True)
for node in m.graph.node:
    if node.op_type != "MatMulQ" or filt not in node.name: continue
    ins = list(node.input)
    used = [inits[i] for i in ins[1:] if i]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    arrs = [numpy_helper.from_array(numpy_helper.to_array(t, base_dir=d), t.name) for t in used]
    x = helper.make_tensor_value_info(ins[0], TensorProto.FLOAT, [1, 1, None])
    y = helper.make_tensor_value_info(node.output[0], TensorProto.FLOAT, None)
    mm = helper.make_model(helper.make_graph([node], "t", [x], [y], initializer=arrs), opset_imports=list(m.opset_import))
    codes = numpy_helper.to_array(inits[ins[1]], base_dir=d)
    n, bits = attrs["N"], attrs["bits"]
    kdim = codes.size * 8 // bits // (-(-n // 8) * 8 if bits == 4 else n)
    xv = rng.standard_t(3, (1, 1, kdim)).astype(np.float32)
    sess, outs, ts = {}, {}, {}
    for name, lib in specs:
        lib, _, opt = lib.partition(":")
        os.environ.pop("WICORE_MATMULQ_WIDEN", None)
        if opt: os.environ["WICORE_MATMULQ_WIDEN"] = "1" if opt == "widen" else "0"
        o = ort.SessionOptions(); o.register_custom_ops_library(lib); o.intra_op_num_threads = th
        s = ort.InferenceSession(mm.SerializeToString(), o, providers=["CPUExecutionProvider"])
        b = s.io_binding(); b.bind_cpu_input(ins[0], xv); b.bind_output(node.output[0], "cpu")
        for _ in range(20): s.run_with_iobinding(b)
        sess[name] = (s, b); ts[name] = []
        outs[name] = s.run(None, {ins[0]: xv})[0]
    for _ in range(rounds):
        for name, (s, b) in sess.items():
            for _ in range(reps):
                t = time.perf_counter(); s.run_with_iobinding(b); ts[name].append(time.perf_counter() - t)
    same = all(np.array_equal(outs[specs[0][0]], v) for v in outs.values())
    base = np.median(ts[specs[0][0]])
    print(f"{node.name:42s} K {kdim} N {n} bits {bits} bs {attrs['block_size']}: " + " | ".join(
        f"{k} {1e6*np.median(v):7.1f} us (p10 {1e6*np.percentile(v, 10):6.1f}, {base/np.median(v):.2f}x)" for k, v in ts.items()) + f" | same bits: {same}", flush=True)
