// CPU kernels of kernels.h: the same arithmetic as kernels.cu (float32 throughout, one rounding
// to half at the end), so CI runs every op the CUDA graphs use.
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels.h"

namespace wicore {
namespace {

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf / nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalize
    exp = 113;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t FloatToHalf(float f) {  // round to nearest even, as __float2half
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) return sign | (abs > 0x7f800000u ? 0x7e00u : 0x7c00u);
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds past 65504: inf
  if (abs < 0x38800000u) {                        // below the smallest normal half: subnormal or zero
    if (abs < 0x33000000u) return sign;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const int shift = 126 - static_cast<int>(abs >> 23);  // 14..24
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return sign | static_cast<uint16_t>(half);
  }
  uint32_t half = ((abs >> 13) - (112u << 10));
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;
  return sign | static_cast<uint16_t>(half);
}

float Activate(float v, Activation act) {
  if (act == Activation::kSilu) return v / (1.0f + std::exp(-v));
  const float k = 0.7978845608028654f;
  return 0.5f * v * (1.0f + std::tanh(k * (v + 0.044715f * v * v * v)));
}

}  // namespace

void ResidualRMSNormCpu(const float* x, const uint16_t* h, const float* w_post, const uint16_t* w, float epsilon,
                        int64_t rows, int64_t hidden, uint16_t* y, float* sum) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t base = r * hidden;
    float inv_h = 1.0f;
    if (w_post != nullptr) {
      float ss = 0.0f;
      for (int64_t i = 0; i < hidden; ++i) {
        const float v = HalfToFloat(h[base + i]);
        ss += v * v;
      }
      inv_h = 1.0f / std::sqrt(ss / static_cast<float>(hidden) + epsilon);
    }
    float ss = 0.0f;
    for (int64_t i = 0; i < hidden; ++i) {
      float v = HalfToFloat(h[base + i]);
      v = w_post != nullptr ? v * inv_h * w_post[i] : v;
      const float s = x[base + i] + v;
      sum[base + i] = s;
      ss += s * s;
    }
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(hidden) + epsilon);
    for (int64_t i = 0; i < hidden; ++i) y[base + i] = FloatToHalf(sum[base + i] * inv * HalfToFloat(w[i]));
  }
}

void GatedActivationCpu(const uint16_t* gate_up, Activation act, int64_t rows, int64_t inter, uint16_t* out) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < inter; ++j) {
      const float g = HalfToFloat(gate_up[r * 2 * inter + j]), u = HalfToFloat(gate_up[r * 2 * inter + inter + j]);
      out[r * inter + j] = FloatToHalf(Activate(g, act) * u);
    }
  }
}

// w exact in float32 ((code - zero point) has at most 8 bits, a half's significand 11), products summed in
// float32 along k, one rounding to half: the reference; the CUDA kernels round each w to half first (kernels.h).
void MatMulQ16Cpu(const MatMulQ16Args& args, int64_t n_begin, int64_t n_end) {
  const int64_t blocks = args.k / args.block_size, row_bytes = args.k * args.bits / 8;
  const float zero_point = static_cast<float>(1 << (args.bits - 1));
  std::vector<float> w(static_cast<size_t>(args.k));
  for (int64_t n = n_begin; n < n_end; ++n) {
    const uint8_t* codes = args.b + n * row_bytes;
    for (int64_t c = 0; c < args.k; ++c) {
      const int code = args.bits == 8 ? codes[c] : (codes[c / 2] >> (4 * (c % 2))) & 15;
      w[c] = (static_cast<float>(code) - zero_point) * HalfToFloat(args.scales[n * blocks + c / args.block_size]);
    }
    for (int64_t m = 0; m < args.m; ++m) {
      const uint16_t* x = args.x + m * args.k;
      float acc = 0.0f;
      for (int64_t c = 0; c < args.k; ++c) acc += HalfToFloat(x[c]) * w[c];
      args.y[m * args.n + n] = FloatToHalf(acc);
    }
  }
}

// MatMulI8's row rounding (kernels.h), the CUDA kernel's to the bit: one IEEE division, one multiply, rint
// (round half to even in the default rounding mode, as __float2int_rn).
void MatMulI8QuantizeRowCpu(const uint16_t* x, int64_t k, int8_t* q, float* scale) {
  float amax = 0.0f;
  for (int64_t c = 0; c < k; ++c) amax = std::fmax(amax, std::fabs(HalfToFloat(x[c])));
  if (amax == 0.0f) {
    std::memset(q, 0, static_cast<size_t>(k));
    *scale = 0.0f;
    return;
  }
  const float inv = 127.0f / amax;
  for (int64_t c = 0; c < k; ++c) {
    const float r = std::nearbyint(HalfToFloat(x[c]) * inv);
    q[c] = static_cast<int8_t>(std::fmin(127.0f, std::fmax(-127.0f, r)));
  }
  *scale = amax / 127.0f;
}

void MatMulI8Cpu(const MatMulI8Args& args, const int8_t* xq, const float* x_scales, int64_t n_begin, int64_t n_end) {
  const int64_t k = args.k;
  std::vector<float> x;
  if (xq == nullptr) {  // weight-only: x in float32 once a task
    x.resize(static_cast<size_t>(args.m * k));
    for (int64_t i = 0; i < args.m * k; ++i) x[i] = HalfToFloat(args.x[i]);
  }
  for (int64_t n = n_begin; n < n_end; ++n) {
    const int8_t* w = args.w + n * k;
    for (int64_t m = 0; m < args.m; ++m) {
      float y;
      if (xq != nullptr) {
        const int8_t* a = xq + m * k;
        int32_t acc = 0;
        for (int64_t c = 0; c < k; ++c) acc += static_cast<int32_t>(a[c]) * w[c];
        y = (static_cast<float>(acc) * x_scales[m]) * args.scales[n];
      } else {
        const float* a = x.data() + m * k;
        float acc = 0.0f;
        for (int64_t c = 0; c < k; ++c) acc += a[c] * static_cast<float>(w[c]);
        y = acc * args.scales[n];
      }
      args.y[m * args.n + n] = FloatToHalf(y);
    }
  }
}

}  // namespace wicore
