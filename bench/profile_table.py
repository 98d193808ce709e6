#!/usr/bin/env python3
"""bench/profile_table.py - read the table of `kiln train --profile`
(out_dir/profile.txt, core/profile.c write_table) into rows.

The layer and op columns are padded to their longest name, and a name may
hold spaces ("step counter", "data wait"), so a row is not split on
whitespace: the header line gives where the op and pass columns start,
and the rest of a row (pass, calls, total ms, mean us, % step, median us,
min us) holds no spaces.

    rows(path) -> [(layer, op, pass, calls, total_ms, mean_us, pct_step,
                    median_us, min_us)], with the "total" row last (layer
                    "total", op and pass "")

Run as a script, it prints each row as layer|op|pass|calls|median_us.
"""
import re
import sys

HEADER = re.compile(r"^(layer\s+)(op\s+)pass\s+calls\s")


def rows(path):
    out, op_at, pass_at = [], None, None
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            m = HEADER.match(line)
            if m:
                op_at = len(m.group(1))
                pass_at = op_at + len(m.group(2))
                continue
            if op_at is None or len(line) <= pass_at or line.startswith("-"):
                continue
            rest = line[pass_at:].split()
            if line.startswith("total ") and len(rest) == 6:
                # the step: no op and no pass
                out.append(("total", "", "", int(rest[0])) + tuple(float(v) for v in rest[1:]))
                continue
            if len(rest) != 7 or not rest[1].isdigit():
                continue  # (host) untracked, by pass:, notes
            out.append((line[:op_at].strip(), line[op_at:pass_at].strip(), rest[0], int(rest[1])) +
                       tuple(float(v) for v in rest[2:]))
    return out


if __name__ == "__main__":
    for r in rows(sys.argv[1]):
        print("%s|%s|%s|%d|%.1f" % (r[0], r[1], r[2], r[3], r[7]))
