"""A/B of two profilerd builds on a noisy machine: both daemons sample the
same workload at the same time (their cpu-clock programs fire on the same
ticks), so the load of the moment weighs on both alike. Per round: each
one's sample-program cost from the kernel's BPF stats (run_time_ns /
run_cnt), and each daemon's CPU over the same window; the order of start
alternates per round. Run as root:

    python3 bench/compare/ab.py BEFORE_BIN AFTER_BIN WORKLOAD_BIN [ROUNDS]

WORKLOAD_BIN: the tests' `split` (target/release/build/profilerd-tests-*/out/split).
Prints one line per daemon and round, and the per-round after/before ratios."""
import json, os, subprocess, sys, time, glob

BEFORE, AFTER, SPLIT = sys.argv[1:4]
ROUNDS = int(sys.argv[4]) if len(sys.argv) > 4 else 6
WINDOW = 20
TICK = os.sysconf("SC_CLK_TCK")

def prog_stats(pid):
    ids = set()
    for info in glob.glob(f"/proc/{pid}/fdinfo/*"):
        try:
            for line in open(info):
                if line.startswith("prog_id:"):
                    ids.add(int(line.split()[1]))
        except OSError:
            pass
    total = [0, 0]
    for prog in ids:
        out = subprocess.run(["bpftool", "-j", "prog", "show", "id", str(prog)], capture_output=True, text=True).stdout
        data = json.loads(out)
        if data.get("name") == "sample":
            total[0] += data.get("run_time_ns", 0)
            total[1] += data.get("run_cnt", 0)
    return total

def cpu(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK

subprocess.run(["sysctl", "-q", "kernel.bpf_stats_enabled=1"], check=True)
results = {"before": [], "after": []}
for round_ in range(ROUNDS):
    order = [("before", BEFORE, 7101), ("after", AFTER, 7102)]
    if round_ % 2:
        order.reverse()
    daemons = {name: subprocess.Popen([path, "--listen", f"127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for name, path, port in order}
    time.sleep(4)
    work = subprocess.Popen([SPLIT, str(WINDOW + 10)], stdout=subprocess.DEVNULL)
    time.sleep(3)
    start = {name: (prog_stats(d.pid), cpu(d.pid)) for name, d in daemons.items()}
    time.sleep(WINDOW)
    end = {name: (prog_stats(d.pid), cpu(d.pid)) for name, d in daemons.items()}
    load = open("/proc/loadavg").read().split()[:3]
    for name in daemons:
        (t0, n0), c0 = start[name]
        (t1, n1), c1 = end[name]
        per = (t1 - t0) / max(n1 - n0, 1) / 1000
        pct = (c1 - c0) / WINDOW * 100
        results[name].append((per, pct, n1 - n0))
        print(f"round {round_} {name:6} bpf {per:.2f} us/sample ({n1 - n0} runs)  daemon CPU {pct:.2f}% of a core  load {load}", flush=True)
    work.kill(); work.wait()
    for d in daemons.values():
        d.terminate()
    for d in daemons.values():
        d.wait(timeout=30)
    time.sleep(2)
for index, (before, after) in enumerate(zip(results["before"], results["after"])):
    print(f"round {index}: after/before BPF per sample {after[0] / before[0]:.3f}, daemon CPU {after[1] / max(before[1], 1e-9):.3f}")
