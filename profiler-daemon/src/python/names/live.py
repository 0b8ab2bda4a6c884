# Run by names/live.rs under each CPython: prints what the reader must find
# in this process (one JSON object a line), then waits to be read.
#   code {"id", "name" (code points), "filename" (code points), "first", "lines"}
#   forged {...}: fake code objects in a ctypes buffer (argv[1]: offsets)
#   ready
import ctypes
import dis
import json
import os
import sys
import time

VERSION = sys.version_info[:2]


class Ledger:
    def settle(self, rounds):
        def one_round(x):
            total = 0
            for i in range(x):
                if i % 3:
                    total += i
                else:
                    total -= rounds
            return total

        return one_round


def café(a):
    return a * 2


def 名前():
    return 1


def 𠀀():
    return 2


def lines_of(code):
    """The line of each code unit, 0 for none."""
    units = len(code.co_code) // 2
    if VERSION >= (3, 11):
        return [position[0] or 0 for position in code.co_positions()]
    if VERSION == (3, 10):
        lines = [0] * units
        for start, end, line in code.co_lines():
            for unit in range((start + 1) // 2, min(units, (end + 1) // 2)):
                lines[unit] = line or 0
        return lines
    starts = list(dis.findlinestarts(code))
    lines, line, next_start = [], code.co_firstlineno, 0
    for unit in range(units):
        while next_start < len(starts) and starts[next_start][0] <= 2 * unit:
            line = starts[next_start][1]
            next_start += 1
        lines.append(line)
    return lines


def renamed(code, name):
    if VERSION >= (3, 11):
        return code.replace(co_name=name, co_qualname=name)
    return code.replace(co_name=name)


here = os.path.dirname(os.path.abspath(__file__))
# A module whose path is long (names of 200 and 240 characters).
long_dir = os.path.join(here, "d" * 200, "é" * 100)
os.makedirs(long_dir, exist_ok=True)
module_name = "m_" + "long" * 58
with open(os.path.join(long_dir, module_name + ".py"), "w") as module:
    module.write("def helper(x):\n    y = x + 1\n    return y\n")
sys.path.insert(0, long_dir)
helper = __import__(module_name).helper

# A filename and a name past the reader's caps, and a lone surrogate.
far = {}
exec(compile("def far():\n    return 3\n", "/" + "f" * 5000 + ".py", "exec"), far)
codes = [
    sys._getframe().f_code,
    Ledger.settle.__code__,
    Ledger().settle(3).__code__,
    café.__code__,
    名前.__code__,
    𠀀.__code__,
    helper.__code__,
    far["far"].__code__,
    renamed(café.__code__, "n" * 2000),
    renamed(名前.__code__, "bad\udc80"),
]
for code in codes:
    name = getattr(code, "co_qualname", code.co_name)
    print("code", json.dumps({
        "id": id(code),
        "name": [ord(c) for c in name],
        "filename": [ord(c) for c in code.co_filename],
        "first": code.co_firstlineno,
        "lines": lines_of(code),
    }))

# Fake code objects, with the real code type so that they get past it.
offsets = json.loads(sys.argv[1])
buffer = ctypes.create_string_buffer(65536)
base = (ctypes.addressof(buffer) + 15) & ~15


def put64(at, value):
    ctypes.c_uint64.from_address(base + at).value = value


def put32(at, value):
    ctypes.c_uint32.from_address(base + at).value = value


def fake_str(at, kind, ascii, character, count):
    put64(at + offsets["length"], 2**31)
    put32(at + offsets["state"], (kind << 2) | (1 << 5) | (ascii << 6))
    data = at + offsets["ascii_data" if ascii else "compact_data"]
    for index in range(count):
        if kind == 1:
            ctypes.c_uint8.from_address(base + data + index).value = ord(character)
        else:
            put32(data + 4 * index, ord(character))


def fake_code(at, type_address, name, filename, table):
    put64(at + 8, type_address)
    put32(at + offsets["first_line"], 7)
    put64(at + offsets["name"], name)
    put64(at + offsets["filename"], filename)
    put64(at + offsets["line_table"], table)
    return base + at


fake_str(0x1000, 1, 1, "x", 2048)
fake_str(0x2000, 4, 0, "y", 4100)
code_type = id(type(café.__code__))
table = getattr(café.__code__, "co_linetable", None) or café.__code__.co_lnotab
print("forged", json.dumps({
    "truncated": fake_code(0x100, code_type, base + 0x1000, base + 0x2000, id(table)),
    "garbage": fake_code(0x200, code_type, base + 0x1000, 0xdeadbeef000, 0x1234),
    "not_code": fake_code(0x300, base + 0x1000, base + 0x1000, base + 0x1000, id(table)),
    "first": 7,
}))
print("ready", flush=True)
time.sleep(600)
