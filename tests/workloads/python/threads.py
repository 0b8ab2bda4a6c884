"""Two threads of one process: one computing in Python, one in a C call
that releases the GIL.

    python3 threads.py SECONDS OUTPUT

  py-compute  python_compute(): a pure-Python loop
  c-hash      hash_in_c(): hashlib.sha256 over a 16 MiB buffer, again and
              again (OpenSSL's SHA-256, run without the GIL)
Once both run, OUTPUT gets one line per thread, `NAME NATIVE_TID`, so a test
can tell their samples apart by thread id. The main thread waits in join().
Runs unchanged on CPython 3.8 to 3.14.
"""

import hashlib
import os
import sys
import threading
import time


def python_compute(deadline):
    total = 0
    while time.monotonic() < deadline:
        for i in range(10000):
            total = (total * 31 + i) % 1000003
    return total


def hash_in_c(buffer, deadline):
    digest = b""
    while time.monotonic() < deadline:
        digest = hashlib.sha256(buffer).digest()
    return digest


def run(name, tids, ready, work, *args):
    tids[name] = threading.get_native_id()
    ready.wait()
    work(*args)


def main():
    seconds = float(sys.argv[1])
    output = sys.argv[2]
    buffer = os.urandom(1 << 16) * 256
    deadline = time.monotonic() + seconds
    tids = {}
    ready = threading.Barrier(3)
    threads = [
        threading.Thread(target=run, name="py-compute", args=("py-compute", tids, ready, python_compute, deadline)),
        threading.Thread(target=run, name="c-hash", args=("c-hash", tids, ready, hash_in_c, buffer, deadline)),
    ]
    for thread in threads:
        thread.start()
    ready.wait()
    partial = output + ".partial"
    with open(partial, "w") as out:
        for name, tid in sorted(tids.items()):
            out.write("%s %d\n" % (name, tid))
    os.replace(partial, output)
    for thread in threads:
        thread.join()


if __name__ == "__main__":
    main()
