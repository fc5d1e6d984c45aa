// Activations cuDNN does not offer: gelu (erf), gelu_tanh, leaky_relu, softplus, linear.
// kind: 0 gelu, 1 gelu_tanh, 2 leaky_relu, 3 softplus, 4 linear, 5 clipped_relu (bfloat16 only:
// cuDNN's bfloat16 clipped-relu backward disagreed with the reference on the H200). Arithmetic in float
// (double for float64); x, y, dy, dx are contiguous arrays of n elements.

template <typename A> __device__ __forceinline__ A act_value(int kind, A x, A alpha) {
    const A kSqrt1_2 = (A)0.70710678118654752440;
    const A kSqrt2_Pi = (A)0.79788456080286535588;
    switch (kind) {
    case 0: return (A)0.5 * x * ((A)1 + m_erf(x * kSqrt1_2));
    case 1: return (A)0.5 * x * ((A)1 + m_tanh(kSqrt2_Pi * (x + (A)0.044715 * x * x * x)));
    case 2: return x > (A)0 ? x : alpha * x;
    case 3: return m_max(x, (A)0) + m_log1p(m_exp(-m_abs(x)));  // log(1 + e^x) without overflow
    case 5: return m_min(m_max(x, (A)0), alpha);
    default: return x;
    }
}

template <typename A> __device__ __forceinline__ A act_derivative(int kind, A x, A alpha) {
    const A kSqrt1_2 = (A)0.70710678118654752440;
    const A kSqrt2_Pi = (A)0.79788456080286535588;
    const A kInvSqrt2Pi = (A)0.39894228040143267794;
    switch (kind) {
    case 0: return (A)0.5 * ((A)1 + m_erf(x * kSqrt1_2)) + x * kInvSqrt2Pi * m_exp((A)-0.5 * x * x);
    case 1: {
        A inner = kSqrt2_Pi * (x + (A)0.044715 * x * x * x);
        A t = m_tanh(inner);
        return (A)0.5 * ((A)1 + t) + (A)0.5 * x * ((A)1 - t * t) * kSqrt2_Pi * ((A)1 + (A)0.134145 * x * x);
    }
    case 2: return x > (A)0 ? (A)1 : alpha;
    case 3: {  // sigmoid(x), written to stay finite for large |x|
        A e = m_exp(-m_abs(x));
        return x >= (A)0 ? (A)1 / ((A)1 + e) : e / ((A)1 + e);
    }
    case 5: return (x > (A)0 && x < alpha) ? (A)1 : (A)0;
    default: return (A)1;
    }
}

#define ACT_KERNELS(T, S)                                                                          \
    extern "C" __global__ void act_fwd_##S(const T* x, T* y, i64 n, int kind, double alpha) {      \
        typedef Acc<T>::t A;                                                                       \
        GRID_STRIDE(i, n) { store(y, i, act_value<A>(kind, (A)load(x, i), (A)alpha)); }            \
    }                                                                                              \
    extern "C" __global__ void act_bwd_##S(const T* dy, const T* x, T* dx, i64 n, int kind,        \
                                           double alpha) {                                         \
        typedef Acc<T>::t A;                                                                       \
        GRID_STRIDE(i, n) {                                                                        \
            store(dx, i, (A)load(dy, i) * act_derivative<A>(kind, (A)load(x, i), (A)alpha));       \
        }                                                                                          \
    }
FOR_FLOAT_TYPES(ACT_KERNELS)
