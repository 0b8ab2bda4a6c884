"""One measurement: one tool on one workload, and profilerd's extra ones.

Protocol of `measure` (the same for every tool):
 1. start the workload's processes, let them run 0.5 s;
 2. exec the tool (t_launch), wait for its first sample (see tools.py);
 3. at first sample + WARMUP read the CPU time of the tool's process tree
    (clock_gettime on each process's CPU clock: ns, all threads), and again at
    first sample + DURATION: steady-state CPU = difference / elapsed (the
    same readings every 0.5 s through the warm-up's first half too, unless
    --no-meet, so the harness is no newcomer to a system-wide tool in the
    window; the CPU from the first of them to the window is kept apart; by
    thread name too);
 4. then, tool still running: peak RSS (VmHWM summed over its processes), its
    BPF programs' run_time_ns / run_cnt and its maps' bytes_memlock;
 5. profilerd only: GET /folded for the last DURATION s (part of its cost);
 6. stop it (SIGINT; SIGTERM for profilerd) and reap it with wait4: the
    whole-run CPU is its rusage (all threads and reaped children, from exec to
    exit: start-up, sampling, and writing/symbolizing its output at exit);
 7. read its output, keep the workload's stacks, score them.
Whatever fails, the tool's process group and the workload are killed.
"""
import contextlib
import os
import re
import statistics
import subprocess
import time

import bpf
import stacks
import tools
from procs import (cpu_by_name, forks_total, process_cpu_ns, rss_by_mapping, thread_cpu_ns, tree_cpu_ns,
                   tree_hwm_by_process, tree_hwm_kib, tree_thread_cpu_ns)
from workloads import Running, settle


# pingpong's rate window, after the main one (see rate_window).
RATE_WINDOW_S = 10


def sleep_until(moment):
    time.sleep(max(0.0, moment - time.monotonic()))


def measure(ctx, tool, workload, duration=None):
    duration = duration or ctx.duration
    warmup = min(ctx.warmup, duration / 2)
    run = {"id": re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{tool.name}-{workload.name}"), "tool": tool.name,
           "workload": workload.name, "duration_s": duration, "warmup_s": warmup}
    running = Running(workload, duration + ctx.startup_timeout + 60, ctx.work)
    proc = None
    try:
        settle()
        run["workload_pid"] = running.pid
        if isinstance(tool, tools.NoProfiler):
            first = time.monotonic()
        else:
            proc = tool.start(run)
            first = tool.first_sample(run, proc, proc.launched + ctx.startup_timeout)
            if first is None:
                exited = not proc.running()
                proc.stop(tool.stop_signal, 10)
                run["error"] = (f"exited with status {proc.exit_status} before its first sample" if exited
                                else f"no sample within {ctx.startup_timeout} s")
                run["stderr"] = tool.stderr_tail(run, lines=12)
                return run
            run["first_sample_s"] = first - proc.launched
            tool.after_first(run, proc)
        root = proc.pid if proc else None
        workload_cpu_first = process_cpu_ns(running.pid)

        # The readings below are the harness's own work, which a system-wide
        # profiler samples like any other: a first sample of this process, or
        # of its code that reads /proc, makes profilerd snapshot it, build its
        # unwind tables and name its frames (once per daemon; for pyenv's
        # Python, 9 MB of DWARF). Unless --no-meet, the same readings run every
        # 0.5 s through the first half of the warm-up, so that work lands
        # before the window (at least two 1 s drains before it with the
        # default 5 s warm-up) and the window holds what recurs; the CPU
        # from the first of them to the window is reported beside it
        # (cpu_meet_pct), so what moved out stays in view.
        meet_at = meet_cpu = None
        if root and ctx.meet:
            reading_at = first + 0.5
            while reading_at <= first + warmup / 2:
                sleep_until(reading_at)
                _ = tree_thread_cpu_ns(root), forks_total()
                now, cpu = time.monotonic(), tree_cpu_ns(root)
                if meet_at is None:
                    meet_at, meet_cpu = now, cpu
                reading_at += 0.5
        sleep_until(first + warmup)
        # Each end reads the threads, then the tree, in the same order: the
        # by-thread figures span their own readings.
        warm_threads, warm_threads_at = tree_thread_cpu_ns(root) if root else {}, time.monotonic()
        warm_at, warm_cpu, warm_forks = time.monotonic(), tree_cpu_ns(root) if root else 0, forks_total()
        sleep_until(first + duration)
        end_threads, end_threads_at = tree_thread_cpu_ns(root) if root else {}, time.monotonic()
        end_at, end_cpu = time.monotonic(), tree_cpu_ns(root) if root else 0
        if root:
            # Where the steady window's CPU went, by thread name (workers included).
            run["steady_cpu_by_thread"] = cpu_by_name(warm_threads, end_threads, end_threads_at - warm_threads_at)
        if meet_at is not None:
            run["meet_window_s"] = warm_at - meet_at
            run["cpu_meet_pct"] = (warm_cpu - meet_cpu) / 1e9 / (warm_at - meet_at) * 100
        run["forks_per_s"] = (forks_total() - warm_forks) / (end_at - warm_at)
        workload_cpu = (process_cpu_ns(running.pid) or 0) - (workload_cpu_first or 0)
        run["workload_cpu_s"] = workload_cpu / 1e9
        run["steady_window_s"] = end_at - warm_at
        if workload.name == "pingpong":
            run["pingpong_rate_with_stats"] = running.pingpong_rate(warm_at, end_at)
        if proc is None:
            rate_window(run, running)
            return run
        run["cpu_steady_pct"] = (end_cpu - warm_cpu) / 1e9 / (end_at - warm_at) * 100
        hwm = tree_hwm_kib(root)
        run["peak_rss_by_process_kib"] = tree_hwm_by_process(root)
        run["rss_now_kib"], run["rss_top_kib"] = rss_by_mapping(root)
        if tool.bpf:
            detail = bpf.tool_bpf(root)
            run.update(bpf.summarize(detail))
            run["bpf"] = detail
        if rate_window(run, running):
            # The tools report the window's samples too: expected covers it.
            workload_cpu = (process_cpu_ns(running.pid) or 0) - (workload_cpu_first or 0)
            run["workload_cpu_s"] = workload_cpu / 1e9

        tool.before_stop(run, proc)
        stop_at = time.monotonic()
        if not proc.stop(tool.stop_signal, tool.stop_timeout):
            run["error"] = f"did not exit within {tool.stop_timeout} s of the stop signal (killed)"
        run["stop_s"] = time.monotonic() - stop_at
        run["cpu_whole_s"] = proc.cpu_s()
        run["wall_s"] = time.monotonic() - proc.launched
        run["peak_rss_kib"] = max(hwm, proc.maxrss_kib())
        run["exit_status"] = proc.exit_status

        found = tool.read_output(run, proc)
        mine = stacks.select(found, comms=workload.comms, pids={running.pid})
        run["workload_samples"] = sum(s.count for s in mine)
        run["all_samples"] = sum(s.count for s in found)
        # what a sampler at this frequency should see of the CPU time the
        # workload got in the window (the machine is shared: not always
        # duration x CPUs)
        run["expected_samples"] = round(workload_cpu / 1e9 * tool_frequency(tool))
        if workload.name == "split":
            run.update(stacks.split_accuracy(mine))
        run["stderr"] = tool.stderr_tail(run)
    except Exception as err:  # noqa: BLE001 - recorded in the report, the run goes on
        run["error"] = f"{type(err).__name__}: {err}"
        if proc:
            run["stderr"] = tool.stderr_tail(run, lines=12)
    finally:
        if proc and proc.exit_status is None:
            proc.kill()
        running.stop()
    return run


def rate_window(run, running):
    """pingpong only: its round trips/s over RATE_WINDOW_S more seconds with
    `kernel.bpf_stats_enabled` off. The statistics cost two clock reads around
    every program run, which is the harness's cost, not the tool's: at the
    storm's ~500k switches/s they alone slowed it by ~2.5% with profilerd's
    off-CPU program (measured here), and nobody runs a profiler with them on.
    Every tool and the runs without one get the same window (the BPF figures
    were read before it). The sysctl is one of the kernel's holders of the
    statistics: a tool holding a BPF_ENABLE_STATS descriptor (bpftop) keeps
    them on. True if the window ran."""
    if running.workload.name != "pingpong":
        return False
    with bpf.stats_off():
        start = time.monotonic()
        time.sleep(RATE_WINDOW_S)
        run["pingpong_rate"] = running.pingpong_rate(start, time.monotonic())
    run["rate_window_s"] = RATE_WINDOW_S
    return True


def tool_frequency(tool):
    return getattr(tool, "frequency", 99)


def percentile(values, fraction):
    """Linear interpolation between closest ranks."""
    ordered = sorted(values)
    if not ordered:
        return None
    position = (len(ordered) - 1) * fraction
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@contextlib.contextmanager
def profilerd_sampling(ctx, workload, run_id, budget_s):
    """profilerd at 99 Hz with the workload running, for profilerd's extra
    measurements: yields (tool, process, time of its first sample); both are
    stopped whatever happens."""
    tool = tools.Profilerd(ctx)
    running = Running(workload, budget_s, ctx.work)
    proc = None
    try:
        settle()
        run = {"id": run_id, "workload_pid": None}
        proc = tool.start(run)
        first = tool.first_sample(run, proc, proc.launched + ctx.startup_timeout)
        if first is None:
            raise RuntimeError(f"profilerd did not start sampling within {ctx.startup_timeout} s")
        yield tool, proc, first
    finally:
        if proc:
            proc.kill()
        running.stop()


def pprof_latency(ctx, workload):
    """profilerd at 99 Hz with both CPUs busy for WINDOW s, then CALLS
    sequential GET /pprof?seconds=WINDOW (the whole system)."""
    window, calls = ctx.latency_window, ctx.latency_calls
    result = {"window_s": window, "calls": calls}
    budget = window + ctx.startup_timeout + calls * 5 + 60
    try:
        with profilerd_sampling(ctx, workload, "profilerd-latency", budget) as (tool, proc, first):
            sleep_until(first + window + 1)
            latencies, sizes = [], []
            cpu_before = tree_cpu_ns(proc.pid)
            for _ in range(calls):
                started = time.monotonic()
                body = tools.http_get(tool.url(f"/pprof?seconds={window}"), timeout=60)
                latencies.append(time.monotonic() - started)
                sizes.append(len(body))
            result.update({
                "p50_ms": percentile(latencies, 0.5) * 1000,
                "p99_ms": percentile(latencies, 0.99) * 1000,
                "max_ms": max(latencies) * 1000,
                "mean_ms": statistics.mean(latencies) * 1000,
                "cpu_ms_per_call": (tree_cpu_ns(proc.pid) - cpu_before) / 1e6 / calls,
                "bytes": statistics.median(sizes),
            })
    except Exception as err:  # noqa: BLE001
        result["error"] = f"{type(err).__name__}: {err}"
    return result


def self_profile(ctx, workload):
    """profilerd at 99 Hz on the split workload: its CPU per thread (schedstat)
    over a steady window, and a `perf record -e cpu-clock -c 250000 -g -p PID`
    of it over the same window (one sample per 250 us of its CPU time: a
    frequency would adapt badly to its short bursts), folded into its hottest
    functions; and what its resident memory is made of."""
    seconds = ctx.duration
    result = {"seconds": seconds}
    data = os.path.join(ctx.work, "self.perf.data")
    budget = seconds + ctx.warmup + ctx.startup_timeout + 60
    try:
        with profilerd_sampling(ctx, workload, "profilerd-self", budget) as (_, proc, first):
            sleep_until(first + ctx.warmup)
            _profile_itself(result, proc.pid, seconds, data)
    except Exception as err:  # noqa: BLE001
        result["error"] = f"{type(err).__name__}: {err}"
    finally:
        if os.path.exists(data):
            os.unlink(data)
    return result


def _profile_itself(result, pid, seconds, data):
    """The self-profile's window: per-thread CPU, perf record, memory."""
    before, started, forks = thread_cpu_ns(pid), time.monotonic(), forks_total()
    subprocess.run(["perf", "record", "-e", "cpu-clock", "-c", "250000", "-g", "-p", str(pid), "-o", data,
                    "--", "sleep", str(seconds)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    after, elapsed = thread_cpu_ns(pid), time.monotonic() - started
    result["forks_per_s"] = (forks_total() - forks) / elapsed
    result["peak_rss_kib"] = tree_hwm_kib(pid)
    result["rss_now_kib"], result["rss_top_kib"] = rss_by_mapping(pid)
    threads = {}
    for (tid, name), ns in after.items():
        threads[name] = threads.get(name, 0) + ns - before.get((tid, name), 0)
    total = sum(threads.values())
    result["elapsed_s"] = elapsed
    result["cpu_pct"] = total / 1e9 / elapsed * 100
    result["threads"] = sorted(([name, ns / 1e9 / elapsed * 100] for name, ns in threads.items() if ns > 0),
                               key=lambda item: -item[1])
    script = subprocess.run(["perf", "script", "-i", data, "-F", "comm,pid,tid,time,ip,sym,dso"],
                            capture_output=True, text=True).stdout
    found, _ = stacks.perf_script(script)
    by_self, _ = stacks.top_functions(found, limit=15)
    own = [s._replace(user=[f for f in s.user if OWN_CODE.search(f) and not GLUE.search(f)]) for s in found]
    _, by_total = stacks.top_functions([s._replace(kernel=[]) for s in own], limit=15)
    result["samples"] = sum(s.count for s in found)
    result["top_self"], result["top_total"] = by_self, by_total
    by_thread = {}
    for s in found:
        by_thread[s.comm] = by_thread.get(s.comm, 0) + s.count
    result["samples_by_thread"] = sorted(by_thread.items(), key=lambda item: -item[1])


# the daemon's and its libraries' functions, for the inclusive list; the
# thread start-up and closure-call glue around them would top it otherwise
OWN_CODE = re.compile(r"profilerd|blazesym|aya|gimli|tokio|axum|flate2|prost|inferno")
GLUE = re.compile(r"call_once|\{shim|__rust_begin_short_backtrace|spawn_unchecked|thread_start|"
                  r"Pipeline>::start::\{closure")

BREAKDOWN = [
    ("count only", "profile:hz:99 { @ = count(); }"),
    ("+ kernel stack", "profile:hz:99 { @[kstack] = count(); }"),
    ("+ user stack", "profile:hz:99 { @[ustack] = count(); }"),
    ("+ both stacks", "profile:hz:99 { @[kstack, ustack] = count(); }"),
    ("count only, 999 Hz", "profile:hz:999 { @ = count(); }"),
]


def bpf_breakdown(ctx, workload):
    """What a sample costs in BPF on this machine, piece by piece: bpftrace
    programs that only count, then add a kernel and/or a user stack id."""
    rows = []
    for label, program in BREAKDOWN:
        tool = tools.Bpftrace(ctx, program=program, name=f"bpftrace ({label})")
        run = measure(ctx, tool, workload, duration=max(3, ctx.duration / 2))
        rows.append({"label": label, "program": program, "bpf_ns_per_sample": run.get("bpf_ns_per_sample"),
                     "bpf_samples": run.get("bpf_samples"), "error": run.get("error")})
    return rows
