// Shared by every dnnbind kernel source (prepended by _kernels.py; NVRTC gets no headers,
// so fp16/bf16 conversions are written here with PTX and bit arithmetic).
typedef long long i64;
typedef unsigned long long u64;

struct half_t { unsigned short bits; };
struct bf16_t { unsigned short bits; };
struct bool_t { unsigned char v; };

// The type arithmetic happens in: float for every float type but double.
template <typename T> struct Acc { typedef float t; };
template <> struct Acc<double> { typedef double t; };

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(half_t v) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
    return f;
}
__device__ __forceinline__ float to_f32(bf16_t v) { return __uint_as_float(((unsigned)v.bits) << 16); }

template <typename T> __device__ __forceinline__ T from_f32(float f);
template <> __device__ __forceinline__ float from_f32<float>(float f) { return f; }
template <> __device__ __forceinline__ half_t from_f32<half_t>(float f) {
    half_t h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
    return h;
}
template <> __device__ __forceinline__ bf16_t from_f32<bf16_t>(float f) {
    // Round to nearest even, as ml_dtypes does; NaN stays a (quiet) NaN.
    unsigned u = __float_as_uint(f);
    bf16_t b;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        b.bits = (unsigned short)((u >> 16) | 0x40u);
    } else {
        u += 0x7fffu + ((u >> 16) & 1u);
        b.bits = (unsigned short)(u >> 16);
    }
    return b;
}

// Load as the accumulation type / store from it.
__device__ __forceinline__ float load(const float* p, i64 i) { return p[i]; }
__device__ __forceinline__ double load(const double* p, i64 i) { return p[i]; }
__device__ __forceinline__ float load(const half_t* p, i64 i) { return to_f32(p[i]); }
__device__ __forceinline__ float load(const bf16_t* p, i64 i) { return to_f32(p[i]); }
__device__ __forceinline__ void store(float* p, i64 i, float v) { p[i] = v; }
__device__ __forceinline__ void store(double* p, i64 i, double v) { p[i] = v; }
__device__ __forceinline__ void store(half_t* p, i64 i, float v) { p[i] = from_f32<half_t>(v); }
__device__ __forceinline__ void store(bf16_t* p, i64 i, float v) { p[i] = from_f32<bf16_t>(v); }

// Math overloads (no <cmath> under NVRTC without headers).
__device__ __forceinline__ float m_exp(float x) { return expf(x); }
__device__ __forceinline__ double m_exp(double x) { return exp(x); }
__device__ __forceinline__ float m_log(float x) { return logf(x); }
__device__ __forceinline__ double m_log(double x) { return log(x); }
__device__ __forceinline__ float m_log1p(float x) { return log1pf(x); }
__device__ __forceinline__ double m_log1p(double x) { return log1p(x); }
__device__ __forceinline__ float m_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double m_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float m_erf(float x) { return erff(x); }
__device__ __forceinline__ double m_erf(double x) { return erf(x); }
__device__ __forceinline__ float m_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double m_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float m_abs(float x) { return fabsf(x); }
__device__ __forceinline__ double m_abs(double x) { return fabs(x); }
__device__ __forceinline__ float m_max(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double m_max(double a, double b) { return fmax(a, b); }
__device__ __forceinline__ float m_min(float a, float b) { return fminf(a, b); }
__device__ __forceinline__ double m_min(double a, double b) { return fmin(a, b); }
__device__ __forceinline__ float m_pow(float a, float b) { return powf(a, b); }
__device__ __forceinline__ double m_pow(double a, double b) { return pow(a, b); }

#define DNB_NEG_INF __int_as_float(0xff800000)
#define DNB_NAN __int_as_float(0x7fc00000)

#define GRID_STRIDE(i, n) \
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

// Block-wide reductions; blockDim.x must be a multiple of 32 and at most 1024. Every thread
// gets the result. `scratch` needs 32 entries. Lanes of warp 0 read the per-warp partials, then
// lane 0 overwrites scratch[0] with the total: the __syncwarp() between them orders that read
// and that write for every lane (racecheck reported the hazard without it), and lanes past the
// last warp read the identity instead of scratch[0].
template <typename A> __device__ __forceinline__ A warp_sum(A v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}
template <typename A> __device__ __forceinline__ A warp_max(A v) {
    for (int o = 16; o > 0; o >>= 1) v = m_max(v, __shfl_down_sync(0xffffffffu, v, o));
    return v;
}
template <typename A> __device__ A block_sum(A v, A* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();  // scratch may still be read from a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    A r = (A)0;
    if (warp == 0) {
        r = lane < nwarps ? scratch[lane] : (A)0;
        r = warp_sum(r);
        __syncwarp();
        if (lane == 0) scratch[0] = r;
    }
    __syncthreads();
    return scratch[0];
}
template <typename A> __device__ A block_max(A v, A* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        A r = lane < nwarps ? scratch[lane] : (A)DNB_NEG_INF;
        r = warp_max(r);
        __syncwarp();
        if (lane == 0) scratch[0] = r;
    }
    __syncthreads();
    return scratch[0];
}

// SplitMix64's output function: a bijective 64-bit mix; splitmix64(key + i) over i is a
// SplitMix64 stream, so hashing (seed, counter, index) gives counter-based random bits.
__device__ __forceinline__ u64 splitmix64(u64 z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

#define FOR_FLOAT_TYPES(M) M(float, f32) M(double, f64) M(half_t, f16) M(bf16_t, bf16)
#define FOR_INDEX_TYPES(M) M(int, i32) M(i64, i64)



// Vector access: N elements of T at p[i .. i+N) in one load/store of N*sizeof(T) bytes (16-byte
// pieces beyond that). p + i must be aligned to min(16, N*sizeof(T)) bytes: the callers check
// the pointers on the host and take a scalar path otherwise.
template <int BYTES> struct Words;
template <> struct Words<1> { typedef unsigned char t; enum { n = 1 }; };
template <> struct Words<2> { typedef unsigned short t; enum { n = 1 }; };
template <> struct Words<4> { typedef unsigned t; enum { n = 1 }; };
template <> struct Words<8> { typedef uint2 t; enum { n = 1 }; };
template <> struct Words<16> { typedef uint4 t; enum { n = 1 }; };
template <> struct Words<32> { typedef uint4 t; enum { n = 2 }; };
template <> struct Words<64> { typedef uint4 t; enum { n = 4 }; };
template <typename T, int N> union Pack {
    typedef Words<N * (int)sizeof(T)> W;
    T e[N];
    typename W::t w[W::n];
};
template <typename T, int N> __device__ __forceinline__ Pack<T, N> load_pack(const T* p, i64 i) {
    Pack<T, N> r;
    const typename Pack<T, N>::W::t* src = (const typename Pack<T, N>::W::t*)(p + i);
#pragma unroll
    for (int k = 0; k < Pack<T, N>::W::n; ++k) r.w[k] = src[k];
    return r;
}
template <typename T, int N> __device__ __forceinline__ void store_pack(T* p, i64 i, const Pack<T, N>& v) {
    typename Pack<T, N>::W::t* dst = (typename Pack<T, N>::W::t*)(p + i);
#pragma unroll
    for (int k = 0; k < Pack<T, N>::W::n; ++k) dst[k] = v.w[k];
}
