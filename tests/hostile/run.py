#!/usr/bin/env python3
"""Hostile inputs for the `hpmoe` binary, each run under a 4 GB address-space cap and a 20 s
limit (`prlimit --as`, `timeout`). Prints one line per failing case and the counts of panics,
stack overflows, hangs, out-of-memory aborts and invalid inputs accepted with exit 0.

    python3 tests/hostile/run.py [path/to/hpmoe] [--keep DIR]

Cases marked `ok` must succeed; the others must end with exit 1 or 2 and a message.
"""
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else os.path.join(ROOT, "target/release/hpmoe")

HEAD = "import std::moe::*;\nimport std::device::ascend_a3;\n"


def moe(tokens=64, hidden=64, experts=8, topk=2, ranks=4, route="balanced", extra="", tile=16, dev=""):
    return (
        HEAD
        + f"param tokens = {tokens};\nparam hidden = {hidden};\nparam experts = {experts};\n"
        + f"device = ascend_a3 {{ ranks: {ranks}{dev} }};\n"
        + f"route r = {route}(experts: experts, topk: {topk}{extra});\n"
        + "taskflow f(x: bf16[tokens, hidden], w: bf16[experts / %d, hidden, hidden]) -> bf16[tokens, hidden] {\n" % ranks
        + f"    let xd = dispatch(x, r) tile(t: {tile});\n    let h = gmm(xd, w) tile(m: {tile}, n: 16, k: 16);\n"
        + f"    return combine(h, r) tile(m: {tile});\n}}\n"
    )


def elementwise(body, shape="[64, 64]", tile=""):
    return (
        "import std::device::ascend_a3;\ndevice = ascend_a3 { ranks: 1 };\n"
        + f"op e<T>(x: T[M, N]) -> T[M, N] on aiv {{ {body} }}\n"
        + f"taskflow f(x: f32{shape}) -> f32{shape} {{ return e(x){tile}; }}\n"
    )


def comm(puts, out="T[r.recv, H]"):
    return (
        "import std::device::ascend_a3;\nparam tokens = 32;\ndevice = ascend_a3 { ranks: 2 };\n"
        + "route r = balanced(experts: 4, topk: 2);\n"
        + f"comm c<T>(x: T[r.tokens, H], r: route) -> {out} {{ {puts} }}\n"
        + f"taskflow f(x: bf16[tokens, 16]) -> {out.replace('T[', 'bf16[').replace('H', '16')} {{ return c(x, r); }}\n"
    )


CASES = []


def case(name, text=None, args=("check",), expect="fail", files=None, stdin=None):
    CASES.append(dict(name=name, text=text, args=list(args), expect=expect, files=files or {}, stdin=stdin))


# Arithmetic in constant evaluation and index analysis.
case("arith_zero_coef", elementwise("out[m, n] = x[0 * m, n];"))
case("arith_min_div", "param a = -9223372036854775807 - 1;\nparam b = a / -1;\n")
case("arith_min_mod", "param a = -9223372036854775807 - 1;\nparam b = a % -1;\n")
case("arith_floor_div", "param a = -9223372036854775807 - 1;\nparam b = floor_div(a, -1);\n")
case("arith_ceil_div", "param a = -9223372036854775807 - 1;\nparam b = ceil_div(a, -1);\n")
case("arith_mul", "param a = 4611686018427387904 * 4;\n")
case("arith_pow", "param a = 2 ** 200;\n")
case("arith_div_zero", "param a = 1 / 0;\n")
case("arith_big_offset", elementwise("out[m, n] = x[m + 9223372036854775807, n];"))
case("arith_big_coef", elementwise("out[m, n] = x[9223372036854775807 * m, n];"))
case("arith_shape_overflow", "import std::device::ascend_a3;\ndevice = ascend_a3 { ranks: 1 };\n"
     "taskflow f(x: f32[4294967296, 4294967296, 4294967296]) -> f32[4294967296, 4294967296, 4294967296] { return x; }\n")
# Recursion depth.
case("depth_flat_sum_check", "param p = " + " + ".join(["1"] * 20000) + ";\n")
case("depth_flat_sum_fmt", "param p = " + " + ".join(["1"] * 50000) + ";\n", args=("fmt",))
case("depth_parens", "param p = " + "(" * 100000 + "1" + ")" * 100000 + ";\n")
case("depth_parens_fmt", "param p = " + "(" * 100000 + "1" + ")" * 100000 + ";\n", args=("fmt",))
case("depth_unary", "param p = " + "-" * 100000 + "1;\n")
case("depth_brackets", "param p = " + "[" * 50000 + "\n")
case("depth_reverse_params", "".join(f"param p{i} = p{i + 1} + 1;\n" for i in range(10000)) + "param p10000 = 1;\n", expect="ok")
case("depth_body", elementwise("out[m, n] = " + "silu(" * 20000 + "x[m, n]" + ")" * 20000 + ";"))
case("depth_repl_line", None, args=("repl",), stdin=("param p = " + "1 + " * 500000 + "1;\n:quit\n"), expect="any")
# Limits before allocation.
case("limit_tasks_flag", elementwise("out[m, n] = x[m, n];", "[32768, 32768]", " tile(m: 1, n: 1)"),
     args=("lower", "--emit", "tasks", "--max-tasks", "1000"))
case("limit_tasks_default", elementwise("out[m, n] = x[m, n];", "[32768, 32768]", " tile(m: 1, n: 1)"), args=("run",))
case("limit_tasks_raised", elementwise("out[m, n] = x[m, n];", "[16384, 4096]", " tile(m: 1, n: 1)"),
     args=("lower", "--emit", "tasks", "--max-tasks", "100000000"))
case("limit_aic_cores", moe(dev=", aic_cores: 1000000000"))
case("limit_ranks", moe(ranks=1000000))
case("limit_experts", moe(experts=4 * 100000000, ranks=4), args=("run",))
case("limit_experts_zipf", moe(experts=4 * 20000000, route="zipf", extra=", s: 1.0"), args=("run",))
case("limit_tokens_zipf", moe(tokens=1000000000, hidden=16, route="zipf", extra=", s: 1.0"), args=("run",))
case("limit_tokens_uniform_lower", moe(tokens=200000000, hidden=16, route="uniform"), args=("lower", "--emit", "routing"))
case("limit_static_capacity", moe(tokens=1000000, hidden=16, experts=4096, ranks=64) + "schedule f = expert_level { static_capacity: true };\n", args=("run",))
case("limit_topk_quadratic", moe(tokens=64, hidden=16, experts=8192, topk=8192, ranks=1, route="uniform"), args=("lower", "--emit", "routing"), expect="any")
case("limit_set_tokens", moe(), args=("run", "--set", "tokens=10000000000000000000000"))
case("limit_jobs", moe(), args=("run", "--jobs", "1000000000"))
case("limit_threads", moe(), args=("sweep", "--vary", "tokens=64", "--threads", "1000000000"))
case("limit_source_50mb", "// " + "x" * (50 << 20) + "\n", args=("fmt",), expect="any")
case("limit_source_70mb", "// " + "x" * (70 << 20) + "\n")
# Non-regular files and quadratic work.
case("fifo_fmt", None, args=("fmt", "@FIFO"))
case("fifo_check", None, args=("check", "@FIFO"))
case("devzero_fmt", None, args=("fmt", "/dev/zero"))
case("devzero_check", None, args=("check", "/dev/zero"))
case("dir_check", None, args=("check", "@DIR"))
case("fmt_many_errors", "".join("param = ;\n" for _ in range(100000)), args=("fmt",))
case("suggest_many", "".join(f"param p{i} = 1;\n" for i in range(16000)) + "".join(f"param q{i} = p{i}x;\n" for i in range(16000)))
# Bad input accepted.
case("routing_unknown_name", moe(), args=("check", "--routing", "q=zipf(s: 1.0)"))
case("routing_trailing_items", moe(), args=("check", "--routing", "zipf(s: 1); param evil = 1"))
case("routing_garbage", moe(), args=("check", "--routing", "zipf(s: 1.0"))
case("set_twice", moe(), args=("check", "--set", "tokens=64", "--set", "tokens=128"))
case("set_unknown", moe(), args=("check", "--set", "nosuch=1"))
case("input_twice", moe(), args=("run", "--input", "x=@DIR/a.npy", "--input", "x=@DIR/b.npy"))
case("comm_two_puts", comm("put out @ r.rank(t, j) [r.slot(t, j), h] = x[t, h]; put out @ r.rank(t, j) [r.slot(t, j), h] = x[t, h];"))
case("comm_gap_offset", comm("put out @ r.rank(t, j) [r.slot(t, j), h] = x[t, h + 1];"))
case("comm_gap_half", comm("put out @ r.rank(t, j) [r.slot(t, j), h] = x[t, h];", out="T[r.recv, 2 * H]"))
case("comm_gap_tokens", comm("put out @ r.rank(t, j) [r.slot(t, j), h] = x[t + 1, h];"))
case("comm_ok_halves", comm("put out @ r.rank(t, j) [r.slot(t, j), h] = x[t, h]; put out @ r.rank(t, j) [r.slot(t, j), h + H] = x[t, h];",
                            out="T[r.recv, 2 * H]"), expect="ok")
case("body_overlap", elementwise("out[m, n] = x[m, n]; out[m, n] = x[m, n];"))
case("policy_aiv_fraction", moe() + "schedule f = expert_level { aiv_fraction: -0.5 };\n")
case("dev_kernel_launch", moe(dev=", kernel_launch: -100 us"))
case("dev_latency_inf", moe(), args=("check", "--set", "device.link_latency=inf"))
case("dev_bandwidth_zero", moe(dev=", hbm_bandwidth: 0 GB/s"))
case("dev_bandwidth_nan", moe(), args=("check", "--set", "device.hbm_bandwidth=NaN"))
case("dev_cores_zero", moe(dev=", aiv_cores: 0"))
case("tile_zero", moe(tile=0))
case("tile_huge", moe(tile=9223372036854775807), expect="any")
case("zero_tokens", moe(tokens=0))
case("topk_over_experts", moe(topk=9))
# Reading outside the program.
case("import_passwd", 'import "/etc/passwd";\n')
case("import_parent", 'import "../../../../../../etc/passwd";\n')
case("import_environ", 'import "/proc/self/environ";\n')
case("route_file_passwd", moe().replace("route r = balanced(experts: experts, topk: 2);", 'route r = file(path: "/etc/passwd", experts: experts, topk: 2);'))
# Good programs must still pass.
case("ok_moe", moe(), args=("run",), expect="ok")
case("ok_zipf", moe(route="zipf", extra=", s: 1.2, seed: 3"), args=("run",), expect="ok")


def classify(rc, err, expect):
    if rc == 124:
        return "hang"
    if "stack overflow" in err or rc in (-11, 139):
        return "overflow"
    if "memory allocation" in err or "out of memory" in err.lower() or "capacity overflow" in err:
        return "oom"
    if "panicked" in err or rc == 101:
        return "panic"
    if rc < 0 or rc > 128:
        return "signal"
    if expect == "fail" and rc == 0:
        return "accepted-invalid"
    if expect == "ok" and rc != 0:
        return "refused-valid"
    return "ok"


def main():
    keep = None
    if "--keep" in sys.argv:
        keep = sys.argv[sys.argv.index("--keep") + 1]
    work = keep or tempfile.mkdtemp(prefix="hostile-")
    os.makedirs(work, exist_ok=True)
    fifo = os.path.join(work, "fifo.hpm")
    if not os.path.exists(fifo):
        os.mkfifo(fifo)
    sub = os.path.join(work, "dir.hpm")
    os.makedirs(sub, exist_ok=True)
    for n in ("a.npy", "b.npy"):
        open(os.path.join(work, n), "wb").write(b"\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (4, 64, 64), }" + b" " * 49 + b"\n" + b"\0" * (4 * 64 * 64 * 4))
    counts = {}
    for c in CASES:
        args = [a.replace("@DIR", work).replace("@FIFO", fifo) for a in c["args"]]
        if c["text"] is not None:
            path = os.path.join(work, c["name"] + ".hpm")
            open(path, "w").write(c["text"])
            # The file goes right after the subcommand (before its options).
            args = args[:1] + [path] + args[1:]
        if args[0] == "sweep":
            args += ["--out", os.path.join(work, c["name"] + "-out")]
        cmd = ["prlimit", "--as=4000000000", "--", "timeout", "20", BIN] + args
        p = subprocess.run(cmd, input=(c["stdin"] or "").encode(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=work)
        err = p.stderr.decode("utf-8", "replace")
        expect = c["expect"]
        kind = classify(p.returncode, err, expect)
        counts[kind] = counts.get(kind, 0) + 1
        if kind != "ok" or "-v" in sys.argv:
            first = next((l for l in err.splitlines() if l.strip()), "")
            print(f"{kind:17} {c['name']:28} rc={p.returncode} {first[:150]}")
    total = len(CASES)
    print(f"{total} cases: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    bad = sum(v for k, v in counts.items() if k != "ok")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
