#!/usr/bin/env python3
"""A small MoE layer (dispatch, grouped GEMM, combine) on many ranks: 64 tokens of 64 values
per rank, one expert per rank, top-2, tiles of 16 rows (the README's figures for thousands of
ranks). Optional: tokens per rank, top-k, rows per tile.

    python3 docs/scripts/ranks.py 4096 > ranks.hpm
    python3 docs/scripts/ranks.py 4096 192 > ranks_kbk.hpm    # 192 tokens per rank
    python3 docs/scripts/ranks.py 1024 256 8 32 > wide.hpm    # top-8, 32 rows per tile
"""
import sys

ranks = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 64
topk = int(sys.argv[3]) if len(sys.argv) > 3 else 2
tile = int(sys.argv[4]) if len(sys.argv) > 4 else 16
sys.stdout.write(
    "import std::moe::*;\nimport std::device::ascend_a3;\n"
    f"param tokens = {tokens};\nparam hidden = 64;\nparam experts = {ranks};\n"
    f"device = ascend_a3 {{ ranks: {ranks} }};\n"
    f"route r = balanced(experts: experts, topk: {topk});\n"
    f"taskflow f(x: bf16[tokens, hidden], w: bf16[experts / {ranks}, hidden, hidden]) -> bf16[tokens, hidden] {{\n"
    f"    let xd = dispatch(x, r) tile(t: {tile});\n    let h = gmm(xd, w) tile(m: {tile}, n: 16, k: 16);\n"
    f"    return combine(h, r) tile(m: {tile});\n}}\n"
)
