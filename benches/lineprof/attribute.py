#!/usr/bin/env python3
"""Attribute a Lua line profile (redis-lineprof.patch) to the library's lines and functions.

usage: attribute.py LIBRARY CALLS PROFILE [BASELINE] [--lines N]

LIBRARY   the library's code as loaded (`redis-cli --raw FUNCTION LIST WITHCODE`, the text after
          `library_code`: its line numbers are the profile's)
CALLS     the script calls the profile covers (counts are printed per call)
PROFILE   a profile file (LUA_LINEPROF=PATH writes PATH.<pid>)
BASELINE  another profile of the same library: the difference is printed (PROFILE - BASELINE)

Prints VM instructions per call by top-level function (`local function f`, `function T.f`),
or with --lines N the N lines that differ most, with the calls each line makes.
"""
import re
import sys


def owners(lines):
    """The top-level function each line belongs to."""
    out, current = [None], 'top level'
    for line in lines:
        m = re.match(r'(?:local\s+)?function\s+([\w.:]+)', line) or re.match(r'local (\w+) = ', line)
        if m:
            current = m.group(1)
        out.append(current)
    return out


def load(path):
    counts = {}
    with open(path) as f:
        for row in f:
            line, ins, calls = map(int, row.split())
            counts[line] = (ins, calls)
    return counts


def main(argv):
    top = None
    if '--lines' in argv:
        at = argv.index('--lines')
        top = int(argv[at + 1])
        del argv[at:at + 2]
    library, calls, profile = argv[0], int(argv[1]), argv[2]
    lines = open(library).read().split('\n')
    owner = owners(lines)
    new = load(profile)
    old = load(argv[3]) if len(argv) > 3 else {}
    per = lambda n: n / calls
    if top:
        rows = sorted(set(new) | set(old), key=lambda k: -abs(new.get(k, (0, 0))[0] - old.get(k, (0, 0))[0]))
        for k in rows[:top]:
            (a, ac), (b, bc) = old.get(k, (0, 0)), new.get(k, (0, 0))
            print('%+8.1f ins %+5.1f calls  %5d %-24s %s' % (per(b - a), per(bc - ac), k, owner[k], lines[k - 1].strip()[:80]))
        return
    by = {}
    for counts, sign in ((new, 1), (old, -1)):
        for k, (ins, _) in counts.items():
            by[owner[k]] = by.get(owner[k], 0) + sign * ins
    print('VM instructions per call: %.1f' % per(sum(v[0] for v in new.values()) - sum(v[0] for v in old.values())))
    for name, n in sorted(by.items(), key=lambda kv: -abs(kv[1]))[:40]:
        print('%+9.1f  %s' % (per(n), name))


if __name__ == '__main__':
    main(sys.argv[1:])
