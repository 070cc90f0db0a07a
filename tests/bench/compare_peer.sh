#!/usr/bin/env bash
# A/B of the two-process replicator bench: BASE (a git revision) against the working tree,
# alternating runs so that both see the same machine and hour.
#
#   tests/bench/compare_peer.sh BASE [ROUNDS] [-- bench_peer.py arguments]
#   tests/bench/compare_peer.sh d152d8f 3 -- --count 10000 --big-count 10 --big-mib 10 --skip large
#
# BASE is checked out in a temporary git worktree; both sides use this tree's .venv and keep
# their own store cache under /tmp (the stores are built once, not timed).
set -euo pipefail
top=$(git rev-parse --show-toplevel)
base=${1:?usage: compare_peer.sh BASE [ROUNDS] [-- bench args]}
shift
rounds=2
if [ $# -gt 0 ] && [ "$1" != "--" ]; then rounds=$1; shift; fi
[ $# -gt 0 ] && [ "$1" = "--" ] && shift
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--count 10000 --big-count 10 --big-mib 10)
wt=$(mktemp -d /tmp/p2psync-base.XXXXXX)
trap 'git -C "$top" worktree remove --force "$wt" >/dev/null 2>&1 || true' EXIT
git -C "$top" worktree add --detach -q "$wt" "$base"
[ -e "$top/interop/node_modules" ] && ln -s "$top/interop/node_modules" "$wt/interop/node_modules"
for i in $(seq "$rounds"); do
  for side in base head; do
    dir=$top; [ "$side" = base ] && dir=$wt
    echo "== $side, round $i, $(date +%T), load $(cut -d' ' -f1 /proc/loadavg)"
    (cd "$dir" && PYTHONPATH="$dir" "$top/.venv/bin/python" tests/bench/bench_peer.py "${args[@]}" \
      --cache "/tmp/p2psync-bench-$side" 2>/dev/null)
  done
done
