"""The 40-case matrix: the 8 MoE example taskflows x 5 routings, under interleaved,
expert_level and kernel_by_kernel, as a Markdown table (docs/REPRODUCTION.md, section 9).

Usage: python3 docs/scripts/matrix.py HPMOE_BINARY [NAME=VALUE ...]   (the values go to --set)
JOBS=N runs N cases side by side (default: the number of CPUs).
"""
import concurrent.futures
import json
import os
import subprocess
import sys

B = sys.argv[1]
sets = sys.argv[2:]
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
ex=["deepseek_v3_ep4_fwd","deepseek_v3_ep4_bwd","deepseek_v3_ep8_fwd","deepseek_v3_ep8_bwd","deepseek_v3_ep16_fwd","deepseek_v3_ep16_bwd","qwen_moe_ep8_fwd","qwen_moe_ep8_bwd"]
routes=[("balanced",None),("zipf0.8","zipf(s: 0.8)"),("zipf1.2","zipf(s: 1.2)"),("hot1.5","hotspot(max_over_mean: 1.5)"),("hot2","hotspot(max_over_mean: 2)")]
def run(e,rt,pol):
    cmd=[B,"run",os.path.join(ROOT, "examples", "%s.hpm" % e),"--policy",pol,"--format","json"]
    for s in sets:
        # Qwen keeps its own expert count (48 over 8 ranks).
        if not (e.startswith("qwen") and s.startswith("experts=")):
            cmd += ["--set", s]
    if rt: cmd+=["--routing",rt]
    out=subprocess.run(cmd,capture_output=True,text=True)
    try: d=json.loads(out.stdout)
    except Exception: print(out.stderr[:500]); raise
    d=d['runs'][0]
    return d
def case(arg):
    e, (name, rt) = arg
    return e, name, run(e, rt, "interleaved"), run(e, rt, "expert_level"), run(e, rt, "kernel_by_kernel")

bad=0
print("| example | routing | interleaved us | expert_level us | kbk us | bound us (kind) | interleaved schedule | eff |")
print("|---|---|---|---|---|---|---|---|")
# The cases run side by side (each `hpmoe run` is single-threaded), printed in order.
jobs = int(os.environ.get("JOBS", os.cpu_count() or 1))
with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
    for e, name, i, el, k in pool.map(case, [(e, r) for e in ex for r in routes]):
        li,le,lk=i['latency_us'],el['latency_us'],k['latency_us']
        ok = li <= min(le,lk)+1e-9
        bad += not ok
        print("| %s | %s | %.1f | %.1f | %.1f | %.1f (%s) | %s | %.1f%% |%s"%(e,name,li,le,lk,i['lower_bound_us'],i['bound_kind'],i['options'].get('schedule',''),100*i['efficiency'],"" if ok else " LOSES"),flush=True)
print("losing cases:",bad)
