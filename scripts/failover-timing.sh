#!/usr/bin/env bash
# How long the agent stops writing when Redis fails over or reshards under a steady load, and
# whether it still writes every count exactly once. Each scenario runs `runs` times on a fresh
# private topology (loopback ports picked free); per run and as the median it prints:
#
#   cluster   3 masters + 3 replicas (cluster-node-timeout 2000); one master SIGKILLed ~6 s into
#             the load (a different one each run). a: kill -> its replica is master and every live
#             node says cluster_state:ok; b: kill -> the agent wrote a window again (the end of
#             the longest gap in statsd_redis_last_flush_timestamp_seconds, polled every 100 ms;
#             `gap` is that gap, b_minus_a what the agent took once Redis was back); c: kill ->
#             backlog_windows back to 0; d: after the load has drained and the agent stopped,
#             exact totals (lost and doubled counts) of every series at every precision, and
#             the agent's windows_dropped_total and chunks_applied_before_total.
#   sentinel  1 master + 2 replicas + 3 sentinels (quorum 2, down-after 2000, failover-timeout
#             5000), agent with --wait-replicas 1; the master SIGKILLed ~6 s in. a: kill -> every
#             sentinel names the same new master and its ROLE is master; b, c, d as above (d
#             read from the new master, also with `loadgen check`).
#   reshard   the 3+3 cluster; the same load once without and once with 1024 slots moved from one
#             master to another (`redis-cli --cluster reshard`) ~6 s in: the reshard's wall time,
#             flush p50/p99 (histogram bucket bounds, windows of the load only; inf: over 10 s)
#             and the longest gap between two windows written, of both; exact totals of both;
#             `redis-cli --cluster check` after.
#
#   scripts/failover-timing.sh [runs=3] [seconds=20] [series=2000] [rate=20000] [scenarios=cluster,sentinel,reshard]
#
# Load: counters only, `series` series, `rate` lines/s, 20 lines per datagram. The agent runs
# with --redis-timeout-ms 500 and --cleaner-enabled false; KEEP=DIR keeps every run's files
# (logs, timelines, totals) there. Needs target/release/statsd-redis and examples/loadgen, from
# `cargo build --release --bin statsd-redis --example loadgen` (not built here). Polls are 100 ms
# apart, so a and c are within 0.1 s; b is the agent's own timestamp of the first window written
# after the gap (later by up to 0.1 s when several windows were written between two polls).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}; secs=${2:-20}; series=${3:-2000}; rate=${4:-20000}; scenarios=${5:-cluster,sentinel,reshard}
kill_at=6
for bin in target/release/statsd-redis target/release/examples/loadgen; do
  [ -x "$bin" ] || { echo "$bin is missing: cargo build --release --bin statsd-redis --example loadgen" >&2; exit 1; }
done
. scripts/common.sh
fo() { python3 "$dir/fo.py" "$@"; }
results="$dir/results"; : >"$results"

cat >"$dir/fo.py" <<'EOF'
# Helpers for failover-timing.sh: a minimal RESP client, the 100 ms monitor, its analysis, the
# exact-totals check, and the histogram and median arithmetic.
import json, socket, statistics, sys, time, urllib.request

class Err(str):
    pass

def _read(f):
    line = f.readline()
    if not line:
        raise EOFError("connection closed")
    t, rest = line[:1], line[1:-2]
    if t == b"+": return rest.decode()
    if t == b"-": return Err(rest.decode())
    if t == b":": return int(rest)
    if t == b"$":
        n = int(rest)
        return None if n < 0 else f.read(n + 2)[:-2].decode()
    if t == b"*":
        n = int(rest)
        return None if n < 0 else [_read(f) for _ in range(n)]
    raise ValueError("bad reply %r" % line)

def _pack(args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)

def pipeline(port, cmds, timeout=0.3):
    """Replies to cmds (lists of args), sent at once over a new connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(b"".join(_pack(c) for c in cmds))
        f = s.makefile("rb")
        return [_read(f) for _ in cmds]

def call(port, *args, timeout=0.3):
    return pipeline(port, [args], timeout)[0]

def info(port, section):
    return dict(l.split(":", 1) for l in call(port, "INFO", section).splitlines() if ":" in l)

def metrics(url):
    out = {}
    with urllib.request.urlopen(url, timeout=0.5) as r:
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
    return out

def m(ms, name):
    """A metric's value, the sum over its labels."""
    return sum(v for k, v in ms.items() if k == name or k.startswith(name + "{"))

def crc16(data):
    crc = 0
    for b in data:
        crc ^= b << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc

def slot(key):
    k = key.encode()
    s = k.find(b"{")
    if s >= 0:
        e = k.find(b"}", s + 1)
        if e > s + 1:
            k = k[s + 1:e]
    return crc16(k) % 16384

def owners(port):
    table = [None] * 16384
    for start, end, master, *_ in call(port, "CLUSTER", "SLOTS", timeout=2):
        for i in range(start, end + 1):
            table[i] = master[1]
    return table

def monitor(mode, url, out, max_secs, a, b):
    """Every 100 ms, one JSON line: time, the agent's metrics, the topology's state."""
    end = time.time() + max_secs
    with open(out, "w", buffering=1) as f:
        while time.time() < end:
            t = time.time()
            row = {"t": t}
            try:
                ms = metrics(url)
                row.update(last=m(ms, "statsd_redis_last_flush_timestamp_seconds"),
                           backlog=m(ms, "statsd_redis_backlog_windows"),
                           errors=ms.get('statsd_redis_flushes_total{outcome="error"}', 0))
            except Exception as e:
                row["metrics_error"] = str(e)
            if mode == "agent":
                pass
            elif mode == "cluster":
                live, replicas = [int(p) for p in a.split(",")], [int(p) for p in b.split(",")]
                states = []
                for p in live:
                    try:
                        ci = dict(l.split(":", 1) for l in call(p, "CLUSTER", "INFO").splitlines() if ":" in l)
                        states.append(ci.get("cluster_state"))
                    except Exception:
                        states.append("?")
                row["ok"] = all(s == "ok" for s in states)
                row["fail"] = any(s == "fail" for s in states)
                promoted = []
                for p in replicas:
                    try:
                        promoted.append(info(p, "replication").get("role") == "master")
                    except Exception:
                        promoted.append(False)
                row["promoted"] = any(promoted)
            else:
                sentinels, old = [int(p) for p in a.split(",")], int(b)
                named = []
                for s in sentinels:
                    try:
                        r = call(s, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster")
                        named.append(int(r[1]) if isinstance(r, list) else None)
                    except Exception:
                        named.append(None)
                row["named"] = named
                new = named[0] if len(set(named)) == 1 and named[0] not in (None, old) else None
                row["any_new"] = any(n not in (None, old) for n in named)
                row["new"] = None
                if new:
                    try:
                        if call(new, "ROLE")[0] == "master":
                            row["new"] = new
                    except Exception:
                        pass
            f.write(json.dumps(row) + "\n")
            time.sleep(max(0, t + 0.1 - time.time()))

def write_times(rows):
    """The distinct values of last_flush_timestamp_seconds, in order."""
    seen = []
    for r in rows:
        v = r.get("last")
        if v and (not seen or v != seen[-1]):
            seen.append(v)
    return seen

def analyze(mode, timeline, kill):
    """a, b, c (seconds after the kill) and what else the timeline shows, as key=value. Mode
    `agent`: the longest gap between two windows written until `kill` (there: the load's end)."""
    kill = float(kill)
    rows = [json.loads(l) for l in open(timeline)]
    if mode == "agent":
        seen = write_times(rows)
        return {"max_write_gap": max((b - a for a, b in zip(seen, seen[1:]) if a <= kill + 1.5),
                                     default=None)}
    after = [r for r in rows if r["t"] >= kill]
    res = {}
    if mode == "cluster":
        fail = next((r["t"] for r in after if r.get("fail")), None)
        prom = next((r["t"] for r in after if r.get("promoted")), None)
        a = next((r["t"] for r in after if r.get("promoted") and r.get("ok")), None)
        res["detect"] = fail and fail - kill
        res["promoted"] = prom and prom - kill
    else:
        first = next((r["t"] for r in after if r.get("any_new")), None)
        a = next((r["t"] for r in after if r.get("new")), None)
        res["first_sentinel"] = first and first - kill
    res["a"] = a and a - kill
    # b: the end of the longest gap between the distinct write times seen, among those after the
    # kill (a window in flight at the kill may still finish just after it).
    seen = write_times(rows)
    gaps = [(seen[i] - seen[i - 1], seen[i]) for i in range(1, len(seen)) if seen[i] > kill]
    resume = max(gaps)[1] if gaps else None
    res["b"] = resume and resume - kill
    res["b_minus_a"] = res["b"] - res["a"] if res["a"] and res["b"] else None
    res["gap"] = gaps and max(gaps)[0]
    # c: the first poll from the resumption on that shows an empty backlog.
    c = next((r["t"] for r in after if resume and r["t"] >= resume and r.get("backlog") == 0), None)
    res["c"] = c and c - kill
    res["max_backlog"] = int(max((r.get("backlog", 0) for r in rows), default=0))
    errs = [r["errors"] for r in rows if "errors" in r]
    res["flush_errors"] = errs and int(errs[-1] - errs[0])
    return res

def check(port, totals, precisions, cluster):
    """Compares every series' count hash, summed, with what loadgen sent."""
    table = owners(port) if cluster else None
    expected = {}
    for line in open(totals):
        name, n = line.rstrip("\n").split("\t")
        for p in precisions.split(","):
            expected["count:%s:%s" % (p, name)] = int(n)
    by_port = {}
    for k in expected:
        by_port.setdefault(table[slot(k)] if cluster else port, []).append(k)
    got = {}
    for p, keys in by_port.items():
        for i in range(0, len(keys), 1000):
            batch = keys[i:i + 1000]
            for k, r in zip(batch, pipeline(p, [["HGETALL", k] for k in batch], timeout=10)):
                if isinstance(r, Err):   # MOVED/ASK: a slot not settled; ask its owner alone
                    to = int(r.split()[2].rsplit(":", 1)[1])
                    cmds = ([["ASKING"]] if r.startswith("ASK") else []) + [["HGETALL", k]]
                    r = pipeline(to, cmds, timeout=10)[-1]
                    if isinstance(r, Err):
                        sys.exit("HGETALL %s: %s" % (k, r))
                got[k] = sum(int(v) for v in r[1::2])
    lost = sum(max(0, e - got[k]) for k, e in expected.items())
    doubled = sum(max(0, got[k] - e) for k, e in expected.items())
    bad = [k for k, e in expected.items() if got[k] != e]
    for k in bad[:5]:
        print("    %s: sent %d, Redis holds %d" % (k, expected[k], got[k]), file=sys.stderr)
    byp = {}
    for k in bad:
        byp[k.split(":")[1]] = byp.get(k.split(":")[1], 0) + 1
    print("lost=%d doubled=%d keys_wrong=%d keys=%d sent=%d%s" % (
        lost, doubled, len(bad), len(expected), sum(expected.values()),
        (" by_precision=" + ",".join("%s:%d" % kv for kv in sorted(byp.items(), key=lambda kv: int(kv[0])))) if bad else ""))

def buckets(url):
    return {k.split('le="')[1].split('"')[0]: v for k, v in metrics(url).items()
            if k.startswith("statsd_redis_flush_duration_seconds_bucket")}

def pctl(before, after):
    """p50 and p99 (bucket upper bounds) and the count of the flushes between two snapshots."""
    b0, b1 = json.load(open(before)), json.load(open(after))
    b = sorted(((float(le.replace("+Inf", "inf")), b1[le] - b0.get(le, 0)) for le in b1))
    total = b[-1][1]
    q = lambda x: next((le for le, c in b if c >= x * total), None) if total else None
    return {"p50": q(0.5), "p99": q(0.99), "windows": total}

def fmt(v):
    if v is None or v == []:
        return "never"
    return ("%.2f" % v) if isinstance(v, float) else str(v)

def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "monitor":
        monitor(args[0], args[1], args[2], float(args[3]), args[4], args[5])
    elif cmd == "analyze":
        print(" ".join("%s=%s" % (k, fmt(v)) for k, v in analyze(*args).items()))
    elif cmd == "check":
        check(int(args[0]), args[1], args[2], args[3] == "cluster")
    elif cmd == "owner":            # owner PORT KEY: the master port serving KEY's slot
        print(owners(int(args[0]))[slot(args[1])])
    elif cmd == "masters":          # masters PORT: the master ports, by their first slot
        table = owners(int(args[0]))
        firsts = {}
        for i, p in enumerate(table):
            firsts.setdefault(p, i)
        print(" ".join(str(p) for p in sorted(firsts, key=firsts.get)))
    elif cmd == "metric":           # metric URL NAME: its value, summed over labels
        print("%g" % m(metrics(args[0]), args[1]))
    elif cmd == "drained":          # drained URL T_END: T_END's window closed (an empty one is not
        ms = metrics(args[0])       # queued) and nothing is queued
        sys.exit(not (time.time() >= int(float(args[1])) + 1.5
                      and m(ms, "statsd_redis_backlog_windows") == 0))
    elif cmd == "buckets":
        json.dump(buckets(args[0]), open(args[1], "w"))
    elif cmd == "pctl":
        print(" ".join("%s=%s" % (k, fmt(v)) for k, v in pctl(*args).items()))
    elif cmd == "sleep-until":
        time.sleep(max(0, float(args[0]) - time.time()))
    elif cmd == "medians":          # medians FILE: per scenario, the median of every numeric key
        rows = {}
        for line in open(args[0]):
            scenario, *kv = line.split()
            for k, v in (x.split("=", 1) for x in kv if "=" in x):
                rows.setdefault(scenario, {}).setdefault(k, []).append(v)
        for scenario, keys in rows.items():
            parts = []
            for k, vs in keys.items():
                try:
                    nums = [float(v) for v in vs]
                except ValueError:
                    parts.append("%s=%s" % (k, "/".join(vs)))
                    continue
                med = statistics.median(nums)
                parts.append("%s=%s" % (k, "%d" % med if all("." not in v for v in vs) else fmt(med)))
            print("  %-9s median of %d: %s" % (scenario, len(next(iter(keys.values()))), " ".join(parts)))

main()
EOF

# wait_for SECS WHAT CMD...: runs CMD every 0.1 s until it succeeds; after SECS gives up, saying WHAT.
wait_for() {
  local secs=$1 what=$2 end=$((SECONDS + $1)); shift 2
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$end" ] || { echo "timed out after ${secs} s waiting for $what" >&2; return 1; }
    sleep 0.1
  done
}

# start_node PORT [flags...]: common.sh's, in the run's dir with its log kept; its pid in
# pid_of[PORT].
declare -A pid_of
start_node() {
  redis-server --port "$1" --bind 127.0.0.1 --save '' --appendonly no --dir "$rdir" --daemonize no \
    --dbfilename "dump-$1.rdb" --repl-diskless-sync-delay 0 "${@:2}" >"$rdir/redis-$1.log" 2>&1 &
  pid_of[$1]=$!
  wait_for 10 "redis-server on port $1" redis-cli -p "$1" ping
}

# stop_all: every server and sentinel of the run, by pid.
stop_all() {
  local p
  for p in "${!pid_of[@]}"; do kill "${pid_of[$p]}" 2>/dev/null || true; done
  for p in "${!pid_of[@]}"; do wait "${pid_of[$p]}" 2>/dev/null || true; done
  pid_of=()
}

# The whole cluster agrees: every node cluster_state:ok, every replica's link up.
cluster_settled() {
  local p repl
  for p in "$@"; do
    [[ $(redis-cli -p "$p" cluster info) == *cluster_state:ok* ]] || return 1
    repl=$(redis-cli -p "$p" info replication)
    [[ $repl != *role:slave* || $repl == *master_link_status:up* ]] || return 1
  done
}

start_cluster() {
  nodes=()
  local i p
  for i in 1 2 3 4 5 6; do
    p=$(node_port)
    start_node "$p" --cluster-enabled yes --cluster-config-file "nodes-$p.conf" --cluster-node-timeout 2000
    nodes+=("$p")
  done
  redis-cli --cluster create $(printf '127.0.0.1:%s ' "${nodes[@]}") --cluster-replicas 1 --cluster-yes \
    >"$rdir/create.log" 2>&1
  wait_for 30 "the cluster to form" cluster_settled "${nodes[@]}"
  seeds=$(printf 'redis://127.0.0.1:%s,' "${nodes[@]}"); seeds=${seeds%,}
}

sentinel_ready() { # every sentinel sees master $1, 2 replicas, 2 other sentinels
  local s out
  for s in "${sentinels[@]}"; do
    out=$(redis-cli -p "$s" sentinel master mymaster | paste -sd' ')
    [[ " $out " == *" port $1 "* && " $out " == *" num-slaves 2 "* && " $out " == *" num-other-sentinels 2 "* ]] || return 1
  done
}

start_sentinels() {
  local p s
  master=$(free_port); start_node "$master"
  replicas=()
  for _ in 1 2; do
    p=$(free_port); start_node "$p" --replicaof 127.0.0.1 "$master"; replicas+=("$p")
    wait_for 30 "replica $p to sync" sh -c "redis-cli -p $p info replication | grep -c '^master_link_status:up'"
  done
  sentinels=()
  for _ in 1 2 3; do
    s=$(free_port)
    printf '%s\n' "port $s" "bind 127.0.0.1" "dir $rdir" "sentinel monitor mymaster 127.0.0.1 $master 2" \
      "sentinel down-after-milliseconds mymaster 2000" "sentinel failover-timeout mymaster 5000" \
      "sentinel parallel-syncs mymaster 1" >"$rdir/sentinel-$s.conf"
    redis-server "$rdir/sentinel-$s.conf" --sentinel >"$rdir/sentinel-$s.log" 2>&1 &
    pid_of[$s]=$!
    wait_for 10 "sentinel on port $s" redis-cli -p "$s" ping
    sentinels+=("$s")
  done
  wait_for 30 "the sentinels to see the whole topology" sentinel_ready "$master"
}

# start_agent LABEL FLAGS...: the agent, ready (its /readyz answers), logging to the run's dir.
start_agent() {
  local label=$1; shift
  udp=$(free_port); http=$(free_port); murl="http://127.0.0.1:$http/metrics"
  target/release/statsd-redis --udp "127.0.0.1:$udp" --http "127.0.0.1:$http" --cleaner-enabled false \
    --redis-timeout-ms 500 "$@" 2>"$rdir/agent-$label.log" &
  agent_pid=$!
  wait_for 20 "the agent to be ready" curl -sf "127.0.0.1:$http/readyz"
  sleep 1
}

# start_load PREFIX: the load in the background, its totals in $rdir/totals-PREFIX; gen_pid, t0.
start_load() {
  t0=$(date +%s.%N)
  target/release/examples/loadgen send --target "127.0.0.1:$udp" --series "$series" --prefix "$1" \
    --lines-per-datagram 20 --lines $((rate * secs)) --rate "$rate" --totals "$rdir/totals-$1" \
    >"$rdir/loadgen-$1.out" &
  gen_pid=$!
}

# finish_load: waits for the load (gen_pid, unless empty) and the backlog to drain, notes what the
# agent counted (`agent_notes`, `errors_end`, its flush histogram in $rdir/b1), then stops the
# agent (SIGTERM; a hang is reported and SIGKILLed).
finish_load() {
  [ -n "$gen_pid" ] && wait "$gen_pid"
  t_end=$(date +%s.%N)
  echo "t0=$t0 t_end=$t_end${t_kill:+ t_kill=$t_kill}" >>"$rdir/times"
  # long enough to see a stalled writer recover (a whole window's slot chunks timing out)
  wait_for 150 "the backlog to drain after the load" fo drained "$murl" "$t_end" || drain="DRAIN_TIMED_OUT"
  fo buckets "$murl" "$rdir/b1"
  errors_end=$(fo metric "$murl" 'statsd_redis_flushes_total{outcome="error"}')
  agent_notes="${drain:-}${drain:+ }dropped=$(fo metric "$murl" statsd_redis_windows_dropped_total)"; drain=""
  agent_notes+=" backlog_left=$(fo metric "$murl" statsd_redis_backlog_windows)"
  agent_notes+=" kernel_drops=$(fo metric "$murl" statsd_redis_kernel_drops_total)"
  agent_notes+=" applied_before=$(fo metric "$murl" statsd_redis_chunks_applied_before_total)"
  agent_notes+=" reconnects=$(fo metric "$murl" statsd_redis_redis_reconnects_total)"
  kill -TERM "$agent_pid"
  if ! wait_for 15 "the agent to exit on SIGTERM" sh -c "! kill -0 $agent_pid"; then
    agent_notes+=" HUNG_ON_SIGTERM"
    kill -KILL "$agent_pid" 2>/dev/null || true
  fi
  wait "$agent_pid" 2>/dev/null || agent_notes+=" exit=$?"
}

# monitor MODE A B: the 100 ms poller in the background (mon_pid), its timeline in $rdir/timeline.
monitor() {
  python3 "$dir/fo.py" monitor "$1" "$murl" "$rdir/timeline" 180 "$2" "$3" &
  mon_pid=$!
}
stop_monitor() { kill "$mon_pid" 2>/dev/null || true; wait "$mon_pid" 2>/dev/null || true; }

sent_lines() { awk '{print $2}' "$rdir/loadgen-$1.out"; }

cluster_failover() { # run number
  local run=$1 victim replica known_at masters analysis check
  start_cluster
  read -ra masters <<<"$(fo masters "${nodes[0]}")"
  victim=${masters[$(( (run - 1) % 3 ))]}
  replica=$(for p in "${nodes[@]}"; do
    [[ $(redis-cli -p "$p" info replication) == *master_port:$victim* ]] && echo "$p" || true; done | paste -sd,)
  known_at=$(fo owner "${nodes[0]}" known:)
  start_agent cluster --redis-mode cluster --redis-cluster-nodes "$seeds"
  start_load fo
  fo sleep-until "$(python3 -c "print($t0 + $kill_at - 1)")"
  monitor cluster "$(printf '%s\n' "${nodes[@]}" | grep -vx "$victim" | paste -sd,)" "$replica"
  fo sleep-until "$(python3 -c "print($t0 + $kill_at)")"
  t_kill=$(date +%s.%N)
  kill -KILL "${pid_of[$victim]}"; wait "${pid_of[$victim]}" 2>/dev/null || true
  finish_load
  stop_monitor
  analysis=$(fo analyze cluster "$rdir/timeline" "$t_kill")
  check=$(fo check "${replica%%,*}" "$rdir/totals-fo" 1,5,60,300,3600,18000,86400 cluster 2>"$rdir/check.err") || true
  echo "  run $run: killed master :$victim$([ "$victim" = "$known_at" ] && echo ' (holds known:)'), replica :$replica; sent $(sent_lines fo) lines"
  echo "    $analysis"
  echo "    totals: $check"
  [ -s "$rdir/check.err" ] && cat "$rdir/check.err"
  echo "    agent: $agent_notes"
  echo "cluster $analysis $check $agent_notes" >>"$results"
  stop_all
}

sentinel_failover() {
  local run=$1 analysis check new loadgen_check
  start_sentinels
  start_agent sentinel --redis-mode sentinel --redis-sentinels "$(printf '127.0.0.1:%s,' "${sentinels[@]}" | sed 's/,$//')" \
    --redis-master-name mymaster --wait-replicas 1 --wait-timeout-ms 200
  start_load fo
  fo sleep-until "$(python3 -c "print($t0 + $kill_at - 1)")"
  monitor sentinel "$(IFS=,; echo "${sentinels[*]}")" "$master"
  fo sleep-until "$(python3 -c "print($t0 + $kill_at)")"
  t_kill=$(date +%s.%N)
  kill -KILL "${pid_of[$master]}"; wait "${pid_of[$master]}" 2>/dev/null || true
  finish_load
  stop_monitor
  analysis=$(fo analyze sentinel "$rdir/timeline" "$t_kill")
  new=$(redis-cli -p "${sentinels[0]}" sentinel get-master-addr-by-name mymaster | tail -1)
  check=$(fo check "$new" "$rdir/totals-fo" 1,5,60,300,3600,18000,86400 single 2>"$rdir/check.err") || true
  loadgen_check=$(target/release/examples/loadgen check --redis "redis://127.0.0.1:$new" --totals "$rdir/totals-fo" 2>&1 | tail -1) || true
  echo "  run $run: killed master :$master, new master :$new; sent $(sent_lines fo) lines"
  echo "    $analysis"
  echo "    totals: $check"
  [ -s "$rdir/check.err" ] && cat "$rdir/check.err"
  echo "    loadgen check: $loadgen_check"
  echo "    agent: $agent_notes (replica_waits_short in the log: $(grep -c 'fewer replicas' "$rdir/agent-sentinel.log" || true))"
  echo "sentinel $analysis $check $agent_notes" >>"$results"
  stop_all
}

# load_run LABEL PREFIX [reshard FROM TO]: the load on the running cluster (and the reshard ~6 s
# in); flush p50/p99 of the windows written from the load's start until it drained.
load_run() {
  local label=$1 prefix=$2 t_rs rs="" pct check errors0
  t_kill=""
  start_agent "$label" --redis-mode cluster --redis-cluster-nodes "$seeds"
  fo buckets "$murl" "$rdir/b0-$label"
  errors0=$(fo metric "$murl" 'statsd_redis_flushes_total{outcome="error"}')
  start_load "$prefix"
  monitor agent - -
  if [ "${3:-}" = reshard ]; then
    fo sleep-until "$(python3 -c "print($t0 + $kill_at)")"
    t_rs=$(date +%s.%N)
    timeout 120 redis-cli --cluster reshard "127.0.0.1:$4" --cluster-from "$(redis-cli -p "$4" cluster myid)" \
      --cluster-to "$(redis-cli -p "$5" cluster myid)" --cluster-slots 1024 --cluster-pipeline 100 --cluster-yes \
      >"$rdir/reshard.log" 2>&1 || echo "    reshard failed (exit $?): $(tail -3 "$rdir/reshard.log")"
    # and how much of the load was left when it ended (negative: it ended after the load)
    rs=$(python3 -c "import time; t = time.time(); print('reshard_secs=%.2f load_left=%.1f' % (t - $t_rs, $t0 + $secs - t))")
  fi
  wait "$gen_pid"; gen_pid=""
  finish_load
  stop_monitor
  pct="$(fo pctl "$rdir/b0-$label" "$rdir/b1") $(fo analyze agent "$rdir/timeline" "$t_end")"
  mv "$rdir/timeline" "$rdir/timeline-$label"
  errors0=$(python3 -c "print('%d' % ($errors_end - $errors0))")
  check=$(fo check "${nodes[0]}" "$rdir/totals-$prefix" 1,5,60,300,3600,18000,86400 cluster 2>"$rdir/check.err") || true
  echo "    $label: ${rs:+$rs }$pct flush_errors=$errors0"
  echo "      totals: $check"
  [ -s "$rdir/check.err" ] && cat "$rdir/check.err"
  echo "      agent: $agent_notes"
  echo "reshard ${rs:+$rs }$(sed -E "s/(^| )([a-z0-9_]+)=/\1${label}_\2=/g" <<<"$pct flush_errors=$errors0 $check $agent_notes")" >>"$results"
}

reshard() {
  local run=$1 masters from to cc
  start_cluster
  read -ra masters <<<"$(fo masters "${nodes[0]}")"
  from=${masters[$(( (run - 1) % 3 ))]}; to=${masters[$(( run % 3 ))]}
  echo "  run $run: 1024 slots :$from -> :$to (known: on :$(fo owner "${nodes[0]}" known:))"
  load_run base rb
  for p in "${masters[@]}"; do redis-cli -p "$p" flushall >/dev/null; done
  wait_for 30 "the cluster to settle" cluster_settled "${nodes[@]}"
  load_run reshard rr reshard "$from" "$to"
  wait_for 30 "the cluster to settle after the reshard" cluster_settled "${nodes[@]}" || true
  cc=$(redis-cli --cluster check "127.0.0.1:${nodes[0]}" 2>&1)
  if grep -q 'All 16384 slots covered' <<<"$cc" && ! grep -qiE 'warning|err|migrating|importing' <<<"$cc"; then
    echo "    redis-cli --cluster check: clean"
  else
    echo "    redis-cli --cluster check:"; sed 's/^/      /' <<<"$cc"
  fi
  stop_all
}

echo "failover-timing: $runs runs; load $series counter series, $rate lines/s, 20 lines/datagram, ${secs} s; kill/reshard at ${kill_at} s"
for scenario in ${scenarios//,/ }; do
  echo "== $scenario"
  for run in $(seq 1 "$runs"); do
    rdir="$dir/$scenario-$run"; mkdir -p "$rdir"
    case $scenario in
      cluster) cluster_failover "$run" ;;
      sentinel) sentinel_failover "$run" ;;
      reshard) reshard "$run" ;;
      *) echo "unknown scenario $scenario" >&2; exit 2 ;;
    esac
  done
done
echo "== medians (seconds after the kill; p50/p99 are flush-duration bucket bounds in s)"
fo medians "$results"
if [ -n "${KEEP:-}" ]; then rm -rf "$KEEP"; cp -r "$dir" "$KEEP"; echo "run files kept in $KEEP"; fi
