"""A busy CPython workload for bench/python_cost.sh: a closure in a method,
eight Python frames deep, splitting its CPU between two functions."""
import sys
import time


def hot_a(n):
    s = 0
    for i in range(n):
        s += i * i
    return s


def hot_b(n):
    s = 0
    for i in range(n):
        s ^= i
    return s


def depth(k, f):
    return f() if k == 0 else depth(k - 1, f)


class Ledger:
    def settle(self, seconds):
        def one_round():
            hot_a(3000)
            hot_b(1000)

        end = time.monotonic() + seconds
        while time.monotonic() < end:
            depth(3, one_round)


def main():
    Ledger().settle(float(sys.argv[1]))


main()
