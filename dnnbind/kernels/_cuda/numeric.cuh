// The numeric engine's device code (dnnbind.kernels._cuda.numeric): types, conversions, the op
// functions of the op tables, index arithmetic and the kernel templates. Every module the engine
// compiles is prelude.cuh + this file + a short generated tail that names one specialisation
// (numeric.py's _Body): templates here cost only their parse until that tail instantiates them.
//
// Conventions:
// * Storage types: float, double, half_t, bf16_t, bool_t (one byte 0/1) and the C integer types;
//   the compute type C of an op is float for float16/bfloat16, otherwise the storage type itself
//   (bool computes as signed char 0/1). cvt<D>(s) converts like NumPy's astype / ml_dtypes: floats
//   round to nearest even (directly, also from double and 64-bit ints: round to odd in float32
//   first, which makes the second rounding exact), float -> int truncates toward zero through a
//   64-bit int (out-of-range values wrap; NumPy calls them undefined), anything -> bool is != 0.
// * Integer arithmetic wraps (done in the unsigned type of the same width, so no signed overflow).
// * Offsets are element offsets. The "32" kernels index with 32-bit unsigned positions and signed
//   32-bit offsets (the host checks every reachable offset fits), dividing by the extents with
//   precomputed multipliers (FastDiv); the "64" kernels use 64-bit arithmetic throughout.
// * The modules compile with --fmad=false: a * b + c rounds twice, as NumPy computes it.

namespace nx {

typedef signed char i8;
typedef unsigned char u8;
typedef short i16;
typedef unsigned short u16;
typedef int i32;
typedef unsigned u32;

template <typename A, typename B> struct Same { enum { v = 0 }; };
template <typename A> struct Same<A, A> { enum { v = 1 }; };

// kind: 0 bool, 1 signed int, 2 unsigned int, 3 float16/bfloat16, 4 float, 5 double
template <typename T> struct Traits;
#define NX_TRAITS(T, KIND, BITS) \
    template <> struct Traits<T> { enum { kind = KIND, bits = BITS }; };
NX_TRAITS(bool, 0, 8) NX_TRAITS(bool_t, 0, 8)
NX_TRAITS(i8, 1, 8) NX_TRAITS(i16, 1, 16) NX_TRAITS(i32, 1, 32) NX_TRAITS(i64, 1, 64)
NX_TRAITS(u8, 2, 8) NX_TRAITS(u16, 2, 16) NX_TRAITS(u32, 2, 32) NX_TRAITS(u64, 2, 64)
NX_TRAITS(half_t, 3, 16) NX_TRAITS(bf16_t, 3, 16) NX_TRAITS(float, 4, 32) NX_TRAITS(double, 5, 64)
#undef NX_TRAITS
template <typename T> struct IsFloat { enum { v = Traits<T>::kind >= 3 }; };
template <typename T> struct IsInt { enum { v = Traits<T>::kind == 1 || Traits<T>::kind == 2 }; };
template <typename T> struct IsSigned { enum { v = Traits<T>::kind == 1 }; };

// The unsigned type integer arithmetic wraps in (unsigned int for the narrow types: no promotion to
// int can overflow there).
template <typename T> struct Wide { typedef u32 t; };
template <> struct Wide<i64> { typedef u64 t; };
template <> struct Wide<u64> { typedef u64 t; };

template <typename T> struct Lim;
#define NX_LIM(T, LO, HI) \
    template <> struct Lim<T> { __device__ static T lo() { return LO; } __device__ static T hi() { return HI; } };
NX_LIM(i8, (i8)-128, (i8)127) NX_LIM(u8, (u8)0, (u8)255) NX_LIM(i16, (i16)-32768, (i16)32767)
NX_LIM(u16, (u16)0, (u16)65535) NX_LIM(i32, (i32)(-2147483647 - 1), (i32)2147483647)
NX_LIM(u32, 0u, 4294967295u) NX_LIM(i64, (i64)(-9223372036854775807ll - 1), (i64)9223372036854775807ll)
NX_LIM(u64, 0ull, 18446744073709551615ull) NX_LIM(float, __int_as_float(0xff800000), __int_as_float(0x7f800000))
NX_LIM(double, __longlong_as_double(0xfff0000000000000ll), __longlong_as_double(0x7ff0000000000000ll))
#undef NX_LIM

// ------------------------------------------------------------------------------- conversions
__device__ __forceinline__ float arith(half_t v) { return to_f32(v); }
__device__ __forceinline__ float arith(bf16_t v) { return to_f32(v); }
__device__ __forceinline__ u8 arith(bool_t v) { return (u8)(v.v != 0); }
template <typename T> __device__ __forceinline__ T arith(T v) { return v; }

// float32 of d rounded to odd: a later rounding to a narrower float is then the correct rounding of d.
__device__ __forceinline__ float f32_round_odd(double d) {
    float f = __double2float_rz(d);
    if ((double)f != d) f = __int_as_float(__float_as_int(f) | 1);
    return f;
}

template <typename D, typename S> __device__ __forceinline__ D cvt(S s) {
    auto v = arith(s);
    typedef decltype(v) V;
    if constexpr (Same<D, bool_t>::v) {
        bool_t r;
        r.v = (u8)(v != (V)0);
        return r;
    } else if constexpr (Same<D, bool>::v) {
        return v != (V)0;
    } else if constexpr (Same<D, half_t>::v || Same<D, bf16_t>::v) {
        if constexpr (Same<V, float>::v) return from_f32<D>(v);
        else if constexpr (Same<V, double>::v) return from_f32<D>(f32_round_odd(v));
        else if constexpr (Traits<V>::bits <= 16) return from_f32<D>((float)v);
        else return from_f32<D>(f32_round_odd((double)v));
    } else if constexpr (IsFloat<D>::v) {
        return (D)v;
    } else if constexpr (IsFloat<V>::v) {  // float -> integer: truncate toward zero through 64 bits
        if constexpr (Traits<D>::bits == 64 && !IsSigned<D>::v) return v < (V)0 ? (D)(i64)v : (D)v;
        else return (D)(i64)v;
    } else {
        return (D)v;
    }
}

template <typename D, typename S> __device__ __forceinline__ D bitcast(S s) {
    static_assert(sizeof(D) == sizeof(S), "bitcast needs types of one size");
    union { S s; D d; } u;
    u.s = s;
    return u.d;
}

// ------------------------------------------------------------------------------- arithmetic
template <typename T> __device__ __forceinline__ T w_add(T a, T b) {
    if constexpr (IsInt<T>::v) { typedef typename Wide<T>::t U; return (T)((U)a + (U)b); }
    else return a + b;
}
template <typename T> __device__ __forceinline__ T w_sub(T a, T b) {
    if constexpr (IsInt<T>::v) { typedef typename Wide<T>::t U; return (T)((U)a - (U)b); }
    else return a - b;
}
template <typename T> __device__ __forceinline__ T w_mul(T a, T b) {
    if constexpr (IsInt<T>::v) { typedef typename Wide<T>::t U; return (T)((U)a * (U)b); }
    else return a * b;
}
template <typename T> __device__ __forceinline__ T w_neg(T a) { return w_sub((T)0, a); }

template <typename T> __device__ __forceinline__ bool is_nan(T v) {
    if constexpr (IsFloat<T>::v) return v != v;
    else return false;
}
// NumPy's maximum/minimum (NaN propagates; on ties the second operand) and fmax/fmin (NaN ignored).
template <typename T> __device__ __forceinline__ T np_maximum(T a, T b) { return is_nan(a) ? a : (a > b ? a : b); }
template <typename T> __device__ __forceinline__ T np_minimum(T a, T b) { return is_nan(a) ? a : (a < b ? a : b); }
template <typename T> __device__ __forceinline__ T np_fmax(T a, T b) {
    return is_nan(b) ? a : (is_nan(a) ? b : (a > b ? a : b));
}
template <typename T> __device__ __forceinline__ T np_fmin(T a, T b) {
    return is_nan(b) ? a : (is_nan(a) ? b : (a < b ? a : b));
}

// Math overloads (float / double).
#define NX_MATH1(NAME, F, D) \
    __device__ __forceinline__ float NAME(float x) { return F(x); } \
    __device__ __forceinline__ double NAME(double x) { return D(x); }
NX_MATH1(m_sqrt, sqrtf, sqrt) NX_MATH1(m_cbrt, cbrtf, cbrt) NX_MATH1(m_exp, expf, exp)
NX_MATH1(m_exp2, exp2f, exp2) NX_MATH1(m_expm1, expm1f, expm1) NX_MATH1(m_log, logf, log)
NX_MATH1(m_log2, log2f, log2) NX_MATH1(m_log10, log10f, log10) NX_MATH1(m_log1p, log1pf, log1p)
NX_MATH1(m_sin, sinf, sin) NX_MATH1(m_cos, cosf, cos) NX_MATH1(m_tan, tanf, tan)
NX_MATH1(m_asin, asinf, asin) NX_MATH1(m_acos, acosf, acos) NX_MATH1(m_atan, atanf, atan)
NX_MATH1(m_sinh, sinhf, sinh) NX_MATH1(m_cosh, coshf, cosh) NX_MATH1(m_tanh, tanhf, tanh)
NX_MATH1(m_asinh, asinhf, asinh) NX_MATH1(m_acosh, acoshf, acosh) NX_MATH1(m_atanh, atanhf, atanh)
NX_MATH1(m_floor, floorf, floor) NX_MATH1(m_ceil, ceilf, ceil) NX_MATH1(m_rint, rintf, rint)
NX_MATH1(m_trunc, truncf, trunc) NX_MATH1(m_erf, erff, erf) NX_MATH1(m_erfc, erfcf, erfc)
NX_MATH1(m_erfinv, erfinvf, erfinv) NX_MATH1(m_lgamma, lgammaf, lgamma) NX_MATH1(m_i0, cyl_bessel_i0f, cyl_bessel_i0)
NX_MATH1(m_fabs, fabsf, fabs)
#undef NX_MATH1
#define NX_MATH2(NAME, F, D) \
    __device__ __forceinline__ float NAME(float a, float b) { return F(a, b); } \
    __device__ __forceinline__ double NAME(double a, double b) { return D(a, b); }
NX_MATH2(m_pow, powf, pow) NX_MATH2(m_fmod, fmodf, fmod) NX_MATH2(m_atan2, atan2f, atan2)
NX_MATH2(m_hypot, hypotf, hypot) NX_MATH2(m_copysign, copysignf, copysign) NX_MATH2(m_nextafter, nextafterf, nextafter)
#undef NX_MATH2
__device__ __forceinline__ float m_ldexp(float a, int e) { return ldexpf(a, e); }
__device__ __forceinline__ double m_ldexp(double a, int e) { return ldexp(a, e); }
__device__ __forceinline__ bool m_signbit(float x) { return __float_as_int(x) < 0; }
__device__ __forceinline__ bool m_signbit(double x) { return __double_as_longlong(x) < 0; }

// NumPy's float floor division and remainder (npy_divmod, npy_floor_divide, npy_remainder).
template <typename F> __device__ __forceinline__ F npy_divmod(F a, F b, F* modulus) {
    F mod = m_fmod(a, b);
    if (!b) { *modulus = mod; return a / b; }
    F div = (a - mod) / b;
    if (mod) {
        if ((b < (F)0) != (mod < (F)0)) { mod += b; div -= (F)1; }
    } else {
        mod = m_copysign((F)0, b);
    }
    F floordiv;
    if (div) {
        floordiv = m_floor(div);
        if (div - floordiv > (F)0.5) floordiv += (F)1;
    } else {
        floordiv = m_copysign((F)0, a / b);
    }
    *modulus = mod;
    return floordiv;
}
template <typename F> __device__ __forceinline__ F npy_floor_divide(F a, F b) {
    F mod;
    if (!b) return a / b;
    return npy_divmod(a, b, &mod);
}
template <typename F> __device__ __forceinline__ F npy_remainder(F a, F b) {
    F mod;
    if (!b) return m_fmod(a, b);
    npy_divmod(a, b, &mod);
    return mod;
}
template <typename F> __device__ __forceinline__ F npy_logaddexp(F x, F y) {
    if (x == y) return x + (F)0.693147180559945309417232121458176568;  // log(2): also equal infinities
    F t = x - y;
    if (t > (F)0) return x + m_log1p(m_exp(-t));
    if (t <= (F)0) return y + m_log1p(m_exp(t));
    return t;  // NaN
}
template <typename F> __device__ __forceinline__ F npy_logaddexp2(F x, F y) {
    const F log2e = (F)1.442695040888963407359924681001892137;
    if (x == y) return x + (F)1;
    F t = x - y;
    if (t > (F)0) return x + log2e * m_log1p(m_exp2(-t));
    if (t <= (F)0) return y + log2e * m_log1p(m_exp2(t));
    return t;
}

// Integer division rules of NumPy: x // 0 and x % 0 are 0, MIN // -1 is MIN, MIN % -1 is 0.
template <typename T> __device__ __forceinline__ T int_floor_divide(T a, T b) {
    if (b == (T)0) return (T)0;
    if constexpr (IsSigned<T>::v) {
        if (a == Lim<T>::lo() && b == (T)-1) return a;
        T q = (T)(a / b);
        if (((a > (T)0) != (b > (T)0)) && (T)(q * b) != a) q = (T)(q - 1);
        return q;
    } else {
        return (T)(a / b);
    }
}
template <typename T> __device__ __forceinline__ T int_mod(T a, T b) {
    if (b == (T)0) return (T)0;
    if constexpr (IsSigned<T>::v) {
        if (a == Lim<T>::lo() && b == (T)-1) return (T)0;
        T r = (T)(a % b);
        if (r != (T)0 && ((r < (T)0) != (b < (T)0))) r = (T)(r + b);
        return r;
    } else {
        return (T)(a % b);
    }
}
template <typename T> __device__ __forceinline__ T int_fmod(T a, T b) {
    if (b == (T)0) return (T)0;
    if constexpr (IsSigned<T>::v) {
        if (a == Lim<T>::lo() && b == (T)-1) return (T)0;
    }
    return (T)(a % b);
}
// b >= 0: a ** b wrapping; b < 0 (NumPy raises): 1 for a == 1, +-1 for a == -1, else 0.
template <typename T> __device__ __forceinline__ T int_power(T a, T b) {
    if constexpr (IsSigned<T>::v) {
        if (b < (T)0) {
            if (a == (T)1) return (T)1;
            if (a == (T)-1) return (b & (T)1) ? (T)-1 : (T)1;
            return (T)0;
        }
    }
    T r = (T)1;
    T base = a;
    typedef typename Wide<T>::t U;
    U e = (U)b;
    while (e) {
        if (e & 1u) r = w_mul(r, base);
        base = w_mul(base, base);
        e >>= 1;
    }
    return r;
}
template <typename T> __device__ __forceinline__ T int_shl(T a, T b) {
    typedef typename Wide<T>::t U;
    if ((U)b < (U)Traits<T>::bits) return (T)((U)a << (U)b);
    return (T)0;
}
template <typename T> __device__ __forceinline__ T int_shr(T a, T b) {
    typedef typename Wide<T>::t U;
    if constexpr (Traits<T>::bits == 64) {
        if ((u64)b < 64ull) return (T)(a >> (int)b);
    } else {
        if ((U)b < (U)Traits<T>::bits) return (T)(a >> (int)b);
    }
    if constexpr (IsSigned<T>::v) return a < (T)0 ? (T)-1 : (T)0;
    else return (T)0;
}
template <typename T> __device__ __forceinline__ T int_abs(T a) {
    if constexpr (IsSigned<T>::v) return a < (T)0 ? w_neg(a) : a;
    else return a;
}
template <typename T> __device__ __forceinline__ T int_sign(T a) {
    if constexpr (IsSigned<T>::v) return (T)((a > (T)0) - (a < (T)0));
    else return (T)(a != (T)0);
}
template <typename T> __device__ __forceinline__ T int_gcd(T a, T b) {
    a = int_abs(a);
    b = int_abs(b);
    while (a != (T)0) { T c = a; a = (T)(b % a); b = c; }
    return b;
}
template <typename T> __device__ __forceinline__ T int_lcm(T a, T b) {
    a = int_abs(a);
    b = int_abs(b);
    T g = int_gcd(a, b);
    return g == (T)0 ? (T)0 : w_mul((T)(a / g), b);
}

// ------------------------------------------------------------------------- the unary op table
// un_<name>(x, p0, p1) of compute type C. Float functions of an integer compute type compute in
// double (NumPy uses float16/float32 for 8/16-bit ints before the integer result's cast).
#define NX_FLOAT_UNARY(NAME, EXPR)                                                                \
    template <typename F> __device__ __forceinline__ F un_##NAME##_f(F x, double p0, double p1) {  \
        (void)p0; (void)p1;                                                                        \
        return (F)(EXPR);                                                                          \
    }                                                                                              \
    template <typename C> __device__ __forceinline__ auto un_##NAME(C x, double p0, double p1) {   \
        if constexpr (IsFloat<C>::v) return un_##NAME##_f<C>(x, p0, p1);                          \
        else return un_##NAME##_f<double>((double)x, p0, p1);                                     \
    }
NX_FLOAT_UNARY(sqrt, m_sqrt(x))
NX_FLOAT_UNARY(rsqrt, (F)1 / m_sqrt(x))
NX_FLOAT_UNARY(cbrt, m_cbrt(x))
NX_FLOAT_UNARY(exp, m_exp(x))
NX_FLOAT_UNARY(exp2, m_exp2(x))
NX_FLOAT_UNARY(expm1, m_expm1(x))
NX_FLOAT_UNARY(log, m_log(x))
NX_FLOAT_UNARY(log2, m_log2(x))
NX_FLOAT_UNARY(log10, m_log10(x))
NX_FLOAT_UNARY(log1p, m_log1p(x))
NX_FLOAT_UNARY(sin, m_sin(x))
NX_FLOAT_UNARY(cos, m_cos(x))
NX_FLOAT_UNARY(tan, m_tan(x))
NX_FLOAT_UNARY(arcsin, m_asin(x))
NX_FLOAT_UNARY(arccos, m_acos(x))
NX_FLOAT_UNARY(arctan, m_atan(x))
NX_FLOAT_UNARY(sinh, m_sinh(x))
NX_FLOAT_UNARY(cosh, m_cosh(x))
NX_FLOAT_UNARY(tanh, m_tanh(x))
NX_FLOAT_UNARY(arcsinh, m_asinh(x))
NX_FLOAT_UNARY(arccosh, m_acosh(x))
NX_FLOAT_UNARY(arctanh, m_atanh(x))
NX_FLOAT_UNARY(erf, m_erf(x))
NX_FLOAT_UNARY(erfc, m_erfc(x))
NX_FLOAT_UNARY(erfinv, m_erfinv(x))
NX_FLOAT_UNARY(lgamma, m_lgamma(x))
NX_FLOAT_UNARY(i0, m_i0(x))
// the reference's two-sided form: no overflow of exp, relative precision in both tails
NX_FLOAT_UNARY(sigmoid, x >= (F)0 ? (F)1 / ((F)1 + m_exp(-m_fabs(x))) : m_exp(-m_fabs(x)) / ((F)1 + m_exp(-m_fabs(x))))
NX_FLOAT_UNARY(softplus, npy_logaddexp(x, (F)0))
NX_FLOAT_UNARY(scale_shift, x * (F)p0 + (F)p1)
NX_FLOAT_UNARY(power_scalar, m_pow(x, (F)p0))
NX_FLOAT_UNARY(clip, np_minimum(np_maximum(x, (F)p0), (F)p1))
NX_FLOAT_UNARY(leaky_relu, x >= (F)0 ? x : x * (F)p0)
NX_FLOAT_UNARY(elu, x > (F)0 ? x : (F)p0 * m_expm1(np_minimum(x, (F)0)))
#undef NX_FLOAT_UNARY

// Ops an integer computes in its own type (rounding ops are the identity there).
#define NX_EXACT_UNARY(NAME, FEXPR, IEXPR)                                                        \
    template <typename C> __device__ __forceinline__ C un_##NAME(C x, double, double) {           \
        if constexpr (IsFloat<C>::v) return (C)(FEXPR);                                            \
        else return (C)(IEXPR);                                                                    \
    }
NX_EXACT_UNARY(negative, -x, w_neg(x))
NX_EXACT_UNARY(positive, x, x)
NX_EXACT_UNARY(abs, m_fabs(x), int_abs(x))
NX_EXACT_UNARY(sign, x > (C)0 ? (C)1 : (x < (C)0 ? (C)-1 : (x == (C)0 ? (C)0 : x)), int_sign(x))
NX_EXACT_UNARY(square, x * x, w_mul(x, x))
NX_EXACT_UNARY(reciprocal, (C)1 / x, x == (C)0 ? (C)0 : (C)((C)1 / x))
NX_EXACT_UNARY(floor, m_floor(x), x)
NX_EXACT_UNARY(ceil, m_ceil(x), x)
NX_EXACT_UNARY(round, m_rint(x), x)
NX_EXACT_UNARY(trunc, m_trunc(x), x)
NX_EXACT_UNARY(relu, np_maximum(x, (C)0), np_maximum(x, (C)0))
#undef NX_EXACT_UNARY
template <typename C> __device__ __forceinline__ C un_bitwise_invert(C x, double, double) {
    static_assert(IsInt<C>::v, "bitwise_invert needs an integer compute type");
    return (C)~x;
}

template <typename T> __device__ __forceinline__ bool int_negative(T a) {
    if constexpr (IsSigned<T>::v) return a < (T)0;
    else return false;
}
// Predicates (bool results).
#define NX_PREDICATE(NAME, FEXPR, IEXPR)                                                          \
    template <typename C> __device__ __forceinline__ bool un_##NAME(C x, double, double) {        \
        if constexpr (IsFloat<C>::v) return (FEXPR);                                               \
        else return (IEXPR);                                                                       \
    }
NX_PREDICATE(isnan, x != x, false)
NX_PREDICATE(isinf, m_fabs(x) == Lim<C>::hi(), false)
NX_PREDICATE(isfinite, x == x && m_fabs(x) != Lim<C>::hi(), true)
NX_PREDICATE(isposinf, x == Lim<C>::hi(), false)
NX_PREDICATE(isneginf, x == Lim<C>::lo(), false)
NX_PREDICATE(signbit, m_signbit(x), int_negative(x))
NX_PREDICATE(logical_not, x == (C)0, x == (C)0)
#undef NX_PREDICATE

// ------------------------------------------------------------------------ the binary op table
#define NX_FLOAT_BINARY(NAME, EXPR)                                                               \
    template <typename F> __device__ __forceinline__ F bin_##NAME##_f(F a, F b) { return (F)(EXPR); } \
    template <typename C> __device__ __forceinline__ auto bin_##NAME(C a, C b) {                  \
        if constexpr (IsFloat<C>::v) return bin_##NAME##_f<C>(a, b);                             \
        else return bin_##NAME##_f<double>((double)a, (double)b);                                 \
    }
NX_FLOAT_BINARY(divide, a / b)
NX_FLOAT_BINARY(arctan2, m_atan2(a, b))
NX_FLOAT_BINARY(hypot, m_hypot(a, b))
NX_FLOAT_BINARY(copysign, m_copysign(a, b))
NX_FLOAT_BINARY(nextafter, m_nextafter(a, b))
NX_FLOAT_BINARY(logaddexp, npy_logaddexp(a, b))
NX_FLOAT_BINARY(logaddexp2, npy_logaddexp2(a, b))
NX_FLOAT_BINARY(heaviside, a != a ? a : (a == (F)0 ? b : (a < (F)0 ? (F)0 : (F)1)))
NX_FLOAT_BINARY(ldexp, m_ldexp(a, cvt<int>(b)))
#undef NX_FLOAT_BINARY

#define NX_EXACT_BINARY(NAME, FEXPR, IEXPR)                                                       \
    template <typename C> __device__ __forceinline__ C bin_##NAME(C a, C b) {                     \
        if constexpr (IsFloat<C>::v) return (C)(FEXPR);                                            \
        else return (C)(IEXPR);                                                                    \
    }
NX_EXACT_BINARY(add, a + b, w_add(a, b))
NX_EXACT_BINARY(subtract, a - b, w_sub(a, b))
NX_EXACT_BINARY(multiply, a * b, w_mul(a, b))
NX_EXACT_BINARY(floor_divide, npy_floor_divide(a, b), int_floor_divide(a, b))
NX_EXACT_BINARY(mod, npy_remainder(a, b), int_mod(a, b))
NX_EXACT_BINARY(fmod, m_fmod(a, b), int_fmod(a, b))
NX_EXACT_BINARY(power, m_pow(a, b), int_power(a, b))
NX_EXACT_BINARY(maximum, np_maximum(a, b), np_maximum(a, b))
NX_EXACT_BINARY(minimum, np_minimum(a, b), np_minimum(a, b))
NX_EXACT_BINARY(fmax, np_fmax(a, b), np_fmax(a, b))
NX_EXACT_BINARY(fmin, np_fmin(a, b), np_fmin(a, b))
#undef NX_EXACT_BINARY

#define NX_INT_BINARY(NAME, EXPR)                                                                 \
    template <typename C> __device__ __forceinline__ C bin_##NAME(C a, C b) {                     \
        static_assert(IsInt<C>::v, #NAME " needs an integer compute type");                       \
        return (C)(EXPR);                                                                          \
    }
NX_INT_BINARY(bitwise_and, a & b)
NX_INT_BINARY(bitwise_or, a | b)
NX_INT_BINARY(bitwise_xor, a ^ b)
NX_INT_BINARY(left_shift, int_shl(a, b))
NX_INT_BINARY(right_shift, int_shr(a, b))
NX_INT_BINARY(gcd, int_gcd(a, b))
NX_INT_BINARY(lcm, int_lcm(a, b))
#undef NX_INT_BINARY

#define NX_BOOL_BINARY(NAME, EXPR) \
    template <typename C> __device__ __forceinline__ bool bin_##NAME(C a, C b) { return (EXPR); }
NX_BOOL_BINARY(equal, a == b)
NX_BOOL_BINARY(not_equal, a != b)
NX_BOOL_BINARY(less, a < b)
NX_BOOL_BINARY(less_equal, a <= b)
NX_BOOL_BINARY(greater, a > b)
NX_BOOL_BINARY(greater_equal, a >= b)
NX_BOOL_BINARY(logical_and, a != (C)0 && b != (C)0)
NX_BOOL_BINARY(logical_or, a != (C)0 || b != (C)0)
NX_BOOL_BINARY(logical_xor, (a != (C)0) != (b != (C)0))
#undef NX_BOOL_BINARY

// ------------------------------------------------------------------------------ index arithmetic
// n / d for n < 2^31 by a multiply and a shift (CUTLASS's FastDivmod): mul = ceil(2^p / d),
// p = 31 + ceil(log2 d), shr = p - 32; d == 1 has mul == 0.
struct FastDiv { u32 d, mul, shr; };
__device__ __forceinline__ u32 fdiv(u32 n, const FastDiv& f) { return f.mul ? (__umulhi(n, f.mul) >> f.shr) : n; }

// Element strides of NOPS operands over an index space of `ndim` (<= MAXD) extents, innermost last.
// (numeric.py's geo_dtype is the same record; MAXD is 4, 8 or 16 by the number of merged axes.)
template <int NOPS, int MAXD> struct Geo32 { int ndim; FastDiv dim[MAXD]; int stride[NOPS][MAXD]; };
template <int NOPS, int MAXD> struct Geo64 { int ndim; int pad; i64 dim[MAXD]; i64 stride[NOPS][MAXD]; };

// A position divided by an extent: FastDiv's multiply for the 32-bit records, a division for the 64-bit.
__device__ __forceinline__ u32 div_by(u32 n, const FastDiv& f) { return fdiv(n, f); }
__device__ __forceinline__ u32 extent(const FastDiv& f) { return f.d; }
__device__ __forceinline__ i64 div_by(i64 n, i64 d) { return n / d; }
__device__ __forceinline__ i64 extent(i64 d) { return d; }

// The operands' offsets of position i (P: u32 or i64; O: the offset type, int or i64). The loops are
// unrolled to MAXD with the rank as a uniform guard, so the parameter record is only indexed by
// constants (a dynamic index would copy it to local memory).
template <int NOPS, int MAXD, class G, typename P, typename O>
__device__ __forceinline__ void offsets_of(const G& g, P i, O (&off)[NOPS]) {
#pragma unroll
    for (int k = 0; k < NOPS; ++k) off[k] = 0;
#pragma unroll
    for (int d = MAXD - 1; d >= 1; --d) {
        if (d < g.ndim) {
            const P q = div_by(i, g.dim[d]);
            const O r = (O)(i - q * extent(g.dim[d]));
#pragma unroll
            for (int k = 0; k < NOPS; ++k) off[k] += r * g.stride[k][d];
            i = q;
        }
    }
#pragma unroll
    for (int k = 0; k < NOPS; ++k) off[k] += (O)i * g.stride[k][0];
}
template <int NOPS, int MAXD> __device__ __forceinline__ void offsets(const Geo32<NOPS, MAXD>& g, u32 i,
                                                                      int (&off)[NOPS]) {
    offsets_of<NOPS, MAXD>(g, i, off);
}
template <int NOPS, int MAXD> __device__ __forceinline__ void offsets(const Geo64<NOPS, MAXD>& g, i64 i,
                                                                      i64 (&off)[NOPS]) {
    offsets_of<NOPS, MAXD>(g, i, off);
}

// An index into an axis of n > 0 elements: negative ones count from the end, the rest are clamped.
template <typename I> __device__ __forceinline__ i64 clamp_index(I v, i64 n) {
    if constexpr (IsSigned<I>::v) {
        i64 j = (i64)v;
        if (j < 0) j += n;
        return j < 0 ? 0 : (j >= n ? n - 1 : j);
    } else {
        u64 j = (u64)v;
        return j >= (u64)n ? n - 1 : (i64)j;
    }
}

// Raw element units (copies move bits, never values).
template <int BYTES> struct Unit;
template <> struct Unit<1> { typedef u8 t; };
template <> struct Unit<2> { typedef u16 t; };
template <> struct Unit<4> { typedef u32 t; };
template <> struct Unit<8> { typedef u64 t; };
template <> struct Unit<16> { typedef uint4 t; };

// A warp shuffle of any trivially copyable value, 32 bits at a time.
template <typename T> __device__ __forceinline__ T shfl_down(T v, int o) {
    union { T v; u32 w[(sizeof(T) + 3) / 4]; } u;
    u.v = v;
#pragma unroll
    for (int k = 0; k < (int)((sizeof(T) + 3) / 4); ++k) u.w[k] = __shfl_down_sync(0xffffffffu, u.w[k], o);
    return u.v;
}

// Gathers and scatters: the element offset of indices idx[0..g.k) into the first g.k axes.
struct NdGeo { int k; int pad; i64 dim[16]; i64 stride[16]; };
template <typename I> __device__ __forceinline__ i64 nd_offset(const NdGeo& g, const I* idx) {
    i64 off = 0;
#pragma unroll
    for (int t = 0; t < 16; ++t)
        if (t < g.k) off += clamp_index(idx[t], g.dim[t]) * g.stride[t];
    return off;
}

__device__ __forceinline__ void atomic_add(float* p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(double* p, double v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(i32* p, i32 v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(u32* p, u32 v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(i64* p, i64 v) { atomicAdd((unsigned long long*)p, (unsigned long long)v); }
__device__ __forceinline__ void atomic_add(u64* p, u64 v) { atomicAdd((unsigned long long*)p, (unsigned long long)v); }

// Padding: per (merged) axis the output extent, the source extent n, the padding before (lo) and the
// source stride. MODE: 0 constant, 1 edge, 2 reflect, 3 symmetric, 4 wrap (numeric.py's PAD_MODES).
template <int MAXD> struct PadGeo32 { int ndim; FastDiv dim[MAXD]; int n[MAXD]; int lo[MAXD]; int stride[MAXD]; };
template <int MAXD> struct PadGeo64 { int ndim; int pad; i64 dim[MAXD]; i64 n[MAXD]; i64 lo[MAXD]; i64 stride[MAXD]; };

template <int MODE, typename I> __device__ __forceinline__ I pad_coord(I c, I n, bool* inside) {
    if constexpr (MODE == 0) {
        if (c < 0 || c >= n) *inside = false;
        return c;
    } else if constexpr (MODE == 1) {
        return c < 0 ? (I)0 : (c >= n ? n - 1 : c);
    } else if constexpr (MODE == 2) {  // reflect about the edge elements: period 2(n - 1)
        if (n == 1) return 0;
        const I p = 2 * (n - 1);
        I m = c % p;
        if (m < 0) m += p;
        return m >= n ? p - m : m;
    } else if constexpr (MODE == 3) {  // symmetric: the edge repeated, period 2n
        const I p = 2 * n;
        I m = c % p;
        if (m < 0) m += p;
        return m >= n ? p - 1 - m : m;
    } else {
        I m = c % n;
        return m < 0 ? m + n : m;
    }
}
// The source offset of output position i, false where "constant" pads (P, O as offsets_of).
template <int MODE, int MAXD, class G, typename P, typename O>
__device__ __forceinline__ bool pad_source_of(const G& g, P i, i64* src) {
    bool inside = true;
    O off = 0;
#pragma unroll
    for (int d = MAXD - 1; d >= 0; --d) {
        if (d < g.ndim) {
            O c;
            if (d > 0) {
                const P q = div_by(i, g.dim[d]);
                c = (O)(i - q * extent(g.dim[d]));
                i = q;
            } else {
                c = (O)i;
            }
            off += pad_coord<MODE, O>(c - (O)g.lo[d], (O)g.n[d], &inside) * (O)g.stride[d];
        }
    }
    *src = off;
    return inside;
}
template <int MODE, int MAXD> __device__ __forceinline__ bool pad_source(const PadGeo32<MAXD>& g, u32 i, i64* src) {
    return pad_source_of<MODE, MAXD, PadGeo32<MAXD>, u32, int>(g, i, src);
}
template <int MODE, int MAXD> __device__ __forceinline__ bool pad_source(const PadGeo64<MAXD>& g, i64 i, i64* src) {
    return pad_source_of<MODE, MAXD, PadGeo64<MAXD>, i64, i64>(g, i, src);
}

// Philox4x32-10 (Salmon et al. 2011), as numeric.philox_uint32: the counter words c, the key (k0, k1).
__device__ __forceinline__ void philox10(u32 (&c)[4], u32 k0, u32 k1) {
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        const u32 hi0 = __umulhi(c[0], 0xD2511F53u), lo0 = c[0] * 0xD2511F53u;
        const u32 hi1 = __umulhi(c[2], 0xCD9E8D57u), lo1 = c[2] * 0xCD9E8D57u;
        const u32 n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
        c[0] = n0; c[1] = lo1; c[2] = n2; c[3] = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
}
// float32 in [0, 1) from the top 24 bits (exact).
__device__ __forceinline__ float uniform01(u32 bits) { return (float)(bits >> 8) * 5.9604644775390625e-08f; }
// erfinv by M. Giles' single-precision polynomials, evaluated in double as numeric._erfinv_giles.
__device__ __forceinline__ double erfinv_giles(double x) {
    const double w = -log((1.0 - x) * (1.0 + x));
    double p;
    if (w < 5.0) {
        const double ws = w - 2.5;
        p = 2.81022636e-08;
        p = 3.43273939e-07 + p * ws;
        p = -3.5233877e-06 + p * ws;
        p = -4.39150654e-06 + p * ws;
        p = 0.00021858087 + p * ws;
        p = -0.00125372503 + p * ws;
        p = -0.00417768164 + p * ws;
        p = 0.246640727 + p * ws;
        p = 1.50140941 + p * ws;
    } else {
        const double wl = sqrt(w > 0.0 ? w : 0.0) - 3.0;
        p = -0.000200214257;
        p = 0.000100950558 + p * wl;
        p = 0.00134934322 + p * wl;
        p = -0.00367342844 + p * wl;
        p = 0.00573950773 + p * wl;
        p = -0.0076224613 + p * wl;
        p = 0.00943887047 + p * wl;
        p = 1.00167406 + p * wl;
        p = 2.83297682 + p * wl;
    }
    return p * x;
}

// ---------------------------------------------------------------------------- elementwise kernels
// Op: struct with  `static const int nin;`, `typedef ... TO;`, per input k `typedef Tk` (T0..T2) and
// `static const bool scalar_k`, and `__device__ TO apply(const In& in, args) const`. The engine
// itself lives in the generated tail (numeric.py writes the loads per input), because the number of
// inputs and which of them are scalars differ per call.

// ------------------------------------------------------------------------------------ reductions
// R: typedef Tin, Acc, TO; static Acc identity(); static Acc make(Tin v, i64 r) (r: the position
// along the reduced extent); static Acc combine(Acc a, Acc b); static TO finish(Acc a, i64 count).
// Rows (inner == 1) reduce per block or per warp with VW-element slots (slot j of a chunk holds
// elements [j*VW, j*VW + VW), thread t takes slots t, t + nthreads, ...; each slot adds in order):
// the summation order depends on the shape alone, not on the alignment that picks vector loads.

template <class R, int B> __device__ __forceinline__ typename R::Acc block_combine(typename R::Acc acc,
                                                                                   typename R::Acc* smem) {
    smem[threadIdx.x] = acc;
    __syncthreads();
#pragma unroll
    for (int s = B / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) smem[threadIdx.x] = R::combine(smem[threadIdx.x], smem[threadIdx.x + s]);
        __syncthreads();
    }
    typename R::Acc r = smem[0];
    __syncthreads();
    return r;
}
template <class R> __device__ __forceinline__ typename R::Acc warp_combine(typename R::Acc acc) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc = R::combine(acc, shfl_down(acc, o));
    return acc;
}

// The slots of [start, end) of row `base` that thread `t` of `nt` takes, combined into acc.
template <class R, int VW> __device__ __forceinline__ typename R::Acc row_slots(
        const typename R::Tin* x, i64 base, i64 start, i64 end, int t, int nt, bool vec, typename R::Acc acc) {
    typedef typename R::Tin T;
    for (i64 e0 = start + (i64)t * VW; e0 < end; e0 += (i64)nt * VW) {
        if (VW > 1 && vec && e0 + VW <= end) {
            Pack<T, VW> p = load_pack<T, VW>(x, base + e0);
#pragma unroll
            for (int v = 0; v < VW; ++v) acc = R::combine(acc, R::make(p.e[v], e0 + v));
        } else {
#pragma unroll
            for (int v = 0; v < VW; ++v)
                if (e0 + v < end) acc = R::combine(acc, R::make(x[base + e0 + v], e0 + v));
        }
    }
    return acc;
}

// One block of B threads per (row, split): rows of `len` elements, split into chunks of `chunk`
// (a multiple of B * VW). nsplit == 1: the finished value to out[row]; else partial[row * nsplit + s].
template <class R, int B, int VW> __device__ void reduce_rows_block(
        const typename R::Tin* x, typename R::TO* out, typename R::Acc* partial, i64 rows, i64 len, i64 chunk,
        i64 nsplit, int vec, i64 count) {
    __shared__ typename R::Acc smem[B];
    for (i64 job = blockIdx.x; job < rows * nsplit; job += gridDim.x) {
        i64 row = job / nsplit, s = job - row * nsplit;
        i64 start = s * chunk, end = start + chunk < len ? start + chunk : len;
        typename R::Acc acc = row_slots<R, VW>(x, row * len, start, end, threadIdx.x, B, vec != 0, R::identity());
        acc = block_combine<R, B>(acc, smem);
        if (threadIdx.x == 0) {
            if (nsplit == 1) out[row] = R::finish(acc, count);
            else partial[job] = acc;
        }
    }
}

// One warp per row (blocks of 8 warps).
template <class R, int VW> __device__ void reduce_rows_warp(const typename R::Tin* x, typename R::TO* out, i64 rows,
                                                            i64 len, int vec, i64 count) {
    int lane = threadIdx.x & 31;
    i64 warps = (i64)gridDim.x * (blockDim.x >> 5);
    for (i64 row = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5; row < rows; row += warps) {
        typename R::Acc acc = row_slots<R, VW>(x, row * len, 0, len, lane, 32, vec != 0, R::identity());
        acc = warp_combine<R>(acc);
        if (lane == 0) out[row] = R::finish(acc, count);
    }
}

// x as (outer, len, inner), one thread per (o, split, k) (consecutive threads: consecutive k, so
// the loads coalesce); each adds its chunk of the reduced extent in order.
template <class R, typename Idx> __device__ void reduce_cols(const typename R::Tin* x, typename R::TO* out,
                                                             typename R::Acc* partial, Idx outer, Idx len, Idx inner,
                                                             Idx chunk, Idx nsplit, i64 count) {
    Idx total = outer * nsplit * inner;
    for (Idx j = (Idx)blockIdx.x * blockDim.x + threadIdx.x; j < total; j += (Idx)gridDim.x * blockDim.x) {
        Idx t = j / inner, k = j - t * inner;
        Idx o = t / nsplit, s = t - o * nsplit;
        Idx r0 = s * chunk, r1 = r0 + chunk < len ? r0 + chunk : len;
        typename R::Acc acc = R::identity();
        const typename R::Tin* p = x + (o * len) * inner + k;
        for (Idx r = r0; r < r1; ++r) acc = R::combine(acc, R::make(p[r * inner], (i64)r));
        if (nsplit == 1) out[o * inner + k] = R::finish(acc, count);
        else partial[j] = acc;
    }
}

// Reducers. V: the value type after the reference's conversion (S = its storage/src type, A the
// accumulator); the generated tail picks one of these with its types.
template <typename TIN, typename S, typename A, typename TOUT, int OP> struct Reducer {
    // OP: 0 sum, 1 prod, 2 max, 3 min, 4 mean, 5 any, 6 all
    typedef TIN Tin;
    typedef A Acc;
    typedef TOUT TO;
    __device__ static __forceinline__ A identity() {
        if constexpr (OP == 0 || OP == 4 || OP == 5) return (A)0;
        else if constexpr (OP == 1 || OP == 6) return (A)1;
        else if constexpr (OP == 2) return Lim<A>::lo();
        else return Lim<A>::hi();
    }
    __device__ static __forceinline__ A make(TIN v, i64) {
        if constexpr (OP == 5 || OP == 6) return (A)cvt<bool>(v);
        else return cvt<A>(cvt<S>(v));
    }
    __device__ static __forceinline__ A combine(A a, A b) {
        if constexpr (OP == 0 || OP == 4) return w_add(a, b);
        else if constexpr (OP == 1) return w_mul(a, b);
        else if constexpr (OP == 2) return np_maximum(a, b);
        else if constexpr (OP == 3) return np_minimum(a, b);
        else if constexpr (OP == 5) return (A)(a | b);
        else return (A)(a & b);
    }
    __device__ static __forceinline__ TOUT finish(A a, i64 count) {
        if constexpr (OP == 4) return cvt<TOUT>(a / (A)count);
        else return cvt<TOUT>(a);
    }
};
// The second pass over partial accumulators (the same op, its own identity/combine/finish).
template <class R> struct PartialReducer {
    typedef typename R::Acc Tin;
    typedef typename R::Acc Acc;
    typedef typename R::TO TO;
    __device__ static __forceinline__ Acc identity() { return R::identity(); }
    __device__ static __forceinline__ Acc make(Acc v, i64) { return v; }
    __device__ static __forceinline__ Acc combine(Acc a, Acc b) { return R::combine(a, b); }
    __device__ static __forceinline__ TO finish(Acc a, i64 count) { return R::finish(a, count); }
};

// argmax / argmin: (value, index); the first index of the extremum, a NaN counting as the extremum.
template <typename A> struct ValIdx { A v; i64 i; };
template <typename TIN, typename A, typename TOUT, bool MAX> struct ArgReducer {
    typedef TIN Tin;
    typedef ValIdx<A> Acc;
    typedef TOUT TO;
    __device__ static __forceinline__ Acc identity() {
        Acc a;
        a.v = MAX ? Lim<A>::lo() : Lim<A>::hi();
        a.i = Lim<i64>::hi();
        return a;
    }
    __device__ static __forceinline__ Acc make(TIN v, i64 r) {
        Acc a;
        a.v = cvt<A>(v);
        a.i = r;
        return a;
    }
    __device__ static __forceinline__ Acc combine(Acc a, Acc b) {
        bool an = is_nan(a.v), bn = is_nan(b.v);
        if (an || bn) {
            if (an && bn) return a.i <= b.i ? a : b;
            return an ? a : b;
        }
        bool better = MAX ? (b.v > a.v) : (b.v < a.v);
        return (better || (b.v == a.v && b.i < a.i)) ? b : a;
    }
    __device__ static __forceinline__ TOUT finish(Acc a, i64) { return cvt<TOUT>(a.i); }
};

// ------------------------------------------------------------------------------------------ scans
// Inclusive scans of rows (scan order = index order, or reversed): one block of B threads per
// (row, chunk), tiles of B * ITEMS elements staged in shared memory, each thread scanning ITEMS
// consecutive elements, then a block scan of the thread totals. S: Tin, Acc, TO, identity, make, combine.
template <typename TIN, typename S, typename A, typename TOUT, int OP> struct Scanner {
    // OP: 0 cumsum, 1 cumprod, 2 cummax, 3 cummin
    typedef TIN Tin;
    typedef A Acc;
    typedef TOUT TO;
    __device__ static __forceinline__ A identity() {
        if constexpr (OP == 0) return (A)0;
        else if constexpr (OP == 1) return (A)1;
        else if constexpr (OP == 2) return Lim<A>::lo();
        else return Lim<A>::hi();
    }
    __device__ static __forceinline__ A make(TIN v) { return cvt<A>(cvt<S>(v)); }
    __device__ static __forceinline__ A combine(A a, A b) {
        if constexpr (OP == 0) return w_add(a, b);
        else if constexpr (OP == 1) return w_mul(a, b);
        else if constexpr (OP == 2) return np_maximum(a, b);
        else return np_minimum(a, b);
    }
};

// mode 0: write the scan of each chunk (after carry[row * nchunks + c - 1] for c > 0 when carry is
// given) to out; mode 1: write only each chunk's total to totals[row * nchunks + c].
template <class SC, typename TI, typename TOUT, int B, int ITEMS> __device__ void scan_rows(
        const TI* x, TOUT* out, const typename SC::Acc* carry, typename SC::Acc* totals, i64 rows, i64 len,
        i64 chunk, i64 nchunks, int reverse, int mode) {
    typedef typename SC::Acc A;
    __shared__ A tile[B * ITEMS];
    __shared__ A sums[B];
    for (i64 job = blockIdx.x; job < rows * nchunks; job += gridDim.x) {
        i64 row = job / nchunks, c = job - row * nchunks;
        i64 start = c * chunk, end = start + chunk < len ? start + chunk : len;
        A run = (carry != 0 && c > 0) ? carry[job - 1] : SC::identity();
        const TI* xr = x + row * len;
        TOUT* orow = out + row * len;
        for (i64 t0 = start; t0 < end; t0 += B * ITEMS) {
#pragma unroll
            for (int j = 0; j < ITEMS; ++j) {
                i64 e = t0 + threadIdx.x + j * B;
                A v = SC::identity();
                if (e < end) v = SC::make(xr[reverse ? len - 1 - e : e]);
                tile[threadIdx.x + j * B] = v;
            }
            __syncthreads();
            A acc = tile[threadIdx.x * ITEMS];
#pragma unroll
            for (int j = 1; j < ITEMS; ++j) {
                acc = SC::combine(acc, tile[threadIdx.x * ITEMS + j]);
                tile[threadIdx.x * ITEMS + j] = acc;
            }
            sums[threadIdx.x] = acc;
            __syncthreads();
            // inclusive Hillis-Steele scan of the thread totals (fixed order)
            for (int o = 1; o < B; o <<= 1) {
                A v = sums[threadIdx.x];
                if ((int)threadIdx.x >= o) v = SC::combine(sums[threadIdx.x - o], v);
                __syncthreads();
                sums[threadIdx.x] = v;
                __syncthreads();
            }
            A before = threadIdx.x > 0 ? SC::combine(run, sums[threadIdx.x - 1]) : run;
#pragma unroll
            for (int j = 0; j < ITEMS; ++j)
                tile[threadIdx.x * ITEMS + j] = SC::combine(before, tile[threadIdx.x * ITEMS + j]);
            A tile_total = SC::combine(run, sums[B - 1]);
            __syncthreads();
            if (mode == 0) {
#pragma unroll
                for (int j = 0; j < ITEMS; ++j) {
                    i64 e = t0 + threadIdx.x + j * B;
                    if (e < end) orow[reverse ? len - 1 - e : e] = cvt<TOUT>(tile[threadIdx.x + j * B]);
                }
            }
            run = tile_total;
            __syncthreads();
        }
        if (mode == 1 && threadIdx.x == 0) totals[job] = run;
    }
}

// Columns: x as (outer, len, inner), one thread per (o, k), in order along the extent.
template <class SC, typename TOUT> __device__ void scan_cols(const typename SC::Tin* x, TOUT* out, i64 outer, i64 len,
                                                             i64 inner, int reverse) {
    for (i64 j = (i64)blockIdx.x * blockDim.x + threadIdx.x; j < outer * inner; j += (i64)gridDim.x * blockDim.x) {
        i64 o = j / inner, k = j - o * inner;
        const typename SC::Tin* p = x + o * len * inner + k;
        TOUT* q = out + o * len * inner + k;
        typename SC::Acc run = SC::identity();
        for (i64 r = 0; r < len; ++r) {
            i64 e = reverse ? len - 1 - r : r;
            run = r == 0 ? SC::make(p[e * inner]) : SC::combine(run, SC::make(p[e * inner]));
            q[e * inner] = cvt<TOUT>(run);
        }
    }
}

// ------------------------------------------------------------------------------------------ sorting
// Sort keys: unsigned integers in the order NumPy sorts the values, ascending: NaN last (every NaN
// one key, so NaNs keep their order), -0.0 == 0.0. `desc_nan_high`: the key of descending argsort,
// -value with NaN as +inf's equal (the reference's np.where(isnan, -inf, -x)), inverted.
template <typename T> struct KeyOf { typedef u32 t; };
template <> struct KeyOf<double> { typedef u64 t; };
template <> struct KeyOf<i64> { typedef u64 t; };
template <> struct KeyOf<u64> { typedef u64 t; };

template <typename T> __device__ __forceinline__ typename KeyOf<T>::t sort_key(T raw, bool descending) {
    typedef typename KeyOf<T>::t K;
    K k;
    auto v = arith(raw);
    typedef decltype(v) V;
    if constexpr (IsFloat<V>::v) {
        if (descending && v != v) v = Lim<V>::hi();  // descending argsort: NaN ties with +inf
        if (v == (V)0) v = (V)0;                     // -0.0 -> +0.0
        if constexpr (Same<V, double>::v) {
            u64 b = (u64)__double_as_longlong(v);
            if (v != v) b = 0x7ff8000000000000ull;
            k = (b >> 63) ? ~b : (b | 0x8000000000000000ull);
        } else {
            u32 b = (u32)__float_as_int(v);
            if (v != v) b = 0x7fc00000u;
            k = (b >> 31) ? ~b : (b | 0x80000000u);
        }
    } else if constexpr (IsSigned<V>::v) {
        if constexpr (Traits<V>::bits == 64) k = (K)((u64)v ^ 0x8000000000000000ull);
        else k = (K)((i64)v + 2147483648ll);
    } else {
        k = (K)v;
    }
    return descending ? (K)~k : k;
}

template <typename K> __device__ __forceinline__ bool key_less(K ka, int ia, K kb, int ib) {
    return ka < kb || (ka == kb && ia < ib);
}

// Bitonic sort of (key, index) pairs in shared memory, n a power of two.
template <typename K> __device__ void bitonic(K* keys, int* idx, int n) {
    for (int k = 2; k <= n; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < n; i += blockDim.x) {
                int l = i ^ j;
                if (l > i) {
                    bool up = (i & k) == 0;
                    K a = keys[i], b = keys[l];
                    int ia = idx[i], ib = idx[l];
                    if (key_less(b, ib, a, ia) == up) {
                        keys[i] = b; keys[l] = a; idx[i] = ib; idx[l] = ia;
                    }
                }
            }
            __syncthreads();
        }
    }
}

}  // namespace nx
