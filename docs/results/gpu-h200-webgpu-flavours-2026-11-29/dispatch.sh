#!/usr/bin/env bash
# webgpu3's second H200 run: decode steps against the WebGPU EP's maxNumPendingDispatches (submits a step).
J=$PWD/.gpujob/webgpu3
date -u; for f in $PWD/.gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
python3 -m pip install -q --no-index --no-deps --target /tmp/wsite $J/wheels/*.whl 2>&1 | tail -2
rm -rf /tmp/w3 && cp -r $J/tree /tmp/w3 && cp $J/pending.py /tmp/w3/tools/ && cd /tmp/w3
export PYTHONPATH=/tmp/wsite:/tmp/w3:/tmp/w3/tools
flt() { grep -v "W:onnx\|^.\[m$\|Warning\|^\s*$\|GetCpuPreferredNodes\|ScatterND" "$@"; }
timeout 100 python3 tools/check_webgpu_flavour.py --devices webgpu --layers 26 --work /tmp/wf --flavours webgpu,webgpu-q4,webgpu+paged --jobs 3 --export-only > $OUT/export.log 2>&1
echo "export rc=$?"; date -u; uptime
W=/tmp/wf/gemma3-1b-26l-fp16
for m in webgpu webgpu-q4 webgpu+paged; do for n in 16 64 256 1024 16; do
  [ $m = webgpu+paged ] && [ $n = 64 -o $n = 1024 ] && continue
  timeout 45 python3 tools/pending.py $n --model-dir $W-$m --devices webgpu --batch 1,8 --steps 10 --threads 4 --json $OUT/pending-$m-$n.json > $OUT/pending-$m-$n.log 2>&1
  echo "$m pending $n rc=$?: $(flt $OUT/pending-$m-$n.log | grep '^| /tmp' | awk -F'|' '{printf "batch%s %s ms; ", $5, $6}')"
done; done; date -u
