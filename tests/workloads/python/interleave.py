"""Python calling C calling Python, and Python calling C libraries.

    python3 interleave.py SECONDS

Loops over three stages until SECONDS of wall time have passed:
  sort_stage      sorted(values, key=pykey): the C sort (builtin_sorted,
                  list_sort_impl) calls back into the Python function pykey
  compress_stage  zlib.compress of a 1 MiB buffer (zlib's deflate)
  hash_stage      hashlib.sha256 of a 16 MiB buffer, 8 times (OpenSSL's
                  SHA-256)
Stacks, root first: ... -> main -> sort_stage -> [C sort] -> pykey;
main -> compress_stage -> [C: zlib]; main -> hash_stage -> [C: sha256].
Runs unchanged on CPython 3.8 to 3.14.
"""

import hashlib
import random
import sys
import time
import zlib


def pykey(value):
    # Some work per key, so the time under sorted() is mostly here.
    total = value
    for _ in range(40):
        total = (total * 1103515245 + 12345) & 0x7FFFFFFF
    return total


def sort_stage(values):
    return sorted(values, key=pykey)


def compress_stage(buffer):
    return zlib.compress(buffer, 6)


def hash_stage(buffer):
    # SHA-256 is fast (with the CPU's SHA extensions, over 1 GB/s): eight
    # passes give it a share of the loop like the other stages'.
    digest = b""
    for _ in range(8):
        digest = hashlib.sha256(buffer).digest()
    return digest


def main():
    seconds = float(sys.argv[1])
    rng = random.Random(7)
    values = [rng.randrange(1 << 30) for _ in range(20000)]
    # Compressible but not trivially: words from a small vocabulary.
    words = [b"alpha", b"beta", b"gamma", b"delta", b"epsilon", b"zeta", b"eta", b"theta"]
    text = b" ".join(rng.choice(words) + str(rng.randrange(1000)).encode() for _ in range(150000))
    compressible = text[: 1 << 20]
    big = bytes(rng.getrandbits(8) for _ in range(1 << 16)) * 256
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        sort_stage(values)
        compress_stage(compressible)
        hash_stage(big)


if __name__ == "__main__":
    main()
