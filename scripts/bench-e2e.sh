#!/usr/bin/env bash
# End-to-end benchmark: the load generator at full speed against (1) the floor receiver, which
# only reads and counts lines, (2) the agent writing to a private Redis, and (3) Etsy statsd
# 0.9.0 (installed from npm into a temp dir; skipped when npm is missing); the same load, one
# after the other, several runs. Reports loss and receiver CPU (user+system of the receiving
# process, flush included) per datagram and per line, and the ratios to the floor.
#
#   scripts/bench-e2e.sh [runs=5] [series=1000]
#
# DEAD_RELAY=1 also runs the agent relaying to a TCP StatsD server that is down (`relay`; every
# line dropped and counted), interleaved with the others: "agent+relay" in the table. ETSY=0
# leaves Etsy statsd out.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}; series=${2:-1000}
cargo build --release --quiet --bin statsd-redis --example loadgen --example floor
. scripts/common.sh
cpu_us() { awk '{ print ($14 + $15) * 1000000 / '"$(getconf CLK_TCK)"' }' "/proc/$1/stat"; }
metric() { curl -s "127.0.0.1:$1/metrics" | awk -v m="statsd_redis_$2" '$1 == m || index($1, m "{") == 1 { s += $2; n++ } END { if (n) print s }'; }

results="$dir/results.tsv"
etsy=""
if [ "${ETSY:-1}" != 0 ] && command -v npm >/dev/null 2>&1; then
  (cd "$dir" && npm install --silent --no-audit --no-fund statsd@0.9.0 >/dev/null 2>&1) && etsy="$dir/node_modules/statsd"
  # A backend that keeps the running total of what Etsy statsd received, for the loss figure.
  cat > "$dir/count-backend.js" <<'JS'
const fs = require('fs');
let metrics = 0, packets = 0;
exports.init = function (startup, config, events) {
  events.on('flush', function (ts, m) {
    metrics += m.counters['statsd.metrics_received'] || 0;
    packets += m.counters['statsd.packets_received'] || 0;
    fs.writeFileSync(config.countFile, metrics + ' ' + packets + '\n');
  });
  return true;
};
JS
fi
run_floor() { # lines_per_datagram lines
  local port; port=$(free_port)
  target/release/examples/floor "127.0.0.1:$port" > "$dir/floor.out" &
  local pid=$!; sleep 0.3
  target/release/examples/loadgen send --target "127.0.0.1:$port" --series "$series" \
    --lines-per-datagram "$1" --lines "$2" > "$dir/send.out"
  wait $pid
  local got cpu
  got=$(sed -E 's/.*lines=([0-9]+).*/\1/' "$dir/floor.out")
  cpu=$(sed -E 's/.*cpu_us=([0-9]+).*/\1/' "$dir/floor.out")
  printf 'floor\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$got" "$cpu" "$(cat "$dir/send.out")" >> "$results"
}
run_agent() { # lines_per_datagram lines [label extra-agent-args...]
  local sock="$dir/r.sock" udp http label=${3:-agent}
  start_redis "$sock"
  start_agent "$dir/agent.log" --redis "redis+unix://$sock" --cleaner-enabled false "${@:4}"
  local pid=$agent_pid
  local before; before=$(cpu_us $pid)
  target/release/examples/loadgen send --target "127.0.0.1:$udp" --series "$series" \
    --lines-per-datagram "$1" --lines "$2" --totals "$dir/totals.tsv" > "$dir/send.out"
  # Wait for the last window to be flushed: lines stop moving and the backlog is empty.
  local prev=-1 now
  while true; do
    sleep 1.5
    now=$(metric "$http" lines_received_total)
    [ "$now" = "$prev" ] && [ "$(metric "$http" backlog_windows)" = "0" ] && break
    prev=$now
  done
  local after; after=$(cpu_us $pid)
  local drops; drops=$(metric "$http" kernel_drops_total)
  kill -TERM $pid; wait $pid || true
  local check
  check=$(target/release/examples/loadgen check --redis "redis+unix://$sock" --totals "$dir/totals.tsv" 2>&1 | tail -1 || true)
  printf '%s\t%s\t%s\t%s\t%s\t%s\tkernel_drops=%s\t%s\n' "$label" "$1" "$2" "$now" "$((after - before))" \
    "$(cat "$dir/send.out")" "$drops" "$check" >> "$results"
  kill "$redis_pid"; wait "$redis_pid" 2>/dev/null || true
  rm -f "$sock"
}

run_etsy() { # lines_per_datagram lines
  local udp mgmt; udp=$(free_port); mgmt=$(free_port)
  rm -f "$dir/etsy.count"
  printf '{ port: %s, mgmt_port: %s, flushInterval: 1000, backends: ["%s/count-backend.js"], countFile: "%s/etsy.count" }\n' \
    "$udp" "$mgmt" "$dir" "$dir" > "$dir/etsy-config.js"
  node "$etsy/stats.js" "$dir/etsy-config.js" > "$dir/etsy.log" 2>&1 &
  local pid=$!
  until [ -f "$dir/etsy.count" ]; do sleep 0.1; done
  local before; before=$(cpu_us $pid)
  target/release/examples/loadgen send --target "127.0.0.1:$udp" --series "$series" \
    --lines-per-datagram "$1" --lines "$2" > "$dir/send.out"
  local prev=-1 now
  while true; do
    sleep 2.5
    now=$(cut -d' ' -f1 "$dir/etsy.count")
    [ "$now" = "$prev" ] && break
    prev=$now
  done
  local after; after=$(cpu_us $pid)
  kill $pid; wait $pid 2>/dev/null || true
  printf 'etsy\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$now" "$((after - before))" "$(cat "$dir/send.out")" >> "$results"
}

for scenario in "1 2000000" "20 20000000"; do
  for run in $(seq 1 "$runs"); do
    run_floor $scenario
    run_agent $scenario
    [ "${DEAD_RELAY:-0}" = 1 ] && run_agent $scenario agent+relay --relay "tcp://127.0.0.1:$(free_port)"
    [ -n "$etsy" ] && run_etsy $scenario
  done
done
cat "$results"
python3 - "$results" <<'PY'
import sys, statistics as st
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
print()
print("| receiver | lines/datagram | sent lines | received (median) | loss (median) | CPU per datagram | CPU per line | send rate (median) |")
print("|---|---|---|---|---|---|---|---|")
med = {}
for who in ("floor", "agent", "agent+relay", "etsy"):
    for lpd in ("1", "20"):
        rs = [r for r in rows if r[0] == who and r[1] == lpd]
        if not rs: continue
        sent = int(rs[0][2]); got = [int(r[3]) for r in rs]; cpu = [int(r[4]) for r in rs]
        rate = [float(r[5].split("(")[1].split()[0]) for r in rs]
        per_line = st.median(c * 1000 / g for c, g in zip(cpu, got))
        per_dgram = per_line * int(lpd)
        med[(who, lpd)] = per_line
        print(f"| {who} | {lpd} | {sent} | {st.median(got):.0f} | {100 * (sent - st.median(got)) / sent:.2f}% | {per_dgram / 1000:.2f} µs | {per_line:.0f} ns | {st.median(rate) / 1e3:.0f}k lines/s |")
print()
for lpd in ("1", "20"):
    for who in ("agent", "agent+relay", "etsy"):
        if ("floor", lpd) in med and (who, lpd) in med:
            print(f"{who} / floor CPU per line, {lpd}-line datagrams: {med[(who, lpd)] / med[('floor', lpd)]:.2f}x")
    if ("etsy", lpd) in med and ("agent", lpd) in med:
        print(f"etsy / agent CPU per line, {lpd}-line datagrams: {med[('etsy', lpd)] / med[('agent', lpd)]:.2f}x")
PY
