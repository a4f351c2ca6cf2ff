#!/usr/bin/env python3
"""Two Yutu nodes side by side: one change measured against the node without it, in one run.

The rows of mooncake_compare.py move 10-20% between runs on a small VM, more than most changes
do, so comparing two runs of that bench says little. This script starts two nodes (node A and
node B: two binaries, or one binary with different arguments), writes the same read sets to
both, and runs the same cases on each in alternating order, repetition after repetition; a
row's ratio is B's median over A's (A's over B's for latencies: > 1 means B is ahead), both
measured minutes apart at most. The cases are
mooncake_compare.py's own (its Workload class, through Yutu's Mooncake-compatible store), run
in this process, each node with a client and a registered numpy buffer of its own.

  cargo build --release -p yutu-server
  .venv-bench/bin/python benches/python/node_ab.py --a-arg=--copy-threads=1       # a flag
  .venv-bench/bin/python benches/python/node_ab.py --a-server OLD --b-server NEW  # two builds
  .venv-bench/bin/python benches/python/node_ab.py --cases get,lmcache_get --reps 7

Cases (GB/s): put / get (batch_put_from / batch_get_into, 2 MiB x 16, numpy), alloc_put /
alloc_get (the same in MooncakeHostMemAllocator memory), malloc_put / malloc_get (the same in
posix_memalign memory, torch's kind: no transparent-huge-page advice of its own), vllm_put / vllm_get (16 keys x 8 spans
x 256 KiB), sglang_put / sglang_get (16 x 32 x 32 KiB, allocator memory), lmcache_put
(put_parts, 28 B + 2 MiB), lmcache_get (batch_get_buffer, 8 x 2 MiB), single_put
(batch_put_from of one 2 MiB block), small_put / small_get (batch_put_from /
batch_get_into of 4 KiB x 256, as mooncake_compare.py's full run: 32 and 96 batches, the gets
over a read set of 4096 keys), memcpy (one thread's numpy memcpy, the reference), stress
(Mooncake's concurrent stress shape: 8 threads `put` then `get` 25 values of 1 MiB each as
bytes, a quarter of mooncake_compare.py's full run; rows stress_put and stress_get).
Latency cases (p50 and p99 rows, microseconds; their ratio is A over B, so > 1 still means B
is ahead): is_exist, get_4KiB (get of a 4 KiB value as bytes), batch_is_exist_64.
Both nodes run with --prefault (set up before any case) and no NVMe tier.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mooncake_compare as mc  # noqa: E402

MiB = mc.MiB
KiB = mc.KiB
BIG = 2 * MiB
SMALL, SMALL_BATCH = mc.SMALL
VLLM = [16, 8, 256 * KiB]
SGLANG = [16, 32, 32 * KiB]
CASES = ["put", "get", "alloc_put", "alloc_get", "malloc_put", "malloc_get", "vllm_put", "vllm_get", "sglang_put", "sglang_get",
         "lmcache_put", "lmcache_get", "single_put", "small_put", "small_get", "memcpy", "stress", "is_exist", "get_4KiB", "batch_is_exist_64"]
# The latency cases: each gives a p50 and a p99 row (microseconds, lower is better).
LATENCY = {"is_exist", "get_4KiB", "batch_is_exist_64"}
LAT_KEYS, LAT_ITERS = 64, 2000
# Values per thread of the stress case: a quarter of mooncake_compare.py's full run (100, as
# Mooncake's own test), which keeps an A/B run short.
STRESS_PER_THREAD = 25


class Node:
    """One yutu-server in a scratch directory, and a client of it."""

    def __init__(self, name: str, server: str, extra: list[str], memory: str, tmp: Path):
        self.name = name
        self.dir = tmp / name
        self.dir.mkdir()
        self.log = self.dir / "log"
        args = [server, "--listen", "127.0.0.1:0", "--data-dir", str(self.dir / "data"),
                "--memory", memory, "--nvme-capacity", "0", "--prefault", *extra]
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                                         env=dict(os.environ, NO_COLOR="1"))
        self.work: mc.Workload | None = None

    def wait_ready(self, shards: int, deadline: float) -> str:
        """The node's URL once it listens, has written its admin token and has prefaulted."""
        token = self.dir / "data" / "auth" / "admin-token"
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"node {self.name} exited; log:\n{mc.tail(self.log)}")
            text = self.log.read_text(errors="replace")
            m = mc.LISTENING.search(text)
            if m and token.is_file() and text.count("DRAM arena prefaulted") >= shards:
                os.environ["YUTU_TOKEN"] = token.read_text().strip()
                return f"http://{m.group(1)}"
            if time.monotonic() > deadline:
                raise RuntimeError(f"node {self.name} not ready in time; log:\n{mc.tail(self.log)}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def shards_of(extra: list[str]) -> int:
    for i, a in enumerate(extra):
        if a.startswith("--shards="):
            return int(a.split("=", 1)[1])
        if a == "--shards" and i + 1 < len(extra):
            return int(extra[i + 1])
    return os.cpu_count() or 1


def prepare(w: mc.Workload, name: str) -> None:
    """The read sets, written once, untimed; the put cases write fresh keys."""
    w.use("numpy")
    w.op_warm(BIG, 16, 16)
    w.op_prepare("big", BIG, 16, 4)
    w.op_prepare("abig", BIG, 16, 4, mem="alloc")
    w.op_prepare("mbig", BIG, 16, 4, mem="malloc")
    w.op_prepare("small", SMALL, SMALL_BATCH, 16)
    w.op_multi_prepare("vllm", VLLM, 2, mem="numpy")
    w.op_multi_prepare("sglang", SGLANG, 2, mem="alloc")
    w.op_parts_put("lmc", BIG, 16, True)
    w.op_prepare_values("lat", LAT_KEYS, mc.LAT_SIZE)


def run_case(w: mc.Workload, case: str, rep: int, verify: bool) -> dict:
    if case == "put":
        return w.op_put(f"p{rep}", BIG, 16, 16, verify)
    if case == "get":
        return w.op_get("big", BIG, 16, 4, 64, verify)
    if case == "alloc_put":
        return w.op_put(f"ap{rep}", BIG, 16, 16, verify, mem="alloc")
    if case == "alloc_get":
        return w.op_get("abig", BIG, 16, 4, 64, verify, mem="alloc")
    if case == "malloc_put":
        return w.op_put(f"mp{rep}", BIG, 16, 16, verify, mem="malloc")
    if case == "malloc_get":
        return w.op_get("mbig", BIG, 16, 4, 64, verify, mem="malloc")
    if case == "vllm_put":
        return w.op_multi_put(f"vp{rep}", VLLM, 8, verify, mem="numpy")
    if case == "vllm_get":
        return w.op_multi_get("vllm", VLLM, 2, 32, verify, mem="numpy")
    if case == "sglang_put":
        return w.op_multi_put(f"sp{rep}", SGLANG, 8, verify, mem="alloc")
    if case == "sglang_get":
        return w.op_multi_get("sglang", SGLANG, 2, 32, verify, mem="alloc")
    if case == "lmcache_put":
        return w.op_parts_put(f"lp{rep}", BIG, 16, verify)
    if case == "lmcache_get":
        return w.op_buffers_get("lmc", BIG, 16, 8, 32)
    if case == "single_put":
        return w.op_put(f"s{rep}", BIG, 1, 64, verify)
    if case == "small_put":
        return w.op_put(f"sm{rep}", SMALL, SMALL_BATCH, 32, verify)
    if case == "small_get":
        return w.op_get("small", SMALL, SMALL_BATCH, 16, 96, verify)
    if case == "memcpy":
        return w.op_memcpy(BIG, 16, 64)
    if case == "stress":
        threads, size = mc.STRESS
        return w.op_stress(f"st{rep}", threads, STRESS_PER_THREAD, size)
    if case == "is_exist":
        return w.op_exist_latency("lat", LAT_KEYS, LAT_ITERS)
    if case == "get_4KiB":
        return w.op_get_latency("lat", LAT_KEYS, mc.LAT_SIZE, LAT_ITERS)
    if case == "batch_is_exist_64":
        return w.op_batch_exist_latency("lat", LAT_KEYS, 64, LAT_ITERS)
    raise ValueError(case)


def rows_of(case: str, r: dict) -> list[tuple[str, float]]:
    """A case's rows: (name, value) for GB/s cases, p50 and p99 for latency cases."""
    if case in LATENCY:
        return [(f"{case}_p50", r["p50_us"]), (f"{case}_p99", r["p99_us"])]
    if case == "stress":
        n = r["ops"] * mc.STRESS[1]
        return [("stress_put", n / r["put_elapsed"] / 1e9), ("stress_get", n / r["get_elapsed"] / 1e9)]
    return [(case, r["bytes"] / r["elapsed"] / 1e9)]


def guarded(run, nodes: list[Node], tmp: Path, cleanup=None) -> int:
    """`run()`'s exit status, then the nodes stopped whatever happened: 130 when interrupted,
    1 on an error (logged); the scratch directory is removed unless something failed (its
    node logs are kept, and named)."""
    rc = 1
    try:
        rc = run()
    except KeyboardInterrupt:
        mc.log("interrupted; stopping the nodes")
        rc = 130
    except Exception as e:  # noqa: BLE001
        mc.log(f"error: {e}")
        rc = 1
    finally:
        if cleanup is not None:
            cleanup()
        for node in nodes:
            node.work = None
            node.stop()
        if rc not in (0, 130):
            mc.log(f"logs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return rc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    default = str(mc.REPO / "target" / "release" / "yutu-server")
    ap.add_argument("--a-server", default=default, help="node A's binary (default: target/release/yutu-server)")
    ap.add_argument("--b-server", default=default, help="node B's binary (default: the same)")
    ap.add_argument("--a-arg", action="append", default=[], metavar="ARG", help="an extra argument of node A (repeatable)")
    ap.add_argument("--b-arg", action="append", default=[], metavar="ARG", help="an extra argument of node B (repeatable)")
    ap.add_argument("--a-env", action="append", default=[], metavar="KEY=VALUE",
                    help="client environment while node A's client is made and registers its buffers "
                         "(repeatable; e.g. YUTU_HUGE_PAGES=0)")
    ap.add_argument("--b-env", action="append", default=[], metavar="KEY=VALUE",
                    help="the same for node B's client")
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated cases (default: all)")
    ap.add_argument("--reps", type=int, default=5, help="repetitions per case and node (default 5)")
    ap.add_argument("--memory", default="2GiB", help="each node's --memory (default 2GiB)")
    ap.add_argument("--json", metavar="FILE", help="also write the report as JSON (benches/src/report.rs shape)")
    args = ap.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        print(f"unknown cases {unknown}; known: {', '.join(CASES)}", file=sys.stderr)
        return 2
    for s in (args.a_server, args.b_server):
        if not Path(s).is_file():
            print(f"{s} not found: cargo build --release -p yutu-server", file=sys.stderr)
            return 2
    envs = {}
    for name, pairs in (("a", args.a_env), ("b", args.b_env)):
        bad = [p for p in pairs if "=" not in p]
        if bad:
            print(f"--{name}-env takes KEY=VALUE, not {bad}", file=sys.stderr)
            return 2
        envs[name] = dict(p.split("=", 1) for p in pairs)
    if args.a_server == args.b_server and args.a_arg == args.b_arg and envs["a"] == envs["b"]:
        print("node A and node B are the same: give another binary or other arguments", file=sys.stderr)
        return 2

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_signal)

    tmp = Path(tempfile.mkdtemp(prefix="yutu-node-ab-"))
    nodes: list[Node] = []

    def run() -> int:
        rc = 0
        for name, server, extra in (("a", args.a_server, args.a_arg), ("b", args.b_server, args.b_arg)):
            node = Node(name, server, extra, args.memory, tmp)
            nodes.append(node)
            url = node.wait_ready(shards_of(extra), time.monotonic() + 120)
            saved = {k: os.environ.get(k) for k in envs[name]}
            os.environ.update(envs[name])
            try:
                node.work = mc.Workload({"system": "yutu", "metadata_server": url, "master_server_addr": url,
                                         "global_segment_size": 0, "local_buffer_size": 64 * MiB,
                                         "key_prefix": f"ab-{name}-"})
                mc.log(f"[node {name}] {server} {' '.join(extra)} {' '.join(getattr(args, name + '_env'))}: "
                       "writing the read sets")
                prepare(node.work, name)
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
        samples: dict = {n.name: {} for n in nodes}
        errors = {n.name: {c: 0 for c in cases} for n in nodes}
        # A first round, checked and not counted: first-touch costs (a slab mapped, a
        # buffer checked by the node) belong to neither side.
        for rep in range(-1, args.reps):
            mc.log(f"-- repetition {rep + 1}/{args.reps}" if rep >= 0 else "-- warm-up")
            for node in (nodes if rep % 2 == 0 else list(reversed(nodes))):
                for case in cases:
                    r = run_case(node.work, case, rep + 1, verify=rep < 0)
                    errors[node.name][case] += r.get("errors", 0)
                    if rep >= 0:
                        for row, value in rows_of(case, r):
                            samples[node.name].setdefault(row, []).append(value)
        results = []
        lines = [f"node A: {args.a_server} {' '.join(args.a_arg + args.a_env)}",
                 f"node B: {args.b_server} {' '.join(args.b_arg + args.b_env)}",
                 f"{'case':22s} {'A':>8s} {'B':>8s} {'unit':5s} {'ratio':>6s}   samples A | B"]
        for case in cases:
            for row, _ in rows_of(case, {"p50_us": 0, "p99_us": 0, "bytes": 0, "elapsed": 1,
                                           "ops": 0, "put_elapsed": 1, "get_elapsed": 1}):
                a = statistics.median(samples["a"][row])
                b = statistics.median(samples["b"][row])
                lower = case in LATENCY
                ratio = (a / b if b > 0 else None) if lower else (b / a if a > 0 else None)
                unit = "us" if lower else "GB/s"
                res = {"name": row, "value": b, "unit": unit, "errors": errors["b"][case],
                       "reference": {"name": f"node_a_{row}", "value": a, "errors": errors["a"][case]},
                       "ratio": ratio, "target": 1.0}
                if lower:
                    res["lower_is_better"] = True
                results.append(res)
                lines.append(f"{row:22s} {a:8.2f} {b:8.2f} {unit:5s} {ratio or 0:6.2f}   "
                             + " ".join(f"{x:.1f}" for x in samples["a"][row]) + " | "
                             + " ".join(f"{x:.1f}" for x in samples["b"][row]))
                if errors["a"][case] or errors["b"][case]:
                    lines[-1] += f"  (errors A {errors['a'][case]}, B {errors['b'][case]})"
                    rc = 1
        print("\n".join(lines), flush=True)
        if args.json:
            out = {"suite": "node_ab", "machine": mc.machine(), "results": results,
                   "notes": {"a": " ".join([args.a_server, *args.a_arg]),
                             "b": " ".join([args.b_server, *args.b_arg])}}
            Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
            mc.log(f"wrote {args.json}")
        return rc

    return guarded(run, nodes, tmp)


if __name__ == "__main__":
    sys.exit(main())
