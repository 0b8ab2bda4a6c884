"""Two CPU-bound functions, reached through a closure inside a method called
from main(), in a proportion the program measures itself.

    python3 split.py SECONDS OUTPUT [SCALE]

Runs for SECONDS of wall time, calling hot_a and hot_b alternately (hot_a
with 7/3 of hot_b's work, a few milliseconds a call, SCALE times longer if
given). Each call's work is drawn between half and one and a half times
its mean: calls of always the same length make a rhythm that a sampler at
a fixed period can beat with (the scheduler switching on its ticks, 4 ms
at HZ=250, keeps a process's phase), and perf itself then leans 2 points
one way or the other for a whole run. It times each call with
time.thread_time_ns and, after a call when 20 ms have passed since the last
line, and at the end, appends a line to OUTPUT: `WALL_NS HOT_A_NS
HOT_B_NS`, the wall clock (time.time_ns) and the CPU time each function has
run so far. A test
reads the lines around its profile's window: the difference is the split
the profile must show.

Stacks, root first: <module> -> main -> Ledger.settle ->
Ledger.settle.<locals>.one_round -> hot_a or hot_b (co_name before 3.11:
settle, one_round). Runs unchanged on CPython 3.8 to 3.14.
"""

import random
import sys
import time

A_ROUNDS = 14000
B_ROUNDS = 6000
REPORT_NS = 20000000


def hot_a(rounds):
    total = 0
    for i in range(rounds):
        total = (total * 31 + i) % 1000003
    return total


def hot_b(rounds):
    total = 0
    for i in range(rounds):
        total = (total * 31 + i) % 1000003
    return total


class Ledger:
    def __init__(self, output, scale):
        self.output = output
        self.scale = scale

    def settle(self, seconds):
        spent = [0, 0]
        a_rounds = A_ROUNDS * self.scale
        b_rounds = B_ROUNDS * self.scale

        def report(now):
            output.write("%d %d %d\n" % (now, spent[0], spent[1]))
            output.flush()

        draw = random.Random(1).random

        def one_round():
            rounds_a = int(a_rounds * (0.5 + draw()))
            rounds_b = int(b_rounds * (0.5 + draw()))
            start = time.thread_time_ns()
            hot_a(rounds_a)
            middle = time.thread_time_ns()
            spent[0] += middle - start
            # Figures after each call (every 20 ms at most): long calls
            # are then as exact at a window's ends as short ones.
            now = time.time_ns()
            if now >= next_report[0]:
                report(now)
                next_report[0] = now + REPORT_NS
            start = time.thread_time_ns()
            hot_b(rounds_b)
            spent[1] += time.thread_time_ns() - start
            now = time.time_ns()
            if now >= next_report[0]:
                report(now)
                next_report[0] = now + REPORT_NS

        output = self.output
        next_report = [0]
        deadline = time.time_ns() + int(seconds * 1e9)
        while time.time_ns() < deadline:
            one_round()
        report(time.time_ns())
        return spent


def main():
    seconds = float(sys.argv[1])
    scale = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    with open(sys.argv[2], "w") as output:
        a_ns, b_ns = Ledger(output, scale).settle(seconds)
    total = a_ns + b_ns
    print("hot_a %.1f%% hot_b %.1f%%" % (100.0 * a_ns / total, 100.0 * b_ns / total))


if __name__ == "__main__":
    main()
