// Layout helpers for conv and pooling: explicit (asymmetric) padding, cropping, per-position
// scaling, per-channel bias add and reduction. `nhwc` selects the memory order of 4-d tensors;
// shapes are always given as (N, C, H, W) numbers.

// Channels-last bias add, out[r, c] = y[r, c] + b[c] for (rows, C) data, VW channels per thread in
// 16-byte accesses of y/out (b read as VW neighbouring values): the host takes this path when C % VW == 0
// and y, b, out are 16-byte aligned, so a vector never straddles a row and no tail is left. Per element
// it is the scalar kernel's sum. (Scalar 2-byte accesses ran at ~30% of the H200's bandwidth.)
template <typename T, typename B, int VW>
__device__ __forceinline__ void bias_add_rows(const T* y, const B* b, T* out, i64 total, i64 C) {
    typedef typename Acc<T>::t A;
    GRID_STRIDE(v, total / VW) {
        const i64 i = v * VW, c = i % C;
        const Pack<T, VW> x = load_pack<T, VW>(y, i);
        const Pack<B, VW> bb = load_pack<B, VW>(b, c);
        Pack<T, VW> r;
#pragma unroll
        for (int k = 0; k < VW; ++k) store(r.e, k, load(x.e, k) + (A)load(bb.e, k));
        store_pack<T, VW>(out, i, r);
    }
}

// dst (N, C, Hp, Wp) = src (N, C, H, W) placed at (top, left), `value` elsewhere.
#define LAYOUT_KERNELS(T, S)                                                                       \
    extern "C" __global__ void pad2d_##S(const T* src, T* dst, i64 N, int C, int H, int W, int Hp, \
                                         int Wp, int top, int left, float value, int nhwc) {       \
        i64 total = N * C * Hp * Wp;                                                              \
        GRID_STRIDE(i, total) {                                                                    \
            i64 r = i;                                                                             \
            int c, h, w;                                                                           \
            if (nhwc) { c = r % C; r /= C; w = r % Wp; r /= Wp; h = r % Hp; r /= Hp; }             \
            else { w = r % Wp; r /= Wp; h = r % Hp; r /= Hp; c = r % C; r /= C; }                  \
            int sh = h - top, sw = w - left;                                                       \
            if (sh >= 0 && sh < H && sw >= 0 && sw < W) {                                          \
                i64 j = nhwc ? ((r * H + sh) * W + sw) * C + c : ((r * C + c) * H + sh) * W + sw;  \
                dst[i] = src[j];                                                                   \
            } else {                                                                               \
                store(dst, i, value);                                                              \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
    /* dst (N, C, H, W) = the (top, left) window of src (N, C, Hp, Wp). */                         \
    extern "C" __global__ void crop2d_##S(const T* src, T* dst, i64 N, int C, int H, int W, int Hp,\
                                          int Wp, int top, int left, int nhwc) {                   \
        i64 total = N * C * H * W;                                                                 \
        GRID_STRIDE(i, total) {                                                                    \
            i64 r = i;                                                                             \
            int c, h, w;                                                                           \
            if (nhwc) { c = r % C; r /= C; w = r % W; r /= W; h = r % H; r /= H; }                 \
            else { w = r % W; r /= W; h = r % H; r /= H; c = r % C; r /= C; }                      \
            int ph = h + top, pw = w + left;                                                       \
            i64 j = nhwc ? ((r * Hp + ph) * Wp + pw) * C + c : ((r * C + c) * Hp + ph) * Wp + pw;  \
            dst[i] = src[j];                                                                       \
        }                                                                                          \
    }                                                                                              \
    /* dst = src * map[h, w] for (N, C, H, W) tensors; map is float32 (H, W). */                   \
    extern "C" __global__ void scale_hw_##S(const T* src, T* dst, const float* map, i64 total,     \
                                            int C, int HW, int nhwc) {                             \
        GRID_STRIDE(i, total) {                                                                    \
            i64 hw = nhwc ? (i / C) % HW : i % HW;                                                 \
            store(dst, i, load(src, i) * (Acc<T>::t)map[hw]);                                      \
        }                                                                                          \
    }                                                                                              \
    /* out[o, c, k] = y[o, c, k] + b[c] for y viewed as (outer, C, inner); `vec`: bias_add_rows     \
       (inner == 1, checked on the host). */                                                       \
    extern "C" __global__ void bias_add_##S(const T* y, const T* b, T* out, i64 total, i64 C,      \
                                            i64 inner, int vec) {                                  \
        if (vec) { bias_add_rows<T, T, 16 / (int)sizeof(T)>(y, b, out, total, C); return; }        \
        GRID_STRIDE(i, total) { store(out, i, load(y, i) + load(b, (i / inner) % C)); }            \
    }                                                                                              \
    extern "C" __global__ void bias_add_f32bias_##S(const T* y, const float* b, T* out, i64 total, \
                                                    i64 C, i64 inner, int vec) {                   \
        if (vec) { bias_add_rows<T, float, 16 / (int)sizeof(T)>(y, b, out, total, C); return; }    \
        GRID_STRIDE(i, total) { store(out, i, load(y, i) + (Acc<T>::t)b[(i / inner) % C]); }       \
    }                                                                                              \
    /* out[c] = sum over (o, k) of x[o, c, k]; one block per channel, fixed order (deterministic). \
       Writes `scale * sum` as O (T or float). */                                                  \
    extern "C" __global__ void channel_sum_##S(const T* x, T* out, i64 outer, i64 C, i64 inner,    \
                                               double scale) {                                     \
        typedef Acc<T>::t A;                                                                       \
        __shared__ A scratch[32];                                                                  \
        for (i64 c = blockIdx.x; c < C; c += gridDim.x) {                                          \
            A acc = (A)0;                                                                          \
            i64 count = outer * inner;                                                             \
            for (i64 j = threadIdx.x; j < count; j += blockDim.x) {                                \
                i64 o = j / inner, k = j - o * inner;                                              \
                acc += load(x, (o * C + c) * inner + k);                                           \
            }                                                                                      \
            acc = block_sum(acc, scratch);                                                         \
            if (threadIdx.x == 0) store(out, c, acc * (A)scale);                                   \
        }                                                                                          \
    }                                                                                              \
    /* Global average pooling backward: dx[n, c, h, w] = dy[n, c] * scale. */                      \
    extern "C" __global__ void broadcast_hw_##S(const T* dy, T* dx, i64 total, int C, int HW,      \
                                                int nhwc, double scale) {                          \
        GRID_STRIDE(i, total) {                                                                    \
            i64 nc = nhwc ? (i / ((i64)HW * C)) * C + i % C : i / HW;                              \
            store(dx, i, load(dy, nc) * (Acc<T>::t)scale);                                         \
        }                                                                                          \
    }
FOR_FLOAT_TYPES(LAYOUT_KERNELS)

// Channels-last per-channel sums (x is (rows, C), C contiguous): the bias gradient.
// A block is 256 threads: ct column lanes (a power of two) x 256/ct row lanes. Column lane tx
// of column tile blockIdx.y takes the `VW` neighbouring channels from ((blockIdx.y * ct + tx) * VW);
// row lane ty adds rows r0 + ty, r0 + ty + 256/ct, ... of row block blockIdx.x (16-byte loads
// when `vec`: C % VW == 0 and x 16-byte aligned, checked on the host); then the row lanes are
// added in a fixed tree in shared memory. Every order is fixed by the shape: deterministic.
// Large inputs take two passes: channel_sum_rows writes one float (double) row of partial sums
// per row block, channel_sum_partials sums those rows the same way in one row block; a small
// input takes channel_sum_last alone. (Before: 32 channels x 8 rows per block and one thread
// per channel adding up to 1024 partial rows serially: 20% of an mnist_cnn step on an H200.)
template <typename I, typename O, int VW>
__device__ __forceinline__ void column_sums(const I* x, O* out, i64 rows, i64 C, i64 rows_per_block, int ct,
                                            double scale, typename Acc<I>::t* red) {
    typedef typename Acc<I>::t A;
    const int rt = 256 / ct;
    const int tx = threadIdx.x % ct, ty = threadIdx.x / ct;
    const i64 c = ((i64)blockIdx.y * ct + tx) * VW;
    const i64 r0 = (i64)blockIdx.x * rows_per_block;
    const i64 r1 = r0 + rows_per_block < rows ? r0 + rows_per_block : rows;
    A acc[VW];
#pragma unroll
    for (int k = 0; k < VW; ++k) acc[k] = (A)0;
    if (c < C)
        for (i64 r = r0 + ty; r < r1; r += rt) {
            const Pack<I, VW> v = load_pack<I, VW>(x, r * C + c);
#pragma unroll
            for (int k = 0; k < VW; ++k) acc[k] += (A)load(v.e, k);
        }
#pragma unroll
    for (int k = 0; k < VW; ++k) red[threadIdx.x * VW + k] = acc[k];
    __syncthreads();
    for (int half = rt / 2; half > 0; half >>= 1) {
        if (ty < half)
#pragma unroll
            for (int k = 0; k < VW; ++k) red[threadIdx.x * VW + k] += red[(threadIdx.x + half * ct) * VW + k];
        __syncthreads();
    }
    if (ty == 0 && c < C)
#pragma unroll
        for (int k = 0; k < VW; ++k) store(out, (i64)blockIdx.x * C + c + k, red[tx * VW + k] * (A)scale);
}

#define COLUMN_SUMS(I, O, ...)                                                                     \
    {                                                                                              \
        typedef Acc<I>::t A;                                                                       \
        constexpr int VW = 16 / (int)sizeof(I);                                                    \
        __shared__ A red[256 * VW];                                                                \
        if (vec) column_sums<I, O, VW>(__VA_ARGS__, red);                                          \
        else column_sums<I, O, 1>(__VA_ARGS__, red);                                               \
    }
#define CHANNEL_SUM_LAST_KERNELS(T, S)                                                             \
    extern "C" __global__ void channel_sum_rows_##S(const T* x, Acc<T>::t* partial, i64 rows,      \
                                                    i64 C, i64 rows_per_block, int ct, int vec) {  \
        COLUMN_SUMS(T, Acc<T>::t, x, partial, rows, C, rows_per_block, ct, 1.0)                    \
    }                                                                                              \
    extern "C" __global__ void channel_sum_partials_##S(const Acc<T>::t* partial, T* out,          \
                                                        i64 blocks, i64 C, int ct, int vec,        \
                                                        double scale) {                            \
        COLUMN_SUMS(Acc<T>::t, T, partial, out, blocks, C, blocks, ct, scale)                      \
    }                                                                                              \
    extern "C" __global__ void channel_sum_last_##S(const T* x, T* out, i64 rows, i64 C, int ct,   \
                                                    int vec, double scale) {                       \
        COLUMN_SUMS(T, T, x, out, rows, C, rows, ct, scale)                                        \
    }
FOR_FLOAT_TYPES(CHANNEL_SUM_LAST_KERNELS)

// Max pooling for channels-last tensors with non-overlapping windows (stride == window, no
// padding; rows and columns past the last full window belong to no window, Keras "valid"), one
// thread per pooled position and VW neighbouring channels (16-byte accesses when `vec`: C % VW == 0
// and every pointer 16-byte aligned, checked on the host; else VW = 1); 2x2 and 3x3 windows are
// unrolled, and each window is read in full before anything is written, so its loads are in
// flight together.
//
// Forward: y is the window's first maximum in top-left-first order, copied bit for bit from x, or
// a NaN of the window if it holds one (cuDNN's CUDNN_PROPAGATE_NAN, which the cuDNN path sets, and
// np.maximum in the NumPy reference). Values compare in float, exact for every type. (cuDNN's
// pooling_fw_kernel_max_nhwc took 97 us for airbench94's 1024x31x31x64 bfloat16 input on an H200.)
// Where the window of pooled vector i (VW channels of one pooled position, channels fastest)
// starts in x: its top-left element's index.
__device__ __forceinline__ i64 window_base(i64 i, int VW, int H, int W, int C, int OH, int OW, int KH, int KW) {
    const int cv = C / VW;
    i64 r = i / cv;
    const int c = (int)(i - r * cv) * VW;
    const int ow = (int)(r % OW);
    r /= OW;
    const int oh = (int)(r % OH);
    const i64 n = r / OH;
    return ((n * H + (i64)oh * KH) * W + (i64)ow * KW) * C + c;
}

template <typename T, int VW, int KH_, int KW_>
__device__ __forceinline__ void maxpool_fwd_nhwc(const T* __restrict__ x, T* __restrict__ y, i64 total, int H, int W,
                                                 int C, int OH, int OW, int kh_rt, int kw_rt) {
    typedef typename Acc<T>::t A;
    const int KH = KH_ ? KH_ : kh_rt, KW = KW_ ? KW_ : kw_rt;
    GRID_STRIDE(i, total / VW) {
        const i64 base = window_base(i, VW, H, W, C, OH, OW, KH, KW);
        Pack<T, VW> best = load_pack<T, VW>(x, base);
        A m[VW];
#pragma unroll
        for (int k = 0; k < VW; ++k) m[k] = (A)load(best.e, k);
#pragma unroll
        for (int kh = 0; kh < KH; ++kh)
#pragma unroll
            for (int kw = 0; kw < KW; ++kw) {
                if (kh == 0 && kw == 0) continue;
                const Pack<T, VW> v = load_pack<T, VW>(x, base + ((i64)kh * W + kw) * C);
#pragma unroll
                for (int k = 0; k < VW; ++k) {
                    const A a = (A)load(v.e, k);
                    // Strictly greater keeps the first maximum; a NaN, once taken, is never replaced.
                    if (a > m[k] || (a != a && m[k] == m[k])) {
                        m[k] = a;
                        best.e[k] = v.e[k];
                    }
                }
            }
        store_pack<T, VW>(y, i * VW, best);
    }
}

// Backward: the whole window is written, dy at the first maximum in top-left-first order (as the
// NumPy reference), 0 elsewhere; the same threads first write 0 to the rows and columns past the
// last window, so every element of dx is written once and no memset precedes the kernel. (cuDNN's
// NHWC max-pool backward took 1.1 ms of a 9.4 ms airbench94 step on an H200; zeroing all of dx
// first for its 31 -> 15 pooling took 17 us a call.)
//
// The rows and columns past the last window, in a loop of its own before the windows' (after it,
// the bfloat16 kernel took 72 registers instead of 50).
template <typename T, int VW>
__device__ __forceinline__ void maxpool_bwd_nhwc_edges(T* dx, i64 total, int H, int W, int C, int OH, int OW,
                                                       int KH, int KW) {
    typedef typename Acc<T>::t A;
    const int cv = C / VW;
    // Per image the columns [OW*KW, W) of rows [0, OH*KH), then all of rows [OH*KH, H), in order.
    const int h_in = OH * KH, w_in = OW * KW, right = W - w_in;
    const i64 right_items = (i64)h_in * right, per_image = right_items + (i64)(H - h_in) * W;
    if (per_image == 0) return;
    Pack<T, VW> zero;
#pragma unroll
    for (int k = 0; k < VW; ++k) store(zero.e, k, (A)0);
#pragma unroll 1
    GRID_STRIDE(e, total / ((i64)OH * OW * C) * per_image * cv) {  // N * per_image * cv
        const i64 p = e / cv, n = p / per_image;
        const int c = (int)(e - p * cv) * VW;
        i64 q = p - n * per_image;
        int h, w;
        if (q < right_items) {
            h = (int)(q / right);
            w = w_in + (int)(q - (i64)h * right);
        } else {
            q -= right_items;
            h = h_in + (int)(q / W);
            w = (int)(q - (i64)(h - h_in) * W);
        }
        store_pack<T, VW>(dx, ((n * H + h) * W + w) * C + c, zero);
    }
}

template <typename T, int VW, int KH_, int KW_>
__device__ __forceinline__ void maxpool_bwd_nhwc(const T* __restrict__ x, const T* __restrict__ y,
                                                 const T* __restrict__ dy, T* __restrict__ dx, i64 total, int H,
                                                 int W, int C, int OH, int OW, int kh_rt, int kw_rt) {
    typedef typename Acc<T>::t A;
    const int KH = KH_ ? KH_ : kh_rt, KW = KW_ ? KW_ : kw_rt;
    maxpool_bwd_nhwc_edges<T, VW>(dx, total, H, W, C, OH, OW, KH, KW);
    GRID_STRIDE(i, total / VW) {
        const Pack<T, VW> m = load_pack<T, VW>(y, i * VW), g = load_pack<T, VW>(dy, i * VW);
        const i64 base = window_base(i, VW, H, W, C, OH, OW, KH, KW);
        int hit[VW];
#pragma unroll
        for (int k = 0; k < VW; ++k) hit[k] = -1;
#pragma unroll
        for (int kh = 0; kh < KH; ++kh)
#pragma unroll
            for (int kw = 0; kw < KW; ++kw) {
                const Pack<T, VW> v = load_pack<T, VW>(x, base + ((i64)kh * W + kw) * C);
#pragma unroll
                for (int k = 0; k < VW; ++k)
                    if (hit[k] < 0 && (A)load(v.e, k) == (A)load(m.e, k)) hit[k] = kh * KW + kw;
            }
#pragma unroll
        for (int kh = 0; kh < KH; ++kh)
#pragma unroll
            for (int kw = 0; kw < KW; ++kw) {
                Pack<T, VW> out;
#pragma unroll
                for (int k = 0; k < VW; ++k) store(out.e, k, hit[k] == kh * KW + kw ? (A)load(g.e, k) : (A)0);
                store_pack<T, VW>(dx, base + ((i64)kh * W + kw) * C, out);
            }
    }
}

template <typename T, int VW>
__device__ __forceinline__ void maxpool_fwd_nhwc_windows(const T* x, T* y, i64 total, int H, int W, int C, int OH,
                                                         int OW, int KH, int KW) {
    if (KH == 2 && KW == 2) maxpool_fwd_nhwc<T, VW, 2, 2>(x, y, total, H, W, C, OH, OW, KH, KW);
    else if (KH == 3 && KW == 3) maxpool_fwd_nhwc<T, VW, 3, 3>(x, y, total, H, W, C, OH, OW, KH, KW);
    else maxpool_fwd_nhwc<T, VW, 0, 0>(x, y, total, H, W, C, OH, OW, KH, KW);
}

template <typename T, int VW>
__device__ __forceinline__ void maxpool_bwd_nhwc_windows(const T* x, const T* y, const T* dy, T* dx, i64 total,
                                                         int H, int W, int C, int OH, int OW, int KH, int KW) {
    if (KH == 2 && KW == 2) maxpool_bwd_nhwc<T, VW, 2, 2>(x, y, dy, dx, total, H, W, C, OH, OW, KH, KW);
    else if (KH == 3 && KW == 3) maxpool_bwd_nhwc<T, VW, 3, 3>(x, y, dy, dx, total, H, W, C, OH, OW, KH, KW);
    else maxpool_bwd_nhwc<T, VW, 0, 0>(x, y, dy, dx, total, H, W, C, OH, OW, KH, KW);
}

#define MAXPOOL_NHWC_KERNELS(T, S)                                                                 \
    extern "C" __global__ void maxpool2d_fwd_nhwc_##S(const T* x, T* y, i64 total, int H, int W,   \
                                                      int C, int OH, int OW, int KH, int KW,       \
                                                      int vec) {                                   \
        if (vec) maxpool_fwd_nhwc_windows<T, 16 / (int)sizeof(T)>(x, y, total, H, W, C, OH, OW, KH, KW); \
        else maxpool_fwd_nhwc_windows<T, 1>(x, y, total, H, W, C, OH, OW, KH, KW);                 \
    }                                                                                              \
    extern "C" __global__ void maxpool2d_bwd_nhwc_##S(const T* x, const T* y, const T* dy, T* dx,  \
                                                      i64 total, int H, int W, int C, int OH,      \
                                                      int OW, int KH, int KW, int vec) {           \
        if (vec) maxpool_bwd_nhwc_windows<T, 16 / (int)sizeof(T)>(x, y, dy, dx, total, H, W, C, OH, OW, KH, KW); \
        else maxpool_bwd_nhwc_windows<T, 1>(x, y, dy, dx, total, H, W, C, OH, OW, KH, KW);         \
    }
FOR_FLOAT_TYPES(MAXPOOL_NHWC_KERNELS)
