"""New code objects all the time (as templating or exec-heavy code makes):
each round compiles a function never seen before and runs it a while, so
the daemon keeps reading code objects it has not named yet."""
import sys
import time


def main():
    end = time.monotonic() + float(sys.argv[1])
    n = 0
    while time.monotonic() < end:
        n += 1
        source = f"def generated_{n}(k):\n    s = 0\n    for i in range(k):\n        s += i * {n}\n    return s\n"
        scope = {}
        exec(source, scope)
        scope[f"generated_{n}"](20000)


main()
