"""A multiprocessing child burning CPU in a known function while its
parent waits.

    python3 multiproc.py SECONDS OUTPUT

The child (multiprocessing's default start method: fork on Linux up to
3.13) runs multiprocessing_child_work for SECONDS of wall time; OUTPUT gets
the child's pid once it runs. The parent waits in join().
Runs unchanged on CPython 3.8 to 3.14.
"""

import multiprocessing
import os
import sys
import time


def multiprocessing_child_work(deadline, output):
    partial = output + ".partial"
    with open(partial, "w") as out:
        out.write("%d\n" % os.getpid())
    os.replace(partial, output)
    total = 0
    while time.monotonic() < deadline:
        for i in range(10000):
            total = (total * 31 + i) % 1000003
    return total


def main():
    deadline = time.monotonic() + float(sys.argv[1])
    child = multiprocessing.Process(target=multiprocessing_child_work, args=(deadline, sys.argv[2]))
    child.start()
    child.join()
    sys.exit(child.exitcode)


if __name__ == "__main__":
    main()
