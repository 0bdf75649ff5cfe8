# Sourced by the scripts here: a temp dir `$dir`, removed at exit with every background job
# stopped; a free local port; a private Redis (start_redis; start_node on a TCP port) and the CPU
# time it used; the agent (start_agent) and its metrics.

for tool in redis-server redis-cli; do
  command -v "$tool" >/dev/null || { echo "$tool is missing: apt-get install -y redis-server redis-tools" >&2; exit 1; }
done
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT

# The scripts that drive Redis from Python use Debian's python3-redis, with Debian's python3.
need_python_redis() {
  /usr/bin/python3 -c 'import redis' 2>/dev/null || { echo "python3-redis is missing: apt-get install -y python3-redis" >&2; exit 1; }
}

# archives SCHEMA: carbon's retentions (`10s:6h,1min:6d,...`) as each archive's precision and
# seconds kept, `p:kept,...` (scripts/cleaner-cost.sh, scripts/rollup-cost.sh).
archives() {
  /usr/bin/python3 - "$1" <<'PY'
import sys
unit = {"s": 1, "min": 60, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
def seconds(text):
    number = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    return int(number) * unit[text[len(number):] or "s"]
print(",".join("%d:%d" % tuple(map(seconds, a.split(":"))) for a in sys.argv[1].split(",")))
PY
}

# fill_full SOCK SERIES SCHEMA: each of SERIES collectd-like series (`collectd.host<i % 500>.cpu<i>.value`,
# the names bench-carbon.sh's rounds send) holds, in every archive of SCHEMA but the coarsest
# (the ones a rollup reads), its newest 120 slices before the open minute, with its index
# member: the hashes a series that has sent for days leaves (scripts/rollup-cost.sh,
# scripts/bench-carbon.sh with FULL=1).
fill_full() {
  need_python_redis
  /usr/bin/python3 - "$1" "$2" "$(archives "$3")" <<'PY'
import redis, sys, time
sock, n = sys.argv[1], int(sys.argv[2])
finer = [int(a.split(":")[0]) for a in sys.argv[3].split(",")][:-1]
r = redis.Redis(unix_socket_path=sock)
now = int(time.time())
p = r.pipeline(transaction=False)
for i in range(n):
    s = f"collectd.host{i % 500}.cpu{i}.value"
    for prec in finer:
        # The newest 120 slices before the open minute (the open slice, for coarser ones).
        top = now - now % max(prec, 60) - prec
        p.hset(f"gauge:{prec}:{s}", mapping={top - k * prec: (i + k) % 100 for k in range(120)})
        p.zadd("known:gauge:", {f"{prec}:{s}": 0})
    if i % 200 == 0:
        p.execute()
p.execute()
PY
}

# A port free on 127.0.0.1 (TCP; the agent's UDP port is taken from the same range).
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# A port free on 127.0.0.1 whose cluster bus port (+10000) is free too.
node_port() {
  python3 -c '
import random, socket
for _ in range(200):
    p = random.randrange(20000, 55000)
    try:
        for q in (p, p + 10000):
            socket.socket().bind(("127.0.0.1", q))
    except OSError:
        continue
    print(p); break'
}

# start_node PORT [redis-server flags...]: a Redis of our own on 127.0.0.1:PORT (nothing saved),
# ready when this returns.
start_node() {
  redis-server --port "$1" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" --daemonize no \
    --dbfilename "dump-$1.rdb" "${@:2}" >/dev/null &
  until redis-cli -p "$1" ping >/dev/null 2>&1; do sleep 0.05; done
}

# start_redis SOCKET [redis-server flags...]: a Redis of our own on a unix socket (no TCP port,
# nothing saved), ready when this returns; its pid in `redis_pid`.
start_redis() {
  redis-server --port 0 --unixsocket "$1" --save '' --appendonly no --dir "$dir" --daemonize no \
    "${@:2}" >/dev/null &
  redis_pid=$!
  until redis-cli -s "$1" ping >/dev/null 2>&1; do sleep 0.05; done
}

# redis_cpu SOCKET: the CPU seconds (user + system) that Redis has used so far.
redis_cpu() { redis-cli -s "$1" info cpu | awk -F: '/^used_cpu_(user|sys):/ {s += $2} END {print s}'; }

# proc_cpu PID: the CPU seconds (user + system) that a process has used so far.
proc_cpu() { awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$1/stat"; }

# task_usage PID: nanoseconds on a CPU and context switches (voluntary and not) of all the
# process's threads so far (/proc/PID/task/*/schedstat and status): finer than proc_cpu.
task_usage() {
  cat /proc/"$1"/task/*/schedstat | awk '{ns += $1} END {printf "%d ", ns}'
  cat /proc/"$1"/task/*/status | awk '/ctxt_switches/ {n += $2} END {print n}'
}

# seed_graphite [seed flags...]: a Redis of our own on a unix socket, seeded by
# examples/graphite_latency as bench-graphite.sh reads it (10 000 known series, a day of minutes
# for 1 000 of them, up to `now`); its URL in `redis`, the agent's flags to read it in
# `graphite_flags`.
seed_graphite() {
  now=$(date +%s)
  cargo build --release --quiet --example graphite_latency
  start_redis "$dir/redis.sock"
  redis="redis+unix://$dir/redis.sock"
  target/release/examples/graphite_latency seed --redis "$redis" --now "$now" "$@"
  graphite_flags=(--redis "$redis" --sample-count 2880 --cleaner-enabled false --log-level warn)
}

# perf_start OUT PID: `perf record -g` of a running process into OUT, until perf_stop;
# PERF_CALLGRAPH other call-graph flags (`--call-graph dwarf`: the callers of libc's functions).
perf_start() {
  perf record ${PERF_CALLGRAPH:--g} -o "$1" -p "$2" 2>/dev/null &
  perf_pid=$!
  sleep 0.5
}
perf_stop() { kill -INT "$perf_pid"; wait "$perf_pid" || true; }

# redis_usage REDIS-CLI-ADDRESS-FLAGS: the server's CPU seconds (user + system) and HINCRBY calls
# so far (0 before the first).
redis_usage() {
  # shellcheck disable=SC2086
  redis-cli $1 info all | tr -d '\r' |
    awk -F'[:,=]' '/^used_cpu_(user|sys):/ {cpu += $2} /^cmdstat_hincrby:/ {calls = $3} END {print cpu, calls + 0}'
}

# agent_metric HTTP-PORT NAME: an agent metric from /metrics, summed over its labels (0 if absent).
agent_metric() {
  curl -s "127.0.0.1:$1/metrics" |
    awk -v m="statsd_redis_$2" '$1 == m || index($1, m "{") == 1 { s += $2 } END { print s + 0 }'
}

# start_agent LOG [agent flags...]: the agent (`$AGENT`, default target/release/statsd-redis) on
# free ports of 127.0.0.1, put in `udp` and `http`, its stderr in LOG, its pid in `agent_pid`;
# ready (its HTTP side answers) when this returns. The flags say the rest (`--redis`, ...).
start_agent() {
  local log=$1; shift
  udp=$(free_port); http=$(free_port)
  "${AGENT:-target/release/statsd-redis}" --udp "127.0.0.1:$udp" --http "127.0.0.1:$http" "$@" 2>"$log" &
  agent_pid=$!
  until curl -s "127.0.0.1:$http/healthz" >/dev/null; do
    kill -0 "$agent_pid" 2>/dev/null || { echo "the agent did not start:" >&2; cat "$log" >&2; exit 1; }
    sleep 0.05
  done
}

# mkwhisper DIR SERIES LAYOUT SCHEMA: carbon's files for SERIES counters (scripts/bench-history.sh,
# scripts/import-cost.sh), made by python3-whisper
# (create; each archive then written as update_many lays out a new file's points: the oldest
# point at the archive's start, the others after it), full up to now (a minute ahead for the
# schema, half an hour for the book's, so that the import, later, still finds its last slices).
# LAYOUT schema: the archives of SCHEMA (carbon's retentions); no whisper schema holds the book's (18 000 s does
# not divide 86 400 s), so its files hold 1 s for an hour, minutes for a day and hours for 122
# days, from which the import fills every slice of the 7 precisions. A count per point of
# rate × step (rate 1..50 a second, ±20 %), the coarser archives' of their step alike. 16
# files of their own, the series' files hard links to them.
mkwhisper() {
  /usr/bin/python3 - "$@" <<'EOF'
import os, random, struct, sys, time, whisper
root, n, layout, schema = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
archives, ahead = {
    'schema': ([whisper.parseRetentionDef(d) for d in schema.split(',')], 60),
    'book': ([(1, 3600), (60, 1440), (3600, 2928)], 1800),
}[layout]
end = int(time.time()) + ahead
os.makedirs(root, exist_ok=True)
templates = []
for t in range(min(16, n)):
    path = os.path.join(root, 'template-%d.wsp' % t)
    whisper.create(path, archives, xFilesFactor=0, aggregationMethod='sum')
    rng = random.Random(t)
    rate = rng.uniform(1, 50)
    with open(path, 'r+b') as fh:
        for a in whisper.info(path)['archives']:
            step, count = a['secondsPerPoint'], a['points']
            newest = end - end % step
            pts = []
            for i in range(count):
                pts += [newest - (count - 1 - i) * step, float(round(rate * step * rng.uniform(0.8, 1.2)))]
            fh.seek(a['offset'])
            fh.write(struct.pack('!' + 'Ld' * count, *pts))
    templates.append(path)
for i in range(n):
    d = os.path.join(root, 'stats_counts', 'load', str(i))
    os.makedirs(d)
    os.link(templates[i % len(templates)], os.path.join(d, 'c.wsp'))
# Bytes and points of the series' files (each as if its own).
size = os.path.getsize(templates[0])
slots = sum(c for _, c in archives)
print(n * size, n * slots)
EOF
}

# redis_usec SOCKET: Redis's own time (µs, INFO commandstats) since its last CONFIG RESETSTAT.
redis_usec() {
  redis-cli -s "$1" info commandstats | tr -d '\r' |
    awk -F'[=,]' '/^cmdstat_/ && !/cmdstat_(info|config)/ {u += $4} END {print u + 0}'
}

# median: the median of the numbers on stdin, one a line.
median() { sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }

# show_runs WHAT DIGITS VALUES...: "WHAT: <median> us (median of n: <each run>)".
show_runs() {
  printf "%s: %.${2}f us (median of %d:" "$1" "$(printf '%s\n' "${@:3}" | median)" "$(($# - 2))"
  printf " %.${2}f" "${@:3}"
  echo ')'
}
