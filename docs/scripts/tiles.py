#!/usr/bin/env python3
"""Two elementwise calls on an f32[ROWS, COLS] tensor, tiled one row by one column (ROWS x
COLS tasks a call; the README's figure for fine tilings).

    python3 docs/scripts/tiles.py 500 3990 > tiles.hpm
"""
import sys

rows = int(sys.argv[1]) if len(sys.argv) > 1 else 500
cols = int(sys.argv[2]) if len(sys.argv) > 2 else 3990
sys.stdout.write(
    "import std::device::ascend_a3;\ndevice = ascend_a3 { ranks: 1 };\n"
    "op e<T>(x: T[M, N]) -> T[M, N] on aiv { out[m, n] = x[m, n]; }\n"
    f"taskflow f(x: f32[{rows}, {cols}]) -> f32[{rows}, {cols}] {{\n"
    "    let y = e(x) tile(m: 1, n: 1);\n    return e(y) tile(m: 1, n: 1);\n}\n"
)
