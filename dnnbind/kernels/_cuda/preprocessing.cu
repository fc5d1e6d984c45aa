// Per-channel affine maps of the preprocessing layers. x is viewed as (outer, C, inner) and the
// parameters a, b hold C values of the accumulation type (float, double for double data).
// mode 0: y = x * a + b (b may be null: no offset)         rescaling, and its backward
// mode 1: y = (x - a) / max(sqrt(b), eps)                  normalization (a mean, b variance)
// mode 2: y = a + x * max(sqrt(b), eps)                    inverted normalization
// mode 3: y = x / max(sqrt(b), eps)                        normalization backward
// mode 4: y = x * max(sqrt(b), eps)                        inverted normalization backward
#define CHANNEL_AFFINE_KERNELS(T, S)                                                               \
    extern "C" __global__ void channel_affine_##S(const T* x, const Acc<T>::t* a,                  \
                                                  const Acc<T>::t* b, T* y, i64 total, i64 C,      \
                                                  i64 inner, int mode, double eps) {               \
        typedef Acc<T>::t A;                                                                       \
        GRID_STRIDE(i, total) {                                                                    \
            const i64 c = (i / inner) % C;                                                         \
            const A v = load(x, i);                                                                \
            A r;                                                                                   \
            if (mode == 0) {                                                                       \
                r = v * a[c] + (b ? b[c] : (A)0);                                                  \
            } else {                                                                               \
                const A sd = m_max(m_sqrt(b[c]), (A)eps);                                          \
                r = mode == 1 ? (v - a[c]) / sd : mode == 2 ? a[c] + v * sd : mode == 3 ? v / sd  \
                                                                                      : v * sd;    \
            }                                                                                      \
            store(y, i, r);                                                                        \
        }                                                                                          \
    }
FOR_FLOAT_TYPES(CHANNEL_AFFINE_KERNELS)
