"""The profilers under test: how each is started, how its first sample is
detected, how it is stopped and how its output is read.

Start-up to the first sample, per tool:
- BPF tools (profilerd, bpftrace, bcc): from the exec of the tool until one of
  the perf_event programs its processes hold has run_cnt > 0 (polled with
  bpftool every ~10 ms, so the figure is late by up to ~15 ms). For profilerd,
  also until the sample is queryable: /threads?pid=P shows a sample of the
  workload (each request drains the maps first).
- perf: it has no BPF program, so after the run: the timestamp of the first
  sample in perf.data (perf record -k monotonic stamps samples with
  CLOCK_MONOTONIC) minus the exec time taken on the same clock.
"""
import json
import os
import signal
import socket
import time
import urllib.error
import urllib.request

import bpf
import stacks
from procs import Tool, run_measured

BPFTRACE_PROGRAM = "profile:hz:99 { @[kstack, ustack, comm] = count(); }"


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def http_get(url, timeout=30):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


class Profiler:
    """Base: a tool started with `argv()`, stopped with SIGINT."""

    name = "?"
    bpf = True
    stop_signal = signal.SIGINT
    stop_timeout = 180  # bcc and bpftrace symbolize everything at exit

    def __init__(self, ctx):
        self.ctx = ctx

    def command(self, run):
        raise NotImplementedError

    def start(self, run):
        self.out = open(os.path.join(self.ctx.work, f"{run['id']}.out"), "w")
        self.err = open(os.path.join(self.ctx.work, f"{run['id']}.err"), "w")
        try:
            return Tool(self.command(run), env=self.env(), stdout=self.out, stderr=self.err, cwd=self.ctx.work)
        finally:
            self.out.close()
            self.err.close()

    def env(self):
        return None

    def first_sample(self, run, tool, deadline):
        """Monotonic time of the first sample seen live, or None."""
        return bpf.first_run(tool.pid, deadline)

    def after_first(self, run, tool):
        pass

    def before_stop(self, run, tool):
        pass

    def read_output(self, run, tool):
        """-> list of stacks.Stack for the whole system."""
        raise NotImplementedError

    def output_text(self, run):
        with open(os.path.join(self.ctx.work, f"{run['id']}.out"), errors="replace") as out:
            return out.read()

    def stderr_tail(self, run, lines=6):
        try:
            with open(os.path.join(self.ctx.work, f"{run['id']}.err"), errors="replace") as err:
                return [line.rstrip() for line in err.read().splitlines() if line.strip()][-lines:]
        except OSError:
            return []


class Profilerd(Profiler):
    name = "profilerd"
    stop_signal = signal.SIGTERM

    def __init__(self, ctx, frequency=99):
        super().__init__(ctx)
        self.frequency = frequency
        if frequency != 99:
            self.name = f"profilerd@{frequency}Hz"
        self.port = free_port()

    def command(self, run):
        return [self.ctx.profilerd, "--listen", f"127.0.0.1:{self.port}", "--frequency", str(self.frequency)]

    def url(self, path):
        return f"http://127.0.0.1:{self.port}{path}"

    def after_first(self, run, tool):
        """Until /threads shows a sample of the measured process."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                body = json.loads(http_get(self.url(f"/threads?pid={run['workload_pid']}&seconds=5"), timeout=5))
                if any(p.get("samples", 0) > 0 for p in body.get("processes", [])):
                    run["first_queryable_s"] = time.monotonic() - tool.launched
                    return
            except (urllib.error.URLError, OSError, ValueError):
                pass
            time.sleep(0.05)

    def before_stop(self, run, tool):
        """The window's folded stacks of the measured process, and the BPF loss counters."""
        # pingpong's rate window (measure.rate_window) runs before this query:
        # its samples are asked for too, as the other tools report theirs.
        seconds = max(1, round(self.ctx.duration + run.get("rate_window_s", 0)))
        started = time.monotonic()
        self.folded = http_get(self.url(f"/folded?pid={run['workload_pid']}&seconds={seconds}")).decode()
        run["query_s"] = time.monotonic() - started
        try:
            metrics = http_get(self.url("/metrics")).decode()
            run["lost_samples"] = sum(int(float(line.rsplit(" ", 1)[1])) for line in metrics.splitlines()
                                      if line.startswith("profilerd_samples_lost_total"))
        except (urllib.error.URLError, OSError, ValueError, IndexError):
            pass

    def read_output(self, run, tool):
        return stacks.folded(getattr(self, "folded", ""), pid=run["workload_pid"])

    def command_text(self):
        return (f"profilerd --listen 127.0.0.1:PORT --frequency {self.frequency}; at the end "
                f"GET /folded?pid=WORKLOAD&seconds=DURATION (stopped with SIGTERM)")


class ProfilerdOffCpu(Profilerd):
    """profilerd with off-CPU profiling on (the sched_switch program)."""
    name = "profilerd+offcpu"

    def command(self, run):
        return super().command(run) + ["--off-cpu"]

    def command_text(self):
        return super().command_text().replace("--frequency", "--off-cpu --frequency", 1)


class Perf(Profiler):
    name = "perf"
    bpf = False
    start_timeout = 30

    def data(self, run):
        return os.path.join(self.ctx.work, f"{run['id']}.perf.data")

    def command(self, run):
        return ["perf", "record", "-F", "99", "-a", "-g", "-k", "monotonic", "-o", self.data(run)]

    def first_sample(self, run, tool, deadline):
        """Live: perf.data has been created (its header written); the real
        first-sample time is taken from the samples' timestamps afterwards."""
        while time.monotonic() < deadline and tool.running():
            if os.path.exists(self.data(run)) and os.path.getsize(self.data(run)) > 0:
                return time.monotonic()
            time.sleep(0.01)
        return None

    def read_output(self, run, tool):
        script = os.path.join(self.ctx.work, f"{run['id']}.perf.txt")
        with open(script, "w") as out:
            code, cpu, wall = run_measured(["perf", "script", "-i", self.data(run), "-F",
                                            "comm,pid,tid,time,ip,sym,dso"], stdout=out,
                                           stderr=open(os.devnull, "w"))
        run["postprocess_cpu_s"] = cpu
        with open(script, errors="replace") as text:
            result, times = stacks.perf_script(text.read())
        if times:
            run["first_sample_s"] = min(times) - tool.launched
        os.unlink(script)
        return result

    def command_text(self):
        return ("perf record -F 99 -a -g -k monotonic -o perf.data (SIGINT to stop); then "
                "perf script -F comm,pid,tid,time,ip,sym,dso, folded by the harness")


class Bpftrace(Profiler):
    name = "bpftrace"

    def __init__(self, ctx, program=BPFTRACE_PROGRAM, name="bpftrace"):
        super().__init__(ctx)
        self.program, self.name = program, name

    def command(self, run):
        return ["bpftrace", "-e", self.program]

    def read_output(self, run, tool):
        return stacks.bpftrace_map(self.output_text(run))

    def command_text(self):
        return f"bpftrace -e '{self.program}' (SIGINT to stop; it prints the map)"


class Bcc(Profiler):
    name = "bcc"

    def command(self, run):
        return [self.ctx.bcc_profile, "-F", "99", "-f", "-a"]

    def env(self):
        env = dict(os.environ)
        if self.ctx.bcc_kernel_source:
            env["BCC_KERNEL_SOURCE"] = self.ctx.bcc_kernel_source
        return env

    def read_output(self, run, tool):
        return stacks.folded(self.output_text(run))

    def command_text(self):
        return ("BCC_KERNEL_SOURCE=<Debian 6.1 headers, merged> /usr/sbin/profile-bpfcc -F 99 -f -a "
                "(SIGINT to stop; -f folded, -a marks kernel frames)")


class NoProfiler(Profiler):
    """The baseline: the workload alone."""
    name = "none"
    bpf = False

    def start(self, run):
        return None

    def command_text(self):
        return "(no profiler)"
