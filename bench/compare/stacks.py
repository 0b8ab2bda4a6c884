"""Each tool's output read into one form, and the accuracy measures.

A stack is (comm, pid or None, user frames root first, kernel frames root
first, count). Function names lose their +offset and kernel/inline markers."""
import re
from collections import namedtuple

Stack = namedtuple("Stack", "comm pid user kernel count")

_OFFSET = re.compile(r"\+0x[0-9a-f]+$|\+\d+$")


def _name(frame):
    return _OFFSET.sub("", frame.strip())


def folded(text, pid=None):
    """Folded stacks as profilerd and bcc's `profile -f -a` write them:
    `comm;user root;...;user leaf;kernel root_[k];... COUNT`, kernel frames
    suffixed _[k] and (profilerd) inlined frames _[i]."""
    stacks = []
    for line in text.splitlines():
        frames, _, count = line.rpartition(" ")
        if not frames or not count.isdigit():
            continue
        comm, *rest = frames.split(";")
        user = [f.removesuffix("_[i]") for f in rest if not f.endswith("_[k]")]
        kernel = [f.removesuffix("_[k]") for f in rest if f.endswith("_[k]")]
        stacks.append(Stack(comm, pid, user, kernel, int(count)))
    return stacks


_PERF_HEADER = re.compile(r"^(.*?)\s+(\d+)/(\d+)\s+(\d+\.\d+):\s*$")
_PERF_FRAME = re.compile(r"^\s*([0-9a-f]+)\s+(.*?)\s+\((.*)\)\s*$")


def perf_script(text):
    """`perf script -F comm,pid,tid,time,ip,sym,dso`: a header line per sample,
    then its frames leaf first, a blank line between samples. Returns (stacks,
    timestamps of the samples)."""
    stacks, times = [], []
    header, frames = None, []

    def flush():
        if header:
            user = [_name(sym) for sym, dso in reversed(frames) if dso != "[kernel.kallsyms]"]
            kernel = [_name(sym) for sym, dso in reversed(frames) if dso == "[kernel.kallsyms]"]
            stacks.append(Stack(header[0], int(header[1]), user, kernel, 1))
            times.append(float(header[3]))

    for line in text.splitlines():
        if not line.strip():
            flush()
            header, frames = None, []
            continue
        match = _PERF_HEADER.match(line) if header is None else None
        if match:
            header = match.groups()
            continue
        frame = _PERF_FRAME.match(line)
        if frame and header:
            frames.append((frame.group(2), frame.group(3)))
    flush()
    return stacks, times


_BPFTRACE_END = re.compile(r"\]: (\d+)$")


def bpftrace_map(text):
    """bpftrace's print of @[kstack, ustack, comm] = count():

        @[
            kernel_leaf+12
            ...
        ,
            user_leaf+34
            ...
        , comm]: 5

    An empty kernel stack gives `@[, ` on the first line, an empty user stack
    `, , comm]: N` on the last. Frames are leaf first."""
    stacks, entry = [], None
    for line in text.splitlines():
        if line.startswith("@["):
            entry = [line[2:]]
        elif entry is not None:
            entry.append(line)
        else:
            continue
        end = _BPFTRACE_END.search(entry[-1])
        if not end:
            continue
        entry[-1] = entry[-1][: end.start()]
        *middle, last = entry
        kernel, user, switched = [], [], False
        current = kernel
        for part in middle:
            if part.startswith("    "):
                current.append(_name(part))
            elif part.strip() == ",":
                current, switched = user, True
        comm = last[2:] if last.startswith(", ") else last
        if not switched and comm.startswith(", "):
            comm = comm[2:]  # both separators on the last line: empty user stack
        stacks.append(Stack(comm, None, user[::-1], kernel[::-1], int(end.group(1))))
        entry = None
    return stacks


def select(stacks, comms=None, pids=None):
    """The stacks of the workload: by pid where the tool reports pids, else by
    thread/process name (bpftrace and bcc give only the comm)."""
    if pids is not None and all(s.pid is not None for s in stacks):
        return [s for s in stacks if s.pid in pids]
    return [s for s in stacks if s.comm in comms]


def split_accuracy(stacks, hot="hot_a", cold="hot_b", expected=0.75):
    """On the known-split workload: the share of hot among samples whose
    innermost user frame is hot or cold (error against `expected`, in
    percentage points), and the % of all its samples whose user stack reaches
    main."""
    total = sum(s.count for s in stacks)
    hot_n = sum(s.count for s in stacks if s.user and s.user[-1] == hot)
    cold_n = sum(s.count for s in stacks if s.user and s.user[-1] == cold)
    main_n = sum(s.count for s in stacks if "main" in s.user)
    share = hot_n / (hot_n + cold_n) if hot_n + cold_n else None
    return {
        "samples": total,
        "hot_share": share,
        "share_error_pp": abs(share - expected) * 100 if share is not None else None,
        "main_pct": main_n * 100 / total if total else None,
    }


def top_functions(stacks, limit=15):
    """(self, total) sample counts per function, hottest self first; a
    function counts once per stack for total however deep it recurses."""
    self_counts, totals = {}, {}
    for s in stacks:
        frames = s.user + s.kernel
        if not frames:
            continue
        self_counts[frames[-1]] = self_counts.get(frames[-1], 0) + s.count
        for name in set(frames):
            totals[name] = totals.get(name, 0) + s.count
    by_self = sorted(self_counts.items(), key=lambda item: -item[1])[:limit]
    by_total = sorted(totals.items(), key=lambda item: -item[1])[:limit]
    return by_self, by_total
