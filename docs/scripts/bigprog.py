#!/usr/bin/env python3
"""Prints a valid .hpm program of about N MB (default 50): params in a chain with comments,
and every tenth item an op definition with a doc comment.

    python3 docs/scripts/bigprog.py 50 > big50.hpm && hpmoe check big50.hpm
"""
import sys


def main():
    mb = float(sys.argv[1]) if len(sys.argv) > 1 else 50.0
    out = sys.stdout
    head = "import std::moe::*;\nimport std::device::ascend_a3;\ndevice = ascend_a3 { ranks: 8 };\nparam p0 = 1;\n"
    out.write(head)
    size, i, last = len(head), 1, 0
    while size < mb * 1024 * 1024:
        if i % 10 == 0:
            line = (f"/// Op {i}.\nop e{i}<T>(x: T[M, N], y: T[M, N]) -> T[M, N] on aiv tile(m: 64) {{\n"
                    f"    out[m, n] = silu(x[m, n]) * y[m, n] + {i}.0;\n}}\n")
        else:
            line = f"param p{i} = {i} * 2 + (p{last} % 7) - 3; // a comment\n"
            last = i
        out.write(line)
        size += len(line)
        i += 1


if __name__ == "__main__":
    main()
