#!/usr/bin/env bash
# The Graphite API beside graphite-web as sites run it: graphite-web over whisper files (written
# by Debian's python3-whisper from the same points), served by gunicorn (2 workers), and the
# agent (release build) over one private Redis holding 10 000 known series, 1 000 of them with a
# day of minutes. Each request's answers are checked equal first; then both are timed,
# interleaved, one request at a time, with Redis's own time (INFO commandstats) beside the
# agent's. The requests: a render of 100 series over a day, their sumSeries,
# aliasByNode(movingAverage(10 series, 10), 2), a find of one level, a render of 1 000 series, the
# same named by aliasByNode, a dashboard of 20 targets over graphite-web's other functions
# (examples/graphite_latency.rs).
#   scripts/bench-graphite.sh [agent runs] [graphite-web runs]   (30 and 5 by default; 0
#   graphite-web runs: the agent alone)
# graphite-web is 1.1.10's webapp (from PyPI, as tests/graphite.rs runs it) on Debian's 1.1.8
# install; ORACLE_WEBAPP=debian runs 1.1.8's (its moving windows end one point earlier, so
# the moving average's answers then differ).
# Needs: apt-get install -y --no-install-recommends graphite-web python3-whisper python3-redis gunicorn
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh
runs=${1:-30}
oracle_runs=${2:-5}
cargo build --release --quiet
# whisper reads against the clock: the data is written up to now. Two days of minutes kept (a
# day of them written), so that a window or a shift before `-1d` still reads minutes, in both.
seed_graphite
start_agent "$dir/agent.log" "${graphite_flags[@]}"
oracle=()
if [ "$oracle_runs" -gt 0 ]; then
  tests/graphite/whisper_from_redis.py --url "unix://$dir/redis.sock" --dir "$dir/whisper" \
    --precision 60 --points 2880
  export ORACLE_WHISPER_DIR="$dir/whisper" ORACLE_SERVER=gunicorn ORACLE_STATE="$dir/graphite"
  tests/graphite/graphite-web.sh start >/dev/null
  trap 'tests/graphite/graphite-web.sh stop >/dev/null; kill $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT
  oracle=(--oracle "$(cat "$dir/graphite/url")")
  echo "graphite-web $(curl -s "$(cat "$dir/graphite/url")/version") over whisper, gunicorn"
fi
echo "statsd-redis $(target/release/statsd-redis --version | cut -d' ' -f2-), $(nproc) cores, $(date -u +%F)"
target/release/examples/graphite_latency measure --redis "$redis" \
  --base "http://127.0.0.1:$http/graphite" "${oracle[@]}" --now "$now" --runs "$runs" \
  --oracle-runs "$oracle_runs"
