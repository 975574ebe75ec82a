#!/usr/bin/env python3
"""A SimPy replay of an hpmoe task graph and schedule, to compare simulation speed.

    pip install simpy
    python3 hpmoe-sim/benches/simpy_replay.py [--hpmoe target/release/hpmoe] FILE.hpm [hpmoe options]

It exports the taskflow's tasks and static schedule (`hpmoe lower --emit tasks` and `--emit
schedule`, JSON), then replays them as a competent user would write a discrete-event model
in SimPy: one process per core walking its queue in order; one event per counter, fired when
it has received its threshold of signals; a task starts when it heads its queue and its
counters have fired, and lasts its roofline time (cube FLOPs at the cube rate, vector bytes
at the vector rate, memory bytes at the core's HBM share, plus the task overhead); a task's
remote bytes then hold its rank's egress port (a SimPy resource, first come first served) for
bytes / port rate plus the link latency. The constants are the `ascend_a3` profile's, as the
header of `hpmoe run` prints them.

This model is coarser than hpmoe's (no L2, no shared HBM, no max-min sharing of ports and
pairs, no per-message costs), so its latencies differ; it is here to time event processing on
the same graph and schedule. It then runs `hpmoe run --timings` on the same program and
prints both times and their ratio, per CPU-second: hpmoe's `prepare` and `simulate` stages of
the simulation of the schedule kept (single-threaded, so wall = CPU), against SimPy's
process time for building the model and running it (reading the JSON excluded).
"""
import argparse
import json
import re
import subprocess
import sys
import time

# The ascend_a3 profile as `hpmoe run` prints it (cube per AIC core sustained, vector per AIV
# core, HBM per core, the rank's port, the node latency, the task overhead).
CUBE_FLOPS = 12.88e12
VECTOR_BYTES = 473.6e9
CORE_HBM = 59.2e9
PORT = 196.0e9
LATENCY = 0.70e-6
TASK_OVERHEAD = 0.50e-6


def export(hpmoe, args, emit):
    out = subprocess.run([hpmoe, "lower", *args, "--emit", emit, "--format", "json"], check=True,
                         stdout=subprocess.PIPE).stdout
    return json.loads(out)


def replay(tasks, sched):
    import simpy

    start = time.process_time()
    env = simpy.Environment()
    n = len(tasks)
    duration = [0.0] * n
    remote = [0.0] * n
    rank = [0] * n
    for t in tasks:
        c = t["cost"]
        i = t["id"]
        rank[i] = t["rank"]
        mem = (c["bytes_in"] + c["bytes_out"]) / CORE_HBM
        if t["engine"] == "aic":
            work = c["flops"] / CUBE_FLOPS
        else:
            work = (c["bytes_in"] + c["bytes_out"]) / VECTOR_BYTES
        duration[i] = max(work, mem) + TASK_OVERHEAD
        remote[i] = c["remote_bytes"]
    waits = [[] for _ in range(n)]
    signals = [[] for _ in range(n)]
    counters = sched["counters"]
    count = [0] * len(counters)
    threshold = [c["threshold"] for c in counters]
    fired = [env.event() for _ in counters]
    for c in counters:
        for t in c["waited_by"]:
            waits[t].append(c["id"])
        for t in c["signalled_by"]:
            signals[t].append(c["id"])
    for k, th in enumerate(threshold):
        if th == 0:
            fired[k].succeed()
    ranks = 1 + max(rank, default=0)
    port = [simpy.Resource(env, capacity=1) for _ in range(ranks)]
    end = [0.0]

    def signal(t):
        for k in signals[t]:
            count[k] += 1
            if count[k] == threshold[k]:
                fired[k].succeed()

    def core(queue):
        for t in queue:
            w = waits[t]
            if len(w) == 1:
                yield fired[w[0]]
            elif w:
                yield env.all_of([fired[k] for k in w])
            yield env.timeout(duration[t])
            if remote[t] > 0.0:
                with port[rank[t]].request() as req:
                    yield req
                    yield env.timeout(remote[t] / PORT + LATENCY)
            signal(t)
            end[0] = max(end[0], env.now)

    for q in sched["queues"]:
        if q["tasks"]:
            env.process(core(q["tasks"]))
    built = time.process_time()
    env.run()
    done = time.process_time()
    return end[0], built - start, done - built


def hpmoe_times(hpmoe, args):
    # `--resimulate`: the schedule kept among candidates prepared and simulated on its own,
    # as its own stages (else its simulation is the one run while choosing it).
    err = subprocess.run([hpmoe, "run", *args, "--timings", "--resimulate", "--jobs", "1"], check=True,
                         stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE).stderr.decode()
    stage = {}
    for line in err.splitlines():
        m = re.match(r"\s+(prepare|simulate)\s+([0-9.]+) s", line)
        if m:
            stage[m.group(1)] = stage.get(m.group(1), 0.0) + float(m.group(2))
    return stage


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hpmoe", default="target/release/hpmoe")
    ap.add_argument("program")
    ap.add_argument("options", nargs=argparse.REMAINDER, help="passed to hpmoe (e.g. --policy expert_level)")
    a = ap.parse_args()
    args = [a.program, *a.options]
    t0 = time.perf_counter()
    tasks = export(a.hpmoe, args, "tasks")
    sched = export(a.hpmoe, args, "schedule")
    load = time.perf_counter() - t0
    total_py = 0.0
    total_hp = 0.0
    stage = hpmoe_times(a.hpmoe, args)
    for tf, sc in zip(tasks, sched):
        makespan, build, run = replay(tf["tasks"], sc)
        total_py += build + run
        print(f"{tf['taskflow']} ({sc['policy']}): {len(tf['tasks'])} tasks; SimPy replay "
              f"{makespan * 1e6:.1f} us simulated, {build:.2f} s to build + {run:.2f} s to run (CPU)")
    total_hp = stage.get("prepare", 0.0) + stage.get("simulate", 0.0)
    print(f"hpmoe: prepare {stage.get('prepare', 0.0):.3f} s + simulate {stage.get('simulate', 0.0):.3f} s "
          f"(reading the exported JSON took {load:.1f} s and is not counted)")
    if total_hp > 0:
        print(f"ratio: {total_py / total_hp:.1f}x (SimPy CPU seconds per hpmoe second, prepare included)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
