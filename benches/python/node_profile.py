#!/usr/bin/env python3
"""One Yutu node kept busy with one case for a while, so a profiler can watch a steady phase.

node_ab.py and mooncake_compare.py run each case for well under a second at a time, and their
stress case runs its put and get phases back to back; a profile of the node needs one phase
alone for seconds. This script starts one node (as node_ab.py does: --prefault, no NVMe
tier), writes node_ab.py's read sets, then repeats one case until --seconds are up and prints
each repetition's rows and their medians. With --perf FILE it also runs
`perf record --call-graph dwarf -p NODE_PID` for --perf-seconds once the first repetition is
done (`scripts/install-bench-deps.sh` installs perf; it must be allowed to trace the node),
and prints the command that reads the profile.

  cargo build --release -p yutu-server
  .venv-bench/bin/python benches/python/node_profile.py --case stress_get --seconds 12 --perf get.data
  .venv-bench/bin/python benches/python/node_profile.py --case small_put --arg=--copy-threads=1

Cases: every case of node_ab.py, and stress_put / stress_get: one phase of Mooncake's
concurrent stress shape alone (8 threads `put` 1 MiB `bytes` values under fresh keys and
remove them, or `get` a fixed set of values and compare them, as its test does), in
puts or gets per second.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mooncake_compare as mc  # noqa: E402
import node_ab as ab  # noqa: E402

PHASES = ["stress_put", "stress_get"]
# Values per thread a stress phase cycles over.
PHASE_VALUES = 25


def stress_phase(w: mc.Workload, phase: str, rep: int, values: list[bytes]) -> dict:
    """One pass of a stress phase: every thread puts (or gets) its PHASE_VALUES values."""
    st = w.store
    threads = len(values)
    errors = [0] * threads

    def work(t: int) -> None:
        if phase == "stress_put":
            keys = [f"sp{rep}-{t}-{i}" for i in range(PHASE_VALUES)]
            for k in keys:
                if st.put(k, values[t]) != 0:
                    errors[t] += 1
            for k in keys:
                st.remove(k)
        else:
            for i in range(PHASE_VALUES):
                if st.get(f"sg-{t}-{i}") != values[t]:
                    errors[t] += 1

    ths = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    t0 = time.perf_counter()
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    return {"elapsed": time.perf_counter() - t0, "ops": threads * PHASE_VALUES, "errors": sum(errors)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", default=str(mc.REPO / "target" / "release" / "yutu-server"),
                    help="the node's binary (default: target/release/yutu-server)")
    ap.add_argument("--arg", action="append", default=[], metavar="ARG",
                    help="an extra argument of the node (repeatable)")
    ap.add_argument("--case", required=True, help=f"one of {', '.join(ab.CASES + PHASES)}")
    ap.add_argument("--seconds", type=float, default=10.0, help="how long to repeat it (default 10)")
    ap.add_argument("--memory", default="2GiB", help="the node's --memory (default 2GiB)")
    ap.add_argument("--perf", metavar="FILE", help="record the node with perf into FILE")
    ap.add_argument("--perf-seconds", type=float, default=4.0, help="how long perf records (default 4)")
    args = ap.parse_args()
    if args.case not in ab.CASES + PHASES:
        print(f"unknown case {args.case}; known: {', '.join(ab.CASES + PHASES)}", file=sys.stderr)
        return 2
    if not Path(args.server).is_file():
        print(f"{args.server} not found: cargo build --release -p yutu-server", file=sys.stderr)
        return 2

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_signal)

    tmp = Path(tempfile.mkdtemp(prefix="yutu-node-profile-"))
    node = ab.Node("n", args.server, args.arg, args.memory, tmp)
    perf: subprocess.Popen | None = None

    def run() -> int:
        nonlocal perf
        url = node.wait_ready(ab.shards_of(args.arg), time.monotonic() + 120)
        node.work = mc.Workload({"system": "yutu", "metadata_server": url, "master_server_addr": url,
                                 "global_segment_size": 0, "local_buffer_size": 64 * mc.MiB,
                                 "key_prefix": "prof-"})
        mc.log(f"[node] pid {node.proc.pid}: writing the read sets")
        values: list[bytes] = []
        if args.case in PHASES:
            threads, size = mc.STRESS
            values = [os.urandom(size) for _ in range(threads)]
            for t in range(threads):
                for i in range(PHASE_VALUES):
                    node.work.store.put(f"sg-{t}-{i}", values[t])
        else:
            ab.prepare(node.work, "n")
        samples: list[float] = []
        errors = 0
        end = time.monotonic() + args.seconds
        rep = 0
        while rep == 0 or time.monotonic() < end:
            if args.case in PHASES:
                r = stress_phase(node.work, args.case, rep, values)
                row = r["ops"] / r["elapsed"]
            else:
                r = ab.run_case(node.work, args.case, rep, verify=rep == 0)
                row = ab.rows_of(args.case, r)[0][1]
            errors += r.get("errors", 0)
            samples.append(row)
            if rep == 0 and args.perf:
                perf = subprocess.Popen(["perf", "record", "--call-graph", "dwarf", "-o", args.perf,
                                         "-p", str(node.proc.pid), "--", "sleep", str(args.perf_seconds)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
                # The load lasts as long as the recording.
                end = max(end, time.monotonic() + args.perf_seconds)
            rep += 1
        unit = "/s" if args.case in PHASES else ("us" if args.case in ab.LATENCY else "GB/s")
        print(f"{args.case}: median {statistics.median(samples):.2f} {unit} over {len(samples)} "
              f"repetitions (min {min(samples):.2f}, max {max(samples):.2f}), {errors} errors", flush=True)
        if perf is not None:
            perf.wait(timeout=args.perf_seconds + 60)
            print(f"profile: perf report -i {args.perf} --no-children", flush=True)
        return 1 if errors else 0

    def stop_perf() -> None:
        if perf is not None and perf.poll() is None:
            perf.terminate()

    return ab.guarded(run, [node], tmp, cleanup=stop_perf)


if __name__ == "__main__":
    sys.exit(main())
