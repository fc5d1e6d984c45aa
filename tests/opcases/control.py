"""Cases of the control-flow family (``dnnbind/ops/_control.py``). The functions are written with Python's
operators, so the same function runs on NumPy arrays (the references below) and on dnnbind tensors.
Their arguments are callables, which the registry's JSON cases cannot send to Keras: real Keras 3 is
compared in tests/test_ops_control.py (through tests/keras_callables.py)."""

import numpy as np

from . import A, Case


def _step(c, x):
    return c * 0.9 + x * x, c * x


def _np_scan(f, init, xs, reverse=False):
    carry, ys = init, []
    for x in (xs[::-1] if reverse else xs):
        carry, y = f(carry, x)
        ys.append(y)
    return [carry, np.stack(ys[::-1] if reverse else ys)]


def _np_while(cond, body, state, limit=None):
    count = 0
    while (limit is None or count < limit) and cond(*state):
        state = body(*state)
        count += 1
    return list(state)


def _lin(a, b):  # the associative combine of x_t = a_t x_{t-1} + b_t: (a1, b1) then (a2, b2)
    return [a[0] * b[0], a[1] * b[0] + b[1]]


def _np_linear_recurrence(elems, reverse=False):
    a, b = (e[::-1] for e in elems) if reverse else elems
    pa, pb = [a[0]], [b[0]]
    for t in range(1, len(a)):
        pa.append(pa[-1] * a[t])
        pb.append(pb[-1] * a[t] + b[t])
    out = [np.stack(pa), np.stack(pb)]
    return [o[::-1] for o in out] if reverse else out


CASES = [
    Case("cond", (True, lambda: np.float32(1.0), lambda: np.float32(2.0)), keras=False, ref=lambda p, t, f: t()),
    Case("switch", (1, [lambda a, b: a + b, lambda a, b: a * b], A((3,)), A((3,))), grad=(2, 3), keras=False,
         ref=lambda i, br, a, b: a * b),
    Case("switch", (9, [lambda a: a + 1.0, lambda a: a * a], A((2, 2))), grad=(2,), keras=False, name="clamped",
         ref=lambda i, br, a: a * a),
    Case("scan", (_step, A((3,)), A((5, 3))), grad=(1, 2), keras=False, ref=_np_scan),
    Case("scan", (_step, A((3,)), A((4, 3))), {"reverse": True, "unroll": 2}, grad=(1, 2), keras=False,
         name="reverse", ref=lambda f, i, x, reverse, unroll: _np_scan(f, i, x, reverse)),
    Case("fori_loop", (1, 4, lambda i, v: v * 1.5 + i, A((2, 3))), grad=(3,), keras=False,
         ref=lambda lo, hi, f, v: ((v * 1.5 + 1) * 1.5 + 2) * 1.5 + 3),
    Case("while_loop", (lambda a, b: (a * a).sum() < 20.0, lambda a, b: (a * 2.0, b + a), [A((3,), 0.5, 1.0),
                                                                                         A((3,))]),
         grad=(2,), keras=False, ref=lambda c, b, s: _np_while(c, b, s)),
    Case("while_loop", (lambda a: (a * a).sum() < 1e9, lambda a: a * 2.0, A((2,), 0.5, 1.0)),
         {"maximum_iterations": 3}, grad=(2,), keras=False, name="maximum_iterations",
         ref=lambda c, b, s, maximum_iterations: s * 8.0),
    Case("map", (lambda x: x * x + 1.0, A((4, 3))), grad=(1,), keras=False, ref=lambda f, x: x * x + 1.0),
    Case("vectorized_map", (lambda e: e[0] * e[1], [A((4, 3)), A((4, 3))]), grad=(1,), keras=False,
         ref=lambda f, e: e[0] * e[1]),
    Case("associative_scan", (lambda a, b: a * b, A((7, 2))), grad=(1,), keras=False,
         ref=lambda f, x: np.cumprod(x, axis=0)),
    Case("associative_scan", (_lin, [A((6, 2)), A((6, 2))]), {"reverse": True}, grad=(1,), keras=False,
         name="pytree_reverse", ref=lambda f, e, reverse: _np_linear_recurrence(e, reverse)),
    Case("associative_scan", (lambda a, b: a + b, A((3, 5))), {"axis": 1}, grad=(1,), keras=False, name="axis",
         ref=lambda f, x, axis: np.cumsum(x, axis=1)),
]
