"""Processes: the CPU time, peak RSS and descendants of a tool, and starting and
stopping it so that nothing is left running."""
import os
import signal
import subprocess
import time

CPUCLOCK_SCHED = 2  # linux/posix-timers.h: the scheduler's runtime, in ns


def process_cpu_ns(pid):
    """CPU time of process `pid`, all its threads, live and exited, in ns.

    clock_gettime on the process CPU clock (what clock_getcpuclockid(pid)
    returns) reads the kernel's sum_exec_runtime: nanoseconds, where
    /proc/PID/stat has 10 ms ticks. None if the process is gone."""
    try:
        return time.clock_gettime_ns(((~pid) << 3) | CPUCLOCK_SCHED)
    except OSError:
        return None


def _stat_fields(pid):
    with open(f"/proc/{pid}/stat") as stat:
        # the comm (field 2) may hold spaces and parentheses: split after the last ')'
        return stat.read().rsplit(")", 1)[1].split()


def descendants(root):
    """`root` and every live process below it."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(_stat_fields(int(entry))[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def tree_cpu_ns(root):
    """CPU time of `root` and its live descendants (ns)."""
    return sum(process_cpu_ns(pid) or 0 for pid in descendants(root))


def vm_hwm_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_hwm_kib(root):
    """Sum of the peak RSS (VmHWM) of `root` and its live descendants."""
    return sum(vm_hwm_kib(pid) for pid in descendants(root))


def tree_hwm_by_process(root):
    """[[name, VmHWM KiB]] of `root` and its live descendants: which process
    a peak RSS sum owes to (profilerd's workers run its own binary as `exe`,
    named in comm)."""
    peaks = []
    for pid in descendants(root):
        try:
            with open(f"/proc/{pid}/comm") as comm:
                name = comm.read().strip()
        except OSError:
            continue
        peaks.append([name, vm_hwm_kib(pid)])
    return peaks


def thread_cpu_ns(pid):
    """{(tid, thread name): CPU ns} of the live threads of `pid` (schedstat)."""
    threads = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return threads
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as comm, open(f"/proc/{pid}/task/{tid}/schedstat") as sched:
                threads[(int(tid), comm.read().strip())] = int(sched.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return threads


def tree_thread_cpu_ns(root):
    """{(pid, tid): (thread name, CPU ns)} of the live threads of `root` and
    its live descendants: where a tree's CPU went. A thread or process that
    exits between two readings is missing from their difference (as a
    process is from tree_cpu_ns's)."""
    threads = {}
    for pid in descendants(root):
        for (tid, name), ns in thread_cpu_ns(pid).items():
            threads[(pid, tid)] = (name, ns)
    return threads


def cpu_by_name(before, after, seconds):
    """[[thread name, % of a core]] between two tree_thread_cpu_ns readings,
    largest first; a thread is matched by pid and tid, named as it was last.
    A clock that went back is another thread under a reused tid: all its
    time is the window's."""
    names = {}
    for key, (name, ns) in after.items():
        earlier = before.get(key, (name, 0))[1]
        spent = ns - earlier if ns >= earlier else ns
        names[name] = names.get(name, 0) + spent
    return sorted(([name, ns / 1e9 / seconds * 100] for name, ns in names.items() if ns > 0),
                  key=lambda item: -item[1])


class Tool:
    """A started tool: a Popen in its own process group, stopped with a signal
    and reaped with wait4 so that its rusage (CPU of all its threads and of the
    children it reaped, peak RSS) covers its whole life, exit included."""

    def __init__(self, argv, env=None, stdout=None, stderr=None, cwd=None):
        self.argv = argv
        self.launched = time.monotonic()
        self.proc = subprocess.Popen(argv, env=env, stdout=stdout, stderr=stderr, cwd=cwd,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        self.pid = self.proc.pid
        self.rusage = None
        self.exit_status = None

    def running(self):
        if self.exit_status is not None:
            return False
        pid, status, rusage = os.wait4(self.pid, os.WNOHANG)
        if pid == 0:
            return True
        self._reaped(status, rusage)
        return False

    def _reaped(self, status, rusage):
        self.exit_status = os.waitstatus_to_exitcode(status)
        self.rusage = rusage
        self.proc.returncode = self.exit_status  # so Popen does not wait again

    def stop(self, sig, timeout):
        """Signal the tool, wait up to `timeout` s, then kill its whole group.
        Returns True if it exited on its own after the signal."""
        if not self.running():
            return False
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.running():
                self._kill_group()  # anything it left behind
                return True
            time.sleep(0.02)
        self.kill()
        return False

    def _kill_group(self):
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def kill(self):
        self._kill_group()
        if self.exit_status is None:
            _, status, rusage = os.wait4(self.pid, 0)
            self._reaped(status, rusage)

    def cpu_s(self):
        """Whole-life CPU seconds from wait4 (None until reaped)."""
        if self.rusage is None:
            return None
        return self.rusage.ru_utime + self.rusage.ru_stime

    def maxrss_kib(self):
        return self.rusage.ru_maxrss if self.rusage else 0


def run_measured(argv, **kwargs):
    """Run a command to completion; (CompletedProcess-like stdout, CPU seconds)."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, **kwargs)
    _, status, rusage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, rusage.ru_utime + rusage.ru_stime, time.monotonic() - start


def forks_total():
    """Processes (and threads) created on the machine since boot."""
    with open("/proc/stat") as stat:
        for line in stat:
            if line.startswith("processes "):
                return int(line.split()[1])
    return 0


def rss_by_mapping(pid, limit=8):
    """({"anon": KiB, "file": KiB}, [(mapping, KiB)] biggest first) of `pid`
    now, from /proc/PID/status and /proc/PID/smaps; anonymous mappings are
    named [anon]."""
    totals, by_path, path = {}, {}, None
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(("RssAnon:", "RssFile:", "RssShmem:")):
                    totals[line.split(":")[0].removeprefix("Rss").lower()] = int(line.split()[1])
        with open(f"/proc/{pid}/smaps") as smaps:
            for line in smaps:
                fields = line.split()
                if fields and "-" in fields[0] and len(fields) >= 5 and not fields[0].endswith(":"):
                    path = fields[5] if len(fields) > 5 else "[anon]"
                elif fields and fields[0] == "Rss:" and path is not None:
                    by_path[path] = by_path.get(path, 0) + int(fields[1])
    except OSError:
        pass
    return totals, sorted(by_path.items(), key=lambda item: -item[1])[:limit]
