"""Recurses DEPTH Python calls deep and burns CPU at the bottom.

    python3 deep.py DEPTH SECONDS

The stack, root first: <module>, main, DEPTH + 1 calls of descend, spin.
Runs for SECONDS of wall time. Runs unchanged on CPython 3.8 to 3.14.
"""

import sys
import time

# The script's directory is on sys.path: burn.py's loop, not a copy of it.
from burn import spin


def descend(levels, deadline):
    if levels == 0:
        return spin(deadline)
    return descend(levels - 1, deadline)


def main():
    depth = int(sys.argv[1])
    sys.setrecursionlimit(depth + 100)
    descend(depth, time.monotonic() + float(sys.argv[2]))


main()
