// Merge-layer kernels: elementwise maximum/minimum, their gradient, and the row copies of
// concatenation. Inputs are contiguous.

// --- out = max(a, b) (is_min: min), NaN-propagating as NumPy; ties keep a. The element chosen
// is copied, not converted, so the result is exact in every dtype.
#define EXTREMUM_KERNELS(T, S)                                                                     \
    extern "C" __global__ void extremum_##S(const T* a, const T* b, T* out, i64 n, int is_min) {   \
        typedef Acc<T>::t A;                                                                       \
        GRID_STRIDE(i, n) {                                                                        \
            A x = load(a, i), y = load(b, i);                                                      \
            bool keep_a = x != x || (is_min ? x <= y : x >= y);                                    \
            out[i] = keep_a ? a[i] : b[i];                                                         \
        }                                                                                          \
    }                                                                                              \
    /* dx = dy where x == y and no earlier input took the element (taken[i] != 0), else 0; then    \
       marks the elements this input took. Called once per input, in input order. */               \
    extern "C" __global__ void extremum_bwd_##S(const T* dy, const T* x, const T* y, T* dx,        \
                                                unsigned char* taken, i64 n) {                     \
        GRID_STRIDE(i, n) {                                                                        \
            bool hit = !taken[i] && load(x, i) == load(y, i);                                      \
            if (hit) taken[i] = 1;                                                                 \
            if (hit) dx[i] = dy[i]; else store(dx, i, 0.0f);                                       \
        }                                                                                          \
    }
FOR_FLOAT_TYPES(EXTREMUM_KERNELS)

// --- dst[o * dst_row + dst_off + m] = src[o * src_row + src_off + m] for o < rows, m < width,
// in units of U (the widest of 8/4/2/1 bytes that every size, offset and pointer allows).
// Concatenation copies each input into its column block of the output; its backward copies
// the blocks back out.
#define COPY_ROWS_KERNEL(U, US)                                                                    \
    extern "C" __global__ void copy_rows_##US(const U* src, U* dst, i64 rows, i64 width,           \
                                              i64 src_row, i64 src_off, i64 dst_row,               \
                                              i64 dst_off) {                                       \
        GRID_STRIDE(i, rows * width) {                                                             \
            i64 o = i / width, m = i - o * width;                                                  \
            dst[o * dst_row + dst_off + m] = src[o * src_row + src_off + m];                       \
        }                                                                                          \
    }
COPY_ROWS_KERNEL(unsigned long long, u8)
COPY_ROWS_KERNEL(unsigned int, u4)
COPY_ROWS_KERNEL(unsigned short, u2)
COPY_ROWS_KERNEL(unsigned char, u1)
