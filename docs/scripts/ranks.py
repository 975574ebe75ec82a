#!/usr/bin/env python3
"""A small MoE layer (dispatch, grouped GEMM, combine) on many ranks: 64 tokens of 64 values
per rank, one expert per rank, top-2 (the README's figures for thousands of ranks).

    python3 docs/scripts/ranks.py 4096 > ranks.hpm
    python3 docs/scripts/ranks.py 4096 192 > ranks_kbk.hpm    # 192 tokens per rank
"""
import sys

ranks = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 64
sys.stdout.write(
    "import std::moe::*;\nimport std::device::ascend_a3;\n"
    f"param tokens = {tokens};\nparam hidden = 64;\nparam experts = {ranks};\n"
    f"device = ascend_a3 {{ ranks: {ranks} }};\n"
    "route r = balanced(experts: experts, topk: 2);\n"
    f"taskflow f(x: bf16[tokens, hidden], w: bf16[experts / {ranks}, hidden, hidden]) -> bf16[tokens, hidden] {{\n"
    "    let xd = dispatch(x, r) tile(t: 16);\n    let h = gmm(xd, w) tile(m: 16, n: 16, k: 16);\n"
    "    return combine(h, r) tile(m: 16);\n}\n"
)
