#!/usr/bin/env bash
# Before/after of a change, in one run: builds `yutu-server` and `yutu-bench` (release) at a
# base commit in a temporary worktree and at the working tree, then runs each suite for both,
# alternating base and head, ROUNDS times. Reports go to OUT (JSON per run, and a summary).
#
#   scripts/bench-compare.sh BASE_COMMIT [SUITES...]     (default suites: s3 kv cluster)
#   ROUNDS=2 OUT=/tmp/bench-compare scripts/bench-compare.sh 7ec9f17 s3 kv
#
# Both versions share the workspace's target directory (the base's binaries are copied out
# before the head is built), so only what changed is rebuilt. Needs the references the
# suites use (scripts/install-bench-deps.sh).
set -euo pipefail
base=${1:?usage: scripts/bench-compare.sh BASE_COMMIT [SUITES...]}
shift
suites=("$@")
[ $# -eq 0 ] && suites=(s3 kv cluster)
rounds=${ROUNDS:-2}
out=${OUT:-/tmp/bench-compare}
root=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
mkdir -p "$out/bin"
wt=$(mktemp -d /tmp/bench-base.XXXXXX)
cleanup() { git -C "$root" worktree remove --force "$wt" >/dev/null 2>&1 || true; }
trap cleanup EXIT
git -C "$root" worktree add -q --detach "$wt" "$base"
(cd "$wt" && CARGO_TARGET_DIR=$target cargo build -q --release -p yutu-server -p yutu-bench)
cp "$target/release/yutu-server" "$out/bin/yutu-server-base"
cp "$target/release/yutu-bench" "$out/bin/yutu-bench-base"
(cd "$root" && cargo build -q --release -p yutu-server -p yutu-bench)
cp "$target/release/yutu-server" "$out/bin/yutu-server-head"
cp "$target/release/yutu-bench" "$out/bin/yutu-bench-head"
for round in $(seq 1 "$rounds"); do
  for suite in "${suites[@]}"; do
    for v in base head; do
      YUTU_SERVER_BIN="$out/bin/yutu-server-$v" timeout 1200 "$out/bin/yutu-bench-$v" "$suite" \
        --json "$out/$suite-$v-$round.json" > "$out/$suite-$v-$round.log" 2>&1
      echo "round $round: $suite $v done"
    done
  done
done
python3 - "$out" <<'PY'
import glob, json, sys
out = sys.argv[1]
rows = {}
for f in sorted(glob.glob(f"{out}/*-*-*.json")):
    suite, version, _ = f.rsplit("/", 1)[1][:-5].split("-")
    for c in json.load(open(f)).get("results", []):
        rows.setdefault((suite, c["name"], c.get("unit", "")), {}).setdefault(version, []).append(c["value"])
lines = ["| suite | case | unit | base | head | head / base (means) |", "|---|---|---|---|---|---|"]
for (suite, case, unit), v in rows.items():
    b, h = v.get("base", []), v.get("head", [])
    fmt = lambda xs: " / ".join(f"{x:.4g}" for x in xs)
    ratio = (sum(h) / len(h)) / (sum(b) / len(b)) if b and h and sum(b) else float("nan")
    lines.append(f"| {suite} | {case} | {unit} | {fmt(b)} | {fmt(h)} | {ratio:.3f} |")
open(f"{out}/summary.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
