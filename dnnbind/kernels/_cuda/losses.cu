// Losses: per-row loss into a float buffer plus the gradient in one pass, then a fixed-order
// mean: one block, or fixed chunks and one block over their partials (deterministic, no atomics).

// Fused softmax cross-entropy, one block per row of logits (N, C).
// Target t = (1 - ls) * label + ls / C, label one-hot (sparse) or a dense row.
// loss_row = lse * sum(t) - sum(t * z), dlogits = (softmax(z) * sum(t) - t) * gscale,
// gscale = grad_scale (or *grad_scale_ptr) / N. A sparse label outside [0, C) gives a NaN
// loss and NaN gradient row (visible, instead of a read out of bounds). Sample weights `w`
// (float32 (N,), or null for all ones) multiply the row's loss and gradient (Keras 3's
// sum_over_batch_size still divides by N, not by the sum of the weights).
template <typename T, typename L, bool SPARSE>
__device__ void softmax_xent_row(const T* logits, const L* labels, T* dlogits, double* row_loss,
                                 i64 N, i64 C, float ls, float gscale, const float* w) {
    typedef typename Acc<T>::t A;
    __shared__ A scratch[32];
    for (i64 row = blockIdx.x; row < N; row += gridDim.x) {
        const T* z = logits + row * C;
        T* dz = dlogits + row * C;
        A mx = (A)DNB_NEG_INF;
        for (i64 c = threadIdx.x; c < C; c += blockDim.x) mx = m_max(mx, (A)load(z, c));
        mx = block_max(mx, scratch);
        A se = 0, sz = 0, st = 0, stz = 0;
        i64 label = 0;
        bool bad = false;
        if constexpr (SPARSE) {
            label = (i64)labels[row];
            bad = label < 0 || label >= C;
        }
        for (i64 c = threadIdx.x; c < C; c += blockDim.x) {
            A v = load(z, c);
            se += m_exp(v - mx);
            if constexpr (SPARSE) {
                sz += v;
            } else {
                A t = (A)(1 - ls) * (A)load(labels, row * C + c) + (A)ls / (A)C;
                st += t;
                stz += t * v;
            }
        }
        se = block_sum(se, scratch);
        if constexpr (SPARSE) {
            sz = block_sum(sz, scratch);
            st = (A)1;
            A zl = bad ? (A)0 : (A)load(z, label);
            stz = (A)(1 - ls) * zl + (A)ls / (A)C * sz;
        } else {
            st = block_sum(st, scratch);
            stz = block_sum(stz, scratch);
        }
        A lse = mx + m_log(se);
        A wr = w ? (A)w[row] : (A)1;
        if (threadIdx.x == 0) row_loss[row] = bad ? (double)DNB_NAN : (double)wr * (double)(lse * st - stz);
        A g_row = (A)gscale * wr;
        for (i64 c = threadIdx.x; c < C; c += blockDim.x) {
            A p = m_exp((A)load(z, c) - lse);
            A t;
            if constexpr (SPARSE) t = (c == label ? (A)(1 - ls) : (A)0) + (A)ls / (A)C;
            else t = (A)(1 - ls) * (A)load(labels, row * C + c) + (A)ls / (A)C;
            store(dz, c, bad ? (A)DNB_NAN : (p * st - t) * g_row);
        }
    }
}

__device__ __forceinline__ float grad_scale_of(float grad_scale, const float* ptr, i64 N) {
    return (ptr ? *ptr : grad_scale) / (float)N;
}

#define XENT_SPARSE(T, S, L, LS)                                                                   \
    extern "C" __global__ void softmax_xent_##S##_##LS(const T* logits, const L* labels, T* dz,    \
                                                       double* row_loss, i64 N, i64 C, float ls,    \
                                                       float grad_scale, const float* gs_ptr,      \
                                                       const float* w) {                           \
        softmax_xent_row<T, L, true>(logits, labels, dz, row_loss, N, C, ls,                       \
                                     grad_scale_of(grad_scale, gs_ptr, N), w);                     \
    }
#define XENT_KERNELS(T, S)                                                                         \
    XENT_SPARSE(T, S, int, i32)                                                                    \
    XENT_SPARSE(T, S, i64, i64)                                                                    \
    extern "C" __global__ void softmax_xent_##S##_dense(const T* logits, const T* labels, T* dz,   \
                                                        double* row_loss, i64 N, i64 C, float ls,   \
                                                        float grad_scale, const float* gs_ptr,     \
                                                        const float* w) {                          \
        softmax_xent_row<T, T, false>(logits, labels, dz, row_loss, N, C, ls,                      \
                                      grad_scale_of(grad_scale, gs_ptr, N), w);                    \
    }
FOR_FLOAT_TYPES(XENT_KERNELS)

// *loss = scale * sum(values[0..n)) in a fixed order: one block, strided partial sums, then a
// tree (deterministic). Launch with one block. The loss is float32, or float64 for float64 data.
#define SUM_TO_SCALAR(LT, LS)                                                                      \
    extern "C" __global__ void sum_to_scalar_##LS(const double* values, LT* loss, i64 n,           \
                                                  double scale) {                                  \
        __shared__ double scratch[32];                                                             \
        double acc = 0;                                                                            \
        for (i64 i = threadIdx.x; i < n; i += blockDim.x) acc += values[i];                        \
        acc = block_sum(acc, scratch);                                                             \
        if (threadIdx.x == 0) *loss = (LT)(acc * scale);                                           \
    }
SUM_TO_SCALAR(float, f32)
SUM_TO_SCALAR(double, f64)

// First stage of a large sum (millions of per-element losses): block b sums values[b*chunk ..
// min(n, (b+1)*chunk)) in a fixed order into partials[b]; sum_to_scalar then sums the partials. The
// split depends on n only (not on the GPU), so the result is bitwise reproducible. Launch with exactly
// ceil(n / chunk) blocks.
extern "C" __global__ void sum_partials_f64(const double* values, double* partials, i64 n, i64 chunk) {
    __shared__ double scratch[32];
    i64 start = (i64)blockIdx.x * chunk;
    i64 end = start + chunk < n ? start + chunk : n;
    double acc = 0;
    for (i64 i = start + threadIdx.x; i < end; i += blockDim.x) acc += values[i];
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// Categorical cross-entropy of probabilities (Keras from_logits=False), one block per row:
// p = q / sum(q), clipped to [eps, 1 - eps]; loss_row = -sum(t log p_clipped);
// g = -t / p_clipped inside the clip, 0 outside; dq = (g - sum(g p)) / sum(q) * gscale;
// loss and gradient times the row's sample weight (w null: 1).
template <typename T, typename L, bool SPARSE>
__device__ void probs_xent_row(const T* probs, const L* labels, T* dq, double* row_loss, i64 N, i64 C,
                               float ls, float gscale, float eps, const float* w) {
    typedef typename Acc<T>::t A;
    __shared__ A scratch[32];
    for (i64 row = blockIdx.x; row < N; row += gridDim.x) {
        const T* q = probs + row * C;
        T* d = dq + row * C;
        i64 label = 0;
        bool bad = false;
        if constexpr (SPARSE) {
            label = (i64)labels[row];
            bad = label < 0 || label >= C;
        }
        A total = 0;
        for (i64 c = threadIdx.x; c < C; c += blockDim.x) total += (A)load(q, c);
        total = block_sum(total, scratch);
        A loss = 0, gp = 0;
        for (i64 c = threadIdx.x; c < C; c += blockDim.x) {
            A p = (A)load(q, c) / total;
            A t;
            if constexpr (SPARSE) t = (c == label ? (A)(1 - ls) : (A)0) + (A)ls / (A)C;
            else t = (A)(1 - ls) * (A)load(labels, row * C + c) + (A)ls / (A)C;
            A pc = m_min(m_max(p, (A)eps), (A)1 - (A)eps);
            loss -= t * m_log(pc);
            bool inside = p > (A)eps && p < (A)1 - (A)eps;
            gp += inside ? -t / pc * p : (A)0;
        }
        loss = block_sum(loss, scratch);
        gp = block_sum(gp, scratch);
        A wr = w ? (A)w[row] : (A)1;
        if (threadIdx.x == 0) row_loss[row] = bad ? (double)DNB_NAN : (double)wr * (double)loss;
        A g_row = (A)gscale * wr;
        for (i64 c = threadIdx.x; c < C; c += blockDim.x) {
            A p = (A)load(q, c) / total;
            A t;
            if constexpr (SPARSE) t = (c == label ? (A)(1 - ls) : (A)0) + (A)ls / (A)C;
            else t = (A)(1 - ls) * (A)load(labels, row * C + c) + (A)ls / (A)C;
            A pc = m_min(m_max(p, (A)eps), (A)1 - (A)eps);
            bool inside = p > (A)eps && p < (A)1 - (A)eps;
            A g = inside ? -t / pc : (A)0;
            store(d, c, bad ? (A)DNB_NAN : (g - gp) / total * g_row);
        }
    }
}

#define PROBS_SPARSE(T, S, L, LS)                                                                  \
    extern "C" __global__ void probs_xent_##S##_##LS(const T* probs, const L* labels, T* dq,       \
                                                     double* row_loss, i64 N, i64 C, float ls,     \
                                                     float grad_scale, const float* gs_ptr,        \
                                                     float eps, const float* w) {                  \
        probs_xent_row<T, L, true>(probs, labels, dq, row_loss, N, C, ls,                          \
                                   grad_scale_of(grad_scale, gs_ptr, N), eps, w);                  \
    }
#define PROBS_KERNELS(T, S)                                                                        \
    PROBS_SPARSE(T, S, int, i32)                                                                   \
    PROBS_SPARSE(T, S, i64, i64)                                                                   \
    extern "C" __global__ void probs_xent_##S##_dense(const T* probs, const T* labels, T* dq,      \
                                                      double* row_loss, i64 N, i64 C, float ls,    \
                                                      float grad_scale, const float* gs_ptr,       \
                                                      float eps, const float* w) {                 \
        probs_xent_row<T, T, false>(probs, labels, dq, row_loss, N, C, ls,                         \
                                    grad_scale_of(grad_scale, gs_ptr, N), eps, w);                 \
    }
FOR_FLOAT_TYPES(PROBS_KERNELS)

// Elementwise losses over n elements: per-element loss into `elem` (double), gradient into
// dpred, both averaged over n (the gradient already divided by n and times grad_scale).
// kind 0: binary cross-entropy from logits; 1: binary cross-entropy from probabilities
// (clipped to [eps, 1 - eps], zero gradient outside); 2: squared error. Sample weights `w`
// (float32, one per run of `per_row` consecutive elements: one sample; null for all ones)
// multiply the element's loss and gradient.
#define ELEMENTWISE_LOSS(T, S)                                                                     \
    extern "C" __global__ void elementwise_loss_##S(const T* pred, const T* target, T* dpred,      \
                                                    double* elem, i64 n, int kind, float ls,       \
                                                    float grad_scale, const float* gs_ptr,         \
                                                    float eps, const float* w, i64 per_row) {      \
        typedef Acc<T>::t A;                                                                       \
        A g = (A)((gs_ptr ? *gs_ptr : grad_scale) / (double)n);                                   \
        GRID_STRIDE(i, n) {                                                                        \
            A x = load(pred, i), t = load(target, i);                                              \
            A e, d;                                                                                \
            if (kind == 2) {                                                                       \
                A diff = x - t;                                                                    \
                e = diff * diff;                                                                   \
                d = (A)2 * diff;                                                                   \
            } else {                                                                               \
                t = t * (A)(1 - ls) + (A)0.5 * (A)ls;                                              \
                if (kind == 0) {                                                                   \
                    A en = m_exp(-m_abs(x));                                                       \
                    e = m_max(x, (A)0) - x * t + m_log1p(en);                                      \
                    A sig = x >= (A)0 ? (A)1 / ((A)1 + en) : en / ((A)1 + en);                     \
                    d = sig - t;                                                                   \
                } else {                                                                           \
                    A p = m_min(m_max(x, (A)eps), (A)1 - (A)eps);                                  \
                    bool inside = x > (A)eps && x < (A)1 - (A)eps;                                 \
                    e = -(t * m_log(p) + ((A)1 - t) * m_log1p(-p));                                \
                    d = inside ? (p - t) / (p * ((A)1 - p)) : (A)0;                                \
                }                                                                                  \
            }                                                                                      \
            A wi = w ? (A)w[i / per_row] : (A)1;                                                   \
            elem[i] = (double)wi * (double)e;                                                      \
            store(dpred, i, d * g * wi);                                                           \
        }                                                                                          \
    }
FOR_FLOAT_TYPES(ELEMENTWISE_LOSS)
