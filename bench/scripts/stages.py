#!/usr/bin/env python3
"""Per-stage breakdown of lone messages from a MAGNETAR_STAGE_TRACE file.

Usage: bench/scripts/stages.py TRACE_FILE
The broker writes `ns thread stage` lines (storage/src/stage.rs). Meant for
one message in flight at a time with no consumers: each `1_conn_send` opens a
message, and the first mark of each later stage before the next
`1_conn_send` belongs to it. Prints median / p90 of each step and which
thread (shard) each stage ran on.
"""
import collections, statistics, sys

ORDER = ["1_conn_send", "2_owner_send", "3_appended", "4_flusher_woke", "4b_write_submit",
         "5_written", "6_synced", "7_owner_durable", "8_conn_receipt", "9_writer_woke", "10_written"]
rows = []
for line in open(sys.argv[1]):
    ns, tid, st = line.split()
    rows.append((int(ns), int(tid), st))
rows.sort()
msgs, cur = [], None
for ns, tid, st in rows:
    if st == "1_conn_send":
        if cur:
            msgs.append(cur)
        cur = {st: (ns, tid)}
    elif cur is not None and st not in cur:
        if st in ("9_writer_woke", "10_written") and "8_conn_receipt" not in cur:
            continue
        cur[st] = (ns, tid)
if cur:
    msgs.append(cur)
# Stages a build does not mark (e.g. 5_written with an O_DSYNC write) are
# skipped: keep those that most messages reached.
ORDER = [s for s in ORDER if sum(s in m for m in msgs) > len(msgs) // 2]
full = [m for m in msgs if all(s in m for s in ORDER)]
# drop the first 10% (warm-up)
full = full[len(full) // 10:]
hop = collections.Counter(m["1_conn_send"][1] != m["2_owner_send"][1] for m in full)
print(f"{len(full)} complete messages of {len(msgs)}; conn shard != owner shard: {hop[True]}, same: {hop[False]}")
def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]
tot = []
for a, b in zip(ORDER, ORDER[1:]):
    d = [(m[b][0] - m[a][0]) / 1000 for m in full]
    print(f"{a:>16} -> {b:<16} p50 {statistics.median(d):8.1f} us  p90 {pct(d, .9):8.1f} us  mean {statistics.mean(d):8.1f}")
d = [(m["10_written"][0] - m["1_conn_send"][0]) / 1000 for m in full]
print(f"{'total 1 -> 10':>35} p50 {statistics.median(d):8.1f} us  p90 {pct(d, .9):8.1f} us  mean {statistics.mean(d):8.1f}")
g = [(n["1_conn_send"][0] - m["10_written"][0]) / 1000 for m, n in zip(full, full[1:])]
print(f"{'10 -> next 1 (client+kernel)':>35} p50 {statistics.median(g):8.1f} us  p90 {pct(g, .9):8.1f} us")
