// Binary search over a sorted 1-d sequence (kernels/search.py): one thread per value.

// NumPy's sort order: NaN after every number (for integer types `b != b` is false: plain <).
template <typename A> __device__ __forceinline__ bool sort_less(A a, A b) {
    return a < b || (b != b && a == a);
}

__device__ __forceinline__ int key(const int* p, i64 i) { return p[i]; }
__device__ __forceinline__ i64 key(const i64* p, i64 i) { return p[i]; }
__device__ __forceinline__ int key(const signed char* p, i64 i) { return p[i]; }
__device__ __forceinline__ int key(const unsigned char* p, i64 i) { return p[i]; }
__device__ __forceinline__ float key(const float* p, i64 i) { return p[i]; }
__device__ __forceinline__ double key(const double* p, i64 i) { return p[i]; }
__device__ __forceinline__ float key(const half_t* p, i64 i) { return to_f32(p[i]); }
__device__ __forceinline__ float key(const bf16_t* p, i64 i) { return to_f32(p[i]); }

// --- out[i] = the insertion index of vals[i] into seq[0 .. m): side left (right == 0) the first j
// with !(seq[j] < v), side right the first j with v < seq[j]; m when there is none.
#define SEARCH_KERNEL(T, S, IT, IS)                                                                 \
    extern "C" __global__ void searchsorted_##S##_##IS(const T* seq, const T* vals, IT* out, i64 m, \
                                                       i64 n, int right) {                          \
        GRID_STRIDE(i, n) {                                                                         \
            auto v = key(vals, i);                                                                  \
            i64 lo = 0, hi = m;                                                                     \
            while (lo < hi) {                                                                       \
                i64 mid = lo + ((hi - lo) >> 1);                                                    \
                auto s = key(seq, mid);                                                             \
                bool after = right ? !sort_less(v, s) : sort_less(s, v);                            \
                if (after) lo = mid + 1; else hi = mid;                                             \
            }                                                                                       \
            out[i] = (IT)lo;                                                                        \
        }                                                                                           \
    }
#define SEARCH_KERNELS(T, S) SEARCH_KERNEL(T, S, int, i32) SEARCH_KERNEL(T, S, i64, i64)
FOR_FLOAT_TYPES(SEARCH_KERNELS)
SEARCH_KERNELS(int, i32)
SEARCH_KERNELS(i64, i64)
SEARCH_KERNELS(signed char, i8)
SEARCH_KERNELS(unsigned char, u8)
SEARCH_KERNELS(unsigned char, bool)
