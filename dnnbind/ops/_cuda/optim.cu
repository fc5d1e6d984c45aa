// Fused multi-tensor optimizer updates (Keras 3 formulas, the same operation order as the
// NumPy reference in dnnbind/ops/optim.py).
//
// One launch updates every tensor of a (param dtype, grad dtype) group. `table` (int64) holds
// per tensor [param, grad, state0, state1, state2, size] (state pointers may be 0), followed by
// per chunk [tensor index, start]; blocks stride over chunks and threads over a chunk's items.
//
// Scalars that must follow a captured CUDA graph on replay are read through pointers when
// those are non-null: lr (float32), step (float32/int32/int64 by step_kind 1/2/3), grad_scale
// (float32; the gradients are divided by it) and skip (int32; nonzero: change nothing).
//
// Gradient clipping (Keras 3): after the grad_scale division each update multiplies gradient t
// by clip_scale[t] when that pointer is non-null (clipnorm / global_clipnorm factors, made on
// the device by grad_sumsq -> tensor_sumsq -> clip_factors below), then clamps it to
// [-clipvalue, clipvalue] when clipvalue > 0.

struct Chunks {
    const i64* table;
    i64 ntensors, nchunks, chunk;
};

__device__ __forceinline__ float read_lr(float lr, const float* lr_ptr) { return lr_ptr ? *lr_ptr : lr; }
__device__ __forceinline__ double read_inv_scale(double inv, const float* gs_ptr) {
    return gs_ptr ? 1.0 / (double)*gs_ptr : inv;
}
__device__ __forceinline__ double read_step(double step, const void* ptr, int kind) {
    if (!ptr || kind == 0) return step;
    if (kind == 1) return (double)*(const float*)ptr;
    if (kind == 2) return (double)*(const int*)ptr;
    return (double)*(const i64*)ptr;
}

// NaN stays NaN (both comparisons are false), as np.clip / Keras's ops.clip.
template <typename A> __device__ __forceinline__ A clip_grad(A g, const double* clip_scale, i64 t, float clipvalue) {
    if (clip_scale) g = g * (A)clip_scale[t];
    if (clipvalue > 0.0f) {
        const A c = (A)clipvalue;
        g = g < -c ? -c : (g > c ? c : g);
    }
    return g;
}

#define FOR_CHUNK_ITEMS(CH, t, i)                                                                  \
    for (i64 ck = blockIdx.x; ck < (CH).nchunks; ck += gridDim.x)                                  \
        for (i64 t = (CH).table[6 * (CH).ntensors + 2 * ck], _s = (CH).table[6 * (CH).ntensors + 2 * ck + 1], \
                 _n = (CH).table[6 * t + 5], _e = (_s + (CH).chunk < _n ? _s + (CH).chunk : _n),            \
                 i = _s + threadIdx.x;                                                             \
             i < _e; i += blockDim.x)

template <typename P, typename G>
__device__ void sgd_impl(Chunks ch, float lr_h, const float* lr_ptr, float momentum, int nesterov, float wd,
                         double inv_h, const float* gs_ptr, const int* skip, const double* clip_scale,
                         float clipvalue) {
    typedef typename Acc<P>::t A;
    if (skip && *skip) return;
    const A lr = (A)read_lr(lr_h, lr_ptr);
    const A lr_wd = (A)((double)read_lr(lr_h, lr_ptr) * (double)wd);
    const A inv = (A)read_inv_scale(inv_h, gs_ptr);
    const bool scaled = gs_ptr || inv_h != 1.0;
    FOR_CHUNK_ITEMS(ch, t, i) {
        P* p = (P*)ch.table[6 * t];
        const G* g = (const G*)ch.table[6 * t + 1];
        P* v = (P*)ch.table[6 * t + 2];
        A gi = (A)load(g, i);
        if (scaled) gi = gi * inv;
        gi = clip_grad(gi, clip_scale, t, clipvalue);
        A pi = load(p, i);
        if (wd != 0.0f) pi = pi - lr_wd * pi;
        if (momentum != 0.0f) {
            A vi = load(v, i) * (A)momentum;
            vi = vi - lr * gi;
            store(v, i, vi);
            if (nesterov) pi = pi + ((A)momentum * vi - lr * gi);
            else pi = pi + vi;
        } else {
            pi = pi - lr * gi;
        }
        store(p, i, pi);
    }
}

template <typename P, typename G>
__device__ void adam_impl(Chunks ch, float lr_h, const float* lr_ptr, double step_h, const void* step_ptr,
                          int step_kind, double beta1, double beta2, float eps, float wd, int amsgrad,
                          double inv_h, const float* gs_ptr, const int* skip, const double* clip_scale,
                          float clipvalue) {
    typedef typename Acc<P>::t A;
    if (skip && *skip) return;
    const double lr_d = (double)read_lr(lr_h, lr_ptr);
    const double t = read_step(step_h, step_ptr, step_kind);
    const A lr_t = (A)(lr_d * sqrt(1.0 - pow((double)beta2, t)) / (1.0 - pow((double)beta1, t)));
    const A lr_wd = (A)(lr_d * (double)wd);
    const A one_m_b1 = (A)(1.0 - (double)beta1), one_m_b2 = (A)(1.0 - (double)beta2);
    const A inv = (A)read_inv_scale(inv_h, gs_ptr);
    const bool scaled = gs_ptr || inv_h != 1.0;
    FOR_CHUNK_ITEMS(ch, t_, i) {
        P* p = (P*)ch.table[6 * t_];
        const G* g = (const G*)ch.table[6 * t_ + 1];
        P* m = (P*)ch.table[6 * t_ + 2];
        P* v = (P*)ch.table[6 * t_ + 3];
        P* vhat = (P*)ch.table[6 * t_ + 4];
        A gi = (A)load(g, i);
        if (scaled) gi = gi * inv;
        gi = clip_grad(gi, clip_scale, t_, clipvalue);
        A pi = load(p, i);
        if (wd != 0.0f) pi = pi - lr_wd * pi;
        A mi = load(m, i), vi = load(v, i);
        mi = mi + (gi - mi) * one_m_b1;
        vi = vi + (gi * gi - vi) * one_m_b2;
        store(m, i, mi);
        store(v, i, vi);
        A denom = vi;
        if (amsgrad) {
            A vh = m_max((A)load(vhat, i), vi);
            store(vhat, i, vh);
            denom = vh;
        }
        denom = m_sqrt(denom) + (A)eps;
        pi = pi - lr_t * mi / denom;
        store(p, i, pi);
    }
}

template <typename P, typename G>
__device__ void rmsprop_impl(Chunks ch, float lr_h, const float* lr_ptr, float rho, float momentum, float eps,
                             int centered, float wd, double inv_h, const float* gs_ptr, const int* skip,
                             const double* clip_scale, float clipvalue) {
    typedef typename Acc<P>::t A;
    if (skip && *skip) return;
    const A lr = (A)read_lr(lr_h, lr_ptr);
    const A lr_wd = (A)((double)read_lr(lr_h, lr_ptr) * (double)wd);
    const A one_m_rho = (A)(1.0 - (double)rho);
    const A inv = (A)read_inv_scale(inv_h, gs_ptr);
    const bool scaled = gs_ptr || inv_h != 1.0;
    FOR_CHUNK_ITEMS(ch, t, i) {
        P* p = (P*)ch.table[6 * t];
        const G* g = (const G*)ch.table[6 * t + 1];
        P* sq = (P*)ch.table[6 * t + 2];
        P* mom = (P*)ch.table[6 * t + 3];
        P* avg = (P*)ch.table[6 * t + 4];
        A gi = (A)load(g, i);
        if (scaled) gi = gi * inv;
        gi = clip_grad(gi, clip_scale, t, clipvalue);
        A pi = load(p, i);
        if (wd != 0.0f) pi = pi - lr_wd * pi;
        A s = load(sq, i) * (A)rho;
        s = s + one_m_rho * gi * gi;
        store(sq, i, s);
        A denom = s;
        if (centered) {
            A a = load(avg, i) * (A)rho;
            a = a + one_m_rho * gi;
            store(avg, i, a);
            denom = s - a * a;
        }
        denom = denom + (A)eps;
        A inc = lr * gi / m_sqrt(denom);
        if (momentum != 0.0f) {
            A mo = load(mom, i) * (A)momentum;
            mo = mo + inc;
            store(mom, i, mo);
            pi = pi - mo;
        } else {
            pi = pi - inc;
        }
        store(p, i, pi);
    }
}

#define OPTIM_KERNELS(P, PS, G, GS)                                                                \
    extern "C" __global__ void sgd_##PS##_##GS(const i64* table, i64 ntensors, i64 nchunks, i64 chunk, \
                                               float lr, const float* lr_ptr, float momentum,      \
                                               int nesterov, float wd, double inv_scale,           \
                                               const float* gs_ptr, const int* skip,               \
                                               const double* clip_scale, float clipvalue) {        \
        Chunks ch = {table, ntensors, nchunks, chunk};                                             \
        sgd_impl<P, G>(ch, lr, lr_ptr, momentum, nesterov, wd, inv_scale, gs_ptr, skip, clip_scale, \
                       clipvalue);                                                                 \
    }                                                                                              \
    extern "C" __global__ void adam_##PS##_##GS(const i64* table, i64 ntensors, i64 nchunks, i64 chunk, \
                                                float lr, const float* lr_ptr, double step,        \
                                                const void* step_ptr, int step_kind, double beta1, \
                                                double beta2, float eps, float wd, int amsgrad,     \
                                                double inv_scale, const float* gs_ptr,             \
                                                const int* skip, const double* clip_scale,         \
                                                float clipvalue) {                                 \
        Chunks ch = {table, ntensors, nchunks, chunk};                                             \
        adam_impl<P, G>(ch, lr, lr_ptr, step, step_ptr, step_kind, beta1, beta2, eps, wd, amsgrad, \
                        inv_scale, gs_ptr, skip, clip_scale, clipvalue);                           \
    }                                                                                              \
    extern "C" __global__ void rmsprop_##PS##_##GS(const i64* table, i64 ntensors, i64 nchunks,    \
                                                   i64 chunk, float lr, const float* lr_ptr,       \
                                                   float rho, float momentum, float eps,           \
                                                   int centered, float wd, double inv_scale,       \
                                                   const float* gs_ptr, const int* skip,           \
                                                   const double* clip_scale, float clipvalue) {    \
        Chunks ch = {table, ntensors, nchunks, chunk};                                             \
        rmsprop_impl<P, G>(ch, lr, lr_ptr, rho, momentum, eps, centered, wd, inv_scale, gs_ptr,    \
                           skip, clip_scale, clipvalue);                                           \
    }
#define OPTIM_FOR_GRADS(P, PS)                                                                     \
    OPTIM_KERNELS(P, PS, float, f32) OPTIM_KERNELS(P, PS, double, f64)                            \
    OPTIM_KERNELS(P, PS, half_t, f16) OPTIM_KERNELS(P, PS, bf16_t, bf16)
OPTIM_FOR_GRADS(float, f32)
OPTIM_FOR_GRADS(double, f64)
OPTIM_FOR_GRADS(half_t, f16)

// step += 1 unless the skip flag is set: the optimizer's count of applied updates (Adam's 1-based
// bias-correction step), so a step skipped for overflowed gradients leaves it unchanged. One
// thread; step_kind 1/2/3: float32/int32/int64, as read_step.
extern "C" __global__ void advance_step(void* step, int step_kind, const int* skip) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    if (skip && *skip) return;
    if (step_kind == 1) *(float*)step += 1.0f;
    else if (step_kind == 2) *(int*)step += 1;
    else *(i64*)step += 1;
}

// ----- gradient clipping factors (clipnorm / global_clipnorm), computed on the device --------
// Three launches per update, none of which the host waits for: grad_sumsq (one block per chunk,
// strided) writes each chunk's sum of g^2 in double; tensor_sumsq (one thread per dtype group)
// adds them per tensor in chunk order; clip_factors (one thread) turns the per-tensor sums into
// the factors the updates multiply by. Every sum has a fixed order (no atomics), so the same
// gradients give the same bits.
template <typename G>
__device__ void grad_sumsq_impl(Chunks ch, double* partial) {
    __shared__ double scratch[32];
    for (i64 ck = blockIdx.x; ck < ch.nchunks; ck += gridDim.x) {
        const i64 t = ch.table[6 * ch.ntensors + 2 * ck], start = ch.table[6 * ch.ntensors + 2 * ck + 1];
        const i64 size = ch.table[6 * t + 5], end = start + ch.chunk < size ? start + ch.chunk : size;
        const G* g = (const G*)ch.table[6 * t + 1];
        double acc = 0.0;
        for (i64 i = start + threadIdx.x; i < end; i += blockDim.x) {
            const double gi = (double)load(g, i);
            acc += gi * gi;
        }
        acc = block_sum(acc, scratch);
        if (threadIdx.x == 0) partial[ck] = acc;
    }
}

#define GRAD_SUMSQ(G, GS)                                                                          \
    extern "C" __global__ void grad_sumsq_##GS(const i64* table, i64 ntensors, i64 nchunks, i64 chunk, \
                                               double* partial) {                                  \
        Chunks ch = {table, ntensors, nchunks, chunk};                                             \
        grad_sumsq_impl<G>(ch, partial);                                                           \
    }
GRAD_SUMSQ(float, f32)
GRAD_SUMSQ(double, f64)
GRAD_SUMSQ(half_t, f16)
GRAD_SUMSQ(bf16_t, bf16)

// sumsq[t] = the sum of partial[ck] over the chunks of tensor t (chunks are listed per tensor).
extern "C" __global__ void tensor_sumsq(const i64* table, i64 ntensors, i64 nchunks, const double* partial,
                                        double* sumsq) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    for (i64 t = 0; t < ntensors; ++t) sumsq[t] = 0.0;
    for (i64 ck = 0; ck < nchunks; ++ck) sumsq[table[6 * ntensors + 2 * ck]] += partial[ck];
}

// Norms are of the gradients after the grad_scale division (Keras unscales, then clips).
// mode 1 (clipnorm): factors[t] = clip / max(norm_t, clip), NaN for a NaN norm.
// mode 2 (global_clipnorm): every factor is clip / norm when norm > clip, else 1; NaN when the
// global norm is not finite (Keras's clip_by_global_norm poisons every gradient then).
extern "C" __global__ void clip_factors(const double* sumsq, i64 ntensors, double* factors, int mode,
                                        double clip, double inv_h, const float* gs_ptr, const int* skip) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    if (skip && *skip) return;
    const double inv = read_inv_scale(inv_h, gs_ptr);
    if (mode == 1) {
        for (i64 t = 0; t < ntensors; ++t) {
            const double norm = sqrt(sumsq[t]) * inv;
            factors[t] = norm != norm ? norm : clip / (norm > clip ? norm : clip);
        }
        return;
    }
    double total = 0.0;
    for (i64 t = 0; t < ntensors; ++t) total += sumsq[t];
    const double norm = sqrt(total) * inv;
    double factor = norm > clip ? clip / norm : 1.0;
    if (!(norm - norm == 0.0)) factor = norm - norm;  // inf or NaN: NaN
    for (i64 t = 0; t < ntensors; ++t) factors[t] = factor;
}
