// Spatial dropout: one keep/drop draw per (sample, channel), applied to every spatial position.

// mask[i] = scale if u_i >= rate else 0, u_i uniform in [0, 1) from (seed, *counter, i); one
// block. Thread 0 reads the draw counter and advances it in the same launch (only it touches
// the counter; the others read the value from shared memory), so each launch, eager or a graph
// replay, draws a new mask with no host involvement.
#define SPATIAL_DROPOUT_MASK(A, S)                                                                 \
    extern "C" __global__ void spatial_dropout_mask_##S(A* mask, i64* counter, u64 seed, i64 n,    \
                                                        float rate, double scale) {                \
        __shared__ u64 draw;                                                                       \
        if (threadIdx.x == 0) {                                                                    \
            draw = (u64)*counter;                                                                  \
            *counter = (i64)(draw + 1);                                                            \
        }                                                                                          \
        __syncthreads();                                                                           \
        const u64 key = splitmix64(seed ^ splitmix64(draw));                                       \
        for (i64 i = threadIdx.x; i < n; i += blockDim.x) {                                        \
            float u = (float)(splitmix64(key + (u64)i) >> 40) * (1.0f / 16777216.0f);              \
            mask[i] = u >= rate ? (A)scale : (A)0;                                                 \
        }                                                                                          \
    }
SPATIAL_DROPOUT_MASK(float, f32)
SPATIAL_DROPOUT_MASK(double, f64)

// out[i] = x[i] * mask[n, c] for x viewed as (N, C, inner) (nhwc = 0) or (N, inner, C) (nhwc = 1).
#define CHANNEL_SCALE(T, S)                                                                        \
    extern "C" __global__ void channel_scale_##S(const T* x, const Acc<T>::t* mask, T* out,        \
                                                 i64 total, i64 C, i64 inner, int nhwc) {          \
        GRID_STRIDE(i, total) {                                                                    \
            i64 n = i / (C * inner);                                                               \
            i64 c = nhwc ? i % C : (i / inner) % C;                                                \
            store(out, i, load(x, i) * mask[n * C + c]);                                           \
        }                                                                                          \
    }
FOR_FLOAT_TYPES(CHANNEL_SCALE)
