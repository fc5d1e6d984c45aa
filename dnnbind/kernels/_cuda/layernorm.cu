// Layer normalization over rows of a (rows, cols) tensor, cols contiguous. Statistics and
// parameters (gamma, beta, mean, inv_std, dgamma, dbeta) are in the accumulation type A (float,
// or double for double data); a null gamma/beta means ones/zeros. Every sum runs in an order
// fixed by the launch shape alone, so results are bitwise deterministic.

// Forward, one block per row: mean, then the biased variance from the centred values (two
// passes over the row, which stays in L1/L2, instead of E[x^2] - E[x]^2 and its cancellation),
// then y = (x - mean) * inv_std * gamma + beta.
#define LAYERNORM_KERNELS(T, S)                                                                    \
    extern "C" __global__ void layernorm_fwd_##S(const T* x, T* y, const Acc<T>::t* gamma,         \
                                                 const Acc<T>::t* beta, Acc<T>::t* mean_out,       \
                                                 Acc<T>::t* inv_std_out, i64 rows, i64 cols,       \
                                                 double eps) {                                     \
        typedef Acc<T>::t A;                                                                       \
        __shared__ A scratch[32];                                                                  \
        for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {                                       \
            const T* xr = x + r * cols;                                                            \
            A acc = (A)0;                                                                          \
            for (i64 c = threadIdx.x; c < cols; c += blockDim.x) acc += load(xr, c);               \
            const A mean = block_sum(acc, scratch) / (A)cols;                                      \
            acc = (A)0;                                                                            \
            for (i64 c = threadIdx.x; c < cols; c += blockDim.x) {                                 \
                A d = load(xr, c) - mean;                                                          \
                acc += d * d;                                                                      \
            }                                                                                      \
            const A inv_std = (A)1 / m_sqrt(block_sum(acc, scratch) / (A)cols + (A)eps);           \
            T* yr = y + r * cols;                                                                  \
            for (i64 c = threadIdx.x; c < cols; c += blockDim.x) {                                 \
                A v = (load(xr, c) - mean) * inv_std;                                              \
                if (gamma) v *= gamma[c];                                                          \
                if (beta) v += beta[c];                                                            \
                store(yr, c, v);                                                                   \
            }                                                                                      \
            if (threadIdx.x == 0) { mean_out[r] = mean; inv_std_out[r] = inv_std; }                \
        }                                                                                          \
    }                                                                                              \
    /* dx, one block per row: g = dy * gamma, xhat = (x - mean) * inv_std,                         \
       dx = inv_std * (g - mean(g) - xhat * mean(g * xhat)). */                                    \
    extern "C" __global__ void layernorm_bwd_dx_##S(const T* dy, const T* x, const Acc<T>::t* gamma,\
                                                    const Acc<T>::t* mean, const Acc<T>::t* inv_std,\
                                                    T* dx, i64 rows, i64 cols) {                   \
        typedef Acc<T>::t A;                                                                       \
        __shared__ A scratch[32];                                                                  \
        for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {                                       \
            const T* xr = x + r * cols;                                                            \
            const T* dyr = dy + r * cols;                                                          \
            const A mu = mean[r], inv = inv_std[r];                                                \
            A sum_g = (A)0, sum_gx = (A)0;                                                         \
            for (i64 c = threadIdx.x; c < cols; c += blockDim.x) {                                 \
                A g = load(dyr, c);                                                                \
                if (gamma) g *= gamma[c];                                                          \
                sum_g += g;                                                                        \
                sum_gx += g * (load(xr, c) - mu) * inv;                                            \
            }                                                                                      \
            const A mean_g = block_sum(sum_g, scratch) / (A)cols;                                  \
            const A mean_gx = block_sum(sum_gx, scratch) / (A)cols;                                \
            T* dxr = dx + r * cols;                                                                \
            for (i64 c = threadIdx.x; c < cols; c += blockDim.x) {                                 \
                A g = load(dyr, c);                                                                \
                if (gamma) g *= gamma[c];                                                          \
                A xhat = (load(xr, c) - mu) * inv;                                                 \
                store(dxr, c, inv * (g - mean_g - xhat * mean_gx));                                \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
    /* dgamma/dbeta, pass 1: block b sums rows [b*rows_per_block, ...) of dy * xhat and dy into    \
       partial_g[b, c] / partial_b[b, c]; a 32x8 thread tile reads 32 neighbouring columns of 8    \
       rows at a time (coalesced whatever cols), then folds its 8 row lanes in order. */           \
    extern "C" __global__ void layernorm_bwd_params_rows_##S(                                      \
        const T* dy, const T* x, const Acc<T>::t* mean, const Acc<T>::t* inv_std,                  \
        Acc<T>::t* partial_g, Acc<T>::t* partial_b, i64 rows, i64 cols, i64 rows_per_block) {      \
        typedef Acc<T>::t A;                                                                       \
        __shared__ A tile_g[8][33];                                                                \
        __shared__ A tile_b[8][33];                                                                \
        const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;                                    \
        const i64 r0 = (i64)blockIdx.x * rows_per_block;                                           \
        const i64 r1 = r0 + rows_per_block < rows ? r0 + rows_per_block : rows;                    \
        for (i64 c0 = 0; c0 < cols; c0 += 32) {                                                    \
            const i64 c = c0 + tx;                                                                 \
            A acc_g = (A)0, acc_b = (A)0;                                                          \
            if (c < cols)                                                                          \
                for (i64 r = r0 + ty; r < r1; r += 8) {                                            \
                    A d = load(dy, r * cols + c);                                                  \
                    acc_g += d * (load(x, r * cols + c) - mean[r]) * inv_std[r];                   \
                    acc_b += d;                                                                    \
                }                                                                                  \
            tile_g[ty][tx] = acc_g;                                                                \
            tile_b[ty][tx] = acc_b;                                                                \
            __syncthreads();                                                                       \
            if (ty == 0 && c < cols) {                                                             \
                A sg = (A)0, sb = (A)0;                                                            \
                for (int k = 0; k < 8; ++k) { sg += tile_g[k][tx]; sb += tile_b[k][tx]; }          \
                partial_g[(i64)blockIdx.x * cols + c] = sg;                                        \
                partial_b[(i64)blockIdx.x * cols + c] = sb;                                        \
            }                                                                                      \
            __syncthreads();                                                                       \
        }                                                                                          \
    }                                                                                              \
    /* pass 2: dgamma[c] / dbeta[c] = sums over the blocks' partials, in block order. */           \
    extern "C" __global__ void layernorm_bwd_params_final_##S(                                     \
        const Acc<T>::t* partial_g, const Acc<T>::t* partial_b, Acc<T>::t* dgamma,                 \
        Acc<T>::t* dbeta, i64 blocks, i64 cols) {                                                  \
        typedef Acc<T>::t A;                                                                       \
        GRID_STRIDE(c, cols) {                                                                     \
            A sg = (A)0, sb = (A)0;                                                                \
            for (i64 b = 0; b < blocks; ++b) {                                                     \
                sg += partial_g[b * cols + c];                                                     \
                sb += partial_b[b * cols + c];                                                     \
            }                                                                                      \
            dgamma[c] = sg;                                                                        \
            dbeta[c] = sb;                                                                         \
        }                                                                                          \
    }
FOR_FLOAT_TYPES(LAYERNORM_KERNELS)
