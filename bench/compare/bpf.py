"""BPF programs and maps of a tool, and their run-time statistics.

A tool's programs and maps are the ones its processes hold descriptors for:
/proc/PID/fdinfo of a BPF program, link or map descriptor names its prog_id or
map_id. Other engineers' profilers may load and unload programs at any moment
on this machine, so a before/after diff of `bpftool prog show` could pick
theirs; the descriptors cannot. Maps only a program refers to (not held by
the tool) are added from the programs' map_ids."""
import contextlib
import json
import os
import subprocess
import time

from procs import descendants

PERF_EVENT_PROG_TYPE = 7  # BPF_PROG_TYPE_PERF_EVENT
STATS_SYSCTL = "/proc/sys/kernel/bpf_stats_enabled"


def bpftool(*args, retries=5):
    """bpftool's JSON output. Listing everything can fail when an object
    disappears half-way (other tests on the machine): retried."""
    for attempt in range(retries):
        out = subprocess.run(["bpftool", *args, "--json"], capture_output=True, text=True)
        if out.returncode == 0:
            return json.loads(out.stdout)
        time.sleep(0.01 * (attempt + 1))
    raise RuntimeError(f"bpftool {' '.join(args)}: {out.stdout.strip()} {out.stderr.strip()}")


def held_objects(root):
    """{"prog": {id: prog_type or None}, "map": {id: memlock bytes}} held by
    the descriptors of `root` and its descendants."""
    progs, maps = {}, {}
    for pid in descendants(root):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if "bpf" not in target:
                    continue
                with open(f"/proc/{pid}/fdinfo/{fd}") as info:
                    fields = dict(line.split(":", 1) for line in info.read().splitlines() if ":" in line)
            except OSError:
                continue
            fields = {key.strip(): value.strip() for key, value in fields.items()}
            if "prog_id" in fields:
                prog_type = fields.get("prog_type")
                known = progs.get(int(fields["prog_id"]))
                progs[int(fields["prog_id"])] = int(prog_type) if prog_type else known
            if "map_id" in fields:
                maps[int(fields["map_id"])] = int(fields.get("memlock", 0))
    return {"prog": progs, "map": maps}


def perf_event_prog_ids(root):
    """Ids of the programs `root`'s processes hold that are, or may be (held
    through a link only, type unknown), perf_event programs."""
    return [pid for pid, kind in held_objects(root)["prog"].items() if kind in (PERF_EVENT_PROG_TYPE, None)]


def prog_info(prog_id):
    try:
        return bpftool("prog", "show", "id", str(prog_id), retries=1)
    except RuntimeError:
        return None


def tool_bpf(root):
    """The tool's programs (with run_time_ns/run_cnt) and maps (bytes_memlock)
    right now; call it before stopping the tool."""
    held = held_objects(root)
    progs = [info for info in (prog_info(pid) for pid in sorted(held["prog"])) if info]
    map_ids = set(held["map"])
    for prog in progs:
        map_ids.update(prog.get("map_ids", []))
    maps = []
    for map_id in sorted(map_ids):
        try:
            info = bpftool("map", "show", "id", str(map_id), retries=1)
        except RuntimeError:
            continue
        maps.append({"id": map_id, "name": info.get("name", ""), "type": info.get("type", ""),
                     "bytes_memlock": int(info.get("bytes_memlock", held["map"].get(map_id, 0)))})
    return {
        "progs": [{"id": p["id"], "name": p.get("name", ""), "type": p.get("type", ""),
                   "run_time_ns": p.get("run_time_ns", 0), "run_cnt": p.get("run_cnt", 0)} for p in progs],
        "maps": maps,
    }


def summarize(bpf):
    """Per-sample BPF time (perf_event programs) and totals."""
    sampling = [p for p in bpf["progs"] if p["type"] == "perf_event"]
    samples = sum(p["run_cnt"] for p in sampling)
    sample_ns = sum(p["run_time_ns"] for p in sampling)
    # profilerd's off-CPU program runs once per context switch.
    switching = [p for p in bpf["progs"] if p["name"] == "on_switch"]
    switches = sum(p["run_cnt"] for p in switching)
    switch_ns = sum(p["run_time_ns"] for p in switching)
    return {
        "bpf_samples": samples,
        "bpf_ns_per_sample": sample_ns / samples if samples else None,
        "bpf_switches": switches,
        "bpf_ns_per_switch": switch_ns / switches if switches else None,
        "bpf_total_s": sum(p["run_time_ns"] for p in bpf["progs"]) / 1e9,
        "map_bytes": sum(m["bytes_memlock"] for m in bpf["maps"]),
        "prog_names": sorted({p["name"] for p in bpf["progs"]}),
    }


def first_run(root, deadline, poll_s=0.01):
    """Poll until one of the tool's perf_event programs has run (run_cnt > 0).
    Returns the monotonic time it was seen, or None at the deadline or if the
    tool exited."""
    while time.monotonic() < deadline:
        for prog_id in perf_event_prog_ids(root):
            info = prog_info(prog_id)
            if info and info.get("type") == "perf_event" and info.get("run_cnt", 0) > 0:
                return time.monotonic()
        if not os.path.exists(f"/proc/{root}") or _zombie(root):
            return None
        time.sleep(poll_s)
    return None


def _zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def enable_stats():
    """Turn on run_time_ns/run_cnt accounting; returns the previous value."""
    with open(STATS_SYSCTL) as current:
        before = current.read().strip()
    with open(STATS_SYSCTL, "w") as sysctl:
        sysctl.write("1")
    return before


@contextlib.contextmanager
def stats_off():
    """`kernel.bpf_stats_enabled` off inside the block, back on after it."""
    with open(STATS_SYSCTL, "w") as sysctl:
        sysctl.write("0")
    try:
        yield
    finally:
        with open(STATS_SYSCTL, "w") as sysctl:
            sysctl.write("1")


def restore_stats(before):
    if before is not None and before != "1":
        with open(STATS_SYSCTL, "w") as sysctl:
            sysctl.write(before)
