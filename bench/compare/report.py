"""docs/benchmarks.md from the results of one run."""
import os

TARGETS_TEXT = ("profilerd (issue 28) steady-state CPU <= 0.1% of one core; BPF per sample no more than "
                "bpftrace's frame-pointer-only `@[kstack, ustack, comm] = count()` in the same run; peak RSS of the "
                "daemon and its workers <= 32 MB; BPF maps <= 32 MiB; first sample within 0.5 s of start; "
                "whole-run CPU below `perf record -a -g`'s (this machine, 99 Hz, both CPUs busy); with `--off-cpu` "
                "and its default settings, at most 1 us of BPF per context switch and the pinned switch storm "
                "at most 5% slower")
OTHERS = ["perf", "bpftrace", "bcc"]
NOTES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "notes.md")


KEPT_MARKER = "<!-- scrape_load.py: kept by bench/run.sh -->"


def fmt(value, spec=".2f", suffix=""):
    if value is None:
        return "n/a"
    return f"{value:{spec}}{suffix}"


def mb(kib_or_bytes, kib=False):
    if kib_or_bytes is None:
        return None
    return kib_or_bytes * (1024 if kib else 1) / 1e6


def us(ns):
    return None if ns is None else ns / 1000


def short(name, limit=90):
    return name if len(name) <= limit else name[: limit - 3] + "..."


def one_line(run):
    if run.get("error"):
        return f"  {run['tool']} on {run['workload']}: FAILED: {run['error']}"
    parts = [f"first sample {fmt(run.get('first_sample_s'), '.3f')} s",
             f"CPU whole {fmt(run.get('cpu_whole_s'), '.3f')} s",
             f"steady {fmt(run.get('cpu_steady_pct'), '.3f')}%",
             f"BPF {fmt(us(run.get('bpf_ns_per_sample')), '.2f')} us/sample",
             f"RSS {fmt(mb(run.get('peak_rss_kib'), kib=True), '.1f')} MB",
             f"maps {fmt(mb(run.get('map_bytes')), '.1f')} MB",
             f"samples {run.get('workload_samples', 'n/a')}"]
    if run.get("hot_share") is not None:
        parts.append(f"hot_a {run['hot_share'] * 100:.1f}% main {fmt(run.get('main_pct'), '.1f')}%")
    if run.get("pingpong_rate") is not None:
        parts.append(f"pingpong {run['pingpong_rate']:.0f}/s "
                     f"({fmt(run.get('pingpong_rate_with_stats'), '.0f')}/s with bpf_stats)")
    if run.get("bpf_ns_per_switch") is not None:
        parts.append(f"off-CPU {us(run['bpf_ns_per_switch']):.2f} us/switch over {run['bpf_switches']} switches")
    return f"  {run['tool']} on {run['workload']}: " + ", ".join(parts)


def find(runs, tool, workload):
    for run in runs:
        if run["tool"] == tool and run["workload"] == workload:
            return run
    return None


def targets(runs):
    """profilerd's targets at 99 Hz, per workload, and off-CPU's with its
    default settings on pingpong: list of verdicts."""
    upgrade(runs)
    verdicts = []
    for run in runs:
        if run["tool"] != "profilerd" or run.get("error"):
            continue
        perf = find(runs, "perf", run["workload"])
        perf_cpu = perf.get("cpu_whole_s") if perf and not perf.get("error") else None
        bpftrace = find(runs, "bpftrace", run["workload"])
        bpftrace_us = us(bpftrace.get("bpf_ns_per_sample")) if bpftrace and not bpftrace.get("error") else None
        checks = [
            ("steady-state CPU <= 0.1% of one core", run.get("cpu_steady_pct"), 0.1, "%", ".3f"),
            ("BPF per sample <= bpftrace's", us(run.get("bpf_ns_per_sample")), bpftrace_us, " us", ".2f"),
            ("peak RSS <= 32 MB", mb(run.get("peak_rss_kib"), kib=True), 32.0, " MB", ".1f"),
            ("BPF maps <= 32 MiB", mb(run.get("map_bytes")), 32 * 1.048576, " MB", ".1f"),
            ("first sample within 0.5 s", run.get("first_sample_s"), 0.5, " s", ".3f"),
            ("whole-run CPU below perf's", run.get("cpu_whole_s"), perf_cpu, " s", ".3f"),
        ]
        verdicts += judge(run["workload"], checks)
    for run in runs:
        # Off-CPU with its default settings, on the switch storm.
        if run["tool"] != "profilerd+offcpu" or run["workload"] != "pingpong" or run.get("error"):
            continue
        bases = [r["pingpong_rate"] for r in runs
                 if r["tool"] == "none" and r["workload"] == "pingpong" and r.get("pingpong_rate")]
        rate = run.get("pingpong_rate")
        slowdown = (1 - rate / (sum(bases) / len(bases))) * 100 if rate and bases else None
        verdicts += judge(run["workload"], [
            ("off-CPU: BPF per switch <= 1 us", us(run.get("bpf_ns_per_switch")), 1.0, " us", ".2f"),
            ("off-CPU: the pinned switch storm <= 5% slower", slowdown, 5.0, "%", ".1f"),
        ])
    return verdicts


def upgrade(runs):
    """Results of runs before pingpong's rate window (no `rate_window_s`)
    measured the rate with bpf_stats on: named so, and no stats-off rate."""
    for run in runs:
        if "pingpong_rate" in run and "rate_window_s" not in run and "pingpong_rate_with_stats" not in run:
            run["pingpong_rate_with_stats"] = run.pop("pingpong_rate")


def judge(workload, checks):
    """Verdicts of (name, value, limit, unit, format) checks on one workload."""
    verdicts = []
    for name, value, limit, unit, spec in checks:
        if value is None or limit is None:
            verdicts.append({"target": name, "workload": workload, "met": None,
                             "text": "not measured"})
            continue
        met = value < limit if "below" in name else value <= limit
        if met:
            how = f"{limit / value:.1f}x under" if value > 0 else "under"
        else:
            how = f"{value / limit:.1f}x the limit, over by {fmt(value - limit, spec, unit)}"
        verdicts.append({"target": name, "workload": workload, "met": met,
                         "text": f"{fmt(value, spec, unit)} vs {fmt(limit, spec, unit)}: "
                                 f"{'met' if met else 'MISSED'} ({how})"})
    return verdicts


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def results_table(runs, workload):
    upgrade(runs)
    header = ["tool", "first sample (s)", "whole-run CPU (s)", "steady CPU (% of a core)", "BPF per sample (us)",
              "BPF runs", "BPF total (s)", "peak RSS (MB)", "BPF maps (MB)", "workload samples (expected)",
              "stop (s)", "new processes/s on the machine"]
    if workload == "pingpong":
        header.append("round trips/s, bpf_stats off (vs the mean of the runs without a profiler); "
                      "with bpf_stats, over the steady window")
    rows = []
    def mean_base(key):
        bases = [r[key] for r in runs if r["tool"] == "none" and r["workload"] == workload and r.get(key)]
        return sum(bases) / len(bases) if bases else None

    base_rate, base_with_stats = mean_base("pingpong_rate"), mean_base("pingpong_rate_with_stats")
    for run in runs:
        if run["workload"] != workload:
            continue
        if run["tool"] == "none":
            if workload == "pingpong":
                rows.append([f"none ({run.get('baseline', 'baseline')})"] + ["-"] * (len(header) - 2) +
                            [fmt(run.get("pingpong_rate"), ".0f") +
                             f"; with bpf_stats {fmt(run.get('pingpong_rate_with_stats'), '.0f')}"])
            continue
        if run.get("error"):
            rows.append([run["tool"], f"**failed**: {run['error']}"] + [""] * (len(header) - 2))
            continue
        row = [run["tool"], fmt(run.get("first_sample_s"), ".3f") +
               (f" ({run['first_queryable_s']:.3f} queryable)" if run.get("first_queryable_s") else ""),
               fmt(run.get("cpu_whole_s"), ".3f") +
               (f" (+{run['postprocess_cpu_s']:.2f} perf script)" if run.get("postprocess_cpu_s") else ""),
               fmt(run.get("cpu_steady_pct"), ".3f"),
               fmt(us(run.get("bpf_ns_per_sample")), ".2f") if run.get("bpf_samples") is not None else "n/a (no BPF)",
               run.get("bpf_samples", "n/a"),
               fmt(run.get("bpf_total_s"), ".4f"),
               fmt(mb(run.get("peak_rss_kib"), kib=True), ".1f"),
               fmt(mb(run.get("map_bytes")), ".1f") if run.get("map_bytes") is not None else "n/a",
               f"{run.get('workload_samples', 'n/a')} ({run.get('expected_samples', '-')})",
               fmt(run.get("stop_s"), ".2f"), fmt(run.get("forks_per_s"), ".1f")]
        if workload == "pingpong":
            rate, with_stats = run.get("pingpong_rate"), run.get("pingpong_rate_with_stats")
            cell = fmt(rate, ".0f") + (f" ({(rate / base_rate - 1) * 100:+.1f}%)" if rate and base_rate else "")
            if with_stats:
                cell += f"; with bpf_stats {with_stats:.0f}" + (
                    f" ({(with_stats / base_with_stats - 1) * 100:+.1f}%)" if base_with_stats else "")
            if run.get("bpf_ns_per_switch") is not None:
                cell += f"; off-CPU {us(run['bpf_ns_per_switch']):.2f} us/switch"
            row.append(cell)
        rows.append(row)
    return table(header, rows)


def peaks_by_process(runs, workload):
    """Per profilerd run: the peak RSS of each of its processes, the steady
    window's CPU by thread, and the CPU from the harness's first warm-up
    reading to the window."""
    lines = []
    for run in runs:
        peaks = run.get("peak_rss_by_process_kib")
        if run["workload"] != workload or not run["tool"].startswith("profilerd") or not peaks:
            continue
        parts = ", ".join(f"{name} {mb(kib, kib=True):.1f} MB" for name, kib in peaks)
        lines.append(f"- {run['tool']}, peak RSS by process (VmHWM): {parts}")
        threads = run.get("steady_cpu_by_thread")
        if threads:
            spent = ", ".join(f"{name} {pct:.3f}" for name, pct in threads if pct >= 0.0005)
            lines.append(f"  - steady window by thread (% of a core): {spent}")
        if run.get("cpu_meet_pct") is not None:
            lines.append(f"  - from the harness's first warm-up reading to the window ({run['meet_window_s']:.1f} s, "
                         f"where meeting the harness's own process lands): {run['cpu_meet_pct']:.3f}% of a core")
    return lines + [""] if lines else []


def accuracy_table(runs):
    rows = []
    for run in runs:
        if run["workload"] != "split" or run["tool"] == "none" or run.get("error"):
            continue
        rows.append([run["tool"], f"{run.get('samples', 'n/a')} ({run.get('expected_samples', '-')})",
                     fmt(run["hot_share"] * 100 if run.get("hot_share") is not None else None, ".1f", "%"),
                     fmt(run.get("share_error_pp"), ".1f", " pp"), fmt(run.get("main_pct"), ".1f", "%")])
    return table(["tool", "split samples (expected)", "hot_a share (75% expected)", "share error",
                  "stacks reaching main"], rows)


RATIO_METRICS = [
    ("whole-run CPU", "cpu_whole_s"), ("steady CPU", "cpu_steady_pct"), ("BPF per sample", "bpf_ns_per_sample"),
    ("peak RSS", "peak_rss_kib"), ("BPF maps", "map_bytes"), ("first sample", "first_sample_s"),
]


def ratio_table(runs, workload):
    mine = find(runs, "profilerd", workload)
    if not mine or mine.get("error"):
        return None
    rows = []
    for other in OTHERS:
        theirs = find(runs, other, workload)
        if not theirs or theirs.get("error"):
            rows.append([other] + ["n/a"] * len(RATIO_METRICS))
            continue
        row = [other]
        for _, key in RATIO_METRICS:
            a, b = mine.get(key), theirs.get(key)
            row.append(f"{a / b:.2f}x" if a is not None and b else "n/a (theirs 0)" if b == 0 else "n/a")
        rows.append(row)
        if other == "perf" and theirs.get("postprocess_cpu_s") and mine.get("cpu_whole_s") is not None:
            # perf symbolizes in perf script, after the run; profilerd while it runs
            cost = theirs["cpu_whole_s"] + theirs["postprocess_cpu_s"]
            rows.append(["perf record + perf script", f"{mine['cpu_whole_s'] / cost:.2f}x"]
                        + [""] * (len(RATIO_METRICS) - 1))
    return table(["profilerd / ..."] + [name for name, _ in RATIO_METRICS], rows)


def write(results, path):
    runs = results.get("runs", [])
    m, v = results["machine"], results["versions"]
    # The workloads keep both CPUs busy, so the load after the run says
    # nothing about other activity; the 1-minute load before it does.
    load = float(results.get("loadavg_before", ["0"])[0])
    out = ["# Benchmarks: profilerd next to perf, bpftrace and bcc", ""]
    out += [f"Generated by `bench/run.sh {' '.join(results['args']['argv'])}`".rstrip() +
            f" on **{results['date']}**; {v.get('profilerd', '?')} at commit {v.get('commit', '?')}. "
            "Regenerate with `sudo bench/run.sh` (about 10 minutes; `--quick` for a smoke run).", ""]
    if results["args"]["duration"] < 20:
        out += [f"> **Short run** ({results['args']['duration']:g} s per tool and workload): indicative only.", ""]
    out += ["## Machine", "",
            f"- {m['cpus']} CPUs, {m['model']}" + (f" ({m['hypervisor']} guest)" if m.get("hypervisor") else "") +
            f", {m['memory_gib']} GiB; kernel {m['kernel']}; Debian {m.get('debian')}; no hardware PMU "
            "(software cpu-clock events only).",
            f"- `uptime` before: `{results.get('uptime_before', '?')}`",
            f"- `uptime` after: `{results.get('uptime_after', '?')}`"]
    out += ["- The load after the run is the benchmark's own: its workloads keep both CPUs busy."]
    if load > 0.5:
        out += [f"- **The machine was not idle before the run** (1-minute load {load:.2f}). CPU and latency "
                "figures are noisier than on a quiet machine."]
    out += [f"- Tools: {v.get('perf')}, bpftrace {v.get('bpftrace')}, {v.get('bcc')}, {v.get('bpftool')}.",
            f"- bcc kernel headers: {results.get('bcc_headers', '?')}.", ""]

    out += ["## What is measured, and how", "",
            f"Each tool samples each workload at 99 Hz for {results['args']['duration']:g} s after its first "
            "sample, one tool at a time; the workload starts 0.5 s before the tool. Workloads (C, built by the "
            "harness with the tests' flags `-O0 -g -fno-omit-frame-pointer -mno-omit-leaf-frame-pointer`):", "",
            "- **split**: `split` (main -> middle -> hot_a 75% / hot_b 25% of the work) plus `busy`, a copy of "
            "it under another name, so both CPUs are busy; accuracy is scored on `split` only.",
            "- **threads**: `threads`, two named threads spinning (both CPUs busy).",
            "- **pingpong**: `bench/pingpong.c -t`, two threads bouncing a byte over two pipes (a "
            "context-switch storm, ~250k switches/s), both pinned to CPU 0 (unpinned, the rate swings "
            "between ~10k and ~130k round trips/s with the scheduler's placement); its round trips/s are "
            "compared with runs without any profiler, over 10 s after the steady window with "
            "`kernel.bpf_stats_enabled` off (the statistics' clock reads around every program run are the "
            "harness's cost: at the storm's switch rate they alone cost profilerd's off-CPU program a few "
            "percent; a tool holding a `BPF_ENABLE_STATS` descriptor, such as bpftop, would keep them on); the "
            "rate over the steady window, statistics on, is shown beside it. The pingpong runs are therefore "
            "10 s longer than the others (whole-run CPU, workload samples and their expected count "
            "included).", "",
            "Per tool:", "",
            "- **first sample**: from the exec of the tool until one of the perf_event BPF programs it holds "
            "has `run_cnt > 0` (bpftool polled every ~10 ms). perf has no BPF: the CLOCK_MONOTONIC timestamp "
            "of its first sample (`perf record -k monotonic`) minus its exec time. For profilerd, "
            "\"queryable\" = until `/threads?pid=` shows a sample of the workload.",
            "- **whole-run CPU**: user+system seconds of the tool from exec to exit (`wait4` rusage: all "
            "threads and reaped children), start-up, sampling and the output at exit included (bpftrace and "
            "bcc symbolize and print at exit; profilerd answers one `/folded` query). perf's `perf script` "
            "is shown apart.",
            f"- **steady CPU**: CPU time of the tool's process tree (ns, from each process's CPU clock) from "
            f"{results['args']['warmup']:g} s after the first sample to the end of the window, as a % of "
            "one core. "
            + ("The harness makes the same readings every 0.5 s through the first half of the warm-up, so that "
               "a system-wide tool meets the harness's own process and code (a snapshot, unwind tables, names: "
               "once per daemon, and pyenv's Python carries 9 MB of DWARF) before the window rather than in it; "
               "profilerd's runs list the CPU from the first of those readings to the window beside the window's "
               "CPU by thread name. This method started with the run of 2026-11-28 09:41; earlier runs' steady "
               "figures included that first meeting whenever it fell in the window (`--no-meet` measures that "
               "way). " if results["args"].get("meet", True) else
               "No harness readings during the warm-up (`--no-meet`): a first sample of the harness's own "
               "process may fall in the window. ")
            + "Processes started during the window (the forks column) are work for profilerd too: run the "
            "benchmark on an otherwise quiet machine.",
            "- **BPF per sample**: `kernel.bpf_stats_enabled=1`; run_time_ns / run_cnt of the tool's "
            "perf_event programs; **BPF total** adds its other programs (profilerd's exec/exit tracepoints). "
            "A tool's programs and maps are those its processes hold descriptors for "
            "(/proc/PID/fdinfo: prog_id, map_id), plus the maps its programs use.",
            "- **peak RSS**: VmHWM summed over the tool's processes before it is stopped, or wait4's "
            "ru_maxrss if larger (exit-time symbolization). **BPF maps**: `bytes_memlock` of its maps "
            "(`bpftool map show`). MB = 10^6 bytes.",
            "- **workload samples**: the tool's samples of the workload (by pid for profilerd and perf, by "
            "thread name for bpftrace and bcc, which do not report pids); expected = the CPU time the "
            "workload's process got during the sampling window x the frequency (the machine is shared, so "
            "not always duration x CPUs).",
            "- **stop**: seconds from the stop signal to exit.", ""]
    out += ["Exact commands:", ""]
    for name, text in results.get("commands", {}).items():
        out.append(f"- {name}: `{text}`")
    out += ["- profilerd extras: the same daemon at `--frequency 999`; `/pprof?seconds=WINDOW` latency.", ""]

    out += ["## Results", ""]
    for workload in ["split", "threads", "pingpong"]:
        if any(r["workload"] == workload for r in runs):
            out += [f"### {workload}", "", results_table(runs, workload), ""]
            out += peaks_by_process(runs, workload)
    if any(r["workload"] == "split" and r.get("hot_share") is not None for r in runs):
        out += ["### Accuracy on split", "",
                "Share of hot_a among the samples whose innermost user frame is hot_a or hot_b, and the "
                "share of all of split's samples whose user stack reaches `main`.", "",
                accuracy_table(runs), ""]

    lat = results.get("latency")
    p999 = find(runs, "profilerd@999Hz", "split")
    if p999 or lat:
        out += ["### profilerd only", ""]
    if p999:
        p99 = find(runs, "profilerd", "split")
        out += [f"- **999 Hz** on split: " + (f"failed: {p999['error']}" if p999.get("error") else
                f"steady CPU {fmt(p999.get('cpu_steady_pct'), '.3f')}% of a core "
                f"(99 Hz: {fmt(p99.get('cpu_steady_pct') if p99 else None, '.3f')}%), whole-run "
                f"{fmt(p999.get('cpu_whole_s'), '.3f')} s, BPF {fmt(us(p999.get('bpf_ns_per_sample')), '.2f')} "
                f"us/sample over {p999.get('bpf_samples')} runs, peak RSS "
                f"{fmt(mb(p999.get('peak_rss_kib'), kib=True), '.1f')} MB, split samples "
                f"{p999.get('samples')} ({p999.get('expected_samples')} expected), hot_a "
                f"{fmt(p999['hot_share'] * 100 if p999.get('hot_share') is not None else None, '.1f')}%, "
                f"reaching main {fmt(p999.get('main_pct'), '.1f')}%.")]
    if lat:
        out += [f"- **/pprof latency** (the whole system, `seconds={lat['window_s']}`, after {lat['window_s']} s "
                f"of sampling at 99 Hz with both CPUs busy, {lat['calls']} sequential calls): " +
                (f"failed: {lat['error']}" if lat.get("error") else
                 f"p50 {lat['p50_ms']:.1f} ms, p99 {lat['p99_ms']:.1f} ms, max {lat['max_ms']:.1f} ms; "
                 f"{lat['cpu_ms_per_call']:.1f} ms of daemon CPU per call; {lat['bytes'] / 1000:.1f} kB "
                 "gzipped.")]
    out.append("")

    ratio_tables = [(w, ratio_table(runs, w)) for w in ["split", "threads", "pingpong"]]
    if any(t for _, t in ratio_tables):
        out += ["## profilerd / each other tool", "",
                "Below 1 = profilerd uses less (or starts sooner).", ""]
        for workload, ratios in ratio_tables:
            if ratios:
                out += [f"{workload}:", "", ratios, ""]

    verdicts = targets(runs)
    out += ["## Targets", "", TARGETS_TEXT + ".", ""]
    workloads_seen = [w for w in ["split", "threads", "pingpong"] if any(x["workload"] == w for x in verdicts)]
    names = list(dict.fromkeys(x["target"] for x in verdicts))
    rows = []
    for name in names:
        row = [name]
        for workload in workloads_seen:
            cell = next((x for x in verdicts if x["target"] == name and x["workload"] == workload), None)
            row.append(cell["text"] if cell else "")
        rows.append(row)
    if rows:
        out += [table(["target"] + [f"{w}" + (" (CPUs not both busy)" if w == "pingpong" else "")
                                    for w in workloads_seen], rows), ""]
        missed = sorted({x["target"] for x in verdicts if x["met"] is False})
        out += [("**Missed:** " + "; ".join(missed) + ".") if missed else "**All targets met.**", ""]

    out += self_profile_section(results)
    out += failures_section(runs, results)
    if os.path.exists(NOTES):
        with open(NOTES) as notes:
            out += [notes.read().rstrip(), ""]
    # bench/scrape_load.py's section is written by hand from its own runs: kept.
    if os.path.exists(path):
        with open(path) as old:
            text = old.read()
        if KEPT_MARKER in text:
            out += [text[text.index(KEPT_MARKER):].rstrip(), ""]
    with open(path, "w") as doc:
        doc.write("\n".join(out).rstrip() + "\n")


def self_profile_section(results):
    out = []
    prof = results.get("self_profile")
    if prof:
        out += ["## What dominates profilerd's cost", ""]
        if prof.get("error"):
            out += [f"Self-profile failed: {prof['error']}", ""]
        else:
            out += [f"profilerd at 99 Hz on split (both CPUs busy), {prof['elapsed_s']:.1f} s after a warm-up: "
                    f"{prof['cpu_pct']:.3f}% of one core (perf sampling it adds a little). Meanwhile the machine "
                    f"created {prof.get('forks_per_s', 0):.1f} processes or threads per second: a system-wide "
                    "profiler snapshots the mappings of (`watch-procs`) and symbolizes (`symbolize`) every new "
                    "process it samples. Per thread (schedstat):", "",
                    table(["thread", "% of one core", "share"],
                          [[name, f"{pct:.3f}", f"{pct / prof['cpu_pct'] * 100:.0f}%"]
                           for name, pct in prof["threads"]]), "",
                    f"`perf record -e cpu-clock -c 250000 -g -p PID` (a sample per 250 us of its CPU) over the same window: {prof['samples']} samples; by thread: "
                    + ", ".join(f"{name} {n}" for name, n in prof["samples_by_thread"]) + ".", ""]
            total = prof["samples"] or 1
            rows = []
            for i in range(max(len(prof["top_self"]), len(prof["top_total"]))):
                s = prof["top_self"][i] if i < len(prof["top_self"]) else ("", 0)
                t = prof["top_total"][i] if i < len(prof["top_total"]) else ("", 0)
                rows.append([f"`{short(s[0])}`" if s[0] else "", f"{s[1] * 100 / total:.1f}%" if s[0] else "",
                             f"`{short(t[0])}`" if t[0] else "", f"{t[1] * 100 / total:.1f}%" if t[0] else ""])
            out += [table(["hottest (self)", "self", "hottest of its own code (inclusive)", "inclusive"], rows), ""]
            now, top = prof.get("rss_now_kib", {}), prof.get("rss_top_kib", [])
            if top:
                out += [f"Resident memory at the end of that window: peak {fmt(mb(prof.get('peak_rss_kib'), kib=True), '.1f')} "
                        f"MB; now {fmt(mb(now.get('anon'), kib=True), '.1f')} MB anonymous (heap: caches, store, "
                        f"buffers) + {fmt(mb(now.get('file'), kib=True), '.1f')} MB file-backed (its binary, and the "
                        "ELF files blazesym maps to symbolize). Largest mappings: "
                        + ", ".join(f"`{path}` {kib * 1024 / 1e6:.1f} MB" for path, kib in top) + ".", ""]
    p99, p999 = find(results.get("runs", []), "profilerd", "split"), find(results.get("runs", []), "profilerd@999Hz", "split")
    if prof and p99 and p999 and p99.get("bpf_ns_per_sample") and p999.get("bpf_ns_per_sample"):
        out += [f"profilerd's `sample` program costs {us(p99['bpf_ns_per_sample']):.2f} us per sample at 99 Hz "
                f"and {us(p999['bpf_ns_per_sample']):.2f} us at 999 Hz on the same workload: the same instructions "
                "run faster when they run ten times as often, the mark of cold caches and TLB (the program, its "
                "maps and the stacks it walks are touched only every 10 ms at 99 Hz; in a VM a TLB miss costs "
                "a two-level page walk). The bpftrace programs below show the same at 99 and 999 Hz.", ""]
    rows = results.get("bpf_breakdown")
    if rows:
        out += ["BPF time per sample of simpler programs on the same workload (bpftrace): what a sample "
                "costs here before any work of profilerd's own, and what a kernel and a user stack id add "
                "(the same `bpf_get_stackid` helper profilerd calls twice per sample); the last row is the "
                "count-only program at 999 Hz.", "",
                table(["program", "BPF per sample (us)", "runs"],
                      [[f"`{r['program']}`", fmt(us(r.get("bpf_ns_per_sample")), ".2f") if not r.get("error")
                        else f"failed: {r['error']}", r.get("bpf_samples", "")] for r in rows]), ""]
    return out


def failures_section(runs, results):
    out = []
    failed = [r for r in runs if r.get("error")]
    if failed:
        out += ["## Failures", ""]
        for run in failed:
            out += [f"- **{run['tool']} on {run['workload']}**: {run['error']}" +
                    (f" (kernel headers: {results.get('bcc_headers')})" if run["tool"] == "bcc" else "")]
            if run.get("stderr"):
                out += ["", "  ```", *["  " + line for line in run["stderr"]], "  ```"]
        out.append("")
    return out
