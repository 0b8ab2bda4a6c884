#!/usr/bin/env python3
"""Load benchmark: CLIENTS clients each scrape /pprof once a second for
DURATION seconds while profilerd samples at 999 Hz with both CPUs busy.

Each client asks for /pprof?seconds=SECONDS (--distinct: client i asks for
SECONDS - i, so that no two ask for the same window and nothing can be
shared). A client that falls behind skips the ticks it missed. Reports, per
client count: answers by status, whether every refusal was a clean 503 (one
line of text/plain, Retry-After, X-Go-Pprof: 1), latency p50/p99/max of the
200s, the daemon's RSS before the load and at its peak, the peak of a
control daemon run alongside and never scraped, and the scraped daemon's
metrics (answers computed/joined/cached, refusals by reason, store bytes).

--clients 0 is the control: the same daemon and load, not scraped.

Usage (root): bench/scrape_load.py [--clients 50 --clients 150] [--duration 60]
    [--seconds 10] [--distinct] [--profilerd PATH] [-- DAEMON FLAGS...]
"""
import argparse
import collections
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLIENT_TIMEOUT = 30.0
WARM_UP = 5.0


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def status_kib(pid, field):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def clean_refusal(err):
    """True if a 503 is what the daemon promises: one line of text, Retry-After, X-Go-Pprof."""
    body = err.read()
    headers = err.headers
    return (headers.get("Content-Type", "").startswith("text/plain")
            and headers.get("X-Go-Pprof") == "1"
            and (headers.get("Retry-After") or "").isdigit()
            and body.endswith(b"\n") and body.count(b"\n") == 1)


def scrape_metrics(port):
    wanted = re.compile(r"^profilerd_(scrape_answers_total|scrape_refused_total|scrape_drains_total)\{(\w+)=\"(\w+)\"\} (\d+)")
    found = {}
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            for line in response.read().decode().splitlines():
                match = wanted.match(line)
                if match:
                    found[f"{match[1].replace('_total', '')}.{match[3]}"] = int(match[4])
                elif line.split(" ")[0] in ("profilerd_store_bytes", "profilerd_drains_total",
                                            "profilerd_symbolize_seconds_total"):
                    found[line.split(" ")[0].replace("profilerd_", "")] = float(line.split()[1])
    except (urllib.error.URLError, OSError):
        pass
    return found


def run(args, clients, split, work):
    port = free_port()
    log_path = os.path.join(work, f"daemon-{clients}.log")
    log = open(log_path, "w")
    daemon = subprocess.Popen([args.profilerd, "--listen", f"127.0.0.1:{port}", "--frequency", "999",
                               *args.daemon_flags], stderr=log)
    # The control: the same daemon at the same time, never scraped. What the
    # machine's other processes make the store and symbolizer hold shows in
    # both; the difference is what the scrapes cost.
    control_port = free_port()
    control = subprocess.Popen([args.profilerd, "--listen", f"127.0.0.1:{control_port}", "--frequency", "999",
                                *args.daemon_flags], stderr=subprocess.DEVNULL)
    busy = [subprocess.Popen([split, str(int(WARM_UP + args.duration + CLIENT_TIMEOUT + 10))]) for _ in range(2)]
    latencies, statuses, unclean = [], collections.Counter(), 0
    lock = threading.Lock()
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        time.sleep(WARM_UP)
        rss_before = status_kib(daemon.pid, "VmRSS")
        load_before = loadavg()
        stop = time.monotonic() + args.duration

        def client(index):
            nonlocal unclean
            seconds = args.seconds - index if args.distinct else args.seconds
            url = f"http://127.0.0.1:{port}/pprof?seconds={seconds}"
            next_at = time.monotonic() + index / clients  # spread the clients over a second
            while next_at < stop:
                time.sleep(max(0.0, next_at - time.monotonic()))
                started = time.monotonic()
                clean = True
                try:
                    with urllib.request.urlopen(url, timeout=CLIENT_TIMEOUT) as response:
                        body = response.read()
                        status = response.status if body else "empty"
                except urllib.error.HTTPError as err:
                    status = err.code
                    clean = err.code != 503 or clean_refusal(err)
                except (urllib.error.URLError, OSError) as err:
                    status = type(getattr(err, "reason", err)).__name__
                elapsed = time.monotonic() - started
                with lock:
                    statuses[status] += 1
                    if status == 200:
                        latencies.append(elapsed)
                    if not clean:
                        unclean += 1
                # Behind (a slow answer): skip the missed ticks rather than burst.
                next_at = max(next_at + 1.0, time.monotonic())

        threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        # With no clients (the control run): the same time, unscraped.
        time.sleep(max(0.0, stop - time.monotonic()))
        load_after = loadavg()
        peak = status_kib(daemon.pid, "VmHWM")
        control_peak = status_kib(control.pid, "VmHWM")
        metrics = scrape_metrics(port)
        control_metrics = scrape_metrics(control_port)
    finally:
        for process in (daemon, control):
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for process in busy:
            process.kill()
            process.wait()
        log.close()
    with open(log_path) as daemon_log:
        # Scrapes that waited the whole 2 s for their drain (the symbolizer
        # busy with, say, a new large binary): they answer late whatever the
        # scrape load.
        slow_drains = sum("drain took over" in line for line in daemon_log)

    latencies.sort()

    def pct(p):
        return latencies[min(len(latencies) - 1, int(p / 100 * len(latencies)))] * 1000 if latencies else float("nan")

    total = sum(statuses.values())
    asked = f"seconds={args.seconds}-i (distinct)" if args.distinct else f"seconds={args.seconds}"
    print(f"{clients} clients x 1 scrape/s x {args.duration} s of /pprof?{asked}, 999 Hz, 2 busy CPUs"
          f" ({os.path.basename(args.profilerd)} {' '.join(args.daemon_flags)})")
    print(f"  load average before/after: {load_before} / {load_after}")
    print(f"  requests: {total}; by status: {dict(statuses.most_common())}; unclean 503s: {unclean}")
    print(f"  latency of 200s, ms: p50 {pct(50):.1f}  p99 {pct(99):.1f}  max {pct(100):.1f}")
    print(f"  daemon RSS: {rss_before / 1024:.1f} MiB before the load, peak {peak / 1024:.1f} MiB"
          f" ({peak * 1024 / 1e6:.1f} MB); the unscraped control's peak {control_peak / 1024:.1f} MiB,"
          f" difference {(peak - control_peak) / 1024:.1f} MiB")
    print(f"  drains that took over 2 s (logged once per shared drain): {slow_drains}")
    if metrics:
        print(f"  daemon metrics: {metrics}")
        print(f"  control's store: {control_metrics.get('store_bytes', float('nan')) / 1e6:.1f} MB,"
              f" drains {control_metrics.get('drains_total', float('nan')):.0f}")
    refused = statuses.get(503, 0)
    print(f"| {clients} | {asked} | {statuses.get(200, 0)} | {refused} | {total - statuses.get(200, 0) - refused}"
          f" | {unclean} | {pct(50):.0f} | {pct(99):.0f} | {peak * 1024 / 1e6:.1f} | {control_peak * 1024 / 1e6:.1f}"
          f" | {(peak - control_peak) * 1024 / 1e6:.1f} | {load_before} |")
    return statuses, unclean


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, action="append")
    parser.add_argument("--duration", type=int, default=60)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--distinct", action="store_true")
    parser.add_argument("--profilerd", default=os.path.join(ROOT, "target/release/profilerd"))
    parser.add_argument("daemon_flags", nargs="*")
    args = parser.parse_args()
    if args.distinct and any(i >= args.seconds for i in range(max(args.clients or [50]))):
        parser.error("--distinct needs --seconds above the number of clients")

    if args.profilerd == os.path.join(ROOT, "target/release/profilerd"):
        subprocess.run(["cargo", "build", "--release", "-p", "profiler-daemon"], cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    work = tempfile.mkdtemp()
    failed = False
    try:
        split = os.path.join(work, "split")
        subprocess.run(["cc", "-O0", "-g", "-fno-omit-frame-pointer", "-o", split,
                        os.path.join(ROOT, "tests/workloads/split.c")], check=True)
        for clients in args.clients or [50]:
            statuses, unclean = run(args, clients, split, work)
            failed |= unclean > 0 or any(status not in (200, 503) for status in statuses)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
