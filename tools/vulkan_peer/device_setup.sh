#!/usr/bin/env bash
# (tools/vulkan_peer: the artifacts in $PEER_DIR, default .gpujob/lead, a git-ignored folder the device tool carries)
# Call 1 on a cold machine: the tree to /tmp/repo, ORT 1.32 + the WebGPU plugin to /tmp/wsite, then in the
# background a random Llama at SmolLM2-360M's shape, its F16 GGUF (llama.cpp's converter) and WiCore's
# webgpu-flavour fp16 export of the same HF folder.
set -e
ROOT=$PWD
mkdir -p /tmp/repo /tmp/wsite /tmp/lead
tar --exclude=./.gpujob --exclude=./.gl --exclude=./.git -cf - . | (cd /tmp/repo && tar xf -)
cp -r ${PEER_DIR:-.gpujob/lead}/. /tmp/lead/
cp tools/vulkan_peer/make_model.py /tmp/lead/
# onnxruntime 1.32, the WebGPU plugin, llguidance (wicore.structured imports it)
python3 -m pip install -q --no-index --no-deps --target /tmp/wsite ${PEER_DIR:-.gpujob/lead}/wheels/*.whl 2>&1 | tail -2
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
cd /tmp/lead && mkdir -p conv && tar -C conv -xJf convert.tar.xz
cat > bg.sh <<'EOS'
cd /tmp/lead; date -u
python3 make_model.py /tmp/lead/hf360 && echo MODEL-OK; date -u
PYTHONPATH=/tmp/lead/conv/gguf-py python3 conv/convert_hf_to_gguf.py hf360 --outtype f16 --outfile m-f16.gguf > conv.log 2>&1; echo "CONVERT rc=$?"; date -u
cd /tmp/repo && PYTHONPATH=/tmp/wsite:/tmp/repo python3 -c 'import sys; from wicore.cli.export import main; sys.exit(main())' --model /tmp/lead/hf360 --out /tmp/lead/w-webgpu-fp16 --op-flavour webgpu --dtype fp16 > /tmp/lead/exp.log 2>&1; echo "EXPORT rc=$?"; date -u; echo BG-DONE
EOS
(setsid nohup bash bg.sh > /tmp/lead/bg.log 2>&1 &); echo started
