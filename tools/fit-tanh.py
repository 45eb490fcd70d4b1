#!/usr/bin/python3
"""Refit psm_fast_tanhf's rational approximation (core/kernels/fastmath.h).

tanh(x) ~ x P(x^2) / Q(x^2) on [0, C], P of degree NP, Q of degree NQ with
Q(0) = 1, minimax in absolute error: linearised least squares x P - tanh(x) Q
weighted by 1 / Q of the previous iteration (Loeb), the weights multiplied by
the error after each iteration (Lawson). Prints the coefficients, highest
power first as fastmath.h evaluates them, and the worst error in double
precision.

    /usr/bin/python3 tools/fit-tanh.py [C [NP [NQ]]]      (default 9 4 4)

Needs numpy (Debian: python3-numpy).
"""
import sys

import numpy as np

C = float(sys.argv[1]) if len(sys.argv) > 1 else 9.0
NP = int(sys.argv[2]) if len(sys.argv) > 2 else 4
NQ = int(sys.argv[3]) if len(sys.argv) > 3 else 4

# dense near 0 and near C, where the error of such fits peaks
x = np.unique(np.concatenate([np.linspace(0, C, 20000),
                              C * (1 - np.cos(np.linspace(0, np.pi / 2, 20000)))]))
u = (x / C) ** 2          # the fit in a scaled variable keeps the system conditioned
y = np.tanh(x)
w = np.full_like(x, 1.0 / len(x))
q_prev = np.ones_like(x)
best = None
for _ in range(200):
    cols = [x * u ** k for k in range(NP + 1)] + [-y * u ** k for k in range(1, NQ + 1)]
    m = np.stack(cols, 1) * (np.sqrt(w) / q_prev)[:, None]
    c, *_ = np.linalg.lstsq(m, y * np.sqrt(w) / q_prev, rcond=None)
    p, q = c[:NP + 1], np.concatenate([[1.0], c[NP + 1:]])
    pv = sum(p[k] * u ** k for k in range(NP + 1))
    qv = sum(q[k] * u ** k for k in range(NQ + 1))
    err = np.abs(x * pv / qv - y)
    if best is None or err.max() < best[0]:
        best = (err.max(), p.copy(), q.copy())
    q_prev = qv
    w = w * (err + 1e-300)
    w /= w.sum()

worst, p, q = best
print(f"tanh(x) ~ x P(x^2) / Q(x^2) on |x| <= {C:g}: worst absolute error {worst:.3g} "
      f"(1 - tanh({C:g}) = {1 - np.tanh(C):.2g})")
for name, coef in (("P", p), ("Q", q)):
    print(f"  {name}, highest power first:",
          ", ".join(f"{coef[k] / C ** (2 * k):.10e}" for k in reversed(range(len(coef)))))
