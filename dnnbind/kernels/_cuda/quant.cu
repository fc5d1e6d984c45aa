// Low-bit inference kernels (kernels/quantize.py): activation quantizers, GEMM epilogues, weight dequantizers
// and a fused int4 GEMM. Every scale and rounding step is the float32 operation dnnbind/quantizers.py
// defines (explicit __f*_rn intrinsics: no contraction into FMAs), so the quantizers match NumPy bit for bit.
// Suffixes: f32 / f16 / bf16 = the activation (and output) type.

#define Q_TYPES(X) X(f32, float) X(f16, half_t) X(bf16, bf16_t)

__device__ __forceinline__ signed char q_int8(float v) {
    v = fminf(fmaxf(rintf(v), -127.0f), 127.0f);
    return (signed char)(int)v;
}

// float32 -> E4M3 (OCP "fn": no infinities, 0x7f/0xff NaN), round to nearest even, saturating to +-448.
__device__ __forceinline__ unsigned char q_e4m3(float f) {
#if __CUDA_ARCH__ >= 890
    unsigned short pair;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(f), "f"(f));  // both halves: either byte
    return (unsigned char)(pair & 0xffu);
#else
    const unsigned u = __float_as_uint(f);
    const unsigned char sign = (unsigned char)((u >> 24) & 0x80u);
    const float a = fabsf(f);
    if (a != a) return (unsigned char)(sign | 0x7fu);
    if (a >= 448.0f) return (unsigned char)(sign | 0x7eu);
    unsigned code;
    if (a < 0.015625f) {  // below 2^-6: subnormal steps of 2^-9 (a * 512 is exact), 8 rounds up to 2^-6
        code = (unsigned)rintf(a * 512.0f);
    } else {
        const unsigned ua = __float_as_uint(a);
        const unsigned e = ((ua >> 23) & 0xffu) - 127u + 7u;
        const unsigned m = ua & 0x7fffffu;
        unsigned base = m >> 20;
        const unsigned rem = m & 0xfffffu;
        if (rem > 0x80000u || (rem == 0x80000u && (base & 1u))) base += 1u;  // may carry into the exponent
        code = (e << 3) + base;
        if (code > 0x7eu) code = 0x7eu;
    }
    return (unsigned char)(sign | code);
#endif
}

__device__ __forceinline__ float q_e4m3_to_f32(unsigned char b) {
    const unsigned e = (b >> 3) & 15u, m = b & 7u;
    float v;
    if (e == 0u) v = (float)m * 0.001953125f;  // m * 2^-9
    else if (e == 15u && m == 7u) v = __uint_as_float(0x7fc00000u);
    else v = __uint_as_float(((e + 120u) << 23) | (m << 20));
    return (b & 0x80u) ? -v : v;
}

// ----- activation quantizers ----------------------------------------------------------------------
// Vector paths (the kernels' `vec` argument, set by the host): VW = 16 / sizeof(T) neighbouring elements per
// step in one 16-byte load of x / store of y (narrower for the 1-byte side), when every array it touches is
// 16-byte aligned and, for the (rows, cols) kernels, cols % VW == 0 (a vector never straddles a row).
// Flat kernels finish the last n % VW elements one by one. Per element the arithmetic is the scalar
// path's, so both give the same bits. (Scalar accesses ran these at 25-50% of the H200's bandwidth.)
#define Q_FLAT_TAIL(i, nv, VW, n) \
    for (i64 i = (nv) * (VW) + blockIdx.x * (i64)blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

// int8, one scale per row: scale = 127 / (max|x_row| + 1e-7); one block per row. VW > 1: the host checks
// cols % VW == 0 (so every row starts aligned); the max does not depend on the order it is taken in.
template <typename T, int VW>
__device__ void quant_rows_int8(const T* x, signed char* q, float* scale, i64 rows, i64 cols) {
    __shared__ float scratch[32];
    const i64 nv = cols / VW;
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = x + r * cols;
        signed char* qr = q + r * cols;
        float m = 0.0f;
        for (i64 v = threadIdx.x; v < nv; v += blockDim.x) {
            const Pack<T, VW> a = load_pack<T, VW>(xr, v * VW);
#pragma unroll
            for (int k = 0; k < VW; ++k) m = fmaxf(m, fabsf(load(a.e, k)));
        }
        m = block_max(m, scratch);  // prelude.cuh; every thread gets it
        const float s = __fdiv_rn(127.0f, __fadd_rn(m, 1e-7f));
        for (i64 v = threadIdx.x; v < nv; v += blockDim.x) {
            const Pack<T, VW> a = load_pack<T, VW>(xr, v * VW);
            Pack<signed char, VW> o;
#pragma unroll
            for (int k = 0; k < VW; ++k) o.e[k] = q_int8(__fmul_rn(load(a.e, k), s));
            store_pack<signed char, VW>(qr, v * VW, o);
        }
        if (threadIdx.x == 0) scale[r] = s;
    }
}

// int8 with one given (calibrated) quantize scale.
template <typename T, int VW>
__device__ void quant_static_int8(const T* x, signed char* q, const float* scale, i64 n) {
    const float s = scale[0];
    const i64 nv = n / VW;
    for (i64 v = blockIdx.x * (i64)blockDim.x + threadIdx.x; v < nv; v += (i64)gridDim.x * blockDim.x) {
        const Pack<T, VW> a = load_pack<T, VW>(x, v * VW);
        Pack<signed char, VW> o;
#pragma unroll
        for (int k = 0; k < VW; ++k) o.e[k] = q_int8(__fmul_rn(load(a.e, k), s));
        store_pack<signed char, VW>(q, v * VW, o);
    }
    Q_FLAT_TAIL(i, nv, VW, n) q[i] = q_int8(__fmul_rn(load(x, i), s));
}

// max|x| into *out (float bits, zeroed first): the bit patterns of non-negative floats order as unsigned
// ints, NaN above infinity.
__device__ __forceinline__ unsigned q_abs_bits_max(unsigned m, float v) {
    const unsigned b = __float_as_uint(fabsf(v));
    return b > m ? b : m;
}

template <typename T, int VW>
__device__ void abs_max(const T* x, unsigned* out, i64 n) {
    unsigned m = 0u;
    const i64 nv = n / VW;
    for (i64 v = blockIdx.x * (i64)blockDim.x + threadIdx.x; v < nv; v += (i64)gridDim.x * blockDim.x) {
        const Pack<T, VW> a = load_pack<T, VW>(x, v * VW);
#pragma unroll
        for (int k = 0; k < VW; ++k) m = q_abs_bits_max(m, load(a.e, k));
    }
    Q_FLAT_TAIL(i, nv, VW, n) m = q_abs_bits_max(m, load(x, i));
    for (int o = 16; o > 0; o >>= 1) {
        const unsigned other = __shfl_xor_sync(0xffffffffu, m, o);
        m = other > m ? other : m;
    }
    if ((threadIdx.x & 31) == 0 && m) atomicMax(out, m);
}

// E4M3 with the quantize scale scales[0] (scales from fp8_scales).
__device__ __forceinline__ unsigned char q_fp8_scaled(float x, float s) {
    float v = __fmul_rn(x, s);
    if (v == v) v = fminf(fmaxf(v, -448.0f), 448.0f);
    return q_e4m3(v);
}

template <typename T, int VW>
__device__ void quant_fp8(const T* x, unsigned char* q, const float* scales, i64 n) {
    const float s = scales[0];
    const i64 nv = n / VW;
    for (i64 v = blockIdx.x * (i64)blockDim.x + threadIdx.x; v < nv; v += (i64)gridDim.x * blockDim.x) {
        const Pack<T, VW> a = load_pack<T, VW>(x, v * VW);
        Pack<unsigned char, VW> o;
#pragma unroll
        for (int k = 0; k < VW; ++k) o.e[k] = q_fp8_scaled(load(a.e, k), s);
        store_pack<unsigned char, VW>(q, v * VW, o);
    }
    Q_FLAT_TAIL(i, nv, VW, n) q[i] = q_fp8_scaled(load(x, i), s);
}

// ----- epilogues of the integer / FP8 GEMMs ---------------------------------------------------------
// The fused activation (act 1: relu) on the float32 value before its rounding to T. A NaN stays NaN (as
// cuDNN's relu with PROPAGATE_NAN and NumPy's maximum), -0 stays -0.
__device__ __forceinline__ float q_act(float v, int act) { return (act == 1 && v < 0.0f) ? 0.0f : v; }

// y = act(acc / (sx * sw[col]) (+ bias[col])); sx one per row (sx_per_row) or one for all. VW = 1: scalar.
template <typename T, typename A, int VW>
__device__ void int8_epilogue(const A* acc, const float* sx, i64 sx_per_row, const float* sw, const T* bias, T* y,
                              i64 rows, i64 cols, int act) {
    const i64 nv = rows * cols / VW;
    for (i64 v = blockIdx.x * (i64)blockDim.x + threadIdx.x; v < nv; v += (i64)gridDim.x * blockDim.x) {
        const i64 i = v * VW, r = i / cols, c = i - r * cols;
        const float sxr = sx[sx_per_row ? r : 0];
        const Pack<A, VW> a = load_pack<A, VW>(acc, i);
        const Pack<float, VW> w = load_pack<float, VW>(sw, c);
        Pack<T, VW> b;
        if (bias) b = load_pack<T, VW>(bias, c);
        Pack<T, VW> o;
#pragma unroll
        for (int k = 0; k < VW; ++k) {
            const float d = __fmul_rn(sxr, w.e[k]);
            float val = __fdiv_rn((float)a.e[k], d);
            if (bias) val = __fadd_rn(val, load(b.e, k));
            store(o.e, k, q_act(val, act));
        }
        store_pack<T, VW>(y, i, o);
    }
}

// y = act(acc * (sx * sw) (+ bias[col])) for the FP8 path without cuBLASLt. VW > 1: the host checks
// cols % VW == 0 and 16-byte aligned acc, bias and y.
template <typename T, int VW>
__device__ void fp8_epilogue(const float* acc, const float* sx, const float* sw, const T* bias, T* y, i64 rows,
                             i64 cols, int act) {
    const i64 nv = rows * cols / VW;
    const float d = __fmul_rn(sx[0], sw[0]);
    for (i64 v = blockIdx.x * (i64)blockDim.x + threadIdx.x; v < nv; v += (i64)gridDim.x * blockDim.x) {
        const i64 i = v * VW, c = i % cols;
        const Pack<float, VW> a = load_pack<float, VW>(acc, i);
        Pack<T, VW> b;
        if (bias) b = load_pack<T, VW>(bias, c);
        Pack<T, VW> o;
#pragma unroll
        for (int k = 0; k < VW; ++k) {
            float val = __fmul_rn(a.e[k], d);
            if (bias) val = __fadd_rn(val, load(b.e, k));
            store(o.e, k, q_act(val, act));
        }
        store_pack<T, VW>(y, i, o);
    }
}

// ----- weight dequantizers (out, in) ------------------------------------------------------------------
template <typename T>
__device__ void dequant_int8(const signed char* q, const float* s, T* out, i64 rows, i64 cols) {
    const i64 n = rows * cols;
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
        store(out, i, __fdiv_rn((float)q[i], s[i / cols]));
}

template <typename T>
__device__ void dequant_fp8(const unsigned char* q, const float* s, T* out, i64 n) {
    const float scale = s[0];
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
        store(out, i, __fmul_rn(q_e4m3_to_f32(q[i]), scale));
}

__device__ __forceinline__ float q_int4(const unsigned char* packed, i64 kp, i64 r, i64 c) {
    const unsigned b = packed[r * kp + (c >> 1)];
    int v = (int)((c & 1) ? (b >> 4) : (b & 15u));
    return (float)(v > 7 ? v - 16 : v);
}

__device__ __forceinline__ float q_nibble(unsigned v) { return (float)((int)v > 7 ? (int)v - 16 : (int)v); }

// Vector path: VW = 16 / sizeof(T) columns (VW / 2 packed bytes) per step, one scale per vector; the host
// checks cols % VW == 0, kp == cols / 2, group % VW == 0 and 16-byte aligned p and out.
template <typename T, int VW>
__device__ void dequant_int4_vec(const unsigned char* p, const float* s, T* out, i64 rows, i64 cols, i64 kp,
                                 i64 groups, i64 group) {
    const i64 nv = rows * cols / VW;
    for (i64 v = blockIdx.x * (i64)blockDim.x + threadIdx.x; v < nv; v += (i64)gridDim.x * blockDim.x) {
        const i64 i = v * VW, r = i / cols, c = i - r * cols;
        const float sc = s[r * groups + c / group];
        const Pack<unsigned char, VW / 2> pk = load_pack<unsigned char, VW / 2>(p, r * kp + (c >> 1));
        Pack<T, VW> o;
#pragma unroll
        for (int j = 0; j < VW / 2; ++j) {
            const unsigned b = pk.e[j];
            store(o.e, 2 * j, __fdiv_rn(q_nibble(b & 15u), sc));
            store(o.e, 2 * j + 1, __fdiv_rn(q_nibble(b >> 4), sc));
        }
        store_pack<T, VW>(out, i, o);
    }
}

template <typename T>
__device__ void dequant_int4(const unsigned char* p, const float* s, T* out, i64 rows, i64 cols, i64 kp,
                             i64 groups, i64 group) {
    const i64 n = rows * cols;
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        const i64 r = i / cols, c = i - r * cols;
        store(out, i, __fdiv_rn(q_int4(p, kp, r, c), s[r * groups + c / group]));
    }
}

// ----- fused int4 GEMM: y (M, N) = x (M, K) @ dequant(p)^T (+ bias); 64x64 tiles, 256 threads of 4x4 ---------
template <typename T>
__device__ void int4_gemm(const T* x, const unsigned char* p, const float* s, const T* bias, T* y, i64 M, i64 N,
                          i64 K, i64 kp, i64 groups, i64 group) {
    __shared__ float xs[32][64 + 4];
    __shared__ float ws[32][64 + 4];
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const i64 m0 = (i64)blockIdx.y * 64, n0 = (i64)blockIdx.x * 64;
    float acc[4][4];
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
    for (i64 k0 = 0; k0 < K; k0 += 32) {
        for (int e = tid; e < 64 * 32; e += 256) {
            const int row = e >> 5, kk = e & 31;
            const i64 m = m0 + row, n = n0 + row, k = k0 + kk;
            xs[kk][row] = (m < M && k < K) ? load(x, m * K + k) : 0.0f;
            ws[kk][row] = (n < N && k < K) ? __fdiv_rn(q_int4(p, kp, n, k), s[n * groups + k / group]) : 0.0f;
        }
        __syncthreads();
        for (int kk = 0; kk < 32; ++kk) {
            float a[4], b[4];
            for (int i = 0; i < 4; ++i) a[i] = xs[kk][ty * 4 + i];
            for (int j = 0; j < 4; ++j) b[j] = ws[kk][tx * 4 + j];
            for (int i = 0; i < 4; ++i)
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
    for (int i = 0; i < 4; ++i) {
        const i64 m = m0 + ty * 4 + i;
        if (m >= M) continue;
        for (int j = 0; j < 4; ++j) {
            const i64 n = n0 + tx * 4 + j;
            if (n >= N) continue;
            float v = acc[i][j];
            if (bias) v += load(bias, n);
            store(y, m * N + n, v);
        }
    }
}

// ----- type-free helpers ------------------------------------------------------------------------------
// The two scales go to two pointers: cuBLASLt reads the dequantize scale through B_SCALE_POINTER, so the
// dense path gives it an allocation of its own (pool-aligned) rather than the second float of a pair.
extern "C" __global__ void fp8_scales(const unsigned* amax_bits, const float* dequant_scale, float* quant_out,
                                      float* dequant_out) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    float qs, ds;
    if (dequant_scale) {
        ds = dequant_scale[0];
        qs = __fdiv_rn(1.0f, ds);
    } else {
        const float a = __uint_as_float(amax_bits[0]);
        if (a > 0.0f && a <= 3.402823466e38f) {
            qs = __fdiv_rn(448.0f, a);
            ds = __fdiv_rn(a, 448.0f);
        } else {
            qs = 1.0f;
            ds = 1.0f;
        }
    }
    quant_out[0] = qs;
    dequant_out[0] = ds;
}

extern "C" __global__ void int8_to_f32(const signed char* q, float* out, i64 n) {
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
        out[i] = (float)q[i];
}

extern "C" __global__ void fp8_to_f32(const unsigned char* q, float* out, i64 n) {
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
        out[i] = q_e4m3_to_f32(q[i]);
}

#define Q_INSTANTIATE(S, T)                                                                                     \
    extern "C" __global__ void quant_rows_int8_##S(const T* x, signed char* q, float* scale, i64 rows,        \
                                                   i64 cols, int vec) {                                      \
        if (vec) quant_rows_int8<T, 16 / (int)sizeof(T)>(x, q, scale, rows, cols);                            \
        else quant_rows_int8<T, 1>(x, q, scale, rows, cols);                                                  \
    }                                                                                                         \
    extern "C" __global__ void quant_static_int8_##S(const T* x, signed char* q, const float* scale, i64 n,  \
                                                     int vec) {                                               \
        if (vec) quant_static_int8<T, 16 / (int)sizeof(T)>(x, q, scale, n);                                   \
        else quant_static_int8<T, 1>(x, q, scale, n);                                                         \
    }                                                                                                         \
    extern "C" __global__ void abs_max_##S(const T* x, unsigned* out, i64 n, int vec) {                      \
        if (vec) abs_max<T, 16 / (int)sizeof(T)>(x, out, n);                                                  \
        else abs_max<T, 1>(x, out, n);                                                                        \
    }                                                                                                         \
    extern "C" __global__ void quant_fp8_##S(const T* x, unsigned char* q, const float* scales, i64 n,        \
                                             int vec) {                                                       \
        if (vec) quant_fp8<T, 16 / (int)sizeof(T)>(x, q, scales, n);                                          \
        else quant_fp8<T, 1>(x, q, scales, n);                                                                \
    }                                                                                                         \
    extern "C" __global__ void int8_epilogue_##S##_i32(const int* acc, const float* sx, i64 sx_per_row,       \
                                                       const float* sw, const T* bias, T* y, i64 rows,        \
                                                       i64 cols, int act, int vec) {                          \
        if (vec) int8_epilogue<T, int, 16 / (int)sizeof(T)>(acc, sx, sx_per_row, sw, bias, y, rows, cols, act);\
        else int8_epilogue<T, int, 1>(acc, sx, sx_per_row, sw, bias, y, rows, cols, act);                     \
    }                                                                                                         \
    extern "C" __global__ void int8_epilogue_##S##_f32(const float* acc, const float* sx, i64 sx_per_row,     \
                                                       const float* sw, const T* bias, T* y, i64 rows,        \
                                                       i64 cols, int act, int vec) {                          \
        if (vec) int8_epilogue<T, float, 16 / (int)sizeof(T)>(acc, sx, sx_per_row, sw, bias, y, rows, cols, act);\
        else int8_epilogue<T, float, 1>(acc, sx, sx_per_row, sw, bias, y, rows, cols, act);                   \
    }                                                                                                         \
    extern "C" __global__ void fp8_epilogue_##S(const float* acc, const float* sx, const float* sw,           \
                                                const T* bias, T* y, i64 rows, i64 cols, int act, int vec) {  \
        if (vec) fp8_epilogue<T, 16 / (int)sizeof(T)>(acc, sx, sw, bias, y, rows, cols, act);                 \
        else fp8_epilogue<T, 1>(acc, sx, sw, bias, y, rows, cols, act);                                       \
    }                                                                                                         \
    extern "C" __global__ void dequant_int8_##S(const signed char* q, const float* s, T* out, i64 rows,       \
                                                i64 cols) {                                                   \
        dequant_int8<T>(q, s, out, rows, cols);                                                               \
    }                                                                                                         \
    extern "C" __global__ void dequant_fp8_##S(const unsigned char* q, const float* s, T* out, i64 n) {       \
        dequant_fp8<T>(q, s, out, n);                                                                         \
    }                                                                                                         \
    extern "C" __global__ void dequant_int4_##S(const unsigned char* p, const float* s, T* out, i64 rows,     \
                                                i64 cols, i64 kp, i64 groups, i64 group, int vec) {           \
        if (vec) dequant_int4_vec<T, 16 / (int)sizeof(T)>(p, s, out, rows, cols, kp, groups, group);          \
        else dequant_int4<T>(p, s, out, rows, cols, kp, groups, group);                                       \
    }                                                                                                         \
    extern "C" __global__ void int4_gemm_##S(const T* x, const unsigned char* p, const float* s,              \
                                             const T* bias, T* y, i64 M, i64 N, i64 K, i64 kp, i64 groups,    \
                                             i64 group) {                                                     \
        int4_gemm<T>(x, p, s, bias, y, M, N, K, kp, groups, group);                                           \
    }

Q_TYPES(Q_INSTANTIATE)
