#!/usr/bin/env bash
# Candidate layouts for long histories against a private Redis (scripts/history-layouts.py says
# which): Redis's CPU per write and per read, and bytes a point, at an archive of 720 slices and
# of 259 200 (five years of 10-minute slices, Etsy's `10min:1800d`).
#
#   scripts/history-layouts.sh [series=20] [writes=20000] [read=144]
#
# `read`: the slices a read asks for (144: a day of 10-minute slices).
set -euo pipefail
cd "$(dirname "$0")/.."
series=${1:-20}; writes=${2:-20000}; read=${3:-144}
. scripts/common.sh
need_python_redis
sock="$dir/r.sock"
# Hashes are kept listpacks however long (the agent asks as much of Redis for today's layout):
# the script sets hash-max-listpack-entries.
start_redis "$sock" --hash-max-listpack-value 64 --enable-debug-command yes
/usr/bin/python3 scripts/history-layouts.py "$sock" "$series" "$writes" "$read"
