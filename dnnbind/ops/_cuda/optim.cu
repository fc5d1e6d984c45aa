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

#define FOR_CHUNK_ITEMS(CH, t, i)                                                                  \
    for (i64 ck = blockIdx.x; ck < (CH).nchunks; ck += gridDim.x)                                  \
        for (i64 t = (CH).table[6 * (CH).ntensors + 2 * ck], _s = (CH).table[6 * (CH).ntensors + 2 * ck + 1], \
                 _n = (CH).table[6 * t + 5], _e = (_s + (CH).chunk < _n ? _s + (CH).chunk : _n),            \
                 i = _s + threadIdx.x;                                                             \
             i < _e; i += blockDim.x)

template <typename P, typename G>
__device__ void sgd_impl(Chunks ch, float lr_h, const float* lr_ptr, float momentum, int nesterov, float wd,
                         double inv_h, const float* gs_ptr, const int* skip) {
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
                          double inv_h, const float* gs_ptr, const int* skip) {
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
                             int centered, float wd, double inv_h, const float* gs_ptr, const int* skip) {
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
                                               const float* gs_ptr, const int* skip) {             \
        Chunks ch = {table, ntensors, nchunks, chunk};                                             \
        sgd_impl<P, G>(ch, lr, lr_ptr, momentum, nesterov, wd, inv_scale, gs_ptr, skip);           \
    }                                                                                              \
    extern "C" __global__ void adam_##PS##_##GS(const i64* table, i64 ntensors, i64 nchunks, i64 chunk, \
                                                float lr, const float* lr_ptr, double step,        \
                                                const void* step_ptr, int step_kind, double beta1, \
                                                double beta2, float eps, float wd, int amsgrad,     \
                                                double inv_scale, const float* gs_ptr,             \
                                                const int* skip) {                                 \
        Chunks ch = {table, ntensors, nchunks, chunk};                                             \
        adam_impl<P, G>(ch, lr, lr_ptr, step, step_ptr, step_kind, beta1, beta2, eps, wd, amsgrad, \
                        inv_scale, gs_ptr, skip);                                                  \
    }                                                                                              \
    extern "C" __global__ void rmsprop_##PS##_##GS(const i64* table, i64 ntensors, i64 nchunks,    \
                                                   i64 chunk, float lr, const float* lr_ptr,       \
                                                   float rho, float momentum, float eps,           \
                                                   int centered, float wd, double inv_scale,       \
                                                   const float* gs_ptr, const int* skip) {         \
        Chunks ch = {table, ntensors, nchunks, chunk};                                             \
        rmsprop_impl<P, G>(ch, lr, lr_ptr, rho, momentum, eps, centered, wd, inv_scale, gs_ptr,    \
                           skip);                                                                  \
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
