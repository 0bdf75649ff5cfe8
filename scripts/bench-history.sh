#!/usr/bin/env bash
# Graphite's history in Redis against whisper (issues 46 and 52): a carbon schema (SCHEMA,
# default `10s:6h,1m:7d,1h:90d,1d:5y`; Etsy's recommended `10s:6h,1min:6d,10min:1800d` is the
# other one measured) beside the book's defaults (7 precisions, 1 s to 1 day, 120 slices each).
# Each run, for each layout: a private Redis on a free TCP port (at Redis's default
# hash-max-listpack-entries, or LISTPACK's); `series` counter series filled completely (every
# slice of every precision), written as carbon leaves them (python3-whisper's files, sum
# aggregation, xFilesFactor 0, each archive full up to now: stats_counts/load/<i>/c.wsp for
# loadgen's `load.<i>.c`) and brought in by `statsd-redis import whisper`; then
#   memory: used_memory's growth over the slices the import wrote (a long archive's hash and
#     blocks: docs/layout.md), beside the whisper files' bytes per point; the import's wall
#     time; OBJECT ENCODING of 20 hashes;
#   write cost: the agent over that Redis (its cleaner makes one pass at start, measured,
#     then none), loadgen sending every series every second, Redis's CPU (INFO cpu) and HINCRBY
#     calls over `secs` seconds of steady load (for --coarse-write-secs 60 from a minute
#     boundary on, as its writes of a minute are spread over the next: keep `secs` a multiple
#     of 60): the schema at each --coarse-write-secs of SCHEMA_COARSE (0 and 60), the book's
#     defaults at 0;
#   render: the schema agent timing /graphite/render of 100 series (load.1??.c: 200 series or
#     more) over each of RANGES (default -1d -7d), beside Redis's own time for them
#     (render_timing, below), and with ORACLE=1 graphite-web 1.1.10 timed over the same whisper
#     files (tests/graphite/graphite-web.sh, its standard finder, served by gunicorn with 2
#     workers as sites serve it) on the same requests
#     (`stats_counts.load.1??.c`).
# Medians over the runs. A run of 200 series takes ~6 min (mostly the minutes of load). At
# 10 000 series of carbon's schema in hashes (an earlier release) written every second (coarse
# 0) Redis needed ~5 cores: measure with SCHEMA_COARSE=60 there.
#
#   [SCHEMA=...] [RANGES="-1h -1d -7d -30d -1y"] [ORACLE=1] [BOOK=0] [LISTPACK=n] [AGENT=binary]
#     [LOADGEN=binary] [RENDER_REQUESTS=3] [RENDER_TIMEOUT=60] [SCHEMA_COARSE="0 60"] \
#     scripts/bench-history.sh [series=200] [runs=3] [secs=60]
#
# BOOK=0 leaves the book's layout out (its figures are then missing from the table).
# AGENT, LOADGEN: builds to use instead of this checkout's release build (which is then not
# built). RENDER_*: requests timed per range, and the seconds after which one ends the range's
# timing. Needs: apt-get install -y --no-install-recommends python3-whisper (and graphite-web
# and gunicorn for ORACLE=1)
set -euo pipefail
cd "$(dirname "$0")/.."
series=${1:-200}; runs=${2:-3}; secs=${3:-60}
schema=${SCHEMA:-10s:6h,1m:7d,1h:90d,1d:5y}
ranges=${RANGES:--1d -7d}
lpd=$((series / 256)); lpd=$((lpd < 1 ? 1 : lpd > 20 ? 20 : lpd))
build=()
[ -n "${AGENT:-}" ] || build+=(--bin statsd-redis)
[ -n "${LOADGEN:-}" ] || build+=(--example loadgen)
[ ${#build[@]} -eq 0 ] || cargo build --release --quiet "${build[@]}"
AGENT=${AGENT:-target/release/statsd-redis}
LOADGEN=${LOADGEN:-target/release/examples/loadgen}
/usr/bin/python3 -c 'import whisper' 2>/dev/null ||
  { echo "python3-whisper is missing: apt-get install -y python3-whisper" >&2; exit 1; }
# graphite-web as sites serve it: gunicorn, not Django's development server.
[ -z "${ORACLE:-}" ] || /usr/bin/python3 -c 'import gunicorn' 2>/dev/null ||
  { echo "gunicorn is missing: apt-get install -y gunicorn" >&2; exit 1; }
. scripts/common.sh
results=$dir/results
: >"$results"


used_memory() { redis-cli -p "$1" info memory | tr -d '\r' | awk -F: '/^used_memory:/ {print $2}'; }

# points PORT: the slices kept, HLEN summed over every count: hash, and the slots a long
# archive's blocks hold (their flag bits: docs/layout.md, "History: fixed slots").
points() {
  local hashes blocks
  hashes=$(redis-cli -p "$1" --scan --pattern 'count:*' | awk '{print "HLEN", $0}' |
    redis-cli -p "$1" | awk '{s += $1} END {print s + 0}')
  blocks=$(redis-cli -p "$1" --scan --pattern 'history:*' | PORT=$1 /usr/bin/python3 -c '
import os, sys, redis
r = redis.Redis(port=int(os.environ["PORT"]))
total = 0
for key in sys.stdin.read().split():
    data = r.get(key) or b""
    total += sum(bin(data[g]).count("1") for g in range(0, len(data), 65))
print(total)')
  echo $((hashes + blocks))
}

# encodings PORT: OBJECT ENCODING of 20 count: hashes, as "listpack:20" (one word per encoding).
encodings() {
  redis-cli -p "$1" --scan --pattern 'count:*' | shuf -n 20 | awk '{print "OBJECT ENCODING", $0}' |
    redis-cli -p "$1" | sort | uniq -c | awk '{printf "%s%s:%d", (NR > 1 ? "," : ""), $2, $1}'
}

# sleep_until EPOCH: until that second of the clock.
sleep_until() { python3 -c "import time; time.sleep(max(0.0, $1 - time.time()))"; }

# write_cost PORT LABEL COARSE [agent flags...]: the agent over the Redis at PORT: its cleaner's
# first pass (all that it trims, every precision), then `secs` seconds of steady load, every
# series every second. Leaves the agent running (agent_pid, http); writes LABEL's figures to
# $results: Redis CPU µs of the cleaner's pass a series, Redis CPU µs and HINCRBY calls a
# series-minute.
write_cost() {
  local port=$1 label=$2 coarse=$3; shift 3
  local cpu0 cpu1 cpu2 cpu3 calls2 calls3 start t1 t2 lg _
  read -r cpu0 _ < <(redis_usage "-p $port")
  start_agent "$dir/agent-$label.log" --redis "redis://127.0.0.1:$port" --log-level warn \
    --cleaner-interval-secs 86400 --coarse-write-secs "$coarse" "$@"
  local waited=0
  until awk -v n="$(agent_metric "$http" cleaner_passes_total)" 'BEGIN {exit !(n >= 1)}'; do
    sleep 0.2; waited=$((waited + 1))
    [ "$waited" -lt 1500 ] || { echo "$label: no cleaner pass in 300 s" >&2; exit 1; }
  done
  read -r cpu1 _ < <(redis_usage "-p $port")
  # Steady load from t1: at once when every window writes everything, else from the minute
  # after the first one the load started in (its sums are written over the next minute).
  start=$(date +%s)
  if [ "$coarse" -gt 0 ]; then t1=$(((start + 5) / 60 * 60 + 62)); else t1=$((start + 5)); fi
  t2=$((t1 + secs))
  # loadgen sends 64 datagrams at a time, then waits: a fourth of the series or fewer a time.
  "$LOADGEN" send --target "127.0.0.1:$udp" --series "$series" --lines-per-datagram "$lpd" \
    --rate "$series" --lines $((series * (t2 + 3 - start))) >/dev/null &
  lg=$!
  sleep_until "$t1"
  read -r cpu2 calls2 < <(redis_usage "-p $port")
  redis-cli -p "$port" info commandstats | tr -d '\r' >"$dir/commands-$label-0"
  sleep_until "$t2"
  read -r cpu3 calls3 < <(redis_usage "-p $port")
  redis-cli -p "$port" info commandstats | tr -d '\r' >"$dir/commands-$label-1"
  wait "$lg"
  python3 -c "
s, m = $series, $secs / 60
print('$label cleaner', ($cpu1 - $cpu0) / s * 1e6)
print('$label cpu', ($cpu3 - $cpu2) / (s * m) * 1e6)
print('$label hincrby', ($calls3 - $calls2) / (s * m))" >>"$results"
  # Where Redis's time went (stderr): each command's usec a series-minute over the load.
  python3 - "$dir/commands-$label-0" "$dir/commands-$label-1" "$series" "$secs" "$label" >&2 <<'EOF'
import re, sys
def read(path):
    out = {}
    for line in open(path):
        m = re.match(r'cmdstat_(\w+):calls=(\d+),usec=(\d+)', line)
        if m:
            out[m[1]] = (int(m[2]), int(m[3]))
    return out
a, b = read(sys.argv[1]), read(sys.argv[2])
per = int(sys.argv[3]) * int(sys.argv[4]) / 60
rows = sorted(((u - a.get(k, (0, 0))[1]) / per, (c - a.get(k, (0, 0))[0]) / per, k) for k, (c, u) in b.items())
print(sys.argv[5] + ': ' + ', '.join(f'{k} {u:.1f} us ({c:.1f} calls)' for u, c, k in reversed(rows) if u > 0.5), 'a series-minute')
EOF
}

# render_timing LABEL BASE TARGET REDIS-PORT [requests=5] [timeout=60]: Graphite renders at BASE
# (the agent's /graphite, or graphite-web's root) of TARGET (100 series: load.1??.c, or Etsy's
# stats_counts.load.1??.c) as JSON over each of $ranges, each timed `requests` times one after the
# other: the median in ms, with the series and points answered, and with a REDIS-PORT (not "-")
# Redis's own time a render (the usec of INFO commandstats over the requests, of the commands a
# render sends: the agent's own writes, still going on, left out). A request that takes longer
# than `timeout` seconds ends that range's timing ("timed out", its Redis work goes on). Lines
# start with LABEL (render, oracle).
render_timing() {
  local label=$1 base=$2 target=$3 redis_port=$4 n=${5:-5} limit=${6:-60} from i code
  for from in $ranges; do
    [ "$redis_port" = - ] || redis-cli -p "$redis_port" config resetstat >/dev/null
    for i in $(seq "$n"); do
      code=$(curl -sg --max-time "$limit" -o "$dir/render.json" -w '%{http_code} %{time_total}' \
        "$base/render?target=$target&from=$from&format=json" || true)
      echo "$code"
      [ "${code%% *}" = 200 ] || break
    done >"$dir/render.codes"
    if [ "$redis_port" != - ]; then
      redis-cli -p "$redis_port" info commandstats | tr -d '\r' |
        awk -F'[=,]' '/^cmdstat_(hgetall|hmget|zrangebylex|scan|getrange):/ {u += $4} END {print "redis_usec", u}' \
        >>"$dir/render.codes"
    fi
    python3 -c "
import json, statistics, sys
lines = open('$dir/render.codes').read().split('\\n')
usec = [float(l.split()[1]) for l in lines if l.startswith('redis_usec')]
rows = [l.split() for l in lines if l and not l.startswith('redis_usec')]
ok = [float(r[1]) for r in rows if r[0] == '200']
answer = json.load(open('$dir/render.json')) if rows[-1][0] == '200' else []
points = sum(len(s['datapoints']) for s in answer)
if len(ok) == len(rows):
    ms = statistics.median(ok) * 1e3
    redis = f' redis {usec[0] / len(rows) / 1e3:.1f} ms' if usec else ''
    print(f'$label from=$from: median {ms:.1f} ms of {len(rows)} ({len(answer)} series, {points} points){redis}')
else:
    print(f'$label from=$from: timed out or failed (HTTP {rows[-1][0]} after {float(rows[-1][1]):.1f} s,'
          f' request {len(rows)}; {len(ok)} answered before)')"
  done
}

# One layout: its Redis, files, import, memory, then its write costs (and the schema's render).
layout() {
  local name=$1 port base t0 t1 used kept wbytes wslots enc
  port=$(free_port)
  if [ "$name" = schema ]; then
    start_node "$port" ${LISTPACK:+--hash-max-listpack-entries "$LISTPACK"}
    local flags=(--retentions "$schema")
  else
    start_node "$port"
    local flags=()
  fi
  rm -rf "$dir/whisper"
  read -r wbytes wslots < <(mkwhisper "$dir/whisper" "$series" "$name" "$schema")
  base=$(used_memory "$port")
  t0=$(date +%s.%N)
  "$AGENT" import whisper --redis "redis://127.0.0.1:$port" "${flags[@]}" "$dir/whisper" \
    >"$dir/import-$name.out" 2>"$dir/import-$name.err" ||
    { echo "the import failed:" >&2; cat "$dir/import-$name.err" >&2; exit 1; }
  t1=$(date +%s.%N)
  if grep -q 'skipped [1-9]' "$dir/import-$name.out"; then cat "$dir/import-$name.err" >&2; fi
  used=$(used_memory "$port"); kept=$(points "$port"); enc=$(encodings "$port")
  echo "$name import_s $(python3 -c "print($t1 - $t0)")" >>"$results"
  echo "$name points $kept" >>"$results"
  echo "$name bytes_per_point $(python3 -c "print(($used - $base) / max(1, $kept))")" >>"$results"
  echo "$name whisper_bytes_per_slot $(python3 -c "print($wbytes / $wslots)")" >>"$results"
  echo "$name enc $enc" >>"$results"
  if [ "$name" = schema ] && [ -n "${ORACLE:-}" ]; then
    ORACLE_WHISPER_DIR="$dir/whisper" ORACLE_STATE="$dir/oracle" ORACLE_SERVER=gunicorn \
      tests/graphite/graphite-web.sh start \
      >"$dir/oracle.out" 2>&1 || { cat "$dir/oracle.out" >&2; exit 1; }
    render_timing oracle "$(cat "$dir/oracle/url")" stats_counts.load.1%3F%3F.c - \
      "${RENDER_REQUESTS:-3}" "${RENDER_TIMEOUT:-60}" |
      sed 's/^/schema /' >>"$results"
    ORACLE_STATE="$dir/oracle" tests/graphite/graphite-web.sh stop >/dev/null 2>&1 || true
  fi
  rm -rf "$dir/whisper"
  if [ "$name" = schema ]; then
    local coarse running=false
    for coarse in ${SCHEMA_COARSE:-0 60}; do
      if $running; then kill "$agent_pid"; wait "$agent_pid" || true; fi
      running=true
      write_cost "$port" "schema-$coarse" "$coarse" "${flags[@]}"
    done
    render_timing render "http://127.0.0.1:$http/graphite" load.1%3F%3F.c "$port" \
      "${RENDER_REQUESTS:-3}" "${RENDER_TIMEOUT:-60}" | sed 's/^/schema /' >>"$results"
  else
    write_cost "$port" book-0 0
  fi
  kill "$agent_pid"; wait "$agent_pid" || true
  used=$(used_memory "$port"); kept=$(points "$port")
  echo "$name after_load_bytes_per_point $(python3 -c "print(($used - $base) / max(1, $kept))")" >>"$results"
  echo "$name after_load_enc $(encodings "$port")" >>"$results"
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
}

echo "statsd-redis $("$AGENT" --version | cut -d' ' -f2-), redis $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/'), $(nproc) cores, $(date -u +%F); $series series, $runs runs, $secs s of load"
for run in $(seq 1 "$runs"); do
  layout schema
  [ "${BOOK:-1}" = 0 ] || layout book
  echo "run $run done ($(date -u +%T))" >&2
done
# The table: medians over the runs.
python3 - "$results" "$series" "$schema" <<'EOF'
import collections, re, statistics, sys
path, series, schema = sys.argv[1], int(sys.argv[2]), sys.argv[3]
num, text, render = collections.defaultdict(list), collections.defaultdict(list), collections.defaultdict(list)
oracle = collections.defaultdict(list)
failed = []
for line in open(path):
    m = re.match(r'schema render from=(\S+): median ([\d.]+) ms of \d+ \((\d+) series, (\d+) points\) redis ([\d.]+) ms', line)
    if m:
        render[m[1]].append((float(m[2]), int(m[3]), int(m[4]), float(m[5])))
        continue
    m = re.match(r'schema oracle from=(\S+): median ([\d.]+) ms', line)
    if m:
        oracle[m[1]].append(float(m[2]))
        continue
    if ' render ' in line or ' oracle ' in line:
        failed.append('schema agent ' + line.split(' ', 1)[1].strip())
        continue
    label, key, value = line.split(maxsplit=2)
    try:
        num[label, key].append(float(value))
    except ValueError:
        text[label, key].append(value.strip())
med = lambda label, key: statistics.median(num[label, key])
units = {'s': 1, 'min': 60, 'm': 60, 'h': 3600, 'd': 86400, 'w': 604800, 'y': 31536000}
def count(d):
    p, r = d.split(':')
    unit = lambda x: (int(re.match(r'\d+', x)[0]), units.get(re.sub(r'\d+', '', x) or 's', 1))
    (pn, pu), (rn, ru) = unit(p), unit(r)
    return rn * ru // (pn * pu) if re.search(r'\D', r) else rn
full = {'schema': sum(count(d) for d in schema.split(',')), 'book': 7 * 120}
print()
print(f"{'memory':<28} {'points/series':>13} {'filled':>7} {'Redis B/pt':>10} {'after load':>10} "
      f"{'whisper B/pt':>12} {'import s':>8}  encodings (20 hashes: at import / after load)")
layouts = [n for n in ('schema', 'book') if num[n, 'points']]
for name, title in [(n, f'schema {schema}' if n == 'schema' else 'book 7 x 120') for n in layouts]:
    per = med(name, 'points') / series
    whisper = f"{med(name, 'whisper_bytes_per_slot'):.2f}" if name == 'schema' else '-'
    print(f"{title:<28} {per:>13.0f} {per / full[name]:>7.1%} {med(name, 'bytes_per_point'):>10.2f} "
          f"{med(name, 'after_load_bytes_per_point'):>10.2f} {whisper:>12} {med(name, 'import_s'):>8.1f}  "
          f"{' '.join(sorted(set(text[name, 'enc'])))} / {' '.join(sorted(set(text[name, 'after_load_enc'])))}")
print()
book = med('book-0', 'cpu') if num['book-0', 'cpu'] else float('nan')
print(f"{'write cost (Redis CPU)':<28} {'coarse s':>8} {'us/series-min':>13} {'x book':>7} "
      f"{'HINCRBY/series-min':>18} {'cleaner 1st pass us/series':>26}")
for label, title, coarse in [(f'schema-{c}', 'schema', c) for c in sorted({int(l[7:]) for l, _ in num if l.startswith('schema-')})] + [('book-0', 'book 7 x 120', 0)][:len(layouts) - 1]:
    cpu = med(label, 'cpu')
    print(f"{title:<28} {coarse:>8} {cpu:>13.0f} {cpu / book:>7.2f} {med(label, 'hincrby'):>18.1f} "
          f"{med(label, 'cleaner'):>26.0f}")
print()
for frm, rows in render.items():
    ms = statistics.median(r[0] for r in rows)
    redis = statistics.median(r[3] for r in rows)
    theirs = oracle.get(frm)
    vs = f"; graphite-web {statistics.median(theirs):.1f} ms, agent/graphite-web {ms / statistics.median(theirs):.2f}" if theirs else ''
    print(f"render (schema agent) from={frm}: {ms:.1f} ms (median over the runs of each run's median)"
          f" ({rows[0][1]} series, {rows[0][2]} points); Redis's own time {redis:.1f} ms, x{ms / redis:.2f}{vs}")
for line in failed:
    print(line)
EOF
# What the agents and the imports said beyond their figures.
{ grep -h -E 'WARN|ERROR' "$dir"/agent-*.log "$dir"/import-*.err || true; } | sed 's/^[^ ]* *//' |
  sort | uniq -c
