// Pointwise activations, one kernel per (direction, kind, dtype): act_fwd_<kind>_<dtype> and
// act_bwd_<kind>_<dtype>. The kind is a template argument, so each kernel's element loop holds
// only its own formula and register count (one kernel with a runtime kind switch per element,
// scalar accesses, ran GELU at ~1.5 TB/s on an H200). Arithmetic in float (double for float64);
// gelu, gelu_tanh, leaky_relu, softplus and clipped_relu are the formulas of that kernel, the rest
// the NumPy reference's functions (ops/activation.py). x, y, dy, dx are contiguous arrays of n
// elements; the forward may run in place (y == x: each element is read before the same thread
// writes it).
//
// Access: with `vec` (every pointer 16-byte aligned, checked on the host) a thread moves 16
// bytes per array per step (8 bf16/fp16, 4 fp32, 2 fp64) and the last n % VW elements are done
// one by one; without it every element is done one by one, with the same arithmetic.
//
// NaN: a NaN input gives a NaN output in every forward (as NumPy, and cuDNN with
// CUDNN_PROPAGATE_NAN): every comparison with 0 or alpha is written so that a NaN fails it and
// goes on to x itself or to arithmetic on x.

enum ActKind {
    ACT_RELU, ACT_SIGMOID, ACT_TANH, ACT_ELU, ACT_CLIPPED_RELU, ACT_SWISH, ACT_GELU, ACT_GELU_TANH,
    ACT_LEAKY_RELU, ACT_SOFTPLUS
};

__device__ __forceinline__ float act_expm1(float x) { return expm1f(x); }
__device__ __forceinline__ double act_expm1(double x) { return expm1(x); }

// 1 / (1 + e^-x) on either side without overflow and with relative precision in both tails.
template <typename A> __device__ __forceinline__ A act_sigmoid(A x) {
    if (x >= (A)0) return (A)1 / ((A)1 + m_exp(-x));
    const A e = m_exp(x);
    return e / ((A)1 + e);
}

template <int K, typename A> __device__ __forceinline__ A act_value(A x, A alpha) {
    const A kSqrt1_2 = (A)0.70710678118654752440;
    const A kSqrt2_Pi = (A)0.79788456080286535588;
    if constexpr (K == ACT_RELU) return x < (A)0 ? (A)0 : x;
    else if constexpr (K == ACT_SIGMOID) return act_sigmoid(x);
    else if constexpr (K == ACT_TANH) return m_tanh(x);
    else if constexpr (K == ACT_ELU) return x > (A)0 ? x : alpha * act_expm1(x);
    else if constexpr (K == ACT_CLIPPED_RELU) return x < (A)0 ? (A)0 : (x > alpha ? alpha : x);
    else if constexpr (K == ACT_SWISH) return x * act_sigmoid(x);
    else if constexpr (K == ACT_GELU) return (A)0.5 * x * ((A)1 + m_erf(x * kSqrt1_2));
    else if constexpr (K == ACT_GELU_TANH)
        return (A)0.5 * x * ((A)1 + m_tanh(kSqrt2_Pi * (x + (A)0.044715 * x * x * x)));
    else if constexpr (K == ACT_LEAKY_RELU) return x > (A)0 ? x : alpha * x;
    else return m_max(x, (A)0) + m_log1p(m_exp(-m_abs(x)));  // softplus: log(1 + e^x) without overflow
}

// Which forward arrays a kind's derivative reads (as the reference: sigmoid and tanh from y alone,
// elu from x and y, the rest from x), so the others are never loaded.
template <int K> struct ActReads {
    enum { x = K != ACT_SIGMOID && K != ACT_TANH, y = K == ACT_SIGMOID || K == ACT_TANH || K == ACT_ELU };
};

// f'(x), from x and/or y = f(x) as stored. The derivative at a kink is the right-open side's.
template <int K, typename A> __device__ __forceinline__ A act_derivative(A x, A y, A alpha) {
    const A kSqrt1_2 = (A)0.70710678118654752440;
    const A kSqrt2_Pi = (A)0.79788456080286535588;
    const A kInvSqrt2Pi = (A)0.39894228040143267794;
    if constexpr (K == ACT_RELU) return x > (A)0 ? (A)1 : (A)0;
    else if constexpr (K == ACT_SIGMOID) return y * ((A)1 - y);
    else if constexpr (K == ACT_TANH) return (A)1 - y * y;
    else if constexpr (K == ACT_ELU) return x > (A)0 ? (A)1 : y + alpha;
    else if constexpr (K == ACT_CLIPPED_RELU) return (x > (A)0 && x < alpha) ? (A)1 : (A)0;
    else if constexpr (K == ACT_SWISH) {
        const A s = act_sigmoid(x);
        return s * ((A)1 + x * ((A)1 - s));
    } else if constexpr (K == ACT_GELU)
        return (A)0.5 * ((A)1 + m_erf(x * kSqrt1_2)) + x * kInvSqrt2Pi * m_exp((A)-0.5 * x * x);
    else if constexpr (K == ACT_GELU_TANH) {
        const A t = m_tanh(kSqrt2_Pi * (x + (A)0.044715 * x * x * x));
        return (A)0.5 * ((A)1 + t) + (A)0.5 * x * ((A)1 - t * t) * kSqrt2_Pi * ((A)1 + (A)0.134145 * x * x);
    } else if constexpr (K == ACT_LEAKY_RELU) return x > (A)0 ? (A)1 : alpha;
    else return act_sigmoid(x);  // softplus
}

// VW results into a pack of T. A 16-byte pack of a half type converts pairs with one
// cvt.rn.{bf16,f16}x2.f32 (sm_80+) straight into its 32-bit words: prelude.cuh's bfloat16 rounding in
// integer arithmetic costs ~6 instructions an element, and the GELU kernels are close to issue-bound
// at bandwidth. Both round to nearest even; a NaN stays a NaN.
template <typename T, int VW> __device__ __forceinline__ void act_pack(Pack<T, VW>& r, const typename Acc<T>::t* v) {
#pragma unroll
    for (int k = 0; k < VW; ++k) store(r.e, k, v[k]);
}
#if __CUDA_ARCH__ >= 800
#define ACT_PACK_PAIRS(T, CVT)                                                                     \
    __device__ __forceinline__ void act_pack(Pack<T, 8>& r, const float* v) {                      \
        unsigned u[4];                                                                             \
        _Pragma("unroll") for (int k = 0; k < 4; ++k)                                              \
            asm(CVT " %0, %1, %2;" : "=r"(u[k]) : "f"(v[2 * k + 1]), "f"(v[2 * k]));               \
        r.w[0].x = u[0];                                                                           \
        r.w[0].y = u[1];                                                                           \
        r.w[0].z = u[2];                                                                           \
        r.w[0].w = u[3];                                                                           \
    }
ACT_PACK_PAIRS(bf16_t, "cvt.rn.bf16x2.f32")
ACT_PACK_PAIRS(half_t, "cvt.rn.f16x2.f32")
#endif

template <int K, typename T, int VW>
__device__ __forceinline__ void act_fwd_step(const T* x, T* y, i64 i, typename Acc<T>::t alpha) {
    typedef typename Acc<T>::t A;
    const Pack<T, VW> a = load_pack<T, VW>(x, i);
    A v[VW];
#pragma unroll
    for (int k = 0; k < VW; ++k) v[k] = act_value<K, A>((A)load(a.e, k), alpha);
    Pack<T, VW> r;
    act_pack(r, v);
    store_pack<T, VW>(y, i, r);
}

// No __restrict__: y may be x.
template <int K, typename T> __device__ __forceinline__ void act_forward(const T* x, T* y, i64 n, double alpha_d,
                                                                        int vec) {
    constexpr int VW = 16 / (int)sizeof(T);
    const typename Acc<T>::t alpha = (typename Acc<T>::t)alpha_d;
    i64 done = 0;
    if (vec) {
        GRID_STRIDE(v, n / VW) { act_fwd_step<K, T, VW>(x, y, v * VW, alpha); }
        done = n / VW * VW;
    }
    GRID_STRIDE(j, n - done) { act_fwd_step<K, T, 1>(x, y, done + j, alpha); }
}

template <int K, typename T, int VW>
__device__ __forceinline__ void act_bwd_step(const T* __restrict__ dy, const T* __restrict__ x,
                                             const T* __restrict__ y, T* __restrict__ dx, i64 i,
                                             typename Acc<T>::t alpha) {
    typedef typename Acc<T>::t A;
    const Pack<T, VW> g = load_pack<T, VW>(dy, i);
    Pack<T, VW> xs, ys, r;
    if constexpr ((bool)ActReads<K>::x) xs = load_pack<T, VW>(x, i);
    if constexpr ((bool)ActReads<K>::y) ys = load_pack<T, VW>(y, i);
    A v[VW];
#pragma unroll
    for (int k = 0; k < VW; ++k) {
        const A xv = ActReads<K>::x ? (A)load(xs.e, k) : (A)0, yv = ActReads<K>::y ? (A)load(ys.e, k) : (A)0;
        v[k] = (A)load(g.e, k) * act_derivative<K, A>(xv, yv, alpha);
    }
    act_pack(r, v);
    store_pack<T, VW>(dx, i, r);
}

// dx = dy * f'(x): the product (not a select), so a NaN in dy stays NaN where f' is 0, as in NumPy.
template <int K, typename T>
__device__ __forceinline__ void act_backward(const T* dy, const T* x, const T* y, T* dx, i64 n, double alpha_d,
                                             int vec) {
    constexpr int VW = 16 / (int)sizeof(T);
    const typename Acc<T>::t alpha = (typename Acc<T>::t)alpha_d;
    i64 done = 0;
    if (vec) {
        GRID_STRIDE(v, n / VW) { act_bwd_step<K, T, VW>(dy, x, y, dx, v * VW, alpha); }
        done = n / VW * VW;
    }
    GRID_STRIDE(j, n - done) { act_bwd_step<K, T, 1>(dy, x, y, dx, done + j, alpha); }
}

#define ACT_KERNELS_KIND(T, S, NAME, K)                                                            \
    extern "C" __global__ void __launch_bounds__(256) act_fwd_##NAME##_##S(                        \
        const T* x, T* y, i64 n, double alpha, int vec) {                                          \
        act_forward<K, T>(x, y, n, alpha, vec);                                                    \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(256) act_bwd_##NAME##_##S(                        \
        const T* dy, const T* x, const T* y, T* dx, i64 n, double alpha, int vec) {                \
        act_backward<K, T>(dy, x, y, dx, n, alpha, vec);                                           \
    }
#define ACT_KERNELS(T, S)                                                                          \
    ACT_KERNELS_KIND(T, S, relu, ACT_RELU)                                                         \
    ACT_KERNELS_KIND(T, S, sigmoid, ACT_SIGMOID)                                                   \
    ACT_KERNELS_KIND(T, S, tanh, ACT_TANH)                                                         \
    ACT_KERNELS_KIND(T, S, elu, ACT_ELU)                                                           \
    ACT_KERNELS_KIND(T, S, clipped_relu, ACT_CLIPPED_RELU)                                         \
    ACT_KERNELS_KIND(T, S, swish, ACT_SWISH)                                                       \
    ACT_KERNELS_KIND(T, S, gelu, ACT_GELU)                                                         \
    ACT_KERNELS_KIND(T, S, gelu_tanh, ACT_GELU_TANH)                                               \
    ACT_KERNELS_KIND(T, S, leaky_relu, ACT_LEAKY_RELU)                                             \
    ACT_KERNELS_KIND(T, S, softplus, ACT_SOFTPLUS)
FOR_FLOAT_TYPES(ACT_KERNELS)
