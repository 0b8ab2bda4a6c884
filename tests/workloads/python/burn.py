"""Burns CPU in a Python function named by the first argument.

    python3 burn.py FUNCTION SECONDS

FUNCTION is one of the functions below, each named for the case a test
runs it in, so that a profile that mixed two processes up shows it. Runs
for SECONDS of wall time. Runs unchanged on CPython 3.8 to 3.14.
"""

import sys
import time


def spin(deadline):
    total = 0
    while time.monotonic() < deadline:
        for i in range(10000):
            total = (total * 31 + i) % 1000003
    return total


# One frame each above spin(), under its own name.
def started_before_daemon(deadline):
    return spin(deadline)


def started_after_daemon(deadline):
    return spin(deadline)


def in_pid_namespace(deadline):
    return spin(deadline)


def main():
    work = globals()[sys.argv[1]]
    work(time.monotonic() + float(sys.argv[2]))


if __name__ == "__main__":
    main()
