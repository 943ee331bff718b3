# Sourced by a job once the six chunks are in /tmp/parts: onnxruntime-gpu into /tmp/site, WiCore's kernels built.
w=/tmp/$(cat /tmp/parts/WHEEL_NAME)
[ -d /tmp/site/onnxruntime/capi ] && python3 -c "import sys; sys.path.insert(0,'/tmp/site'); import onnxruntime as o; assert 'CUDAExecutionProvider' in o.get_available_providers()" 2>/dev/null \
  || { cat /tmp/parts/part.* > "$w" && python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site "$w"; }
export PYTHONPATH=/tmp/site:/tmp/repo:/tmp/repo/tools WICORE_CACHE=/tmp/wc-cache
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -c "import onnxruntime as o; print(o.__version__, o.get_available_providers())"
python3 -c "from wicore.kernels.library import library; print(library(True))" 2>&1 | tail -1
