import time, statistics, numpy as np, onnxruntime as ort
from onnx import helper, TensorProto
print(ort.__version__, ort.__file__)
def model(n):
    nodes = []; prev = "x"
    for i in range(n):
        nodes.append(helper.make_node("Relu", [prev], [f"y{i}"])); prev = f"y{i}"
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256])], [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, 256])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
def bench(f, k=3000):
    ts = []
    for i in range(k):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    return f"med {1e6*statistics.median(ts[500:]):.1f} p10 {1e6*np.percentile(ts[500:],10):.1f}"
for th in (1, 2):
    o = ort.SessionOptions(); o.intra_op_num_threads = th; o.inter_op_num_threads = 1
    s = ort.InferenceSession(model(1), o, providers=["CPUExecutionProvider"])
    x = np.ones((1, 256), np.float32); y = np.zeros((1, 256), np.float32)
    b = s.io_binding(); b.bind_cpu_input("x", x); b.bind_ortvalue_output("y0", ort.OrtValue.ortvalue_from_numpy(y))
    ro = ort.RunOptions()
    print(th, "iobinding prealloc", bench(lambda: s.run_with_iobinding(b, ro)))
    print(th, "None opts", bench(lambda: s.run_with_iobinding(b)))
    print(th, "raw _sess", bench(lambda: s._sess.run_with_iobinding(b._iobinding, ro)))
    print(th, "run numpy", bench(lambda: s.run(None, {"x": x})))
    print(th, "time.perf_counter", bench(lambda: None))
