// Reshaping-layer kernels: 2-d upsampling (nearest, bilinear) forward and backward, and the
// N-d transpose. Shapes are given as (N, C, H, W) numbers; `nhwc` selects the memory order.
// Padding and cropping use pad2d/crop2d of layout.cu.

__device__ __forceinline__ float m_floor(float x) { return floorf(x); }
__device__ __forceinline__ double m_floor(double x) { return floor(x); }

// Bilinear taps of output row `o` (upsampling by `s`, half-pixel centres): input rows i0, i1
// (clamped to [0, n-1]) with weights 1 - f and f.
template <typename A> __device__ __forceinline__ void bilinear_taps(int o, int s, int n, int& i0, int& i1, A& f) {
    A src = ((A)o + (A)0.5) / (A)s - (A)0.5;
    A lo = m_floor(src);
    f = src - lo;
    int l = (int)lo;
    i0 = l < 0 ? 0 : (l > n - 1 ? n - 1 : l);
    i1 = l + 1 < 0 ? 0 : (l + 1 > n - 1 ? n - 1 : l + 1);
}
// The weight input row `i` gets from output row `o`.
template <typename A> __device__ __forceinline__ A bilinear_weight(int o, int s, int n, int i) {
    int i0, i1;
    A f;
    bilinear_taps(o, s, n, i0, i1, f);
    return (i0 == i ? (A)1 - f : (A)0) + (i1 == i ? f : (A)0);
}

// Index of element (r = n, c, h, w) in a tensor of (C, H, W) in either memory order.
__device__ __forceinline__ i64 image_index(i64 n, int c, int h, int w, int C, int H, int W, int nhwc) {
    return nhwc ? ((n * H + h) * W + w) * C + c : ((n * C + c) * H + h) * W + w;
}

// Decompose a linear index over an (N, C, H, W) tensor stored in either order.
#define DECOMPOSE(i, C, H, W, nhwc, n, c, h, w)                                                    \
    i64 n = i;                                                                                     \
    int c, h, w;                                                                                   \
    if (nhwc) { c = n % C; n /= C; w = n % W; n /= W; h = n % H; n /= H; }                         \
    else { w = n % W; n /= W; h = n % H; n /= H; c = n % C; n /= C; }

// x is (N, C, H, W), y is (N, C, H*sh, W*sw).
#define UPSAMPLE_KERNELS(T, S)                                                                     \
    extern "C" __global__ void upsample_nearest_fwd_##S(const T* x, T* y, i64 N, int C, int H,     \
                                                        int W, int sh, int sw, int nhwc) {         \
        const int OH = H * sh, OW = W * sw;                                                        \
        GRID_STRIDE(i, N * C * OH * OW) {                                                          \
            DECOMPOSE(i, C, OH, OW, nhwc, n, c, oh, ow)                                            \
            y[i] = x[image_index(n, c, oh / sh, ow / sw, C, H, W, nhwc)];                          \
        }                                                                                          \
    }                                                                                              \
    /* dx[n, c, h, w] = sum of the sh x sw block of dy it was copied to (fixed order). */           \
    extern "C" __global__ void upsample_nearest_bwd_##S(const T* dy, T* dx, i64 N, int C, int H,   \
                                                        int W, int sh, int sw, int nhwc) {         \
        typedef Acc<T>::t A;                                                                       \
        const int OH = H * sh, OW = W * sw;                                                        \
        GRID_STRIDE(i, N * C * H * W) {                                                            \
            DECOMPOSE(i, C, H, W, nhwc, n, c, h, w)                                                \
            A acc = (A)0;                                                                          \
            for (int a = 0; a < sh; ++a)                                                           \
                for (int b = 0; b < sw; ++b)                                                       \
                    acc += load(dy, image_index(n, c, h * sh + a, w * sw + b, C, OH, OW, nhwc));   \
            store(dx, i, acc);                                                                     \
        }                                                                                          \
    }                                                                                              \
    extern "C" __global__ void upsample_bilinear_fwd_##S(const T* x, T* y, i64 N, int C, int H,    \
                                                         int W, int sh, int sw, int nhwc) {        \
        typedef Acc<T>::t A;                                                                       \
        const int OH = H * sh, OW = W * sw;                                                        \
        GRID_STRIDE(i, N * C * OH * OW) {                                                          \
            DECOMPOSE(i, C, OH, OW, nhwc, n, c, oh, ow)                                            \
            int h0, h1, w0, w1;                                                                    \
            A fh, fw;                                                                              \
            bilinear_taps(oh, sh, H, h0, h1, fh);                                                  \
            bilinear_taps(ow, sw, W, w0, w1, fw);                                                  \
            A top = load(x, image_index(n, c, h0, w0, C, H, W, nhwc)) * ((A)1 - fw) +              \
                    load(x, image_index(n, c, h0, w1, C, H, W, nhwc)) * fw;                        \
            A bottom = load(x, image_index(n, c, h1, w0, C, H, W, nhwc)) * ((A)1 - fw) +           \
                       load(x, image_index(n, c, h1, w1, C, H, W, nhwc)) * fw;                     \
            store(y, i, top * ((A)1 - fh) + bottom * fh);                                          \
        }                                                                                          \
    }                                                                                              \
    /* Gather form of the transposed interpolation (no atomics, deterministic): input row h is a   \
       tap only of output rows in [(h - 1) * sh, (h + 2) * sh), columns likewise. */               \
    extern "C" __global__ void upsample_bilinear_bwd_##S(const T* dy, T* dx, i64 N, int C, int H,  \
                                                         int W, int sh, int sw, int nhwc) {        \
        typedef Acc<T>::t A;                                                                       \
        const int OH = H * sh, OW = W * sw;                                                        \
        GRID_STRIDE(i, N * C * H * W) {                                                            \
            DECOMPOSE(i, C, H, W, nhwc, n, c, h, w)                                                \
            const int oh0 = (h - 1) * sh < 0 ? 0 : (h - 1) * sh;                                   \
            const int oh1 = (h + 2) * sh < OH ? (h + 2) * sh : OH;                                 \
            const int ow0 = (w - 1) * sw < 0 ? 0 : (w - 1) * sw;                                   \
            const int ow1 = (w + 2) * sw < OW ? (w + 2) * sw : OW;                                 \
            A acc = (A)0;                                                                          \
            for (int oh = oh0; oh < oh1; ++oh) {                                                   \
                A wh = bilinear_weight<A>(oh, sh, H, h);                                           \
                if (wh == (A)0) continue;                                                          \
                A row = (A)0;                                                                      \
                for (int ow = ow0; ow < ow1; ++ow) {                                               \
                    A ww = bilinear_weight<A>(ow, sw, W, w);                                       \
                    if (ww != (A)0) row += ww * load(dy, image_index(n, c, oh, ow, C, OH, OW, nhwc)); \
                }                                                                                  \
                acc += wh * row;                                                                   \
            }                                                                                      \
            store(dx, i, acc);                                                                     \
        }                                                                                          \
    }
FOR_FLOAT_TYPES(UPSAMPLE_KERNELS)

// y = transpose(x): y's axis k is x's axis perm[k]. `d0..d7` are y's dims and `s0..s7` the
// matching strides of x (elements), left-padded to 8 axes with 1 / 0. Units of U bytes, so one
// kernel per element size serves every dtype.
#define TRANSPOSE_KERNEL(U, US)                                                                    \
    extern "C" __global__ void transpose_##US(const U* x, U* y, i64 n, i64 d0, i64 d1, i64 d2,     \
                                              i64 d3, i64 d4, i64 d5, i64 d6, i64 d7, i64 s0,      \
                                              i64 s1, i64 s2, i64 s3, i64 s4, i64 s5, i64 s6,      \
                                              i64 s7) {                                            \
        const i64 d[8] = {d0, d1, d2, d3, d4, d5, d6, d7};                                         \
        const i64 s[8] = {s0, s1, s2, s3, s4, s5, s6, s7};                                         \
        GRID_STRIDE(i, n) {                                                                        \
            i64 r = i, j = 0;                                                                      \
            for (int k = 7; k >= 0; --k) {                                                         \
                i64 q = r / d[k];                                                                  \
                j += (r - q * d[k]) * s[k];                                                        \
                r = q;                                                                             \
            }                                                                                      \
            y[i] = x[j];                                                                           \
        }                                                                                          \
    }
TRANSPOSE_KERNEL(unsigned long long, u8)
TRANSPOSE_KERNEL(unsigned int, u4)
TRANSPOSE_KERNEL(unsigned short, u2)
TRANSPOSE_KERNEL(unsigned char, u1)
