"""A process that lives about 300 ms: starts, burns CPU in
short_lived_work for MS milliseconds of its own CPU time, and exits.

    python3 short_lived.py MS OUTPUT

Appends to OUTPUT the CPU time short_lived_work ran (time.thread_time_ns),
one line per process, so a test knows what its samples are worth.
Runs unchanged on CPython 3.8 to 3.14.
"""

import sys
import time


def short_lived_work(budget_ns):
    start = time.thread_time_ns()
    total = 0
    while time.thread_time_ns() - start < budget_ns:
        for i in range(2000):
            total = (total * 31 + i) % 1000003
    return time.thread_time_ns() - start


def main():
    ran = short_lived_work(int(float(sys.argv[1]) * 1e6))
    with open(sys.argv[2], "a") as out:
        out.write("%d\n" % ran)


if __name__ == "__main__":
    main()
