// Batch-norm inference for channels-last data (NHWC 4-d, or 2-d (N, C)): the channel is the
// fastest axis, so y[i] = x[i] * scale[c] + shift[c] with c = i % C reads x and writes y fully
// coalesced. cuDNN's legacy inference kernel walks NHWC one channel at a time (strided).
// scale = gamma / sqrt(var + eps), shift = beta - mean * scale, in float; the per-channel
// parameters are float32 and tiny, so recomputing them per element costs only cached loads.

#define BN_INFER_KERNEL(T, S)                                                                      \
    extern "C" __global__ void bn_infer_channels_last_##S(                                         \
        const T* x, T* y, const float* gamma, const float* beta, const float* mean,                \
        const float* var, i64 n, i64 channels, float eps) {                                        \
        const bool narrow = n <= 0xffffffffLL;  /* 32-bit modulo when the index fits */            \
        GRID_STRIDE(i, n) {                                                                        \
            i64 c = narrow ? (i64)((unsigned)i % (unsigned)channels) : i % channels;               \
            float scale = gamma[c] / sqrtf(var[c] + eps);                                          \
            float shift = beta[c] - mean[c] * scale;                                               \
            store(y, i, load(x, i) * scale + shift);                                               \
        }                                                                                          \
    }
BN_INFER_KERNEL(float, f32)
BN_INFER_KERNEL(half_t, f16)
BN_INFER_KERNEL(bf16_t, bf16)

// Batch-norm training from per-channel sums (conv_bn.py: a convolution whose cuDNN graph wrote
// sum(x) and sum(x*x) per channel in its epilogue, genstats). Each block first finalizes the
// statistics of every channel into shared tables (mean = sum / count, biased var = E[x^2] - mean^2,
// clamped at 0; scale = gamma / sqrt(var + eps), shift = beta - mean * scale); block 0 also writes
// the saved mean and 1/std and updates the running statistics (running = momentum * running +
// (1 - momentum) * batch, biased variance: Keras), one thread per channel. Then
// y = x * scale[c] + shift[c] (relu'd when `relu`; NaN kept, as the relu op keeps it) over N-element
// packs: 16-byte loads and stores in the `_vec` kernels (C a multiple of N and 16-byte aligned
// x and y, which the host checks), one element per step in the others. C <= BN_APPLY_MAX_C.
#define BN_APPLY_MAX_C 2048

// N per-channel float32 values t[c0 .. c0+N) into r: 16-byte loads when N is a multiple of 4 (c0 is a
// multiple of N, the table 16-byte aligned). A warp's scalar loads of an N-strided table would hit a
// few shared-memory banks many times over (8-way for C = 256, N = 8: the pass ran at 35% of bandwidth).
template <int N> __device__ __forceinline__ void load_coefficients(const float* t, int c0, float* r) {
    if (N % 4 == 0) {
#pragma unroll
        for (int k = 0; k < N; k += 4) {
            float4 q = *(const float4*)(t + c0 + k);
            r[k] = q.x; r[k + 1] = q.y; r[k + 2] = q.z; r[k + 3] = q.w;
        }
    } else {
#pragma unroll
        for (int k = 0; k < N; ++k) r[k] = t[c0 + k];
    }
}

template <typename T, int N>
__device__ __forceinline__ void bn_apply_sums(const T* x, T* y, const float* sum, const float* sq_sum,
                                              const float* gamma, const float* beta, float* running_mean,
                                              float* running_var, float* save_mean, float* save_inv_std,
                                              i64 n, int channels, float count, float eps, float momentum,
                                              int relu) {
    __shared__ float4 scale4[BN_APPLY_MAX_C / 4];
    __shared__ float4 shift4[BN_APPLY_MAX_C / 4];
    float* table_scale = (float*)scale4;
    float* table_shift = (float*)shift4;
    const float inv_count = 1.0f / count;
    for (int c = threadIdx.x; c < channels; c += blockDim.x) {
        float mean = sum[c] * inv_count;
        float var = fmaxf(sq_sum[c] * inv_count - mean * mean, 0.0f);
        float inv_std = 1.0f / sqrtf(var + eps);
        float scale = gamma[c] * inv_std;
        table_scale[c] = scale;
        table_shift[c] = beta[c] - mean * scale;
        if (blockIdx.x == 0) {
            save_mean[c] = mean;
            save_inv_std[c] = inv_std;
            running_mean[c] = momentum * running_mean[c] + (1.0f - momentum) * mean;
            running_var[c] = momentum * running_var[c] + (1.0f - momentum) * var;
        }
    }
    __syncthreads();
    const i64 packs = n / N;
    const bool narrow = n <= 0xffffffffLL;  /* 32-bit modulo when the index fits */
    GRID_STRIDE(p, packs) {
        i64 i = p * N;
        int c0 = narrow ? (int)((unsigned)i % (unsigned)channels) : (int)(i % channels);
        Pack<T, N> v = load_pack<T, N>(x, i);
        Pack<T, N> o;
        float scale[N], shift[N];
        load_coefficients<N>(table_scale, c0, scale);
        load_coefficients<N>(table_shift, c0, shift);
#pragma unroll
        for (int k = 0; k < N; ++k) {
            float f = to_f32(v.e[k]) * scale[k] + shift[k];
            if (relu && !(f > 0.0f) && f == f) f = 0.0f;
            o.e[k] = from_f32<T>(f);
        }
        store_pack<T, N>(y, i, o);
    }
}

#define BN_APPLY_SUMS_KERNEL(T, S, N, NAME)                                                        \
    extern "C" __global__ void NAME(                                                               \
        const T* x, T* y, const float* sum, const float* sq_sum, const float* gamma,               \
        const float* beta, float* running_mean, float* running_var, float* save_mean,              \
        float* save_inv_std, i64 n, int channels, float count, float eps, float momentum,          \
        int relu) {                                                                                \
        bn_apply_sums<T, N>(x, y, sum, sq_sum, gamma, beta, running_mean, running_var, save_mean,  \
                            save_inv_std, n, channels, count, eps, momentum, relu);                \
    }
BN_APPLY_SUMS_KERNEL(float, f32, 1, bn_apply_sums_channels_last_f32)
BN_APPLY_SUMS_KERNEL(half_t, f16, 1, bn_apply_sums_channels_last_f16)
BN_APPLY_SUMS_KERNEL(bf16_t, bf16, 1, bn_apply_sums_channels_last_bf16)
BN_APPLY_SUMS_KERNEL(float, f32, 4, bn_apply_sums_channels_last_vec_f32)
BN_APPLY_SUMS_KERNEL(half_t, f16, 8, bn_apply_sums_channels_last_vec_f16)
BN_APPLY_SUMS_KERNEL(bf16_t, bf16, 8, bn_apply_sums_channels_last_vec_bf16)

// The batch norm's dx from the coefficients cuDNN's dbn_weight computes (conv_bn.py's fused backward:
// dgrad + drelu + dbn_weight as one graph): dx = eq_dy[c] * dz + eq_x[c] * x + eq_b[c], over N-element
// packs (16-byte loads and stores in the `_vec` kernels: C a multiple of N, 16-byte aligned arrays,
// which the host checks; the float32 coefficients, 16-byte aligned allocations, in 16-byte loads too).
template <typename T, int N>
__device__ __forceinline__ void bn_dx_coefficients(const T* dz, const T* x, T* dx, const float* eq_dy,
                                                   const float* eq_x, const float* eq_b, i64 n, int channels) {
    const i64 packs = n / N;
    const bool narrow = n <= 0xffffffffLL;
    GRID_STRIDE(p, packs) {
        i64 i = p * N;
        int c0 = narrow ? (int)((unsigned)i % (unsigned)channels) : (int)(i % channels);
        Pack<T, N> g = load_pack<T, N>(dz, i);
        Pack<T, N> v = load_pack<T, N>(x, i);
        Pack<T, N> o;
        float a[N], b[N], e[N];
        load_coefficients<N>(eq_dy, c0, a);
        load_coefficients<N>(eq_x, c0, b);
        load_coefficients<N>(eq_b, c0, e);
#pragma unroll
        for (int k = 0; k < N; ++k)
            o.e[k] = from_f32<T>(a[k] * to_f32(g.e[k]) + b[k] * to_f32(v.e[k]) + e[k]);
        store_pack<T, N>(dx, i, o);
    }
}

#define BN_DX_KERNEL(T, N, NAME)                                                                   \
    extern "C" __global__ void NAME(const T* dz, const T* x, T* dx, const float* eq_dy,             \
                                    const float* eq_x, const float* eq_b, i64 n, int channels) {   \
        bn_dx_coefficients<T, N>(dz, x, dx, eq_dy, eq_x, eq_b, n, channels);                       \
    }
BN_DX_KERNEL(float, 1, bn_dx_coefficients_f32)
BN_DX_KERNEL(half_t, 1, bn_dx_coefficients_f16)
BN_DX_KERNEL(bf16_t, 1, bn_dx_coefficients_bf16)
BN_DX_KERNEL(float, 4, bn_dx_coefficients_vec_f32)
BN_DX_KERNEL(half_t, 8, bn_dx_coefficients_vec_f16)
BN_DX_KERNEL(bf16_t, 8, bn_dx_coefficients_vec_bf16)
