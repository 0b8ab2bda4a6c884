#!/usr/bin/env python3
"""profilerd next to perf, bpftrace and bcc on the same workloads, in one run.

Run through bench/run.sh (which installs the tools and builds profilerd);
writes docs/benchmarks.md and docs/benchmarks.json. Method and caveats: bench/compare/notes.md."""
import argparse
import datetime
import glob
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time

import bpf
import measure
import report
import tools
import workloads

ROOT = workloads.ROOT
TOOLS = ["profilerd", "profilerd-offcpu", "perf", "bpftrace", "bcc"]


class Context:
    """What every measurement needs: the work directory, the binaries, durations."""

    def __init__(self, args, work):
        self.work = work
        self.duration = args.duration
        self.warmup = args.warmup
        self.meet = not args.no_meet
        self.startup_timeout = args.startup_timeout
        self.latency_window = args.latency_window
        self.latency_calls = args.latency_calls
        self.profilerd = os.path.join(work, "profilerd")
        self.bcc_profile = "/usr/sbin/profile-bpfcc"
        self.bcc_kernel_source = None


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=20, help="seconds each tool samples each workload")
    parser.add_argument("--warmup", type=float, default=5,
                        help="seconds after the first sample before the steady-state window")
    parser.add_argument("--tools", default=",".join(TOOLS))
    parser.add_argument("--workloads", default="split,threads,pingpong")
    parser.add_argument("--latency-window", type=int, default=60, help="/pprof?seconds= for the latency test")
    parser.add_argument("--latency-calls", type=int, default=50)
    parser.add_argument("--no-latency", action="store_true")
    parser.add_argument("--no-999", action="store_true", help="skip profilerd at 999 Hz")
    parser.add_argument("--no-meet", action="store_true",
                        help="no harness readings during the warm-up (the method before 2026-11-28 09:41): a "
                             "system-wide tool may then meet the harness's own process inside the steady window")
    parser.add_argument("--self-profile", choices=["auto", "always", "never"], default="auto",
                        help="profile profilerd itself (auto: when one of its targets is missed)")
    parser.add_argument("--startup-timeout", type=float, default=60)
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: --duration 4 --warmup 1 --latency-window 5 --latency-calls 10")
    parser.add_argument("--output", default=os.path.join(ROOT, "docs/benchmarks.md"))
    parser.add_argument("--json", default=os.path.join(ROOT, "docs/benchmarks.json"))
    parser.add_argument("--keep", action="store_true", help="keep the work directory (outputs, perf.data)")
    parser.add_argument("--report-only", metavar="JSON", help="re-render the Markdown from a results file")
    args = parser.parse_args()
    if args.quick:
        args.duration, args.warmup, args.latency_window, args.latency_calls = 4, 1, 5, 10
    return args


def sh(*argv):
    try:
        return subprocess.run(argv, capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


def machine():
    model = re.search(r"Model name:\s*(.*)", sh("lscpu"))
    hypervisor = re.search(r"Hypervisor vendor:\s*(.*)", sh("lscpu"))
    return {
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "model": model.group(1) if model else "?",
        "hypervisor": hypervisor.group(1) if hypervisor else None,
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "debian": open("/etc/debian_version").read().strip() if os.path.exists("/etc/debian_version") else None,
    }


def versions():
    return {
        "profilerd": sh(os.path.join(ROOT, "target/release/profilerd"), "--version"),
        "commit": sh("git", "-C", ROOT, "rev-parse", "--short", "HEAD"),
        "perf": sh("perf", "--version"),
        "bpftrace": sh("bpftrace", "--version"),
        "bcc": "bpfcc-tools " + sh("dpkg-query", "-W", "-f", "${Version}", "bpfcc-tools"),
        "bpftool": sh("bpftool", "version").splitlines()[0] if sh("bpftool", "version") else "?",
    }


def bcc_kernel_source(work):
    """bcc compiles its program against kernel headers. None ship for this
    kernel; Debian's 6.1 headers come as two directories (the arch-specific
    one with the generated headers and .config, and -common with the rest),
    which bcc only combines when they are /lib/modules/$(uname -r)/{build,source}.
    Rather than writing there, merge them with symlinks into the work
    directory and point BCC_KERNEL_SOURCE at it. Returns (path or None, why)."""
    release = platform.release()
    if os.path.isdir(f"/lib/modules/{release}/build"):
        return None, f"kernel headers of the running kernel at /lib/modules/{release}/build"
    if os.path.exists("/sys/kernel/kheaders.tar.xz"):
        return None, "the running kernel's own headers (/sys/kernel/kheaders.tar.xz)"
    arch_dirs = sorted(glob.glob("/usr/src/linux-headers-*-amd64"),
                       key=lambda path: [int(n) for n in re.findall(r"\d+", path)])
    arch_dirs = [d for d in arch_dirs if "cloud" not in d and "-rt-" not in d]
    if not arch_dirs:
        return None, ("no headers for kernel " + release + " and no Debian linux-headers-*-amd64 installed "
                      "(bench/run.sh installs the newest linux-headers-6.1.0-N-amd64)")
    arch = arch_dirs[-1]
    common = arch.removesuffix("-amd64") + "-common"
    merged = os.path.join(work, "kernel-headers")
    os.makedirs(merged)
    if os.path.isdir(common):
        subprocess.run(["cp", "-rs", common + "/.", merged], check=True)
    subprocess.run(["cp", "-rs", "--remove-destination", arch + "/.", merged], check=True)
    return merged, (f"{os.path.basename(arch)} + -common (Debian 6.1 headers, not the running "
                    f"{release}), merged with symlinks; BCC_KERNEL_SOURCE points at them")


def profilerd_missed(runs):
    """Does profilerd miss one of its targets at 99 Hz with its defaults? (The
    self-profile looks at split with defaults: it cannot explain off-CPU's.)"""
    verdicts = report.targets(runs)
    return any(v["met"] is False and not v["target"].startswith("off-CPU") for v in verdicts)


def main():
    args = parse_args()
    if args.report_only:
        with open(args.report_only) as saved:
            results = json.load(saved)
        report.write(results, args.output)
        print(f"wrote {args.output}")
        return 0
    if os.geteuid() != 0:
        sys.exit("run as root (BPF, perf -a, bpf_stats)")

    for path in (args.output, args.json):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    work = tempfile.mkdtemp(prefix="profilerd-bench-")
    ctx = Context(args, work)
    stats_before = None
    results = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(), "versions": versions(),
        "uptime_before": sh("uptime"), "loadavg_before": open("/proc/loadavg").read().split()[:3],
        "args": {"duration": args.duration, "warmup": args.warmup, "meet": not args.no_meet,
                 "latency_window": args.latency_window,
                 "latency_calls": args.latency_calls, "argv": sys.argv[1:]},
        "runs": [],
    }
    try:
        shutil.copy(os.path.join(ROOT, "target/release/profilerd"), ctx.profilerd)
        binaries = workloads.build(work)
        all_workloads = workloads.workloads(binaries)
        ctx.bcc_kernel_source, results["bcc_headers"] = bcc_kernel_source(work)
        stats_before = bpf.enable_stats()

        selected = [t for t in args.tools.split(",") if t]
        makers = {"profilerd": tools.Profilerd, "profilerd-offcpu": tools.ProfilerdOffCpu, "perf": tools.Perf, "bpftrace": tools.Bpftrace, "bcc": tools.Bcc}
        results["commands"] = {name: makers[name](ctx).command_text() for name in selected}
        for name in [w for w in args.workloads.split(",") if w]:
            workload = all_workloads[name]
            # pingpong: a run without profiler before and after the tools, to see the drift
            sequence = ["none"] + selected + ["none"] if name == "pingpong" else selected
            for i, tool_name in enumerate(sequence):
                tool = tools.NoProfiler(ctx) if tool_name == "none" else makers[tool_name](ctx)
                progress(f"{tool.name} on {name} ({args.duration:g} s)")
                run = measure.measure(ctx, tool, workload)
                if tool_name == "none":
                    run["baseline"] = "before" if i == 0 else "after"
                results["runs"].append(run)
                progress(report.one_line(run))

        split = all_workloads["split"]
        if not args.no_999 and "profilerd" in selected:
            progress(f"profilerd at 999 Hz on split ({args.duration:g} s)")
            run = measure.measure(ctx, tools.Profilerd(ctx, frequency=999), split)
            results["runs"].append(run)
            progress(report.one_line(run))
        if not args.no_latency and "profilerd" in selected:
            progress(f"/pprof latency: {args.latency_window} s window, {args.latency_calls} calls")
            results["latency"] = measure.pprof_latency(ctx, split)
            progress(json.dumps(results["latency"]))
        if "profilerd" in selected and (args.self_profile == "always" or
                                        (args.self_profile == "auto" and profilerd_missed(results["runs"]))):
            progress("profiling profilerd itself (perf record -e cpu-clock -c 250000 -g -p PID)")
            results["self_profile"] = measure.self_profile(ctx, split)
            progress("BPF cost breakdown with bpftrace")
            results["bpf_breakdown"] = measure.bpf_breakdown(ctx, split)
    finally:
        bpf.restore_stats(stats_before)
        results["uptime_after"] = sh("uptime")
        results["loadavg_after"] = open("/proc/loadavg").read().split()[:3]
        with open(args.json, "w") as out:
            json.dump(results, out, indent=1, default=str)
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    report.write(results, args.output)
    print(f"wrote {args.output} and {args.json}")
    return 0


def progress(message):
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
