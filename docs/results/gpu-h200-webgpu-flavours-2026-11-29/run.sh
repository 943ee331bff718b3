#!/usr/bin/env bash
# webgpu3's H200 run (one call): portable vs webgpu vs webgpu+paged vs webgpu-q4 (+paged) on WebGPU through
# Vulkan (NVIDIA's ICD), greedy ids against the CUDA EP's record of 2026-11-28, step ms, ORT's per-op profile.
J=$PWD/.gpujob/webgpu3
date -u; for f in $PWD/.gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
python3 -m pip install -q --no-index --no-deps --target /tmp/wsite $J/wheels/*.whl 2>&1 | tail -2
rm -rf /tmp/w3 && cp -r $J/tree /tmp/w3 && cd /tmp/w3
export PYTHONPATH=/tmp/wsite:/tmp/w3:/tmp/w3/tools
python3 -c "import onnxruntime, onnx, numpy; print('ort', onnxruntime.__version__, 'onnx', onnx.__version__, 'numpy', numpy.__version__)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc; uptime
flt() { grep -v "W:onnx\|^.\[m$\|Warning\|^\s*$\|GetCpuPreferredNodes\|ScatterND" "$@"; }
C="--devices webgpu --layers 26 --work /tmp/wf --threads 4"
timeout 150 python3 tools/check_webgpu_flavour.py $C --flavours portable,webgpu,webgpu+paged,webgpu-q4,webgpu-q4+paged --jobs 5 --export-only > $OUT/export.log 2>&1
echo "export rc=$?"; date -u; flt $OUT/export.log | tail -8
timeout 110 python3 tools/check_webgpu_flavour.py $C --flavours portable,webgpu,webgpu+paged --new-tokens 8 --steps 10 \
  --compare-with docs/results/gpu-h100-webgpu-flavour-cuda-2026-11-28.json --json $OUT/float.json > $OUT/float.log 2>&1
echo "float rc=$?"; date -u; flt $OUT/float.log | tail -12
timeout 70 python3 tools/check_webgpu_flavour.py $C --flavours webgpu-q4,webgpu-q4+paged --new-tokens 8 --steps 10 --json $OUT/q4.json > $OUT/q4.log 2>&1
echo "q4 rc=$?"; date -u; flt $OUT/q4.log | tail -8
W=/tmp/wf/gemma3-1b-26l-fp16
timeout 100 python3 tools/profile_step.py --model-dir $W-webgpu --model-dir $W-webgpu+paged --model-dir $W-webgpu-q4+paged \
  --devices webgpu --batch 1,8 --steps 10 --threads 4 --profile --json $OUT/profile.json > $OUT/profile.log 2>&1
echo "profile rc=$?"; date -u; flt $OUT/profile.log | tail -70
timeout 50 python3 tools/check_webgpu_flavour.py --devices cpu --layers 26 --work /tmp/wf --threads 14 --flavours webgpu-q4 --new-tokens 8 \
  --batch 1 --steps 2 --compare-with $OUT/q4.json --json $OUT/q4-cpu.json > $OUT/q4-cpu.log 2>&1
echo "q4 cpu rc=$?"; date -u; flt $OUT/q4-cpu.log | tail -5
