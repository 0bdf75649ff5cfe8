#!/usr/bin/env bash
# `import whisper` of one schema's files, two builds of the agent in alternating rounds, each
# into a Redis of its own (issue 52: a long archive's blocks, each made whole by one SET, against
# an earlier build's hashes, each made whole by RESTORE). `series` counter files full to now
# (python3-whisper, sum aggregation: common.sh's mkwhisper, as scripts/bench-history.sh); per round and
# build: the import's wall seconds, Redis's CPU seconds for it, and used_memory's growth a
# point. Prints each round, then the medians.
#
#   [SCHEMA=10s:6h,1min:6d,10min:1800d] [LISTPACK_B=259202] \
#     scripts/import-cost.sh AGENT_A AGENT_B [series=20] [rounds=3]
#
# LISTPACK_B: hash-max-listpack-entries of B's Redis (an earlier build keeps a whole archive in
# one hash: its longest archive plus two, as it asks); A's Redis runs at Redis's default.
# Needs: apt-get install -y python3-whisper
set -euo pipefail
cd "$(dirname "$0")/.."
a=$1; b=$2; series=${3:-20}; rounds=${4:-3}
schema=${SCHEMA:-10s:6h,1min:6d,10min:1800d}
. scripts/common.sh
mkwhisper "$dir/whisper" "$series" schema "$schema" >/dev/null
used() { redis-cli -p "$1" info memory | tr -d '\r' | awk -F: '/^used_memory:/ {print $2}'; }
cpu() { redis-cli -p "$1" info cpu | tr -d '\r' | awk -F: '/^used_cpu_(user|sys):/ {s += $2} END {print s}'; }
# one LABEL AGENT [redis flags]: a fresh Redis, the import timed; prints the round's figures.
one() {
  local label=$1 agent=$2 port t0 t1 m0 c0 points; shift 2
  port=$(free_port)
  start_node "$port" "$@"
  m0=$(used "$port"); c0=$(cpu "$port")
  t0=$(date +%s.%N)
  "$agent" import whisper --redis "redis://127.0.0.1:$port" --retentions "$schema" "$dir/whisper" \
    >"$dir/import.out" 2>"$dir/import.err" || { cat "$dir/import.err" >&2; exit 1; }
  t1=$(date +%s.%N)
  points=$(grep -o '[0-9]* slices written' "$dir/import.out" | tail -1 | cut -d' ' -f1)
  python3 -c "print('$label', round($t1 - $t0, 2), round($(cpu "$port") - $c0, 2), round(($(used "$port") - $m0) / $points, 2), $points)"
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
}
echo "round build wall_s redis_cpu_s bytes_a_point points ($series series of $schema)"
for round in $(seq "$rounds"); do
  one "$round A" "$a"
  one "$round B" "$b" --hash-max-listpack-entries "${LISTPACK_B:-259202}"
done | tee "$dir/rounds"
python3 - "$dir/rounds" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
for side in 'AB':
    mine = [r for r in rows if r[1] == side]
    med = lambda i: statistics.median(float(r[i]) for r in mine)
    print(f'median {side}: wall {med(2):.2f} s, Redis CPU {med(3):.2f} s, {med(4):.2f} bytes a point')
a = [float(r[2]) for r in rows if r[1] == 'A']; b = [float(r[2]) for r in rows if r[1] == 'B']
print(f'wall A/B, median of the rounds: {statistics.median(x / y for x, y in zip(a, b)):.2f}')
PY
