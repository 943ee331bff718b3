"""WiCore's own fused kernels as an ONNX Runtime custom-op library: C++ and CUDA sources in csrc/
(one header declares each kernel; kernels_cpu.cc and kernels.cu implement it, a HIP port would add
one file), ONNX Runtime's C API headers in include/, and the build (library.py).

The ops (domain "wicore", csrc/kernels.h): AddRMSNorm and NormAddRMSNorm (a residual add fused with
the next RMSNorm, the sum a second output), GeGLU and SwiGLU (the gated MLP's activation on one
gate|up tensor). Graphs use them where exported with `kernels="wicore"` (wicore.graph.decoder).
"""
