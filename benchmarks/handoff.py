"""Where a pipeline's step goes between its stages: the breakdown of `run --measure`'s action timeline.

    .venv/bin/python benchmarks/handoff.py DIR                 # DIR/measured.json of an earlier run --measure
    .venv/bin/python benchmarks/handoff.py DIR --run --emulate --steps 6   # run it first (hetpart run DIR --measure ...)
    .venv/bin/python benchmarks/handoff.py FILE --from-speedup-json         # each plan of a measured_speedup.py --json

Per rank (median over the measured steps): compute (the forward/backward actions; inside them the
generated module's own call, the rest pipelining's overhead), recv waits split at the sender's post
(before: the sender was behind; after: the hand-off's latency), send waits, the rest of the step;
then every link's hand-off latency (median, p90) and how long the data sat ready before the receiver
asked for it; and the critical path of the median step (NOTE [hand-off latency] in hetpart/runtime/handoff.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hetpart.runtime.handoff import analyse  # noqa: E402


def breakdown_lines(timeline_ranks: list[list[dict]], skip_first: bool = True) -> list[str]:
    """The printed breakdown of one run's per-rank timelines."""
    report = analyse(timeline_ranks, skip_first)
    ms = lambda us: f"{us / 1e3:8.2f}"  # noqa: E731
    lines = ["per rank, ms per step (median of the measured steps):",
             f"{'rank':>4} {'step':>8} {'compute':>8} {'forward':>8} {'module':>8} {'overhead':>8} {'behind':>8} "
             f"{'latency':>8} "
             f"{'send':>8} {'rest':>8} {'head':>8} {'tail':>8} {'posting':>8} {'cpu':>8} {'proc cpu':>8}"]
    for r in report.ranks:
        lines.append(f"{r.rank:>4} {ms(r.step_us)} {ms(r.compute_us)} {ms(r.forward_us)} {ms(r.module_us)} "
                     f"{ms(r.overhead_us)} "
                     f"{ms(r.recv_wait_sender_behind_us)} {ms(r.recv_wait_latency_us)} {ms(r.send_wait_us)} "
                     f"{ms(r.other_us)} {ms(r.head_us)} {ms(r.tail_us)} {ms(r.post_us)} {ms(r.compute_cpu_us)} "
                     f"{ms(r.process_cpu_us)}")
    lines += ["  (compute: forwards and backwards; overhead: the forwards less the module's calls; behind: recv waits before the sender posted; latency: after; cpu: the compute thread's CPU in "
              "compute, proc cpu: the process's; rest: the step less compute and waits, of which head: before the first "
              "action, tail: after the last, posting: in the calls that post sends and recvs)", "", "hand-offs (NOTE [hand-off latency]):"]
    for link, s in report.latency_stats_us().items():
        lines.append(f"  {link:>10}: {s['n']:3d} x {s['bytes'] / 1e3:8.1f} kB, latency median {s['latency_median_us']:8.1f} us, "
                     f"p90 {s['latency_p90_us']:8.1f} us; data ready before the receiver asked: median "
                     f"{s['receiver_late_median_us']:8.1f} us")
    cp = report.critical_path
    if cp is not None:
        parts = ", ".join(f"rank {r} compute {v / 1e3:.2f} ms" for r, v in cp.compute_us.items())
        lines += ["", f"critical path of the median step ({cp.step_us / 1e3:.2f} ms): {parts}, "
                      f"{cp.handoffs} hand-off(s) {cp.handoff_us / 1e3:.2f} ms, gaps {cp.gap_us / 1e3:.2f} ms"]
    return lines


def speedup_lines(cases: list[dict]) -> list[str]:
    """Per case, emulation and plan of a `measured_speedup.py --json` file: the median over its runs of each
    rank's breakdown (ms a step) and of the critical path (NOTE [hand-off latency])."""
    import statistics

    fields = ("step_us", "compute_us", "overhead_us", "recv_wait_sender_behind_us", "recv_wait_latency_us",
              "send_wait_us", "other_us", "head_us", "tail_us", "post_us")
    lines = []
    for case in cases:
        lines.append(f"zoo:{case['model']}, {case['cluster']} speeds, --emulate-by {case.get('emulate_by', 'quota')}")
        for name, runs in case["runs"].items():
            reports = [r["handoff"] for r in runs if r.get("handoff")]
            if not reports:
                continue
            lines.append(f"  {name}")
            for k in range(len(reports[0]["ranks"])):
                row = {f: statistics.median(h["ranks"][k][f] for h in reports) / 1e3 for f in fields}
                lines.append(f"    rank {k}: " + ", ".join(f"{f[:-3].replace('recv_wait_', 'wait_')} {v:.2f}"
                                                         for f, v in row.items()))
            for link, s in reports[0]["handoff_latency"].items():
                med = statistics.median(h["handoff_latency"][link]["latency_median_us"] for h in reports)
                late = statistics.median(h["handoff_latency"][link]["receiver_late_median_us"] for h in reports)
                lines.append(f"    {link}: {s['n']} x {s['bytes'] / 1e3:.0f} kB a run, latency median {med:.0f} us, "
                             f"data ready before the receiver asked {late:.0f} us")
            cps = [h["critical_path"] for h in reports if h.get("critical_path")]
            if cps:
                comp = " + ".join(f"rank {r} {statistics.median(c['compute_us'][r] for c in cps) / 1e3:.2f}"
                                  for r in cps[0]["compute_us"])
                lines.append(f"    critical path: {statistics.median(c['step_us'] for c in cps) / 1e3:.2f} = compute "
                             f"{comp} + {statistics.median(c['handoffs'] for c in cps):.0f} hand-off(s) "
                             f"{statistics.median(c['handoff_us'] for c in cps) / 1e3:.2f} + gaps "
                             f"{statistics.median(c['gap_us'] for c in cps) / 1e3:.2f}")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", type=Path, help="an artifacts directory (hetpart partition --out), or with "
                    "--from-speedup-json a measured_speedup.py --json file")
    ap.add_argument("--from-speedup-json", action="store_true",
                    help="DIR is a benchmarks/measured_speedup.py --json file: each plan's medians over its runs")
    ap.add_argument("--run", action="store_true", help="run `hetpart run DIR --measure` first")
    ap.add_argument("--emulate", action="store_true", help="with --run: --emulate")
    ap.add_argument("--steps", type=int, default=6, help="with --run: --steps")
    ap.add_argument("--extra", default="", help="with --run: more `hetpart run` arguments, space-separated")
    args = ap.parse_args()
    if args.from_speedup_json:
        print("\n".join(speedup_lines(json.loads(args.dir.read_text()))))
        return 0
    if args.run:
        cmd = [sys.executable, "-m", "hetpart", "run", str(args.dir), "--measure", "--steps", str(args.steps),
               *(["--emulate"] if args.emulate else []), *args.extra.split()]
        print(f"load average before: {os.getloadavg()}", flush=True)
        subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL)
        print(f"load average after: {os.getloadavg()}", flush=True)
    measured = json.loads((args.dir / "measured.json").read_text())
    timeline = measured.get("timeline")
    if not timeline:
        print(f"{args.dir}/measured.json has no timeline: run it again with this hetpart (`hetpart run DIR --measure`)",
              file=sys.stderr)
        return 2
    print(f"{args.dir}: step median {measured['step_time_us'] / 1e3:.2f} ms, {measured['schedule']}, "
          f"{measured['microbatches']} microbatches, {measured['mode']}")
    print("\n".join(breakdown_lines(timeline["ranks"], skip_first=measured["steps_measured"] > 0)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
