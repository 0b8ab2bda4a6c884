#!/usr/bin/env python3
"""Symbolization throughput of the running daemon, end to end.

Generates a C program with FUNCTIONS distinct non-inlined functions (built
-O2 -g, so there is DWARF to parse) that calls each in turn, runs WORKERS
copies of it under `profilerd --frequency 999` for SECONDS, and reads
/metrics before and after: addresses symbolized (symbol cache misses) per
second of symbolization, symbolization time per batch (drain), the daemon's
CPU and peak RSS (VmHWM, summed over the daemon and any child process). Then
the cold cost: a fresh copy of the binary (a new file, nothing cached) that
spins in one function; its first batch pays for parsing the binary's DWARF.

The machine's other processes are sampled and symbolized too: an idle window
before the run gives their rate, reported apart.

To compare two builds, keep a copy of the old binary and alternate them run
by run (the machine's load drifts between runs; alternating spreads it):
  bench/symbolize_throughput.py --runs 3 --profilerd OLD --profilerd target/release/profilerd

Usage (root): bench/symbolize_throughput.py [--seconds 20] [--functions 20000]
              [--workers 2] [--frequency 999] [--runs 1] [--profilerd BIN]...
              [--json FILE] [--no-build]
"""
import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench", "compare"))
from procs import tree_cpu_ns, tree_hwm_kib  # noqa: E402
from tools import free_port  # noqa: E402

# Leaf functions without a stack keep no frame pointer under GCC 12 (see
# tests/build.rs), which hides only `main`: the sampled leaf is what counts here.
CFLAGS = ["-O2", "-g", "-fno-omit-frame-pointer", "-mno-omit-leaf-frame-pointer", "-fno-ipa-icf"]
# Series read from /metrics, first name found wins (the set may grow).
SERIES = {
    "symbolize_s": ["profilerd_symbolize_seconds_total"],
    "drains": ["profilerd_drains_total"],
    "misses": ["profilerd_symbol_cache_misses_total"],
    "hits": ["profilerd_symbol_cache_hits_total"],
    "unresolved": ["profilerd_symbol_unresolved_total"],
    "samples": ["profilerd_samples_total"],
}
MAIN = r"""
#include <stdlib.h>
#include <string.h>
#include <time.h>
typedef unsigned long (*fn)(unsigned long);
extern const fn table[];
extern const unsigned table_len;
static double since(const struct timespec *start) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (now.tv_sec - start->tv_sec) + (now.tv_nsec - start->tv_nsec) / 1e9;
}
/* argv: seconds [all|one] [first]: call every function in turn from the
   first, or only the first; the clock is read once a round, so its cost
   (vDSO) stays out of the samples. */
int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 20;
    int one = argc > 2 && strcmp(argv[2], "one") == 0;
    unsigned first = argc > 3 ? (unsigned)atoi(argv[3]) % table_len : 0;
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    unsigned long acc = 1;
    while (since(&start) < seconds)
        for (unsigned k = 0; k < table_len; k++) acc = table[one ? first : (first + k) % table_len](acc);
    return (int)(acc & 1);
}
"""


def generate(work, functions, parts):
    """C sources: `parts` files of functions (compiled in parallel) and main."""
    # ~0.3 us per call: a 1 ms sampling period lands on a different function each time.
    body = "{ for (unsigned i = 0; i < spin; i++) x = (x * %dUL + %dUL) ^ (x >> 7); return x; }"
    sources = []
    per_part = -(-functions // parts)
    for part in range(parts):
        lines = ["extern volatile unsigned spin;"]
        for i in range(part * per_part, min(functions, (part + 1) * per_part)):
            lines.append(f"__attribute__((noinline)) unsigned long f{i}(unsigned long x) " + body % (2 * i + 3, i))
        sources.append(os.path.join(work, f"part{part}.c"))
        with open(sources[-1], "w") as out:
            out.write("\n".join(lines) + "\n")
    table = ["typedef unsigned long (*fn)(unsigned long);", "volatile unsigned spin = 200;"]
    table += [f"unsigned long f{i}(unsigned long);" for i in range(functions)]
    table.append("const fn table[] = {" + ",".join(f"f{i}" for i in range(functions)) + "};")
    table.append(f"const unsigned table_len = {functions};")
    sources.append(os.path.join(work, "table.c"))
    with open(sources[-1], "w") as out:
        out.write("\n".join(table) + "\n" + MAIN)
    return sources


def build_program(work, functions):
    sources = generate(work, functions, parts=max(2, 2 * (os.cpu_count() or 1)))

    def compile_one(source):
        subprocess.run(["cc", *CFLAGS, "-c", "-o", source[:-2] + ".o", source], check=True)
        return source[:-2] + ".o"

    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        objects = list(pool.map(compile_one, sources))
    program = os.path.join(work, "many_functions")
    subprocess.run(["cc", "-o", program, *objects], check=True)
    return program


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        text = response.read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                values[name] = float(value)
            except ValueError:
                pass
    picked = {}
    for key, names in SERIES.items():
        picked[key] = next((values[name] for name in names if name in values), None)
    picked["at"] = time.monotonic()
    return picked


def delta(after, before, key):
    if after[key] is None or before[key] is None:
        return None
    return after[key] - before[key]


def batches(polls):
    """Symbolization seconds of each batch: polls where exactly one drain happened."""
    out = []
    for before, after in zip(polls, polls[1:]):
        if delta(after, before, "drains") == 1 and after["symbolize_s"] is not None:
            out.append(after["symbolize_s"] - before["symbolize_s"])
    return out


def poll_for(port, seconds, interval=0.1):
    polls = [scrape(port)]
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(interval)
        polls.append(scrape(port))
    return polls


def rates(polls):
    first, last = polls[0], polls[-1]
    span = last["at"] - first["at"]
    symbolize_s = delta(last, first, "symbolize_s")
    misses = delta(last, first, "misses")
    per_batch = batches(polls)
    return {
        "seconds": round(span, 2),
        "drains": delta(last, first, "drains"),
        "samples": delta(last, first, "samples"),
        "addresses_symbolized": misses,
        "cache_hits": delta(last, first, "hits"),
        "unresolved": delta(last, first, "unresolved"),
        "symbolize_seconds": symbolize_s,
        "symbolize_share_of_wall": symbolize_s / span if symbolize_s is not None and span else None,
        "addresses_per_symbolize_second": misses / symbolize_s if misses and symbolize_s else None,
        "batch_ms_p50": statistics.median(per_batch) * 1e3 if per_batch else None,
        "batch_ms_max": max(per_batch) * 1e3 if per_batch else None,
        "batches_timed": len(per_batch),
    }


def folded_functions(port, pids, seconds):
    """Distinct f<N> leaves and their samples in the workers' profiles."""
    names, samples, unknown = set(), 0, 0
    for pid in pids:
        url = f"http://127.0.0.1:{port}/folded?pid={pid}&seconds={seconds}"
        with urllib.request.urlopen(url, timeout=60) as response:
            text = response.read().decode()
        for line in text.splitlines():
            stack, _, count = line.rpartition(" ")
            leaf = stack.rsplit(";", 1)[-1]
            samples += int(count)
            if re.fullmatch(r"f\d+", leaf):
                names.add(leaf)
            elif leaf.startswith("[unknown]"):
                unknown += int(count)
    return {"distinct_functions_seen": len(names), "worker_samples": samples, "unknown_leaf_samples": unknown}


def measure(binary, program, args):
    """One run of `binary` (a profilerd): idle window, hot window, cold copy."""
    load_before = os.getloadavg()
    work = tempfile.mkdtemp(prefix="symbolize-run-")
    daemon, workers, log = None, [], None
    try:
        port = free_port()
        log = open(os.path.join(work, "daemon.log"), "w+")
        daemon = subprocess.Popen([binary, "--listen", f"127.0.0.1:{port}", "--frequency", str(args.frequency)],
                                  stderr=log)
        for _ in range(200):
            try:
                scrape(port)
                break
            except OSError:
                time.sleep(0.1)
        time.sleep(2)  # kallsyms and the machine's running processes, first seen
        idle = rates(poll_for(port, args.idle))

        cpu_before = tree_cpu_ns(daemon.pid)
        workers = [subprocess.Popen([program, str(args.seconds + 5), "all", str(i * args.functions // args.workers)])
                   for i in range(args.workers)]
        hot_polls = poll_for(port, args.seconds)
        hot = rates(hot_polls)
        if not hot["drains"] or not hot["samples"]:
            raise RuntimeError(f"no drain or no sample in {args.seconds} s: {hot}")
        hot["daemon_cpu_s"] = (tree_cpu_ns(daemon.pid) - cpu_before) / 1e9
        first = (batches(hot_polls) or [None])[0]
        hot["first_batch_ms"] = first * 1e3 if first is not None else None
        hot.update(folded_functions(port, [w.pid for w in workers], int(args.seconds) + 2))
        peak_after_hot = tree_hwm_kib(daemon.pid)
        for worker in workers:
            worker.kill()
            worker.wait()
        workers = []
        time.sleep(2)

        cold_copy = os.path.join(work, "many_functions_cold")
        shutil.copy(program, cold_copy)
        workers = [subprocess.Popen([cold_copy, "4", "one"])]
        per_batch = batches(poll_for(port, 4))
        cold_seen = folded_functions(port, [workers[0].pid], 6)
        cold = {
            "binary_bytes": os.path.getsize(program),
            "batch_ms": [round(b * 1e3, 1) for b in per_batch],
            # the worst batch while the fresh copy runs: its DWARF parsed from nothing
            "cold_batch_ms": max(per_batch) * 1e3 if per_batch else None,
            "samples": cold_seen["worker_samples"],
            "unknown_leaf_samples": cold_seen["unknown_leaf_samples"],
        }
        return {
            "profilerd": binary,
            "functions": args.functions,
            "workers": args.workers,
            "frequency": args.frequency,
            "load_before": load_before,
            "idle": idle,
            "hot": hot,
            "cold": cold,
            # VmHWM can read lower later (reclaimed pages never raised it): the larger.
            "daemon_peak_rss_mib": round(max(peak_after_hot, tree_hwm_kib(daemon.pid)) / 1024, 1),
            "daemon_peak_rss_after_hot_mib": round(peak_after_hot / 1024, 1),
        }
    except (OSError, RuntimeError, subprocess.SubprocessError) as err:
        # A failed run reports no figures: say why, with the daemon's last words.
        status = daemon.poll() if daemon is not None else None
        errors = []
        if log is not None:
            log.seek(0)
            errors = [line for line in log.read().splitlines() if "ERROR" in line or "panicked" in line]
        sys.exit(f"bench: a run of {binary} failed ({err}); daemon exit status {status}; its errors: {errors[-5:]}")
    finally:
        for worker in workers:
            worker.kill()
            worker.wait()
        if daemon is not None:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=15)
        if log is not None:
            log.close()
        shutil.rmtree(work, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--functions", type=int, default=20000)
    parser.add_argument("--workers", type=int, default=2, help="copies of the program run at once")
    parser.add_argument("--frequency", type=int, default=999)
    parser.add_argument("--idle", type=float, default=5, help="seconds of the idle window before each run")
    parser.add_argument("--runs", type=int, default=1, help="runs of each profilerd (same program)")
    parser.add_argument("--profilerd", action="append",
                        help="the binary to measure (default target/release/profilerd); give it twice, e.g. "
                             "a saved binary of the old code and the new one, to alternate them run by run")
    parser.add_argument("--json", help="also write the runs to this file")
    parser.add_argument("--no-build", action="store_true", help="do not build target/release/profilerd first")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench: run as root (BPF)")
    binaries = args.profilerd or [os.path.join(ROOT, "target/release/profilerd")]

    if not args.no_build:
        subprocess.run(["cargo", "build", "--release", "-p", "profiler-daemon"], cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    work = tempfile.mkdtemp(prefix="symbolize-bench-")
    try:
        started = time.monotonic()
        program = build_program(work, args.functions)
        print(f"built {args.functions} functions in {time.monotonic() - started:.1f} s", file=sys.stderr)
        runs = []
        for _ in range(args.runs):
            for binary in binaries:
                runs.append(measure(binary, program, args))
                report(runs[-1])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if len(runs) > 1:
        medians(runs, binaries)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"command": " ".join(sys.argv), "runs": runs}, out, indent=2)
    return 0


def medians(runs, binaries):
    figures = [
        ("addresses/s of symbolization", lambda r: r["hot"]["addresses_per_symbolize_second"], ".0f"),
        ("batch symbolize ms p50", lambda r: r["hot"]["batch_ms_p50"], ".1f"),
        ("batch symbolize ms max", lambda r: r["hot"]["batch_ms_max"], ".1f"),
        ("daemon CPU s", lambda r: r["hot"]["daemon_cpu_s"], ".2f"),
        ("cold batch ms", lambda r: r["cold"]["cold_batch_ms"], ".1f"),
        ("peak RSS MiB", lambda r: r["daemon_peak_rss_mib"], ".1f"),
        ("idle addresses/s (other processes)",
         lambda r: (r["idle"]["addresses_symbolized"] or 0) / r["idle"]["seconds"], ".0f"),
    ]
    print("medians:")
    for binary in binaries:
        mine = [run for run in runs if run["profilerd"] == binary]
        parts = []
        for name, get, spec in figures:
            values = [v for v in map(get, mine) if v is not None]
            parts.append(f"{name} {format(statistics.median(values), spec) if values else 'n/a'}")
        print(f"  {binary} ({len(mine)} runs): " + "; ".join(parts))


def report(s):
    def f(value, spec=".1f"):
        return "n/a" if value is None else format(value, spec)

    hot, idle, cold = s["hot"], s["idle"], s["cold"]
    print(f"{s['profilerd']}: {s['workers']} x {s['functions']} functions (-O2 -g) at {s['frequency']} Hz,"
          f" {hot['seconds']} s; load average before {s['load_before'][0]:.2f}")
    print(f"  addresses symbolized: {f(hot['addresses_symbolized'], '.0f')} in {f(hot['symbolize_seconds'], '.3f')} s"
          f" of symbolization -> {f(hot['addresses_per_symbolize_second'], '.0f')} addresses/s"
          f" ({f(100 * hot['symbolize_share_of_wall'] if hot['symbolize_share_of_wall'] is not None else None)}%"
          " of wall time)")
    print(f"  batch (drain) symbolize time: p50 {f(hot['batch_ms_p50'])} ms, max {f(hot['batch_ms_max'])} ms,"
          f" first {f(hot['first_batch_ms'])} ms ({hot['batches_timed']} batches timed)")
    print(f"  daemon CPU: {f(hot['daemon_cpu_s'], '.2f')} s; samples: {f(hot['samples'], '.0f')}"
          f" (workers {hot['worker_samples']}, leaves unresolved {hot['unknown_leaf_samples']});"
          f" distinct functions seen: {hot['distinct_functions_seen']}")
    print(f"  idle machine: {f(idle['addresses_symbolized'], '.0f')} addresses,"
          f" {f(idle['symbolize_seconds'], '.3f')} s symbolizing in {idle['seconds']} s;"
          f" batch p50 {f(idle['batch_ms_p50'])} ms")
    print(f"  cold ({cold['binary_bytes'] / 1e6:.1f} MB binary, fresh copy): worst batch {f(cold['cold_batch_ms'])} ms"
          f" (batches {cold['batch_ms']}); its samples {cold['samples']}, unresolved {cold['unknown_leaf_samples']}")
    print(f"  daemon peak RSS (VmHWM): {s['daemon_peak_rss_after_hot_mib']} MiB after the run,"
          f" {s['daemon_peak_rss_mib']} MiB after the cold copy")


if __name__ == "__main__":
    sys.exit(main())
