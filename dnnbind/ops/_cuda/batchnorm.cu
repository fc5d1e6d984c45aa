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
