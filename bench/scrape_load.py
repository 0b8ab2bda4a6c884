#!/usr/bin/env python3
"""Load benchmark: CLIENTS clients each scrape /pprof?seconds=10 once a second
for DURATION seconds while profilerd samples at 999 Hz with both CPUs busy.
Reports how many were answered, latency p50/p99/max and the daemon's peak RSS.

Usage (root): bench/scrape_load.py [--clients 50] [--duration 60]
"""
import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def peak_rss_kib(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--duration", type=int, default=60)
    args = parser.parse_args()

    subprocess.run(["cargo", "build", "--release", "-p", "profiler-daemon"], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    work = tempfile.mkdtemp()
    split = os.path.join(work, "split")
    subprocess.run(["cc", "-O0", "-g", "-fno-omit-frame-pointer", "-o", split,
                    os.path.join(ROOT, "tests/workloads/split.c")], check=True)
    port = free_port()
    daemon = subprocess.Popen([os.path.join(ROOT, "target/release/profilerd"), "--listen", f"127.0.0.1:{port}",
                               "--frequency", "999"], stderr=subprocess.DEVNULL)
    busy = [subprocess.Popen([split, str(args.duration + 15)]) for _ in range(2)]
    latencies, failures = [], []
    lock = threading.Lock()
    stop = time.monotonic() + args.duration

    def client(index):
        next_at = time.monotonic() + index / args.clients  # spread the clients over a second
        while next_at < stop:
            time.sleep(max(0.0, next_at - time.monotonic()))
            started = time.monotonic()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/pprof?seconds=10", timeout=30) as response:
                    body = response.read()
                    ok = response.status == 200 and len(body) > 0
            except (urllib.error.URLError, OSError) as err:
                ok, body = False, str(err)
            elapsed = time.monotonic() - started
            with lock:
                (latencies if ok else failures).append(elapsed if ok else body)
            next_at += 1.0

    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        rss = peak_rss_kib(daemon.pid)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=10)
        for process in busy:
            process.kill()
            process.wait()
        shutil.rmtree(work, ignore_errors=True)

    latencies.sort()
    total = len(latencies) + len(failures)
    def pct(p):
        return latencies[min(len(latencies) - 1, int(p / 100 * len(latencies)))] * 1000 if latencies else float("nan")
    print(f"{args.clients} clients x 1 scrape/s x {args.duration} s of /pprof?seconds=10, sampling at 999 Hz, 2 busy CPUs")
    print(f"  answered: {len(latencies)}/{total} (failures: {len(failures)})")
    print(f"  latency ms: p50 {pct(50):.1f}  p99 {pct(99):.1f}  max {latencies[-1] * 1000 if latencies else float('nan'):.1f}"
          f"  mean {statistics.mean(latencies) * 1000 if latencies else float('nan'):.1f}")
    print(f"  daemon peak RSS: {rss / 1024:.1f} MiB")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
