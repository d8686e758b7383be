#!/usr/bin/env python3
"""Reports of side-by-side runs (ab.sh, tls_ab.sh, and siblings).

  ab_report.py round FILE LABEL R          one line for run R of side LABEL
  ab_report.py median OUT ROUNDS [A B] [--goal G]
                                           medians of OUT/{A,B}-{1..ROUNDS}.json
                                           and the B/A ratio; A and B name the
                                           sides in the output (default A, B);
                                           with --goal, a last line says whether
                                           B/A of broker CPU per message is
                                           within G

The run files are `magnetar-bench --json` reports.
"""
import json
import statistics
import sys

KEYS = [("cpu", "broker_us_per_msg"), ("cpu", "client_us_per_msg"), ("produce", "msgs_per_s"),
        ("consume", "msgs_per_s"), ("publish_latency_ms", "p50"), ("publish_latency_ms", "p99"),
        ("publish_latency_ms", "p999"), ("e2e_latency_ms", "p50"), ("e2e_latency_ms", "p99"),
        ("sustainable", "rate"), ("backlog", "consume_msgs_per_s"), ("backlog", "consume_mb_per_s"),
        ("backlog", "catchup_cpu", "broker_us_per_msg"), ("backlog", "catchup_cpu", "client_us_per_msg")]


def get(report, key):
    v = report
    for p in key:
        v = v.get(p) if isinstance(v, dict) else None
    return v


def round_line(path, label, r):
    j = json.load(open(path))
    b = j.get("backlog") or {}
    c = b.get("catchup_cpu") or {}
    line = (f"{label} round {r} {j['produce']['msgs_per_s']:.0f} msg/s consumed {j['consume']['msgs_per_s']:.0f} "
            f"publish p50 {j['publish_latency_ms']['p50']:.3f} p99 {j['publish_latency_ms']['p99']:.3f} ms "
            f"broker {j['cpu']['broker_us_per_msg']:.2f} client {j['cpu']['client_us_per_msg']:.2f} us/msg")
    if b:
        line += (f" catch-up {b['consume_mb_per_s']:.1f} MB/s broker {c.get('broker_us_per_msg') or 0:.2f} "
                 f"client {c.get('client_us_per_msg') or 0:.2f} us/msg")
    print(line)


def medians(out, rounds, a_name, b_name, goal=None):
    runs = {side: [json.load(open(f"{out}/{side}-{r}.json")) for r in range(1, rounds + 1)] for side in "AB"}
    for k in KEYS:
        av = [get(j, k) for j in runs["A"]]
        bv = [get(j, k) for j in runs["B"]]
        if None in av or None in bv:
            continue
        a, b = statistics.median(av), statistics.median(bv)
        ratio = b / a if a else float("nan")
        print(f"median {'.'.join(k):<40}: {a_name} {a:12.3f}  {b_name} {b:12.3f}  {b_name}/{a_name} {ratio:.3f}")
    if goal is not None:
        key = ("cpu", "broker_us_per_msg")
        a = statistics.median(get(j, key) for j in runs["A"])
        b = statistics.median(get(j, key) for j in runs["B"])
        ratio = b / a if a else float("nan")
        verdict = "within" if a and ratio <= goal else "above"
        print(f"broker CPU per message {b_name}/{a_name}: {ratio:.3f} ({verdict} the {goal} goal)")
    print(f"runs: {out}")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "round":
        round_line(sys.argv[2], sys.argv[3], sys.argv[4])
    elif len(sys.argv) >= 4 and sys.argv[1] == "median":
        args, goal = sys.argv[4:], None
        if len(args) >= 2 and args[-2] == "--goal":
            goal, args = float(args[-1]), args[:-2]
        if len(args) not in (0, 2):
            sys.exit(__doc__)
        names = args if args else ["A", "B"]
        medians(sys.argv[2], int(sys.argv[3]), *names, goal=goal)
    else:
        sys.exit(__doc__)
