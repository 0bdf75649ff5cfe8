#!/usr/bin/env bash
# The Graphite API beside graphite-web on the same data: a million known series and a day of
# minutes for 100 of them, in one private Redis; the agent (release build) and Debian's
# graphite-web (tests/graphite/, the oracle of tests/graphite.rs) each answer a find of a prefix,
# a find of the root and a render of 100 series over a day, one request at a time.
#   scripts/bench-graphite.sh [agent runs] [graphite-web runs]      (30 and 3 by default; 0
#   graphite-web runs: the agent alone)
# Needs graphite-web: apt-get install -y --no-install-recommends graphite-web python3-redis
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh
runs=${1:-30}
oracle_runs=${2:-3}
now=1760001237
cargo build --release --quiet --example graphite_latency
cargo build --release --quiet
start_redis "$dir/redis.sock"
target/release/examples/graphite_latency seed --redis "redis+unix://$dir/redis.sock" --now "$now"
start_agent "$dir/agent.log" --redis "redis+unix://$dir/redis.sock" --sample-count 1440 \
  --cleaner-enabled false --log-level warn
echo "agent (statsd-redis $(target/release/statsd-redis --version | cut -d' ' -f2-)):"
target/release/examples/graphite_latency measure --base "http://127.0.0.1:$http/graphite" \
  --now "$now" --runs "$runs"
[ "$oracle_runs" -gt 0 ] || exit 0
export ORACLE_REDIS_URL="unix://$dir/redis.sock" ORACLE_STATE="$dir/graphite" ORACLE_SAMPLE_COUNT=1440
tests/graphite/graphite-web.sh start >/dev/null
echo "graphite-web $(dpkg-query -W -f='${Version}' graphite-web):"
target/release/examples/graphite_latency measure --base "$(cat "$dir/graphite/url")" \
  --now "$now" --runs "$oracle_runs"
tests/graphite/graphite-web.sh stop >/dev/null
