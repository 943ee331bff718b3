"""A copy of an export whose MatMulQ nodes of some roles take another prompt_precision (the per-tensor A/B):
variant.py EXPORT OUT ROLE=PRECISION... (ROLE: qkv_proj, o_proj, gate_up_proj, down_proj, lm_head). The
weights and other files are hard links; the graph and the manifest's sha256 of it are rewritten."""

import hashlib
import json
import sys
from pathlib import Path

import onnx

src, out = Path(sys.argv[1]), Path(sys.argv[2])
wanted = dict(a.split("=") for a in sys.argv[3:])
out.mkdir(parents=True, exist_ok=True)
for f in src.iterdir():
    if f.suffix != ".onnx" and f.name not in ("wicore.json", ".wicore-verified.json") and not (out / f.name).exists():
        (out / f.name).hardlink_to(f)  # not a symlink: ONNX Runtime refuses external data outside the folder
for f in src.glob("*.onnx"):
    model = onnx.load(f, load_external_data=False)
    for node in model.graph.node:
        role = node.name.split("/")[-2]
        if node.op_type == "MatMulQ" and role in wanted:
            for a in node.attribute:
                if a.name == "prompt_precision":
                    a.s = wanted[role].encode()
    onnx.save_model(model, out / f.name)
manifest = json.loads((src / "wicore.json").read_text())  # the rewritten graphs' sha256 (the engine checks them)
for name in manifest["files"]:
    if name.endswith(".onnx"):
        manifest["files"][name] = hashlib.sha256((out / name).read_bytes()).hexdigest()
(out / "wicore.json").write_text(json.dumps(manifest))
print(out, wanted)
