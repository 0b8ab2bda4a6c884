"""The workloads, compiled into a temporary directory with the flags the tests
use (tests/build.rs), and started before the profiler under test."""
import os
import shutil
import signal
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CFLAGS = ["-O0", "-g", "-fno-omit-frame-pointer", "-mno-omit-leaf-frame-pointer", "-pthread"]
SOURCES = {
    "split": "tests/workloads/split.c",
    "threads": "tests/workloads/threads.c",
    "pingpong": "bench/pingpong.c",
}


def build(work):
    """Compiles the workloads into `work`; returns {name: path}. `busy` is a
    copy of split under another name: the second busy process of the split
    workload, told apart from split by its comm."""
    binaries = {}
    for name, source in SOURCES.items():
        binary = os.path.join(work, name)
        subprocess.run(["cc", *CFLAGS, "-o", binary, os.path.join(ROOT, source)], check=True)
        binaries[name] = binary
    binaries["busy"] = os.path.join(work, "busy")
    shutil.copy(binaries["split"], binaries["busy"])
    return binaries


class Workload:
    """name; `commands(seconds)` -> the processes to start, the first is the
    one measured; `comms`: its thread names (for tools that report only the
    comm)."""

    def __init__(self, name, description, commands, comms):
        self.name, self.description = name, description
        self.commands, self.comms = commands, comms


def workloads(binaries):
    return {
        "split": Workload(
            "split",
            "split (main -> middle -> hot_a 75% / hot_b 25%) + busy (a copy of split) so both CPUs are busy",
            lambda s: [[binaries["split"], str(s)], [binaries["busy"], str(s)]],
            {"split"}),
        "threads": Workload(
            "threads", "threads: two named threads (worker-a, worker-b) spinning",
            lambda s: [[binaries["threads"], str(s)]],
            {"threads", "worker-a", "worker-b"}),
        "pingpong": Workload(
            "pingpong", "pingpong: two threads bouncing a byte over two pipes (context-switch storm), "
            "both on CPU 0",
            # Pinned: unpinned, the rate depends on whether the scheduler puts
            # the two threads on one CPU (~130k round trips/s here) or on two
            # (~10k/s, cross-CPU wake-ups), which swamps a profiler's effect.
            lambda s: [["taskset", "-c", "0", binaries["pingpong"], "-t", str(s)]],
            {"pingpong"}),
    }


class Running:
    """The started processes of a workload; the first one's stdout is kept."""

    def __init__(self, workload, seconds, work):
        self.workload = workload
        self.stdout_path = os.path.join(work, f"{workload.name}.stdout")
        self.procs = []
        with open(self.stdout_path, "w") as out:
            for i, argv in enumerate(workload.commands(seconds)):
                self.procs.append(subprocess.Popen(argv, stdout=out if i == 0 else subprocess.DEVNULL,
                                                   stdin=subprocess.DEVNULL, start_new_session=True))
        self.pid = self.procs[0].pid

    def stop(self):
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait()

    def pingpong_rate(self, start, end):
        """Round trips per second between monotonic times start and end, from
        pingpong -t's "CLOCK_MONOTONIC_NS ROUND_TRIPS" lines."""
        points = []
        with open(self.stdout_path) as out:
            for line in out:
                parts = line.split()
                if len(parts) == 2:
                    points.append((int(parts[0]) / 1e9, int(parts[1])))
        inside = [p for p in points if start <= p[0] <= end]
        if len(inside) < 2:
            return None
        (t0, n0), (t1, n1) = inside[0], inside[-1]
        return (n1 - n0) / (t1 - t0)


def settle(seconds=0.5):
    time.sleep(seconds)
