// Layout helpers for conv and pooling: explicit (asymmetric) padding, cropping, per-position
// scaling, per-channel bias add and reduction. `nhwc` selects the memory order of 4-d tensors;
// shapes are always given as (N, C, H, W) numbers.

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
    /* out[o, c, k] = y[o, c, k] + b[c] for y viewed as (outer, C, inner). */                      \
    extern "C" __global__ void bias_add_##S(const T* y, const T* b, T* out, i64 total, i64 C,      \
                                            i64 inner) {                                           \
        GRID_STRIDE(i, total) { store(out, i, load(y, i) + load(b, (i / inner) % C)); }            \
    }                                                                                              \
    extern "C" __global__ void bias_add_f32bias_##S(const T* y, const float* b, T* out, i64 total, \
                                                    i64 C, i64 inner) {                            \
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
