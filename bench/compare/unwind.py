#!/usr/bin/env python3
"""The unwinding benchmark (issue 11): what table unwinding in BPF costs next
to the frame-pointer walk, and next to `perf record --call-graph dwarf`.

Run through `bench/run.sh unwind` (installs perf, bpftool and g++, builds
profilerd). Workload: tests/workloads/cxx_sort.cpp built -O2
-fomit-frame-pointer (no frame pointers anywhere: libstdc++ and libc have none
either), main -> level_one -> level_two -> level_three -> std::sort.

For each mode (`--unwind frame-pointers`, `--unwind auto`) and frequency (99,
999 Hz), with the workload running (one CPU busy):
 1. start profilerd, wait for its first sample, then WARMUP s;
 2. over DURATION s: its CPU (clock_gettime on every process of its tree: the
    steady CPU), and the run_time_ns / run_cnt of its perf_event programs
    (kernel.bpf_stats_enabled=1), as differences: BPF time per sample;
 3. then: bytes_memlock of its maps, its RSS, /metrics' unwind series, and
    /folded?pid=WORKLOAD&seconds=DURATION: the share of the workload's stacks
    that reach main, and that hold main -> level_one -> level_two ->
    level_three in that order.
perf: `perf record --call-graph dwarf,32768 -F HZ -p WORKLOAD -- sleep
DURATION` (its CPU from wait4), then `perf script` (its CPU and wall time:
that is where perf unwinds), the same two shares. perf's copy of 32 KB of
stack per sample is made in the sampled process's interrupt: in neither
figure. Table compile time: profilerd (auto, 99 Hz) while python3 runs a
busy loop, then while Chromium renders a page: the deltas of
profilerd_unwind_table_compile_seconds, of tables loaded and of rows.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import bpf
import stacks
from procs import Tool, process_cpu_ns, run_measured, tree_cpu_ns, tree_hwm_kib
from report import fmt, table
from tools import free_port, http_get

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCE = os.path.join(ROOT, "tests/workloads/cxx_sort.cpp")
CXXFLAGS = ["-O2", "-g", "-fomit-frame-pointer"]
CHAIN = ["main", "level_one", "level_two", "level_three"]
MODES = ["frame-pointers", "auto"]
CHROMIUM = "/usr/lib/chromium/chromium"


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=20, help="seconds of each steady window")
    parser.add_argument("--warmup", type=float, default=5, help="seconds after the first sample")
    parser.add_argument("--frequencies", default="99,999")
    parser.add_argument("--modes", default=",".join(MODES),
                        help="--unwind values; 'default' runs profilerd without the flag")
    parser.add_argument("--no-perf", action="store_true")
    parser.add_argument("--no-compile-times", action="store_true")
    parser.add_argument("--startup-timeout", type=float, default=60)
    parser.add_argument("--quick", action="store_true", help="--duration 4 --warmup 1")
    parser.add_argument("--output", help="also write the tables (Markdown) here")
    parser.add_argument("--json", help="also write the raw results here")
    args = parser.parse_args()
    if args.quick:
        args.duration, args.warmup = 4, 1
    return args


def build(work):
    binary = os.path.join(work, "cxx_sort")
    subprocess.run(["g++", *CXXFLAGS, "-o", binary, SOURCE], check=True)
    return binary


def start_workload(binary, seconds):
    return subprocess.Popen([binary, str(int(seconds))], stdout=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL, start_new_session=True)


def stop_workload(proc):
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def chain_shares(found, pid):
    """% of the workload's samples reaching main, and holding CHAIN in order."""
    mine = stacks.select(found, pids={pid})
    total = sum(s.count for s in mine)

    def holds(user):
        rest = iter(user)
        return all(any(frame == wanted for frame in rest) for wanted in CHAIN)

    main = sum(s.count for s in mine if "main" in s.user)
    chain = sum(s.count for s in mine if holds(s.user))
    return {"samples": total,
            "main_pct": main * 100 / total if total else None,
            "chain_pct": chain * 100 / total if total else None}


def sampling_stats(root):
    """(run_time_ns, run_cnt) summed over the tool's perf_event programs."""
    progs = [p for p in bpf.tool_bpf(root)["progs"] if p["type"] == "perf_event"]
    return sum(p["run_time_ns"] for p in progs), sum(p["run_cnt"] for p in progs)


def metric_sum(text, name):
    """Sum of the series of `name` (any labels), or None."""
    values = []
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        series, value = line.rsplit(" ", 1)
        if series == name or series.startswith(name + "{"):
            try:
                values.append(float(value))
            except ValueError:
                pass
    return sum(values) if values else None


def unwind_series(text):
    return {line.rsplit(" ", 1)[0]: line.rsplit(" ", 1)[1] for line in text.splitlines()
            if "unwind" in line and not line.startswith("#") and " " in line}


def vm_rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def sleep_until(moment):
    time.sleep(max(0.0, moment - time.monotonic()))


class Daemon:
    """profilerd on a free port, its stderr kept; stopped with SIGTERM."""

    def __init__(self, args, work, hz, mode, name, env=None):
        self.port = free_port()
        argv = [os.path.join(ROOT, "target/release/profilerd"), "--listen", f"127.0.0.1:{self.port}",
                "--frequency", str(hz)]
        if mode != "default":
            argv += ["--unwind", mode]
        self.err_path = os.path.join(work, f"{name}.err")
        with open(self.err_path, "w") as err:
            self.tool = Tool(argv, env=env, stdout=subprocess.DEVNULL, stderr=err)
        self.first = bpf.first_run(self.tool.pid, time.monotonic() + args.startup_timeout)

    def get(self, path):
        return http_get(f"http://127.0.0.1:{self.port}{path}", timeout=60).decode()

    def stderr_tail(self, lines=8):
        with open(self.err_path, errors="replace") as err:
            return [line.rstrip() for line in err.read().splitlines() if line.strip()][-lines:]

    def stop(self):
        self.tool.stop(signal.SIGTERM, 10)


def measure_profilerd(args, work, binary, mode, hz):
    label = "profilerd (no --unwind flag)" if mode == "default" else f"profilerd --unwind {mode}"
    run = {"tool": label, "mode": mode, "hz": hz}
    budget = args.startup_timeout + args.warmup + args.duration + 60
    workload = start_workload(binary, budget)
    daemon = None
    try:
        time.sleep(0.5)
        daemon = Daemon(args, work, hz, mode, f"profilerd-{mode}-{hz}")
        if daemon.first is None:
            run["error"] = "no sample (did it start?)"
            run["stderr"] = daemon.stderr_tail()
            return run
        pid = daemon.tool.pid
        sleep_until(daemon.first + args.warmup)
        cpu0, (ns0, cnt0), t0 = tree_cpu_ns(pid), sampling_stats(pid), time.monotonic()
        wl0 = process_cpu_ns(workload.pid) or 0
        sleep_until(t0 + args.duration)
        cpu1, (ns1, cnt1), t1 = tree_cpu_ns(pid), sampling_stats(pid), time.monotonic()
        run["workload_cpu_s"] = ((process_cpu_ns(workload.pid) or 0) - wl0) / 1e9
        run["cpu_steady_pct"] = (cpu1 - cpu0) / 1e9 / (t1 - t0) * 100
        run["bpf_samples_per_s"] = (cnt1 - cnt0) / (t1 - t0)
        run["bpf_ns_per_sample"] = (ns1 - ns0) / (cnt1 - cnt0) if cnt1 > cnt0 else None
        detail = bpf.tool_bpf(pid)
        run["map_bytes"] = sum(m["bytes_memlock"] for m in detail["maps"])
        run["maps"] = sorted(([m["name"], m["bytes_memlock"]] for m in detail["maps"]), key=lambda m: -m[1])[:8]
        run["rss_kib"], run["peak_rss_kib"] = vm_rss_kib(pid), tree_hwm_kib(pid)
        folded = daemon.get(f"/folded?pid={workload.pid}&seconds={int(args.duration)}")
        run.update(chain_shares(stacks.folded(folded, pid=workload.pid), workload.pid))
        run["unwind_metrics"] = unwind_series(daemon.get("/metrics"))
    except Exception as err:  # noqa: BLE001 - recorded in the report, the run goes on
        run["error"] = f"{type(err).__name__}: {err}"
    finally:
        if daemon:
            daemon.stop()
        stop_workload(workload)
    return run


def measure_perf(args, work, binary, hz):
    run = {"tool": "perf record --call-graph dwarf", "mode": "perf", "hz": hz}
    workload = start_workload(binary, args.warmup + args.duration + 120)
    data = os.path.join(work, f"perf-{hz}.data")
    script = os.path.join(work, f"perf-{hz}.txt")
    try:
        time.sleep(min(args.warmup, 2))
        wl0 = process_cpu_ns(workload.pid) or 0
        code, cpu, wall = run_measured(
            ["perf", "record", "-q", "--call-graph", "dwarf,32768", "-F", str(hz), "-p", str(workload.pid),
             "-o", data, "--", "sleep", str(args.duration)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        run["workload_cpu_s"] = ((process_cpu_ns(workload.pid) or 0) - wl0) / 1e9
        if code != 0:
            run["error"] = f"perf record exited with {code}"
            return run
        run["record_cpu_s"], run["record_wall_s"] = cpu, wall
        run["cpu_steady_pct"] = cpu / wall * 100
        run["data_bytes"] = os.path.getsize(data)
        with open(script, "w") as out:
            code, cpu, wall = run_measured(["perf", "script", "--no-inline", "-i", data, "-F",
                                            "comm,pid,tid,time,ip,sym,dso"], stdout=out,
                                           stderr=subprocess.DEVNULL)
        run["script_cpu_s"], run["script_wall_s"] = cpu, wall
        with open(script, errors="replace") as text:
            found, _ = stacks.perf_script(text.read())
        run.update(chain_shares(found, workload.pid))
    except Exception as err:  # noqa: BLE001
        run["error"] = f"{type(err).__name__}: {err}"
    finally:
        stop_workload(workload)
        for path in (data, script):
            if os.path.exists(path):
                os.unlink(path)
    return run


def busy_page(work, rows=60000):
    page = os.path.join(work, "page.html")
    with open(page, "w") as out:
        out.write("<html><body><table>")
        for i in range(rows):
            out.write(f'<tr><td style="padding:{i % 7}px">cell {i}</td><td><b>{i * 7}</b> <i>x</i></td></tr>')
        out.write("</table></body></html>")
    return page


def compile_times(args, work):
    """Table compile time (and tables, rows) added while each program runs."""
    result = {"steps": [], "files": []}
    # The table manager logs each table it loads (path, rows, compile time):
    # per-file figures, whichever process brought the file in first.
    env = dict(os.environ, RUST_LOG="info,profilerd::collect::unwind_tables=debug")
    daemon = Daemon(args, work, 99, "auto", "profilerd-compile", env=env)
    try:
        if daemon.first is None:
            result["error"] = "profilerd (auto) did not start"
            result["stderr"] = daemon.stderr_tail()
            return result
        time.sleep(3)
        programs = [("python3 (busy loop, 3 s)",
                     ["python3", "-c", "import time\nend = time.time() + 3\nwhile time.time() < end: pass"])]
        if os.path.exists(CHROMIUM):
            profile = os.path.join(work, "chromium-profile")
            programs.append(("chromium (headless, renders a 60k-row table)",
                             [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                              f"--user-data-dir={profile}", "--dump-dom", f"file://{busy_page(work)}"]))
        for label, argv in programs:
            before = daemon.get("/metrics")
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    start_new_session=True)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            time.sleep(2)
            after = daemon.get("/metrics")
            step = {"program": label}
            compile_total = ("profilerd_unwind_table_compile_seconds_sum"
                             if metric_sum(after, "profilerd_unwind_table_compile_seconds_sum") is not None
                             else "profilerd_unwind_table_compile_seconds_total")
            for key, name in [("compile_s", compile_total),
                              ("compiled", "profilerd_unwind_table_compiles_total"),
                              ("loaded", "profilerd_unwind_tables_loaded_total"),
                              ("rows", "profilerd_unwind_table_rows"),
                              ("bytes", "profilerd_unwind_table_bytes")]:
                a, b = metric_sum(before, name), metric_sum(after, name)
                step[key] = None if a is None or b is None else b - a
            result["steps"].append(step)
    except Exception as err:  # noqa: BLE001
        result["error"] = f"{type(err).__name__}: {err}"
    finally:
        daemon.stop()
    result["files"] = loaded_tables(daemon.err_path)
    return result


LOADED = re.compile(r"unwind table loaded path=(\S+) rows=(\d+) compile=([\d.]+)(ns|µs|ms|s)\b")
UNITS = {"ns": 1e-9, "µs": 1e-6, "ms": 1e-3, "s": 1.0}


def loaded_tables(err_path):
    """(path, rows, compile seconds) of every table the daemon's log says it loaded."""
    files = []
    with open(err_path, errors="replace") as err:
        for line in err:
            match = LOADED.search(line)
            if match:
                path, rows, value, unit = match.groups()
                files.append({"path": path, "rows": int(rows), "compile_s": float(value) * UNITS[unit]})
    return files


def mib(value):
    return None if value is None else value / 2**20


def render(results):
    rows = []
    for run in results["runs"]:
        if run.get("error"):
            rows.append([run["tool"], run["hz"], f"FAILED: {run['error']}"] + [""] * 8)
            continue
        perf = run["mode"] == "perf"
        rows.append([
            run["tool"], run["hz"],
            "-" if perf else fmt(run.get("bpf_ns_per_sample"), ".0f"),
            fmt(run.get("main_pct"), ".1f"), fmt(run.get("chain_pct"), ".1f"), run.get("samples"),
            "-" if perf else fmt(mib(run.get("map_bytes")), ".1f"),
            "-" if perf else fmt((run.get("rss_kib") or 0) / 1024, ".1f"),
            fmt(run.get("cpu_steady_pct"), ".3f"),
            f"{fmt(run.get('script_cpu_s'), '.2f')} s CPU, {fmt(run.get('script_wall_s'), '.2f')} s"
            if perf else "-",
            fmt(mib(run.get("data_bytes")), ".1f") if perf else "-",
        ])
    text = [f"# Unwinding benchmark ({results['date']}, {results['machine']})", "",
            f"Workload: cxx_sort ({' '.join(CXXFLAGS)}), {results['args']['duration']:g} s steady windows "
            f"after {results['args']['warmup']:g} s of warm-up.", "",
            table(["tool", "Hz", "BPF ns/sample", "reach main %", "main->level_three %", "samples",
                   "maps MiB (memlock)", "RSS MiB", "steady CPU % of a core", "perf script",
                   "perf.data MiB"], rows), ""]
    text += verdicts(results["runs"])
    compile_result = results.get("compile")
    if compile_result:
        text += ["", "## Table compile time (profilerd --unwind auto)", ""]
        if compile_result.get("error"):
            text.append(f"FAILED: {compile_result['error']}")
        text.append(table(["while running", "compile s", "tables compiled", "tables loaded", "rows added",
                           "bytes added"],
                          [[s["program"], fmt(s.get("compile_s"), ".3f"), fmt(s.get("compiled"), ".0f"),
                            fmt(s.get("loaded"), ".0f"), fmt(s.get("rows"), ".0f"), fmt(s.get("bytes"), ".0f")]
                           for s in compile_result.get("steps", [])]))
        files = compile_result.get("files", [])
        wanted = [f for f in files if re.search(r"/libc\.so\.6$|/python3(\.\d+)?$|/chromium/chromium$", f["path"])]
        largest = sorted(files, key=lambda f: -f["rows"])[:5]
        shown = wanted + [f for f in largest if f not in wanted]
        if shown:
            text += ["", "Per file (from the daemon's log, first load of each):", ""]
            text.append(table(["file", "rows", "compile ms"],
                              [[f["path"], str(f["rows"]), f"{f['compile_s'] * 1000:.2f}"] for f in shown]))
    failed = [run for run in results["runs"] if run.get("error") and run.get("stderr")]
    for run in failed:
        text += ["", f"{run['tool']} at {run['hz']} Hz, stderr:", "```", *run["stderr"], "```"]
    return "\n".join(text) + "\n"


def verdicts(runs):
    """The issue's targets: >= 99% complete, BPF <= 1.5x frame pointers', CPU <= 0.1%."""
    lines = ["Targets: >= 99% of stacks whole; BPF time per sample <= 1.5x the frame-pointer walk's; "
             "steady CPU <= 0.1% of a core.", ""]
    for hz in sorted({run["hz"] for run in runs}):
        auto = next((r for r in runs if r["mode"] == "auto" and r["hz"] == hz and not r.get("error")), None)
        fp = next((r for r in runs if r["mode"] == "frame-pointers" and r["hz"] == hz and not r.get("error")), None)
        if not auto:
            lines.append(f"- {hz} Hz: no successful `--unwind auto` run")
            continue
        whole = auto.get("chain_pct")
        ratio = (auto["bpf_ns_per_sample"] / fp["bpf_ns_per_sample"]
                 if fp and auto.get("bpf_ns_per_sample") and fp.get("bpf_ns_per_sample") else None)
        lines.append(f"- {hz} Hz: whole stacks {fmt(whole, '.1f')}% ({'met' if whole and whole >= 99 else 'MISSED'}); "
                     f"BPF {fmt(ratio, '.2f')}x frame pointers' "
                     f"({'met' if ratio and ratio <= 1.5 else 'MISSED' if ratio else 'n/a'}); "
                     f"steady CPU {fmt(auto.get('cpu_steady_pct'), '.3f')}% "
                     f"({'met' if (auto.get('cpu_steady_pct') or 1) <= 0.1 else 'MISSED'})")
    return lines


def main():
    args = parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root (BPF, perf, kernel.bpf_stats_enabled)")
    work = tempfile.mkdtemp(prefix="profilerd-unwind-bench-")
    stats_before = None
    results = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "machine": f"{os.cpu_count()} CPUs, kernel {os.uname().release}",
               "args": {"duration": args.duration, "warmup": args.warmup, "argv": sys.argv[1:]},
               "runs": []}
    try:
        binary = build(work)
        stats_before = bpf.enable_stats()
        for hz in [int(f) for f in args.frequencies.split(",") if f]:
            for mode in [m for m in args.modes.split(",") if m]:
                progress(f"profilerd, unwind mode {mode}, at {hz} Hz ({args.duration:g} s)")
                results["runs"].append(measure_profilerd(args, work, binary, mode, hz))
                progress(json.dumps({k: v for k, v in results["runs"][-1].items()
                                     if k not in ("maps", "unwind_metrics")}))
            if not args.no_perf:
                progress(f"perf record --call-graph dwarf at {hz} Hz ({args.duration:g} s)")
                results["runs"].append(measure_perf(args, work, binary, hz))
                progress(json.dumps(results["runs"][-1]))
        if not args.no_compile_times:
            progress("table compile times: python3, chromium")
            results["compile"] = compile_times(args, work)
    finally:
        bpf.restore_stats(stats_before)
        shutil.rmtree(work, ignore_errors=True)
    text = render(results)
    print(text)
    if args.output:
        with open(args.output, "w") as out:
            out.write(text)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=1, default=str)
    return 0


def progress(message):
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
