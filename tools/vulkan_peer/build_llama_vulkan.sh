#!/usr/bin/env bash
# llama.cpp's Vulkan backend, the peer of WiCore on ONNX Runtime's WebGPU EP (issue 34), built on a
# Debian 12 machine without a GPU from the llama.cpp that llama-cpp-python 0.3.36 vendors (the version
# the CPU benchmarks use), into $1 (default ./llama-vk.tar.xz): llama-bench, llama-quantize, llama-simple
# and the three libraries a device image may lack. Debian 12's Vulkan headers (1.3.239) lack
# VK_EXT_layer_settings, which only the validation layers' settings use: that block is dropped.
set -euo pipefail
out="$(realpath "${1:-llama-vk.tar.xz}")"
work="$(mktemp -d)"
apt-get install -y -q libvulkan-dev glslc spirv-headers ninja-build cmake >/dev/null
pip download -q --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d "$work"
tar -xzf "$work"/llama_cpp_python-0.3.36.tar.gz -C "$work"
cd "$work"/llama_cpp_python-0.3.36/vendor/llama.cpp
python3 - <<'PY'
p = "ggml/src/ggml-vulkan/ggml-vulkan.cpp"
s = open(p).read()
a = s.index("    VkBool32 enable_best_practice = layer_settings;")
end = "&layer_setting_info);"
b = s.index(end, a) + len(end)
s = s[:a] + "    vk::InstanceCreateInfo instance_create_info(vk::InstanceCreateFlags{}, &app_info, layers, extensions);" + s[b:]
open(p, "w").write(s)
PY
cmake -B build -G Ninja -DGGML_VULKAN=ON -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
  -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_EXE_LINKER_FLAGS="-static-libstdc++ -static-libgcc" >/dev/null
ninja -C build llama-bench llama-quantize llama-simple  # ~30 min on 2 cores: the shaders
cd build/bin && strip llama-bench llama-quantize llama-simple && mkdir -p lib
cp /lib/x86_64-linux-gnu/{libgomp.so.1,libssl.so.3,libcrypto.so.3} lib/
tar -cJf "$out" llama-bench llama-quantize llama-simple lib
echo "$out"
