// index_reduce (kernels/segment.py is the NumPy reference): out[o, idx[j], k] = op(out[o, idx[j], k],
// upd[o, j, k]) for every (o, j, k) of upd's (outer, n_idx, inner) view, by atomic updates of out
// (already a copy of x). op: 0 max, 1 min, 2 prod; max/min propagate NaN (a NaN is never replaced).
// Indices count from the end when negative and are clamped into [0, n_out) (no error on the device).

template <int OP, typename T> __device__ __forceinline__ T combine(T cur, T v) {
    if (OP == 2) return cur * v;
    if (cur != cur) return cur;
    if (v != v) return v;
    if (OP == 0) return v > cur ? v : cur;
    return v < cur ? v : cur;
}

// compare-and-swap loops on the bit patterns (the unchanged case leaves without a write)
template <int OP> __device__ __forceinline__ void atomic_combine(float* p, float v) {
    unsigned* a = (unsigned*)p;
    unsigned old = *a, assumed;
    do {
        assumed = old;
        unsigned next = __float_as_uint(combine<OP>(__uint_as_float(assumed), v));
        if (next == assumed) return;
        old = atomicCAS(a, assumed, next);
    } while (old != assumed);
}
template <int OP> __device__ __forceinline__ void atomic_combine(double* p, double v) {
    unsigned long long* a = (unsigned long long*)p;
    unsigned long long old = *a, assumed;
    do {
        assumed = old;
        unsigned long long next = (unsigned long long)__double_as_longlong(
            combine<OP>(__longlong_as_double((long long)assumed), v));
        if (next == assumed) return;
        old = atomicCAS(a, assumed, next);
    } while (old != assumed);
}
template <int OP> __device__ __forceinline__ void atomic_combine(int* p, int v) {
    if (OP == 0) { atomicMax(p, v); return; }
    if (OP == 1) { atomicMin(p, v); return; }
    int old = *p, assumed;
    do {
        assumed = old;
        int next = (int)((unsigned)assumed * (unsigned)v);  // wraps, as NumPy's int32 product
        old = atomicCAS(p, assumed, next);
    } while (old != assumed);
}
template <int OP> __device__ __forceinline__ void atomic_combine(i64* p, i64 v) {
    if (OP == 0) { atomicMax((long long*)p, (long long)v); return; }
    if (OP == 1) { atomicMin((long long*)p, (long long)v); return; }
    unsigned long long* a = (unsigned long long*)p;
    unsigned long long old = *a, assumed;
    do {
        assumed = old;
        unsigned long long next = assumed * (unsigned long long)v;
        old = atomicCAS(a, assumed, next);
    } while (old != assumed);
}

template <int OP, typename T, typename I>
__device__ __forceinline__ void index_reduce(T* out, const I* idx, const T* upd, i64 n_idx, i64 inner,
                                             i64 n_out, i64 total) {
    GRID_STRIDE(e, total) {
        i64 k = e % inner;
        i64 r = e / inner;
        i64 j = r % n_idx;
        i64 o = r / n_idx;
        i64 t = (i64)idx[j];
        if (t < 0) t += n_out;
        t = t < 0 ? 0 : (t >= n_out ? n_out - 1 : t);
        atomic_combine<OP>(out + (o * n_out + t) * inner + k, upd[e]);
    }
}

#define INDEX_REDUCE_KERNEL(NAME, OP, T, S, I, IS)                                                   \
    extern "C" __global__ void index_reduce_##NAME##_##S##_##IS(T* out, const I* idx, const T* upd,  \
                                                                i64 n_idx, i64 inner, i64 n_out,     \
                                                                i64 total) {                         \
        index_reduce<OP, T, I>(out, idx, upd, n_idx, inner, n_out, total);                         \
    }
#define INDEX_REDUCE_OPS(T, S, I, IS)                 \
    INDEX_REDUCE_KERNEL(max, 0, T, S, I, IS)          \
    INDEX_REDUCE_KERNEL(min, 1, T, S, I, IS)          \
    INDEX_REDUCE_KERNEL(prod, 2, T, S, I, IS)
#define INDEX_REDUCE_TYPES(I, IS)                     \
    INDEX_REDUCE_OPS(float, f32, I, IS)               \
    INDEX_REDUCE_OPS(double, f64, I, IS)              \
    INDEX_REDUCE_OPS(int, i32, I, IS)                 \
    INDEX_REDUCE_OPS(i64, i64, I, IS)
INDEX_REDUCE_TYPES(int, i32)
INDEX_REDUCE_TYPES(i64, i64)
