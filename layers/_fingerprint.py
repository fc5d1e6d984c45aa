"""The hashes of ``keras.layers.Hashing`` and ``HashedCrossing``, in pure Python (no TensorFlow):
FarmHash's ``Fingerprint64`` (``farmhashna::Hash64``, what ``tf.strings.to_hash_bucket_fast`` uses) and
SipHash-2-4 keyed by two 64-bit words (what ``tf.strings.to_hash_bucket_strong`` uses with ``key``).

Both take bytes and return an unsigned 64-bit int; a bucket is that value modulo the number of bins,
as TensorFlow computes it. Host code for the data path, as Keras's layers run on the CPU.
"""

from __future__ import annotations

import struct

__all__ = ["fingerprint64", "siphash64"]

_M = (1 << 64) - 1
_K0 = 0xC3A5C85C97CB3127
_K1 = 0xB492B66FBE98F273
_K2 = 0x9AE16A3B2F90404F


def _f64(s: bytes, i: int) -> int:
    return struct.unpack_from("<Q", s, i)[0]


def _f32(s: bytes, i: int) -> int:
    return struct.unpack_from("<I", s, i)[0]


def _rot(v: int, shift: int) -> int:
    return v if shift == 0 else ((v >> shift) | (v << (64 - shift))) & _M


def _shift_mix(v: int) -> int:
    return v ^ (v >> 47)


def _hash16(u: int, v: int, mul: int) -> int:
    a = ((u ^ v) * mul) & _M
    a ^= a >> 47
    b = ((v ^ a) * mul) & _M
    b ^= b >> 47
    return (b * mul) & _M


def _len0to16(s: bytes, n: int) -> int:
    if n >= 8:
        mul = _K2 + n * 2
        a = (_f64(s, 0) + _K2) & _M
        b = _f64(s, n - 8)
        c = (_rot(b, 37) * mul + a) & _M
        d = ((_rot(a, 25) + b) * mul) & _M
        return _hash16(c, d, mul)
    if n >= 4:
        mul = _K2 + n * 2
        a = _f32(s, 0)
        return _hash16((n + (a << 3)) & _M, _f32(s, n - 4), mul)
    if n > 0:
        a, b, c = s[0], s[n >> 1], s[n - 1]
        y = a + (b << 8)
        z = n + (c << 2)
        return (_shift_mix(((y * _K2) ^ (z * _K0)) & _M) * _K2) & _M
    return _K2


def _len17to32(s: bytes, n: int) -> int:
    mul = _K2 + n * 2
    a = (_f64(s, 0) * _K1) & _M
    b = _f64(s, 8)
    c = (_f64(s, n - 8) * mul) & _M
    d = (_f64(s, n - 16) * _K2) & _M
    return _hash16((_rot((a + b) & _M, 43) + _rot(c, 30) + d) & _M, (a + _rot((b + _K2) & _M, 18) + c) & _M, mul)


def _len33to64(s: bytes, n: int) -> int:
    mul = _K2 + n * 2
    a = (_f64(s, 0) * _K2) & _M
    b = _f64(s, 8)
    c = (_f64(s, n - 8) * mul) & _M
    d = (_f64(s, n - 16) * _K2) & _M
    y = (_rot((a + b) & _M, 43) + _rot(c, 30) + d) & _M
    z = _hash16(y, (a + _rot((b + _K2) & _M, 18) + c) & _M, mul)
    e = (_f64(s, 16) * mul) & _M
    f = _f64(s, 24)
    g = ((y + _f64(s, n - 32)) * mul) & _M
    h = ((z + _f64(s, n - 24)) * mul) & _M
    return _hash16((_rot((e + f) & _M, 43) + _rot(g, 30) + h) & _M, (e + _rot((f + a) & _M, 18) + g) & _M, mul)


def _weak32(s: bytes, i: int, a: int, b: int) -> tuple:
    w, x, y, z = _f64(s, i), _f64(s, i + 8), _f64(s, i + 16), _f64(s, i + 24)
    a = (a + w) & _M
    b = _rot((b + a + z) & _M, 21)
    c = a
    a = (a + x + y) & _M
    b = (b + _rot(a, 44)) & _M
    return (a + z) & _M, (b + c) & _M


def fingerprint64(s: bytes) -> int:
    """FarmHash ``Fingerprint64`` of ``s`` (``farmhashna::Hash64``: seed 81), an unsigned 64-bit int."""
    n = len(s)
    if n <= 16:
        return _len0to16(s, n)
    if n <= 32:
        return _len17to32(s, n)
    if n <= 64:
        return _len33to64(s, n)
    seed = 81
    x = seed
    y = (seed * _K1 + 113) & _M
    z = (_shift_mix((y * _K2 + 113) & _M) * _K2) & _M
    v0 = v1 = w0 = w1 = 0
    x = (x * _K2 + _f64(s, 0)) & _M
    end = ((n - 1) // 64) * 64
    last64 = end + ((n - 1) & 63) - 63
    i = 0
    while True:
        x = (_rot((x + y + v0 + _f64(s, i + 8)) & _M, 37) * _K1) & _M
        y = (_rot((y + v1 + _f64(s, i + 48)) & _M, 42) * _K1) & _M
        x ^= w1
        y = (y + v0 + _f64(s, i + 40)) & _M
        z = (_rot((z + w0) & _M, 33) * _K1) & _M
        v0, v1 = _weak32(s, i, (v1 * _K1) & _M, (x + w0) & _M)
        w0, w1 = _weak32(s, i + 32, (z + w1) & _M, (y + _f64(s, i + 16)) & _M)
        z, x = x, z
        i += 64
        if i == end:
            break
    mul = _K1 + ((z & 0xFF) << 1)
    i = last64
    w0 = (w0 + ((n - 1) & 63)) & _M
    v0 = (v0 + w0) & _M
    w0 = (w0 + v0) & _M
    x = (_rot((x + y + v0 + _f64(s, i + 8)) & _M, 37) * mul) & _M
    y = (_rot((y + v1 + _f64(s, i + 48)) & _M, 42) * mul) & _M
    x ^= (w1 * 9) & _M
    y = (y + v0 * 9 + _f64(s, i + 40)) & _M
    z = (_rot((z + w0) & _M, 33) * mul) & _M
    v0, v1 = _weak32(s, i, (v1 * mul) & _M, (x + w0) & _M)
    w0, w1 = _weak32(s, i + 32, (z + w1) & _M, (y + _f64(s, i + 16)) & _M)
    z, x = x, z
    return _hash16((_hash16(v0, w0, mul) + _shift_mix(y) * _K0 + z) & _M, (_hash16(v1, w1, mul) + x) & _M, mul)


def _sipround(v0: int, v1: int, v2: int, v3: int) -> tuple:
    v0 = (v0 + v1) & _M
    v1 = _rotl(v1, 13) ^ v0
    v0 = _rotl(v0, 32)
    v2 = (v2 + v3) & _M
    v3 = _rotl(v3, 16) ^ v2
    v0 = (v0 + v3) & _M
    v3 = _rotl(v3, 21) ^ v0
    v2 = (v2 + v1) & _M
    v1 = _rotl(v1, 17) ^ v2
    v2 = _rotl(v2, 32)
    return v0, v1, v2, v3


def _rotl(v: int, shift: int) -> int:
    return ((v << shift) | (v >> (64 - shift))) & _M


def siphash64(key: "tuple[int, int]", s: bytes) -> int:
    """SipHash-2-4 of ``s`` under the 128-bit key ``(k0, k1)`` (two unsigned 64-bit words), as highwayhash's
    ``SipHash`` that TensorFlow's strong hash buckets use."""
    k0, k1 = key[0] & _M, key[1] & _M
    v0 = k0 ^ 0x736F6D6570736575
    v1 = k1 ^ 0x646F72616E646F6D
    v2 = k0 ^ 0x6C7967656E657261
    v3 = k1 ^ 0x7465646279746573
    n = len(s)
    full = n - n % 8
    for i in range(0, full, 8):
        m = _f64(s, i)
        v3 ^= m
        v0, v1, v2, v3 = _sipround(v0, v1, v2, v3)
        v0, v1, v2, v3 = _sipround(v0, v1, v2, v3)
        v0 ^= m
    tail = s[full:] + bytes(7 - n % 8) + bytes([n & 0xFF])
    m = _f64(tail, 0)
    v3 ^= m
    v0, v1, v2, v3 = _sipround(v0, v1, v2, v3)
    v0, v1, v2, v3 = _sipround(v0, v1, v2, v3)
    v0 ^= m
    v2 ^= 0xFF
    for _ in range(4):
        v0, v1, v2, v3 = _sipround(v0, v1, v2, v3)
    return v0 ^ v1 ^ v2 ^ v3
