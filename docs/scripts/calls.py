#!/usr/bin/env python3
"""A valid program of one taskflow of N small calls, chained: a cube call, then N - 1 vector
calls each reading the one before (the README's figures for graphs of many calls).

    python3 docs/scripts/calls.py 50000 > calls.hpm
"""
import sys

n = int(sys.argv[1]) if len(sys.argv) > 1 else 50000
out = [
    "import std::device::ascend_a3;\ndevice = ascend_a3 { ranks: 2 };\n",
    "op mm<T>(x: T[M, K], w: T[K, N]) -> T[M, N] on aic { out[m, n] = sum(k) x[m, k] * w[k, n]; }\n",
    "op ad<T>(a: T[M, N], b: T[M, N]) -> T[M, N] on aiv { out[m, n] = a[m, n] + b[m, n]; }\n",
    "taskflow f(x: bf16[64, 64], w: bf16[64, 64]) -> bf16[64, 64] {\n    let s0 = mm(x, w);\n",
]
out += [f"    let s{i} = ad(s{i - 1}, x);\n" for i in range(1, n)]
out.append(f"    return s{n - 1};\n}}\n")
sys.stdout.write("".join(out))
