// Fused multi-tensor optimizer updates (Keras 3 formulas, the same operation order as the
// NumPy reference in dnnbind/kernels/optim.py).
//
// One launch updates every tensor of a (param dtype, grad dtype) group. `table` (int64) holds
// per tensor TABLE_COLS columns [param, grad, state0, state1, state2, size, first chunk,
// vectorised] (state pointers may be 0; a null state is one the update does not use), followed
// by per chunk [tensor index, start]. Chunks are `chunk` items (a multiple of every vector
// width) and listed tensor by tensor; one block takes a chunk (striding when chunks outnumber
// the grid), reads its tensor's row once, and its threads take VW = 16 / sizeof(param) items
// at a time when the row is marked vectorised (every pointer aligned to its vector's size,
// checked on the host), then the chunk's last size % VW items one at a time.
// (Before: one table lookup per item, 65536-item chunks so that a 2M-parameter model ran ~60
// blocks, scalar loads: Adam took ~145 us a step where its traffic needs ~14 us on an H200.)
//
// Scalars that must follow a captured CUDA graph on replay are read through pointers when
// those are non-null: lr (float32), step (float32/int32/int64 by step_kind 1/2/3), grad_scale
// (float32; the gradients are divided by it) and skip (int32; nonzero: change nothing).
//
// Gradient clipping (Keras 3): after the grad_scale division each update multiplies gradient t
// by clip_scale[t] when that pointer is non-null (clipnorm / global_clipnorm factors, made on
// the device by grad_sumsq -> tensor_sumsq -> clip_factors below), then clamps it to
// [-clipvalue, clipvalue] when clipvalue > 0.

#define TABLE_COLS 8

struct Chunks {
    const i64* table;
    i64 ntensors, nchunks, chunk;
};

// One chunk's view of its tensor row, read once per chunk (the update's stores may alias the
// table as far as the compiler knows, so reading it per item would reload it every time).
struct ChunkRow {
    i64 t, start, end;
    i64 ptr[5];  // param, grad, state0..2
    bool vec;
};

__device__ __forceinline__ ChunkRow chunk_row(const Chunks& ch, i64 ck) {
    ChunkRow r;
    const i64* c = ch.table + TABLE_COLS * ch.ntensors + 2 * ck;
    r.t = c[0];
    r.start = c[1];
    const i64* row = ch.table + TABLE_COLS * r.t;
#pragma unroll
    for (int k = 0; k < 5; ++k) r.ptr[k] = row[k];
    const i64 size = row[5];
    r.end = r.start + ch.chunk < size ? r.start + ch.chunk : size;
    r.vec = row[7] != 0;
    return r;
}

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

// What every update does to a gradient before its formula: unscale, clip.
template <typename A> struct GradPrep {
    A inv;
    bool scaled;
    const double* clip_scale;
    float clipvalue;
    __device__ __forceinline__ A operator()(A g, i64 t) const {
        if (scaled) g = g * inv;
        return clip_grad(g, clip_scale, t, clipvalue);
    }
};

// VW items at i of the chunk's tensor (or one item when VW == 1): load, update, store. States
// whose pointer is null are neither read nor written (their values read as 0).
template <typename P, typename G, int VW, class Op>
__device__ __forceinline__ void update_items(const ChunkRow& r, i64 i, const GradPrep<typename Acc<P>::t>& prep,
                                             const Op& op) {
    typedef typename Acc<P>::t A;
    const i64 t = r.t;
    P* p = (P*)r.ptr[0];
    const G* g = (const G*)r.ptr[1];
    P* s0 = (P*)r.ptr[2];
    P* s1 = (P*)r.ptr[3];
    P* s2 = (P*)r.ptr[4];
    Pack<P, VW> pp = load_pack<P, VW>(p, i), p0, p1, p2;
    Pack<G, VW> gp = load_pack<G, VW>(g, i);
    if (s0) p0 = load_pack<P, VW>(s0, i);
    if (s1) p1 = load_pack<P, VW>(s1, i);
    if (s2) p2 = load_pack<P, VW>(s2, i);
#pragma unroll
    for (int k = 0; k < VW; ++k) {
        A pi = load(pp.e, k), a0 = s0 ? (A)load(p0.e, k) : (A)0, a1 = s1 ? (A)load(p1.e, k) : (A)0,
          a2 = s2 ? (A)load(p2.e, k) : (A)0;
        op(pi, prep((A)load(gp.e, k), t), a0, a1, a2);
        store(pp.e, k, pi);
        if (s0) store(p0.e, k, a0);
        if (s1) store(p1.e, k, a1);
        if (s2) store(p2.e, k, a2);
    }
    store_pack<P, VW>(p, i, pp);
    if (s0) store_pack<P, VW>(s0, i, p0);
    if (s1) store_pack<P, VW>(s1, i, p1);
    if (s2) store_pack<P, VW>(s2, i, p2);
}

template <typename P, typename G, class Op>
__device__ void update_chunks(const Chunks& ch, const GradPrep<typename Acc<P>::t>& prep, const Op& op) {
    constexpr int VW = 16 / (int)sizeof(P);
    for (i64 ck = blockIdx.x; ck < ch.nchunks; ck += gridDim.x) {
        const ChunkRow r = chunk_row(ch, ck);
        i64 i = r.start;
        if (r.vec) {
            const i64 vend = r.start + (r.end - r.start) / VW * VW;
            for (i64 j = r.start + (i64)threadIdx.x * VW; j < vend; j += (i64)blockDim.x * VW)
                update_items<P, G, VW>(r, j, prep, op);
            i = vend;
        }
        for (i64 j = i + threadIdx.x; j < r.end; j += blockDim.x) update_items<P, G, 1>(r, j, prep, op);
    }
}

// Per-item formulas; a0..a2 are the states in table order.
template <typename A> struct SgdOp {
    A lr, lr_wd, momentum;
    bool nesterov, decay, use_momentum;
    __device__ __forceinline__ void operator()(A& pi, A gi, A& vi, A&, A&) const {
        if (decay) pi = pi - lr_wd * pi;
        if (use_momentum) {
            vi = vi * momentum;
            vi = vi - lr * gi;
            if (nesterov) pi = pi + (momentum * vi - lr * gi);
            else pi = pi + vi;
        } else {
            pi = pi - lr * gi;
        }
    }
};

template <typename A> struct AdamOp {
    A lr_t, lr_wd, one_m_b1, one_m_b2, eps;
    bool decay, amsgrad;
    __device__ __forceinline__ void operator()(A& pi, A gi, A& mi, A& vi, A& vh) const {
        if (decay) pi = pi - lr_wd * pi;
        mi = mi + (gi - mi) * one_m_b1;
        vi = vi + (gi * gi - vi) * one_m_b2;
        A denom = vi;
        if (amsgrad) {
            vh = m_max(vh, vi);
            denom = vh;
        }
        denom = m_sqrt(denom) + eps;
        pi = pi - lr_t * mi / denom;
    }
};

template <typename A> struct RmspropOp {
    A lr, lr_wd, rho, one_m_rho, momentum, eps;
    bool decay, centered, use_momentum;
    __device__ __forceinline__ void operator()(A& pi, A gi, A& s, A& mo, A& a) const {
        if (decay) pi = pi - lr_wd * pi;
        s = s * rho;
        s = s + one_m_rho * gi * gi;
        A denom = s;
        if (centered) {
            a = a * rho;
            a = a + one_m_rho * gi;
            denom = s - a * a;
        }
        denom = denom + eps;
        A inc = lr * gi / m_sqrt(denom);
        if (use_momentum) {
            mo = mo * momentum;
            mo = mo + inc;
            pi = pi - mo;
        } else {
            pi = pi - inc;
        }
    }
};

template <typename A> __device__ __forceinline__ GradPrep<A> grad_prep(double inv_h, const float* gs_ptr,
                                                                      const double* clip_scale, float clipvalue) {
    GradPrep<A> prep;
    prep.inv = (A)read_inv_scale(inv_h, gs_ptr);
    prep.scaled = gs_ptr || inv_h != 1.0;
    prep.clip_scale = clip_scale;
    prep.clipvalue = clipvalue;
    return prep;
}

template <typename P, typename G>
__device__ void sgd_impl(Chunks ch, float lr_h, const float* lr_ptr, float momentum, int nesterov, float wd,
                         double inv_h, const float* gs_ptr, const int* skip, const double* clip_scale,
                         float clipvalue) {
    typedef typename Acc<P>::t A;
    if (skip && *skip) return;
    SgdOp<A> op;
    op.lr = (A)read_lr(lr_h, lr_ptr);
    op.lr_wd = (A)((double)read_lr(lr_h, lr_ptr) * (double)wd);
    op.momentum = (A)momentum;
    op.nesterov = nesterov != 0;
    op.decay = wd != 0.0f;
    op.use_momentum = momentum != 0.0f;
    update_chunks<P, G>(ch, grad_prep<A>(inv_h, gs_ptr, clip_scale, clipvalue), op);
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
    AdamOp<A> op;
    op.lr_t = (A)(lr_d * sqrt(1.0 - pow((double)beta2, t)) / (1.0 - pow((double)beta1, t)));
    op.lr_wd = (A)(lr_d * (double)wd);
    op.one_m_b1 = (A)(1.0 - (double)beta1);
    op.one_m_b2 = (A)(1.0 - (double)beta2);
    op.eps = (A)eps;
    op.decay = wd != 0.0f;
    op.amsgrad = amsgrad != 0;
    update_chunks<P, G>(ch, grad_prep<A>(inv_h, gs_ptr, clip_scale, clipvalue), op);
}

template <typename P, typename G>
__device__ void rmsprop_impl(Chunks ch, float lr_h, const float* lr_ptr, float rho, float momentum, float eps,
                             int centered, float wd, double inv_h, const float* gs_ptr, const int* skip,
                             const double* clip_scale, float clipvalue) {
    typedef typename Acc<P>::t A;
    if (skip && *skip) return;
    RmspropOp<A> op;
    op.lr = (A)read_lr(lr_h, lr_ptr);
    op.lr_wd = (A)((double)read_lr(lr_h, lr_ptr) * (double)wd);
    op.rho = (A)rho;
    op.one_m_rho = (A)(1.0 - (double)rho);
    op.momentum = (A)momentum;
    op.eps = (A)eps;
    op.decay = wd != 0.0f;
    op.centered = centered != 0;
    op.use_momentum = momentum != 0.0f;
    update_chunks<P, G>(ch, grad_prep<A>(inv_h, gs_ptr, clip_scale, clipvalue), op);
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
// strided) writes each chunk's sum of g^2 in double; tensor_sumsq (one thread per tensor) adds
// its chunks' sums in chunk order; clip_factors (one thread) turns the per-tensor sums into the
// factors the updates multiply by. Every sum has a fixed order (no atomics), so the same
// gradients give the same bits: each thread takes runs of `vw` items (the group's vector width)
// whether it loads them as one vector or, for a row not marked vectorised, one by one.
template <typename G, int VW>
__device__ void grad_sumsq_impl(Chunks ch, double* partial) {
    __shared__ double scratch[32];
    for (i64 ck = blockIdx.x; ck < ch.nchunks; ck += gridDim.x) {
        const ChunkRow r = chunk_row(ch, ck);
        const G* g = (const G*)r.ptr[1];
        double acc = 0.0;
        for (i64 j = r.start + (i64)threadIdx.x * VW; j < r.end; j += (i64)blockDim.x * VW) {
            if (r.vec && j + VW <= r.end) {
                const Pack<G, VW> gp = load_pack<G, VW>(g, j);
#pragma unroll
                for (int k = 0; k < VW; ++k) {
                    const double gi = (double)load(gp.e, k);
                    acc += gi * gi;
                }
            } else {
                for (int k = 0; k < VW && j + k < r.end; ++k) {
                    const double gi = (double)load(g, j + k);
                    acc += gi * gi;
                }
            }
        }
        acc = block_sum(acc, scratch);
        if (threadIdx.x == 0) partial[ck] = acc;
    }
}

#define GRAD_SUMSQ(G, GS)                                                                          \
    extern "C" __global__ void grad_sumsq_##GS(const i64* table, i64 ntensors, i64 nchunks, i64 chunk, \
                                               double* partial, int vw) {                          \
        Chunks ch = {table, ntensors, nchunks, chunk};                                             \
        if (vw == 8) grad_sumsq_impl<G, 8>(ch, partial);                                           \
        else if (vw == 4) grad_sumsq_impl<G, 4>(ch, partial);                                      \
        else grad_sumsq_impl<G, 2>(ch, partial);                                                   \
    }
GRAD_SUMSQ(float, f32)
GRAD_SUMSQ(double, f64)
GRAD_SUMSQ(half_t, f16)
GRAD_SUMSQ(bf16_t, bf16)

// sumsq[t] = the sum of partial[ck] over the chunks of tensor t, in chunk order (a tensor's
// chunks are consecutive, from its row's first-chunk column; an empty tensor has none).
extern "C" __global__ void tensor_sumsq(const i64* table, i64 ntensors, i64 nchunks, const double* partial,
                                        double* sumsq) {
    GRID_STRIDE(t, ntensors) {
        const i64 first = table[TABLE_COLS * t + 6];
        const i64 last = t + 1 < ntensors ? table[TABLE_COLS * (t + 1) + 6] : nchunks;
        double s = 0.0;
        for (i64 ck = first; ck < last; ++ck) s += partial[ck];
        sumsq[t] = s;
    }
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
