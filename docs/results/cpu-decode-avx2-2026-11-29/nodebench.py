"""Ad-hoc: each MatMulQ node of an export alone (its real initializers), one-node ORT sessions, µs a call at 1 and 2
threads (median of REPS), x one random row. usage: nodebench.py MODEL_DIR LIB [FILTER]"""
import os, sys, time
import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper, TensorProto
d, lib = sys.argv[1], sys.argv[2]
filt = sys.argv[3] if len(sys.argv) > 3 else ""
m = onnx.load(f"{d}/part-00.onnx")
inits = {i.name: i for i in m.graph.initializer}
reps = int(os.environ.get("REPS", "400"))
rng = np.random.default_rng(0)
for node in m.graph.node:
    if node.op_type != "MatMulQ" or filt not in node.name: continue
    ins = [i for i in node.input]
    used = [inits[i] for i in ins[1:] if i]
    k = [numpy_helper.to_array(t, base_dir=d) for t in used if t.name == ins[1]][0]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    K = attrs.get("K") or None
    x = helper.make_tensor_value_info(ins[0], TensorProto.FLOAT, [1, 1, None])
    y = helper.make_tensor_value_info(node.output[0], TensorProto.FLOAT, None)
    arrs = [numpy_helper.from_array(numpy_helper.to_array(t, base_dir=d), t.name) for t in used]
    g = helper.make_graph([node], "t", [x], [y], initializer=arrs)
    mm = helper.make_model(g, opset_imports=list(m.opset_import))
    res = []
    for th in (1, 2):
        o = ort.SessionOptions(); o.register_custom_ops_library(lib); o.intra_op_num_threads = th
        s = ort.InferenceSession(mm.SerializeToString(), o, providers=["CPUExecutionProvider"])
        kdim = attrs["K"] if "K" in attrs else None
        if kdim is None:
            for kk in (256, 512, 1024):
                try: s.run(None, {ins[0]: rng.normal(0, 1, (1, 1, kk)).astype(np.float32)}); kdim = kk; break
                except Exception: pass
        xv = rng.normal(0, 1, (1, 1, kdim)).astype(np.float32)
        b = s.io_binding(); b.bind_cpu_input(ins[0], xv); b.bind_output(node.output[0], "cpu")
        for _ in range(20): s.run_with_iobinding(b)
        ts = []
        for _ in range(reps):
            t = time.perf_counter(); s.run_with_iobinding(b); ts.append(time.perf_counter() - t)
        res.append(f"{th}t {1e6*np.median(ts):7.1f} us (p10 {1e6*np.percentile(ts,10):6.1f})")
    out = s.run_with_iobinding(b) or b.copy_outputs_to_cpu()[0]
    print(f"{node.name:45s} K {kdim} N {out.shape[-1]} bits {attrs.get('bits')} bs {attrs.get('block_size')}: " + " | ".join(res), flush=True)
