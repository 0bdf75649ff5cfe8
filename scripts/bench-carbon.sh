#!/usr/bin/env bash
# carbon-cache (Debian's graphite-carbon, whisper files) beside the agent and its Redis, on the
# same carbon plaintext stream over one TCP connection, with the schema
# 10s:6h,1m:7d,1h:90d,1d:5y: the CPU a million points cost each (carbon-cache's process; the
# agent's and Redis's together, with the open intervals' rollup run and a cleaner pass after
# the points), how long until each had written everything, and the points the agent placed
# against those sent (0 lost). Two shapes:
#
#   batch:   SERIES series x POINTS points ten seconds apart (the last POINTS*10 s), sent at once
#   rounds:  ROUND_SERIES series, one point each every 5 s for ROUNDS rounds (collectd's shape)
#
#   scripts/bench-carbon.sh [runs]          (SHAPES="batch rounds", SERIES=2000 POINTS=360
#                                            ROUND_SERIES=20000 ROUNDS=12,
#                                            SCHEMA=10s:6h,1m:7d,1h:90d,1d:5y; CARBON=0: the
#                                            agent alone, to compare schemas;
#                                            COMMANDSTATS=1: Redis's own time by command,
#                                            and the agent's and Redis's CPU apart;
#                                            IDLE=1: first, their CPU left idle 60 s;
#                                            AGAIN=1: each shape sent once first, unmeasured,
#                                            so that the measured sending finds the files and
#                                            hashes full, as a relay's backlog would;
#                                            FULL=1, the rounds at steady state: AGAIN=1, and
#                                            the agent's Redis first holds each series' finer
#                                            hashes full (their newest 120 slices, as days of
#                                            sending leave them: fill_full in common.sh), so
#                                            its cleaner moves and its rollups read what a
#                                            series that has sent for days costs them)
#
# carbon-cache runs as its users run it: MAX_CACHE_SIZE, MAX_UPDATES_PER_SECOND and
# MAX_CREATES_PER_MINUTE unlimited (Debian's limits would make it slower still), the sorted write
# strategy, its own metrics off. Needs the release build and graphite-carbon.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh
[ -x /usr/bin/carbon-cache ] || { echo "carbon-cache is missing: apt-get install -y --no-install-recommends graphite-carbon" >&2; exit 1; }
RUNS=${1:-1}
SHAPES=${SHAPES:-batch rounds}
SERIES=${SERIES:-2000}; POINTS=${POINTS:-360}
ROUND_SERIES=${ROUND_SERIES:-20000}; ROUNDS=${ROUNDS:-12}
SCHEMA=${SCHEMA:-10s:6h,1m:7d,1h:90d,1d:5y}
CARBON=${CARBON:-1}
[ -n "${FULL:-}" ] && AGAIN=1


# settle PID...: waits until the CPU of these processes stops moving for 3 s (everything
# written), at most 10 minutes; prints the seconds it waited.
settle() {
  local start last now still=0 waited=0
  start=$(date +%s.%N)
  last=$(for p in "$@"; do proc_cpu "$p"; done | paste -sd+ | bc)
  while [ "$still" -lt 6 ] && [ "$waited" -lt 1200 ]; do
    sleep 0.5; waited=$((waited + 1))
    now=$(for p in "$@"; do proc_cpu "$p"; done | paste -sd+ | bc)
    if [ "$(echo "$now - $last < 0.01" | bc)" = 1 ]; then still=$((still + 1)); else still=0; fi
    last=$now
  done
  echo "$(date +%s.%N) - $start - 3" | bc
}

# send PORT SHAPE: the shape's lines over one connection (the rounds 5 s apart); prints the
# points sent.
send() {
  /usr/bin/python3 - "$1" "$2" "$SERIES" "$POINTS" "$ROUND_SERIES" "$ROUNDS" <<'PY'
import socket, sys, time
port, shape, series, points, round_series, rounds = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
s = socket.create_connection(("127.0.0.1", int(port)))
sent = 0
if shape == "batch":
    now = int(time.time())
    for i in range(series):
        lines = "".join(f"bench.host{i % 100}.metric{i} {(i * 7 + k) % 1000 / 10} {now - (points - k) * 10}\n" for k in range(points))
        s.sendall(lines.encode())
        sent += points
else:
    for r in range(rounds):
        start = time.time()
        now = int(start)
        s.sendall("".join(f"collectd.host{i % 500}.cpu{i}.value {(i + r) % 100} {now}\n" for i in range(round_series)).encode())
        sent += round_series
        time.sleep(max(0, 5 - (time.time() - start)))
s.close()
print(sent)
PY
}

start_carbon() {
  local root=$dir/carbon
  rm -rf "$root"; mkdir -p "$root"/{conf,whisper,log,pids,lists}
  carbon_port=$(free_port); local query; query=$(free_port)
  cat > "$root/conf/carbon.conf" <<EOF
[cache]
STORAGE_DIR = $root/
LOCAL_DATA_DIR = $root/whisper/
WHITELISTS_DIR = $root/lists/
CONF_DIR = $root/conf/
LOG_DIR = $root/log/
PID_DIR = $root/pids/
USER =
ENABLE_LOGROTATION = False
MAX_CACHE_SIZE = inf
MAX_UPDATES_PER_SECOND = inf
MAX_CREATES_PER_MINUTE = inf
LINE_RECEIVER_INTERFACE = 127.0.0.1
LINE_RECEIVER_PORT = $carbon_port
PICKLE_RECEIVER_PORT = 0
CACHE_QUERY_INTERFACE = 127.0.0.1
CACHE_QUERY_PORT = $query
CACHE_WRITE_STRATEGY = sorted
CARBON_METRIC_INTERVAL = 0
LOG_UPDATES = False
LOG_CREATES = False
EOF
  printf '[all]\npattern = .*\nretentions = %s\n' "$SCHEMA" > "$root/conf/storage-schemas.conf"
  GRAPHITE_ROOT=$root /usr/bin/carbon-cache --config="$root/conf/carbon.conf" \
    --pidfile="$root/pids/carbon.pid" --nodaemon start > "$root/log/out" 2>&1 &
  carbon_pid=$!
  until python3 -c "import socket; socket.create_connection(('127.0.0.1', $carbon_port)).close()" 2>/dev/null; do
    kill -0 "$carbon_pid" 2>/dev/null || { cat "$root/log/out" >&2; exit 1; }
    sleep 0.1
  done
}

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); carbon-cache $(dpkg-query -W -f '${Version}' graphite-carbon 2>/dev/null)"
printf '%-7s %4s %12s %12s %10s %12s %10s %8s %8s\n' shape run points carbon_cpu carbon_s agent+redis agent_s ratio lost
for run in $(seq 1 "$RUNS"); do
  for shape in $SHAPES; do
    c0=0; c1=0; carbon_s=0
    if [ "$CARBON" = 1 ]; then
      start_carbon
      if [ -n "${AGAIN:-}" ]; then send "$carbon_port" "$shape" >/dev/null; settle "$carbon_pid" >/dev/null; fi
      c0=$(proc_cpu "$carbon_pid")
      sent=$(send "$carbon_port" "$shape")
      carbon_s=$(settle "$carbon_pid")
      c1=$(proc_cpu "$carbon_pid")
      kill "$carbon_pid"; wait "$carbon_pid" 2>/dev/null || true
    fi

    sock=$dir/redis.sock; rm -f "$sock"
    start_redis "$sock"
    [ -n "${FULL:-}" ] && [ "$shape" = rounds ] && fill_full "$sock" "$ROUND_SERIES" "$SCHEMA"
    agent_carbon=$(free_port)
    start_agent "$dir/agent.log" --redis "unix://$sock" --retentions "$SCHEMA" --carbon-tcp "127.0.0.1:$agent_carbon"
    if [ -n "${IDLE:-}" ]; then
      # What the agent and Redis spend doing nothing for as long as the points wait for their
      # rollup run and cleaner pass (Redis's cron, the agent's ticks): in the figure below too.
      i0=$(echo "$(proc_cpu "$agent_pid") + $(proc_cpu "$redis_pid")" | bc)
      sleep 60
      echo "idle 60 s: agent + Redis $(echo "$(proc_cpu "$agent_pid") + $(proc_cpu "$redis_pid") - $i0" | bc) s CPU" >&2
    fi
    if [ -n "${AGAIN:-}" ]; then
      send "$agent_carbon" "$shape" >/dev/null
      settle "$agent_pid" "$redis_pid" >/dev/null
      first=$(agent_metric "$http" carbon_points_total)
      redis-cli -s "$sock" config resetstat >/dev/null
    fi
    g0=$(proc_cpu "$agent_pid"); r0=$(proc_cpu "$redis_pid")
    a0=$(echo "$g0 + $r0" | bc)
    sent=$(send "$agent_carbon" "$shape")
    # Counted too: the open intervals' rollups, made once a coarse_write_secs (60 s), and a
    # cleaner pass after the points (every cleaner_interval_secs, 60 s), which moves what a
    # long archive's hash no longer keeps into its blocks.
    t0=$(date +%s.%N)
    passes=$(agent_metric "$http" cleaner_passes_total)
    until [ "$(redis-cli -s "$sock" zcard pending:gauge:)" = 0 ] &&
      [ "$(agent_metric "$http" cleaner_passes_total)" != "$passes" ]; do sleep 0.5; done
    agent_s=$(echo "$(date +%s.%N) - $t0 + $(settle "$agent_pid" "$redis_pid")" | bc)
    a1=$(echo "$(proc_cpu "$agent_pid") + $(proc_cpu "$redis_pid")" | bc)
    if [ -n "${COMMANDSTATS:-}" ]; then
      redis-cli -s "$sock" info commandstats | grep -E "cmdstat_" >&2
      echo "measured: agent $(echo "$(proc_cpu "$agent_pid") - $g0" | bc) s, redis $(echo "$(proc_cpu "$redis_pid") - $r0" | bc) s CPU" >&2
    fi
    placed=$(agent_metric "$http" carbon_points_total)
    placed=$(echo "$placed - ${first:-0}" | bc)
    failed=$(agent_metric "$http" write_failures_total)
    kill "$agent_pid"; wait "$agent_pid" 2>/dev/null || true
    kill "$redis_pid"; wait "$redis_pid" 2>/dev/null || true

    carbon_cpu=$(echo "($c1 - $c0) * 1000000 / $sent" | bc -l)
    agent_cpu=$(echo "($a1 - $a0) * 1000000 / $sent" | bc -l)
    ratio=0; [ "$CARBON" = 1 ] && ratio=$(echo "$agent_cpu / $carbon_cpu" | bc -l)
    printf '%-7s %4d %12d %12.2f %10.1f %12.2f %10.1f %8.3f %8d\n' "$shape" "$run" "$sent" \
      "$carbon_cpu" "$carbon_s" "$agent_cpu" "$agent_s" "$ratio" \
      "$((sent - ${placed%.*} + ${failed%.*}))"
  done
done
echo "(cpu columns: CPU seconds per million points; _s: seconds from the first line sent until the CPU settled)"
