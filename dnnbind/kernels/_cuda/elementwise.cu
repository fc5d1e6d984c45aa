// Elementwise ops, reductions, argmax/accuracy counting, casts, fills, row gathers,
// finiteness checks and the random crop/flip augmentation. Inputs are contiguous.

// --- binary ops: out = a (op) b, where b may repeat with period nb (b is a trailing suffix
// of a's shape, or a scalar). op: 0 add, 1 subtract, 2 multiply; `reverse` swaps operands
// when the broadcast one is the first.
#define BINARY_KERNELS(T, S)                                                                       \
    extern "C" __global__ void binary_##S(const T* a, const T* b, T* out, i64 n, i64 nb, int op,   \
                                          int reverse) {                                           \
        typedef Acc<T>::t A;                                                                       \
        GRID_STRIDE(i, n) {                                                                        \
            A x = load(a, i), y = load(b, nb == n ? i : i % nb);                                   \
            if (reverse) { A t = x; x = y; y = t; }                                                \
            A r = op == 0 ? x + y : (op == 1 ? x - y : x * y);                                     \
            store(out, i, r);                                                                      \
        }                                                                                          \
    }                                                                                              \
    /* out = alpha * x; alpha from *alpha_ptr when it is not null (graph-replayable). */           \
    extern "C" __global__ void scale_##S(const T* x, T* out, i64 n, double alpha,                  \
                                         const float* alpha_ptr) {                                 \
        typedef Acc<T>::t A;                                                                       \
        A a = alpha_ptr ? (A)*alpha_ptr : (A)alpha;                                                \
        GRID_STRIDE(i, n) { store(out, i, a * load(x, i)); }                                       \
    }                                                                                              \
    /* y += alpha * x, in place. */                                                                \
    extern "C" __global__ void axpy_##S(const T* x, T* y, i64 n, double alpha,                     \
                                        const float* alpha_ptr) {                                  \
        typedef Acc<T>::t A;                                                                       \
        A a = alpha_ptr ? (A)*alpha_ptr : (A)alpha;                                                \
        GRID_STRIDE(i, n) { store(y, i, load(y, i) + a * load(x, i)); }                            \
    }
FOR_FLOAT_TYPES(BINARY_KERNELS)

// --- reductions of x viewed as (outer, mid, inner) over `mid`, times `scale` (1/count for mean).
// rows: inner == 1, one block per row (coalesced); mid: inner > 1, one thread per output.
// Both sum in a fixed order, so results are deterministic.
#define REDUCE_KERNELS(T, S)                                                                       \
    extern "C" __global__ void reduce_rows_##S(const T* x, T* out, i64 outer, i64 mid,             \
                                               double scale) {                                     \
        typedef Acc<T>::t A;                                                                       \
        __shared__ A scratch[32];                                                                  \
        for (i64 o = blockIdx.x; o < outer; o += gridDim.x) {                                      \
            A acc = (A)0;                                                                          \
            for (i64 m = threadIdx.x; m < mid; m += blockDim.x) acc += load(x, o * mid + m);       \
            acc = block_sum(acc, scratch);                                                         \
            if (threadIdx.x == 0) store(out, o, acc * (A)scale);                                   \
        }                                                                                          \
    }                                                                                              \
    extern "C" __global__ void reduce_mid_##S(const T* x, T* out, i64 outer, i64 mid, i64 inner,   \
                                              double scale) {                                      \
        typedef Acc<T>::t A;                                                                       \
        GRID_STRIDE(j, outer * inner) {                                                            \
            i64 o = j / inner, k = j - o * inner;                                                  \
            const T* p = x + o * mid * inner + k;                                                  \
            A acc = (A)0;                                                                          \
            for (i64 m = 0; m < mid; ++m) acc += load(p, m * inner);                               \
            store(out, j, acc * (A)scale);                                                         \
        }                                                                                          \
    }                                                                                              \
    /* argmax over mid (first maximum wins; a NaN counts as the maximum, as in NumPy). */          \
    extern "C" __global__ void argmax_##S(const T* x, i64* out, i64 outer, i64 mid, i64 inner) {   \
        typedef Acc<T>::t A;                                                                       \
        GRID_STRIDE(j, outer * inner) {                                                            \
            i64 o = j / inner, k = j - o * inner;                                                  \
            const T* p = x + o * mid * inner + k;                                                  \
            A best = load(p, 0);                                                                   \
            i64 arg = 0;                                                                           \
            for (i64 m = 1; m < mid && best == best; ++m) {                                        \
                A v = load(p, m * inner);                                                          \
                if (v > best || v != v) { best = v; arg = m; }                                     \
            }                                                                                      \
            out[j] = arg;                                                                          \
        }                                                                                          \
    }
FOR_FLOAT_TYPES(REDUCE_KERNELS)

// --- accuracy counting: one warp per row of scores (N, C); labels are class indices.
// accuracy: argmax(row) == label; top-k: fewer than k classes score strictly higher than the
// label's class (ties count as hits, as tf.math.in_top_k). count is an int64 accumulated with
// integer atomics (exact, so deterministic).
#define COUNT_KERNELS_L(T, S, L, LS)                                                               \
    extern "C" __global__ void accuracy_count_##S##_##LS(const T* scores, const L* labels,         \
                                                         u64* count, i64 N, i64 C) {               \
        typedef Acc<T>::t A;                                                                       \
        int lane = threadIdx.x & 31;                                                               \
        i64 warps = ((i64)gridDim.x * blockDim.x) >> 5;                                            \
        for (i64 row = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5; row < N; row += warps) { \
            const T* p = scores + row * C;                                                         \
            A best = load(p, 0); i64 arg = 0;                                                      \
            for (i64 c = lane; c < C; c += 32) {                                                   \
                A v = load(p, c);                                                                  \
                if (v > best || (v == best && c < arg)) { best = v; arg = c; }                     \
            }                                                                                      \
            for (int o = 16; o > 0; o >>= 1) {                                                     \
                A ob = __shfl_down_sync(0xffffffffu, best, o);                                     \
                i64 oa = __shfl_down_sync(0xffffffffu, arg, o);                                    \
                if (ob > best || (ob == best && oa < arg)) { best = ob; arg = oa; }                \
            }                                                                                      \
            if (lane == 0 && arg == (i64)labels[row]) atomicAdd(count, 1ull);                      \
        }                                                                                          \
    }                                                                                              \
    extern "C" __global__ void top_k_count_##S##_##LS(const T* scores, const L* labels,            \
                                                      u64* count, i64 N, i64 C, i64 k) {           \
        typedef Acc<T>::t A;                                                                       \
        int lane = threadIdx.x & 31;                                                               \
        i64 warps = ((i64)gridDim.x * blockDim.x) >> 5;                                            \
        for (i64 row = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5; row < N; row += warps) { \
            const T* p = scores + row * C;                                                         \
            i64 label = (i64)labels[row];                                                          \
            bool valid = label >= 0 && label < C;                                                  \
            A target = valid ? load(p, label) : (A)0;                                              \
            i64 higher = 0;                                                                        \
            for (i64 c = lane; c < C; c += 32) higher += (load(p, c) > target) ? 1 : 0;            \
            for (int o = 16; o > 0; o >>= 1) higher += __shfl_down_sync(0xffffffffu, higher, o);   \
            if (lane == 0 && valid && target == target && higher < k) atomicAdd(count, 1ull);      \
        }                                                                                          \
    }
#define COUNT_KERNELS(T, S) COUNT_KERNELS_L(T, S, int, i32) COUNT_KERNELS_L(T, S, i64, i64)
FOR_FLOAT_TYPES(COUNT_KERNELS)

// --- casts between every supported dtype, through double for exactness of the integer range.
__device__ __forceinline__ double to_f64(float v) { return v; }
__device__ __forceinline__ double to_f64(double v) { return v; }
__device__ __forceinline__ double to_f64(half_t v) { return to_f32(v); }
__device__ __forceinline__ double to_f64(bf16_t v) { return to_f32(v); }
__device__ __forceinline__ double to_f64(int v) { return v; }
__device__ __forceinline__ double to_f64(i64 v) { return (double)v; }
__device__ __forceinline__ double to_f64(unsigned char v) { return v; }
__device__ __forceinline__ double to_f64(signed char v) { return v; }
__device__ __forceinline__ double to_f64(bool_t v) { return v.v ? 1.0 : 0.0; }
template <typename D> __device__ __forceinline__ D from_f64(double v) { return (D)v; }
template <> __device__ __forceinline__ half_t from_f64<half_t>(double v) { return from_f32<half_t>((float)v); }
template <> __device__ __forceinline__ bf16_t from_f64<bf16_t>(double v) { return from_f32<bf16_t>((float)v); }
template <> __device__ __forceinline__ bool_t from_f64<bool_t>(double v) { bool_t b; b.v = v != 0.0; return b; }

// Direct conversions where going through double would round twice or lose int64 precision.
template <typename S, typename D> struct Convert {
    static __device__ __forceinline__ D run(S v) { return from_f64<D>(to_f64(v)); }
};
template <typename S> struct Convert<S, S> {
    static __device__ __forceinline__ S run(S v) { return v; }
};
template <> struct Convert<i64, float> {
    static __device__ __forceinline__ float run(i64 v) { return (float)v; }
};
template <> struct Convert<int, float> {
    static __device__ __forceinline__ float run(int v) { return (float)v; }
};
template <> struct Convert<i64, int> {
    static __device__ __forceinline__ int run(i64 v) { return (int)v; }
};
template <> struct Convert<int, i64> {
    static __device__ __forceinline__ i64 run(int v) { return (i64)v; }
};

#define ALL_TYPES_X(M, A1, A2)                                                                     \
    M(A1, A2, float, f32) M(A1, A2, double, f64) M(A1, A2, half_t, f16) M(A1, A2, bf16_t, bf16)   \
    M(A1, A2, int, i32) M(A1, A2, i64, i64) M(A1, A2, unsigned char, u8)                          \
    M(A1, A2, signed char, i8) M(A1, A2, bool_t, bool)
// With `vec` (both pointers aligned to their vectors' sizes, checked on the host) a thread
// converts VW = 16 / (the larger item size) items with one load and one store, then the last
// n % VW items go one by one; the grid is sized for n / VW threads.
template <typename S, typename D> __device__ __forceinline__ void cast_items(const S* x, D* y, i64 n, int vec) {
    constexpr int VW = 16 / (int)(sizeof(S) > sizeof(D) ? sizeof(S) : sizeof(D));
    if (!vec) {
        GRID_STRIDE(i, n) { y[i] = Convert<S, D>::run(x[i]); }
        return;
    }
    const i64 nv = n / VW;
    GRID_STRIDE(i, nv) {
        const Pack<S, VW> a = load_pack<S, VW>(x, i * VW);
        Pack<D, VW> b;
#pragma unroll
        for (int k = 0; k < VW; ++k) b.e[k] = Convert<S, D>::run(a.e[k]);
        store_pack<D, VW>(y, i * VW, b);
    }
    GRID_STRIDE(i, n - nv * VW) { y[nv * VW + i] = Convert<S, D>::run(x[nv * VW + i]); }
}
#define CAST_ONE(ST, SS, DT, DS)                                                                   \
    extern "C" __global__ void cast_##SS##_##DS(const ST* x, DT* y, i64 n, int vec) {              \
        cast_items<ST, DT>(x, y, n, vec);                                                          \
    }
#define CAST_FROM(ST, SS) ALL_TYPES_X(CAST_ONE, ST, SS)
#define FILL_ONE(T, S)                                                                             \
    extern "C" __global__ void fill_##S(T* x, i64 n, double value) {                               \
        T v = from_f64<T>(value);                                                                  \
        GRID_STRIDE(i, n) { x[i] = v; }                                                            \
    }
#define FOR_ALL_TYPES(M)                                                                           \
    M(float, f32) M(double, f64) M(half_t, f16) M(bf16_t, bf16) M(int, i32) M(i64, i64)           \
    M(unsigned char, u8) M(signed char, i8) M(bool_t, bool)
FOR_ALL_TYPES(CAST_FROM)
FOR_ALL_TYPES(FILL_ONE)

// --- multi-tensor cast: every tensor of a list converted in one launch (a mixed-precision step
// casts every weight; one launch per tensor ran launch-bound, at a few % of memory bandwidth).
// `table` (int64) holds per tensor CAST_COLS columns [source, destination byte offset from
// `dst`, size, first chunk, vectorised], then per chunk [tensor, start]; a block takes a chunk
// (striding when chunks outnumber the grid). Chunks are `chunk` items, a multiple of VW, so a
// chunk of a row marked vectorised (its source and destination offset aligned to their
// vectors' sizes, checked on the host; `dst_vec`: the destination base too) starts aligned.
// The conversion is Convert<S, D>, the same as cast_<s>_<d>: the results are the same bits.
#define CAST_COLS 5
template <typename S, typename D>
__device__ __forceinline__ void cast_chunks(const i64* table, i64 ntensors, i64 nchunks, i64 chunk, char* dst,
                                            int dst_vec) {
    constexpr int VW = 16 / (int)(sizeof(S) > sizeof(D) ? sizeof(S) : sizeof(D));
    for (i64 ck = blockIdx.x; ck < nchunks; ck += gridDim.x) {
        const i64* c = table + CAST_COLS * ntensors + 2 * ck;
        const i64 start = c[1];
        const i64* row = table + CAST_COLS * c[0];
        const S* x = (const S*)row[0];
        D* y = (D*)(dst + row[1]);
        const i64 end = start + chunk < row[2] ? start + chunk : row[2];
        i64 i = start;
        if (row[4] && dst_vec) {
            const i64 vend = start + (end - start) / VW * VW;
            for (i64 j = start + (i64)threadIdx.x * VW; j < vend; j += (i64)blockDim.x * VW) {
                const Pack<S, VW> a = load_pack<S, VW>(x, j);
                Pack<D, VW> b;
#pragma unroll
                for (int k = 0; k < VW; ++k) b.e[k] = Convert<S, D>::run(a.e[k]);
                store_pack<D, VW>(y, j, b);
            }
            i = vend;
        }
        for (i64 j = i + threadIdx.x; j < end; j += blockDim.x) y[j] = Convert<S, D>::run(x[j]);
    }
}
#define CAST_MANY_ONE(ST, SS, DT, DS)                                                              \
    extern "C" __global__ void cast_many_##SS##_##DS(const i64* table, i64 ntensors, i64 nchunks,  \
                                                     i64 chunk, char* dst, int dst_vec) {          \
        cast_chunks<ST, DT>(table, ntensors, nchunks, chunk, dst, dst_vec);                        \
    }
#define FLOAT_TYPES_X(M, A1, A2)                                                                   \
    M(A1, A2, float, f32) M(A1, A2, double, f64) M(A1, A2, half_t, f16) M(A1, A2, bf16_t, bf16)
#define CAST_MANY_FROM(ST, SS) FLOAT_TYPES_X(CAST_MANY_ONE, ST, SS)
FOR_FLOAT_TYPES(CAST_MANY_FROM)

// --- y[r] = x[indices[r]] for rows of `row_units` units (4-byte words or bytes). An index out
// of [0, nrows) (after wrapping one negative turn, as NumPy) fills the row with 0xFF bytes
// (NaN for floats) instead of reading out of bounds: no host check is possible without a sync.
#define TAKE_KERNELS(I, IS)                                                                        \
    extern "C" __global__ void take_rows_w4_##IS(const unsigned* x, unsigned* y, const I* idx,     \
                                                 i64 nidx, i64 row_units, i64 nrows) {             \
        GRID_STRIDE(j, nidx * row_units) {                                                         \
            i64 r = j / row_units, u = j - r * row_units;                                          \
            i64 s = (i64)idx[r];                                                                   \
            if (s < 0) s += nrows;                                                                 \
            y[j] = (s >= 0 && s < nrows) ? x[s * row_units + u] : 0xffffffffu;                     \
        }                                                                                          \
    }                                                                                              \
    extern "C" __global__ void take_rows_b1_##IS(const unsigned char* x, unsigned char* y,         \
                                                 const I* idx, i64 nidx, i64 row_units,            \
                                                 i64 nrows) {                                      \
        GRID_STRIDE(j, nidx * row_units) {                                                         \
            i64 r = j / row_units, u = j - r * row_units;                                          \
            i64 s = (i64)idx[r];                                                                   \
            if (s < 0) s += nrows;                                                                 \
            y[j] = (s >= 0 && s < nrows) ? x[s * row_units + u] : (unsigned char)0xff;             \
        }                                                                                          \
    }
FOR_INDEX_TYPES(TAKE_KERNELS)

// --- *flag = 0 when any element is NaN or +-inf (flag starts at 1; racing writers all write 0).
__device__ __forceinline__ bool finite_value(float v) { return isfinite(v); }
__device__ __forceinline__ bool finite_value(double v) { return isfinite(v); }
__device__ __forceinline__ bool finite_value(half_t v) { return (v.bits & 0x7c00u) != 0x7c00u; }
__device__ __forceinline__ bool finite_value(bf16_t v) { return (v.bits & 0x7f80u) != 0x7f80u; }
#define FINITE_KERNELS(T, S)                                                                       \
    extern "C" __global__ void all_finite_##S(const T* x, i64 n, int* flag) {                      \
        GRID_STRIDE(i, n) {                                                                        \
            if (!finite_value(x[i])) *flag = 0;                                                    \
        }                                                                                          \
    }
FOR_FLOAT_TYPES(FINITE_KERNELS)

// --- random crop (from the image zero-padded by `pad` on each side) and horizontal flip, one
// draw per sample from splitmix64(seed, n): offsets in [0, 2*pad], flip with probability 1/2.
// y[n, c, h, w] = P[n, c, h + oy, (flip ? W - 1 - w : w) + ox] with P the padded image.
#define CROP_FLIP_KERNELS(T, S)                                                                    \
    extern "C" __global__ void random_crop_flip_##S(const T* x, T* y, i64 N, int C, int H, int W,  \
                                                    int pad, u64 seed, int nhwc,                   \
                                                    int allow_flip) {                              \
        i64 total = N * C * H * W;                                                                 \
        unsigned span = 2u * pad + 1u;                                                             \
        GRID_STRIDE(i, total) {                                                                    \
            i64 r = i;                                                                             \
            int c, h, w;                                                                           \
            if (nhwc) { c = r % C; r /= C; w = r % W; r /= W; h = r % H; r /= H; }                 \
            else { w = r % W; r /= W; h = r % H; r /= H; c = r % C; r /= C; }                      \
            u64 bits = splitmix64(seed ^ splitmix64((u64)r));                                      \
            int oy = (int)(bits % span), ox = (int)((bits >> 20) % span);                          \
            int flip = allow_flip && ((bits >> 40) & 1ull);                                        \
            int sh = h + oy - pad, sw = (flip ? W - 1 - w : w) + ox - pad;                         \
            if (sh >= 0 && sh < H && sw >= 0 && sw < W) {                                          \
                i64 j = nhwc ? ((r * H + sh) * W + sw) * C + c : ((r * C + c) * H + sh) * W + sw;  \
                y[i] = x[j];                                                                       \
            } else {                                                                               \
                store(y, i, 0.0f);                                                                 \
            }                                                                                      \
        }                                                                                          \
    }
FOR_FLOAT_TYPES(CROP_FLIP_KERNELS)
