#!/usr/bin/env bash
# (tools/vulkan_peer: the artifacts in $PEER_DIR, default .gpujob/lead, a git-ignored folder the device tool carries)
# Call 2: llama.cpp's Vulkan backend against WiCore on ONNX Runtime's WebGPU EP (Dawn over Vulkan), one GPU,
# the same random SmolLM2-360M-shaped Llama (vk_bg.sh made it).
set -u
ROOT=$PWD
for f in "$ROOT"/.gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
for i in $(seq 1 60); do grep -q BG-DONE /tmp/lead/bg.log && break; sleep 4; done; cat /tmp/lead/bg.log; tail -3 /tmp/lead/exp.log
B=/tmp/lead/bin; mkdir -p $B; tar -C $B -xJf "$ROOT"/${PEER_DIR:-.gpujob/lead}/llama-vk.tar.xz
L="env LD_LIBRARY_PATH=$B/lib"
cd /tmp/lead
for q in Q8_0 Q4_0; do $L $B/llama-quantize m-f16.gguf m-$q.gguf $q > q-$q.log 2>&1; echo "quantize $q rc=$?"; done
for m in m-f16.gguf m-Q8_0.gguf m-Q4_0.gguf; do
  timeout 100 $L $B/llama-bench -m $m -ngl 99 -p 512 -n 128 -d 0,512 -r 3 -o json > "$OUT/llama-vk-$m.json" 2> "$OUT/llama-vk-$m.err"; echo "llama-bench $m rc=$?"
  python3 -c "import json,sys; [print(r['model_type'], 'pp', r['n_prompt'], 'tg', r['n_gen'], 'depth', r['n_depth'], round(r['avg_ts'],1), 't/s', r['backends'], r['gpu_info']) for r in json.load(open(sys.argv[1]))]" "$OUT/llama-vk-$m.json" || tail -5 "$OUT/llama-vk-$m.err"
done
cd /tmp/repo
export PYTHONPATH=/tmp/wsite:/tmp/repo:/tmp/repo/tools
timeout 200 python3 tools/profile_step.py --model-dir /tmp/lead/w-webgpu-fp16 --devices webgpu --batch 1,8 --context 512 --steps 20 --json "$OUT/wicore-webgpu.json" > "$OUT/wicore-webgpu.log" 2>&1; echo "profile rc=$?"
grep -v "^\s*$" "$OUT/wicore-webgpu.log" | grep -v -i warning | tail -8
timeout 100 python3 tools/profile_step.py --model-dir /tmp/lead/w-webgpu-fp16 --devices webgpu --batch 1 --context 512 --steps 10 --profile > "$OUT/wicore-webgpu-prof.log" 2>&1; echo "prof rc=$?"; grep -v "^\s*$" "$OUT/wicore-webgpu-prof.log" | grep -v -i warning | tail -4
