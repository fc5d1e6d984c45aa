// Special functions numeric.cu's unary table lacks (kernels/special.py is the NumPy reference):
//   bessel_i1_<t>(x, y, n): y = I1(x), the Cephes Chebyshev expansions (i1.c) on [0, 8] and (8, inf)
//   sinc_<t>(x, y, n):      y = sin(pi x) / (pi x), 1 at 0
// float16/bfloat16 compute in float32, float32 in float32, float64 in float64. x and y are
// contiguous arrays of n elements of one type.

__device__ __constant__ double I1_SMALL[29] = {
    2.77791411276104639959e-18, -2.11142121435816608115e-17, 1.55363195773620046921e-16,
    -1.10559694773538630805e-15, 7.60068429473540693410e-15, -5.04218550472791168711e-14,
    3.22379336594557470981e-13, -1.98397439776494371520e-12, 1.17361862988909016308e-11,
    -6.66348972350202774223e-11, 3.62559028155211703701e-10, -1.88724975172282928790e-09,
    9.38153738649577178388e-09, -4.44505912879632808065e-08, 2.00329475355213526229e-07,
    -8.56872026469545474066e-07, 3.47025130813767847674e-06, -1.32731636560394358279e-05,
    4.78156510755005422638e-05, -1.61760815825896745588e-04, 5.12285956168575772895e-04,
    -1.51357245063125314899e-03, 4.15642294431288815669e-03, -1.05640848946261981558e-02,
    2.47264490306265168283e-02, -5.29459812080949914269e-02, 1.02643658689847095384e-01,
    -1.76416518357834055153e-01, 2.52587186443633654823e-01};

__device__ __constant__ double I1_LARGE[25] = {
    7.51729631084210481353e-18, 4.41434832307170791151e-18, -4.65030536848935832153e-17,
    -3.20952592199342395980e-17, 2.96262899764595013876e-16, 3.30820231092092828324e-16,
    -1.88035477551078244854e-15, -3.81440307243700780478e-15, 1.04202769841288027642e-14,
    4.27244001671195135429e-14, -2.10154184277266431302e-14, -4.08355111109219731823e-13,
    -7.19855177624590851209e-13, 2.03562854414708950722e-12, 1.41258074366137813316e-11,
    3.25260358301548823856e-11, -1.89749581235054123450e-11, -5.58974346219658380687e-10,
    -3.83538038596423702205e-09, -2.63146884688951950684e-08, -2.51223623787020892529e-07,
    -3.88256480887769039346e-06, -1.10588938762623716291e-04, -9.76109749136146840777e-03,
    7.78576235018280120474e-01};

// Cephes chbevl: the Chebyshev series at y in [-2, 2], coefficients highest degree first.
template <typename A> __device__ __forceinline__ A chbevl(A y, const double* c, int n) {
    A b0 = (A)c[0], b1 = (A)0, b2 = (A)0;
    for (int k = 1; k < n; ++k) {
        b2 = b1;
        b1 = b0;
        b0 = y * b1 - b2 + (A)c[k];
    }
    return (A)0.5 * (b0 - b2);
}

__device__ __forceinline__ float m_sin(float x) { return sinf(x); }
__device__ __forceinline__ double m_sin(double x) { return sin(x); }

template <typename A> __device__ __forceinline__ A bessel_i1(A x) {
    A z = m_abs(x);
    A r;
    if (z <= (A)8) {
        r = chbevl(z / (A)2 - (A)2, I1_SMALL, 29) * z * m_exp(z);
    } else {
        r = m_exp(z) * chbevl((A)32 / z - (A)2, I1_LARGE, 25) / m_sqrt(z);
    }
    return x < (A)0 ? -r : r;
}

template <typename A> __device__ __forceinline__ A sinc(A x) {
    // as NumPy's sinc: sin(pi x) / (pi x) of the rounded product, 1 at 0
    if (x == (A)0) return (A)1;
    A px = (A)3.141592653589793238462643383279502884 * x;
    return m_sin(px) / px;
}

#define SPECIAL_KERNELS(T, S)                                                                 \
    extern "C" __global__ void bessel_i1_##S(const T* x, T* y, i64 n) {                       \
        GRID_STRIDE(i, n) { store(y, i, bessel_i1(load(x, i))); }                              \
    }                                                                                          \
    extern "C" __global__ void sinc_##S(const T* x, T* y, i64 n) {                            \
        GRID_STRIDE(i, n) { store(y, i, sinc(load(x, i))); }                                   \
    }
FOR_FLOAT_TYPES(SPECIAL_KERNELS)
