#!/bin/bash
# The classic StatsD stack, run privately for tests/etsy.rs: Etsy statsd (from the npm registry,
# its Graphite backend) -> Debian's carbon-cache (whisper files) -> graphite-web 1.1.10 over
# those files (tests/graphite/graphite-web.sh).
#
#   STATSD_PKG=.../node_modules/statsd REALSTACK_RUN=DIR tests/etsy/stack.sh start
#   REALSTACK_RUN=DIR tests/etsy/stack.sh stop
#
# `start` prints KEY=VALUE lines (STATSD_PORT, GRAPHITE_URL, ...). Environment: REALSTACK_RUN
# (the state dir, everything lives under it), STATSD_PKG (Etsy statsd's package dir), FLUSH_MS
# (statsd's flushInterval, default 1000), RETENTIONS (whisper's, default 1s:1h,1m:1d).
# carbon runs with a configuration of its own (Debian's switches user and creates 50 series a
# minute): no user switch, nothing limited, the pickle receiver off, ports free on 127.0.0.1.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
RUN="${REALSTACK_RUN:?REALSTACK_RUN: the state dir}"
FLUSH_MS="${FLUSH_MS:-1000}"
RETENTIONS="${RETENTIONS:-1s:1h,1m:1d}"
STATSD_PKG="${STATSD_PKG:-}"
GW_SCRIPT="$HERE/../graphite/graphite-web.sh"
PY=/usr/bin/python3

alive() { [ -r "/proc/$1/status" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status"; }

# A free loopback port (tcp or udp), chosen by the kernel.
free_port() {
  $PY - "$1" <<'EOF'
import socket, sys
kind = socket.SOCK_STREAM if sys.argv[1] == 'tcp' else socket.SOCK_DGRAM
s = socket.socket(socket.AF_INET, kind); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])
EOF
}

# wait until a TCP port on 127.0.0.1 accepts connections (or a pid dies)
wait_tcp() {  # port pid what
  for _ in $(seq 1 200); do
    if $PY -c "import socket,sys; socket.create_connection(('127.0.0.1',$1),0.2).close()" 2>/dev/null; then return 0; fi
    alive "$2" || { echo "$3 died" >&2; return 1; }
    sleep 0.05
  done
  echo "$3 did not listen on $1 in 10 s" >&2; return 1
}

wait_udp() {  # port pid what: statsd's UDP socket is bound
  local hex; hex=$(printf '%04X' "$1")
  for _ in $(seq 1 200); do
    if grep -q ":$hex " /proc/net/udp; then return 0; fi
    alive "$2" || { echo "$3 died" >&2; return 1; }
    sleep 0.05
  done
  echo "$3 did not bind UDP $1 in 10 s" >&2; return 1
}

stop_pid() {  # pidfile
  [ -f "$1" ] || return 0
  local pid; pid=$(cat "$1")
  if alive "$pid"; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do alive "$pid" || break; sleep 0.05; done
    if alive "$pid"; then kill -9 "$pid" 2>/dev/null || true; fi
    echo "stopped $(basename "$1" .pid) pid $pid"
  fi
  rm -f "$1"
}

start() {
  [ -f "$STATSD_PKG/stats.js" ] || { echo "STATSD_PKG: Etsy statsd's package dir (npm install statsd)" >&2; exit 2; }
  if [ -f "$RUN/env" ]; then echo "already started ($RUN/env); stop first" >&2; exit 1; fi
  trap 'echo "start failed; stopping what was started" >&2; stop >&2' EXIT
  rm -rf "$RUN"
  mkdir -p "$RUN/carbon" "$RUN/storage/whisper" "$RUN/storage/log" "$RUN/pids"
  local carbon_line carbon_query statsd_udp statsd_mgmt web_port
  carbon_line=$(free_port tcp); carbon_query=$(free_port tcp)
  statsd_udp=$(free_port udp); statsd_mgmt=$(free_port tcp)
  web_port=$(free_port tcp)

  # ---- graphite-web first, so carbon can register tagged series with it (GRAPHITE_URL)
  ORACLE_WHISPER_DIR="$RUN/storage/whisper" ORACLE_STATE="$RUN/gw" ORACLE_SERVER= \
    bash "$GW_SCRIPT" start "$web_port" > "$RUN/gw-start.out"
  local graphite_url="http://127.0.0.1:$web_port"

  # ---- carbon-cache
  cat > "$RUN/carbon/carbon.conf" <<EOF
[cache]
STORAGE_DIR    = $RUN/storage/
LOCAL_DATA_DIR = $RUN/storage/whisper/
WHITELISTS_DIR = $RUN/storage/lists/
CONF_DIR       = $RUN/carbon/
LOG_DIR        = $RUN/storage/log/
PID_DIR        = $RUN/pids/
DATABASE = whisper
ENABLE_LOGROTATION = False
# empty USER: do not switch to Debian's _graphite user
USER =
MAX_CACHE_SIZE = inf
MAX_UPDATES_PER_SECOND = inf
MAX_CREATES_PER_MINUTE = inf
# 0: keep statsd's timestamp as sent (whisper floors it to its slot anyway)
MIN_TIMESTAMP_RESOLUTION = 0
MIN_TIMESTAMP_LAG = 0
LINE_RECEIVER_INTERFACE = 127.0.0.1
LINE_RECEIVER_PORT = $carbon_line
ENABLE_UDP_LISTENER = False
# port 0 = receiver not started (carbon/protocols.py build())
PICKLE_RECEIVER_INTERFACE = 127.0.0.1
PICKLE_RECEIVER_PORT = 0
CACHE_QUERY_INTERFACE = 127.0.0.1
CACHE_QUERY_PORT = $carbon_query
USE_FLOW_CONTROL = True
LOG_UPDATES = True
LOG_CREATES = True
LOG_CACHE_HITS = False
LOG_CACHE_QUEUE_SORTS = False
LOG_LISTENER_CONN_SUCCESS = False
CACHE_WRITE_STRATEGY = sorted
WHISPER_AUTOFLUSH = False
WHISPER_SPARSE_CREATE = False
WHISPER_FALLOCATE_CREATE = True
# no carbon.agents.* self-metrics in the tree
CARBON_METRIC_INTERVAL = 0
# tagged series (name;k=v) are POSTed to GRAPHITE_URL/tags/tagMultiSeries (graphite-web's tag DB)
ENABLE_TAGS = True
# register every update with graphite-web's tag DB (default 100: only every 100th update)
TAG_UPDATE_INTERVAL = 1
TAG_HASH_FILENAMES = True
GRAPHITE_URL = $graphite_url
EOF
  cat > "$RUN/carbon/storage-schemas.conf" <<EOF
[carbon]
pattern = ^carbon\.
retentions = 60:90d

[stats]
pattern = ^stats.*
retentions = $RETENTIONS

[default]
pattern = .*
retentions = $RETENTIONS
EOF
  # Etsy docs/graphite.md, with xFilesFactor 0 everywhere
  cat > "$RUN/carbon/storage-aggregation.conf" <<'EOF'
[min]
pattern = \.lower$
xFilesFactor = 0
aggregationMethod = min

[max]
pattern = \.upper(_\d+)?$
xFilesFactor = 0
aggregationMethod = max

[sum]
pattern = \.sum$
xFilesFactor = 0
aggregationMethod = sum

[count]
pattern = \.count$
xFilesFactor = 0
aggregationMethod = sum

[count_legacy]
pattern = ^stats_counts.*
xFilesFactor = 0
aggregationMethod = sum

[default_average]
pattern = .*
xFilesFactor = 0
aggregationMethod = average
EOF
  # --nodaemon: twistd stays in the foreground, logs (incl. creates/updates) to stdout.
  # GRAPHITE_ROOT only matters for defaults we override; set it so nothing points at /usr.
  GRAPHITE_ROOT="$RUN" setsid /usr/bin/carbon-cache --config="$RUN/carbon/carbon.conf" \
      --pidfile="$RUN/pids/carbon-cache.pid" --nodaemon start \
      > "$RUN/storage/log/carbon-cache.out" 2>&1 < /dev/null &
  local cpid=$!
  echo "$cpid" > "$RUN/pids/carbon.pid"
  wait_tcp "$carbon_line" "$cpid" carbon-cache || { tail -30 "$RUN/storage/log/carbon-cache.out" >&2; exit 1; }

  # ---- statsd
  local backends='"./backends/graphite"'
  cat > "$RUN/statsd.js" <<EOF
{
  address: "127.0.0.1",
  port: $statsd_udp,
  mgmt_address: "127.0.0.1",
  mgmt_port: $statsd_mgmt,
  graphiteHost: "127.0.0.1",
  graphitePort: $carbon_line,
  flushInterval: $FLUSH_MS,
  backends: [$backends],
  automaticConfigReload: false
}
EOF
  (cd "$STATSD_PKG" && exec setsid node stats.js "$RUN/statsd.js" \
      > "$RUN/storage/log/statsd.out" 2>&1 < /dev/null) &
  local spid=$!
  echo "$spid" > "$RUN/pids/statsd.pid"
  wait_udp "$statsd_udp" "$spid" statsd || { tail -30 "$RUN/storage/log/statsd.out" >&2; exit 1; }
  wait_tcp "$statsd_mgmt" "$spid" statsd-mgmt || { tail -30 "$RUN/storage/log/statsd.out" >&2; exit 1; }

  cat > "$RUN/env" <<EOF
STATSD_HOST=127.0.0.1
STATSD_PORT=$statsd_udp
STATSD_MGMT_PORT=$statsd_mgmt
STATSD_PID=$spid
CARBON_LINE_PORT=$carbon_line
CARBON_QUERY_PORT=$carbon_query
CARBON_PID=$cpid
WHISPER_DIR=$RUN/storage/whisper
GRAPHITE_URL=$graphite_url
FLUSH_MS=$FLUSH_MS
RETENTIONS=$RETENTIONS
RUN=$RUN
EOF
  trap - EXIT
  cat "$RUN/env"
}

stop() {
  stop_pid "$RUN/pids/statsd.pid"
  stop_pid "$RUN/pids/carbon.pid"
  if [ -d "$RUN/gw" ]; then ORACLE_STATE="$RUN/gw" bash "$GW_SCRIPT" stop || true; fi
  rm -rf "$RUN"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status)
    [ -f "$RUN/env" ] && cat "$RUN/env"
    for p in "$RUN"/pids/statsd.pid "$RUN"/pids/carbon.pid "$RUN"/gw/pid; do
      [ -f "$p" ] && { pid=$(cat "$p"); alive "$pid" && echo "$p: $pid running" || echo "$p: $pid dead"; }
    done; true ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
