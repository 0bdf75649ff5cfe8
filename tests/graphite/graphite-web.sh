#!/bin/bash
# Starts / stops graphite-web 1.1.10 reading a Redis through redis_finder.py: the webapp of
# graphite-web 1.1.10 (the version whose functions the agent follows), fetched once from PyPI
# into a cache, run on Debian's graphite-web 1.1.8 install (its Django, whisper and the rest;
# the two webapps differ in nine files). ORACLE_WEBAPP=debian runs Debian's 1.1.8 webapp itself.
#
#   ORACLE_REDIS_URL=unix:///path/redis.sock ORACLE_STATE=DIR ./graphite-web.sh start [PORT]
#   ORACLE_STATE=DIR ./graphite-web.sh stop
#   ORACLE_STATE=DIR ./graphite-web.sh index   # its functions' groups and parameters, as JSON
#   ORACLE_REDIS_URL=... ./graphite-web.sh run [PORT]   # in the foreground
#
# Environment: ORACLE_REDIS_URL, ORACLE_KEY_PREFIX, ORACLE_PRECISIONS, ORACLE_SAMPLE_COUNT,
# ORACLE_GAUGE_PREFIX, ORACLE_TAG_DOTTED (see redis_finder.py), and
# ORACLE_STATE (default /tmp/graphite-oracle-run): temp dir with settings, sqlite DB, logs, pid;
# ORACLE_CACHE (default ~/.cache/statsd-redis): where graphite-web 1.1.10's webapp is kept.
# PORT defaults to a free loopback port. Serves with `graphite-manage runserver --noreload`
# (Django's threaded dev server; the only extra process is that one python3).
# Opt-in, to run graphite-web as users do (then ORACLE_REDIS_URL is not needed):
#   ORACLE_WHISPER_DIR=DIR    read whisper files under DIR (see whisper_from_redis.py) with
#                             graphite-web's standard finder and local tag DB, not redis_finder.py
#   ORACLE_SERVER=gunicorn    serve with gunicorn, 2 sync workers (graphite.wsgi:application)
set -euo pipefail
# alive PID: running and not a zombie (an exited child stays a zombie until init reaps it)
alive() { [ -r "/proc/$1/status" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status"; }
HERE="$(cd "$(dirname "$0")" && pwd)"
STATE="${ORACLE_STATE:-/tmp/graphite-oracle-run}"
PY=/usr/bin/python3          # Debian's python: graphite-web is installed for it, not for pyenv's
cmd="${1:-}"; port="${2:-}"

WEBAPP_VERSION=1.1.10

# The webapp directory to put first on Python's path (empty for Debian's own).
webapp() {
  if [ "${ORACLE_WEBAPP:-}" = debian ]; then return; fi
  local cache="${ORACLE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/statsd-redis}/graphite-web-$WEBAPP_VERSION"
  if [ ! -f "$cache/webapp/graphite/render/functions.py" ]; then
    local tmp; tmp=$(mktemp -d)
    python3 -m pip download --quiet --no-deps --no-binary :all: "graphite-web==$WEBAPP_VERSION" -d "$tmp" >&2
    tar xzf "$tmp/graphite-web-$WEBAPP_VERSION.tar.gz" -C "$tmp"
    mkdir -p "$(dirname "$cache")"
    rm -rf "$cache.$$" && mv "$tmp/graphite-web-$WEBAPP_VERSION" "$cache.$$"
    rm -rf "$cache" && mv "$cache.$$" "$cache"
    rm -rf "$tmp"
  fi
  echo "$cache/webapp"
}

# Python's path and Django's settings for graphite-web over $STATE.
environment() {
  app=$(webapp)
  export PYTHONPATH="$STATE:$HERE${app:+:$app}" DJANGO_SETTINGS_MODULE=graphite.settings \
         GRAPHITE_SETTINGS_MODULE=oracle_local_settings
}

is_running() {  # our pid file names a live graphite-manage (or gunicorn master) process
  [ -f "$STATE/pid" ] && alive "$(cat "$STATE/pid")" &&
    tr '\0' ' ' < "/proc/$(cat "$STATE/pid")/cmdline" | grep -qE 'graphite-manage|gunicorn'; }

# The server's command line, in the array srv.
server() {
  case "${ORACLE_SERVER:-runserver}" in
    runserver) srv=($PY /usr/bin/graphite-manage runserver --noreload "127.0.0.1:$port") ;;
    # --timeout: as FETCH_TIMEOUT below; gunicorn would kill a worker after 30 s
    gunicorn) srv=($PY -m gunicorn --workers 2 --timeout 600 --chdir "$STATE"
                   --bind "127.0.0.1:$port" graphite.wsgi:application) ;;
    *) echo "ORACLE_SERVER: runserver or gunicorn" >&2; exit 2 ;;
  esac
}

prepare() {
  if [ -n "${ORACLE_WHISPER_DIR:-}" ]; then
    local whisper; whisper=$(cd "$ORACLE_WHISPER_DIR" && pwd)
  else
    : "${ORACLE_REDIS_URL:?set ORACLE_REDIS_URL (e.g. from ./redis_private.sh start); there is no default}"
  fi
  if is_running; then echo "already running: pid $(cat "$STATE/pid"), $(cat "$STATE/url")" >&2; exit 1; fi
  rm -rf "$STATE"; mkdir -p "$STATE/log" "$STATE/storage"
  if [ -z "$port" ]; then
    port=$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  fi
  server
  cat > "$STATE/oracle_local_settings.py" <<EOF
SECRET_KEY = 'graphite-oracle-test-only'
TIME_ZONE = 'UTC'
DEBUG = False
ALLOWED_HOSTS = ['*']
STORAGE_DIR = '$STATE/storage'
WHISPER_DIR = '$STATE/storage/no-whisper/'   # never created: no standard finder dirs
CERES_DIR = '$STATE/storage/no-ceres/'
RRD_DIR = '$STATE/storage/no-rrd/'
STANDARD_DIRS = []
INDEX_FILE = '$STATE/storage/index'
LOG_DIR = '$STATE/log'
CONF_DIR = '$STATE'
DATABASES = {'default': {'ENGINE': 'django.db.backends.sqlite3', 'NAME': '$STATE/graphite.db'}}
STORAGE_FINDERS = ('redis_finder.RedisFinder',)
TAGDB = 'redis_finder.RedisKnownTagDB'
TAGDB_CACHE_DURATION = 0
CACHES = {'default': {'BACKEND': 'django.core.cache.backends.dummy.DummyCache'}}
DEFAULT_CACHE_DURATION = 0
FIND_CACHE_DURATION = 0
CARBONLINK_HOSTS = []                        # no carbon cache to merge from
FUNCTION_PLUGINS = []
# The finder reads the whole index per request: at a million series (scripts/bench-graphite.sh)
# that takes longer than graphite-web's default 3 s / 6 s allow.
FIND_TIMEOUT = 600.0
FETCH_TIMEOUT = 600.0
EOF
  if [ "${ORACLE_FUNCTIONS_SHIM:-0}" = 1 ]; then
    # Opt-in, NOT stock behaviour: Debian's 1.1.8 answers /functions with HTTP 500 under
    # Python 3.11 (inspect.getargspec/formatargspec were removed). This puts them back so the
    # function index format can be looked at.
    cat >> "$STATE/oracle_local_settings.py" <<'EOF'
import inspect as _inspect
if not hasattr(_inspect, 'getargspec'):
    def _getargspec(f):
        s = _inspect.getfullargspec(f)
        return (s.args, s.varargs, s.varkw, s.defaults)
    def _formatargspec(args, varargs=None, varkw=None, defaults=None):
        specs = []
        first = len(args) - len(defaults) if defaults else len(args)
        for i, a in enumerate(args):
            specs.append(a + ('=' + repr(defaults[i - first]) if defaults and i >= first else ''))
        if varargs is not None:
            specs.append('*' + varargs)
        if varkw is not None:
            specs.append('**' + varkw)
        return '(' + ', '.join(specs) + ')'
    _inspect.getargspec = _getargspec
    _inspect.formatargspec = _formatargspec
EOF
  fi
  if [ -n "${ORACLE_WHISPER_DIR:-}" ]; then
    cat >> "$STATE/oracle_local_settings.py" <<EOF
# ORACLE_WHISPER_DIR: graphite-web's standard whisper finder and tag DB instead of the above
WHISPER_DIR = '$whisper/'
STANDARD_DIRS = [WHISPER_DIR]
STORAGE_FINDERS = ('graphite.finders.standard.StandardFinder',)
TAGDB = 'graphite.tags.localdatabase.LocalDatabaseTagDB'
EOF
  fi
  environment
  # A migrated empty DB is cached per graphite-web version (migrate alone takes ~2 s).
  local tmpl="/tmp/graphite-oracle-template-$(dpkg-query -W -f='${Version}' graphite-web)${app:+-$WEBAPP_VERSION}.db"
  if [ -f "$tmpl" ]; then
    cp "$tmpl" "$STATE/graphite.db"
  else
    $PY /usr/bin/graphite-manage migrate --run-syncdb -v 0 >"$STATE/log/migrate.log" 2>&1
    cp "$STATE/graphite.db" "$tmpl.$$" && mv "$tmpl.$$" "$tmpl"
  fi
  echo "http://127.0.0.1:$port" > "$STATE/url"
}

case "$cmd" in
  start)
    prepare
    setsid "${srv[@]}" >"$STATE/log/server.log" 2>&1 < /dev/null &
    echo $! > "$STATE/pid"
    url=$(cat "$STATE/url")
    for _ in $(seq 1 300); do
      if curl -fsS -o /dev/null "$url/version" 2>/dev/null; then
        # warm-up: the first /render imports the 150 render functions (~0.3 s)
        curl -fsS -o /dev/null "$url/render?target=constantLine(1)&format=json" || true
        echo "GRAPHITE_URL=$url pid=$(cat "$STATE/pid") state=$STATE"
        exit 0
      fi
      if ! is_running; then echo "graphite-web died:" >&2; tail -30 "$STATE/log/server.log" >&2; exit 1; fi
      sleep 0.05
    done
    echo "graphite-web did not answer in 15 s" >&2; tail -30 "$STATE/log/server.log" >&2
    kill "$(cat "$STATE/pid")"; exit 1 ;;
  index)
    # Every function's group and parameters as graphite-web declares them (its /functions
    # answers 500 under Python 3.11), from a running oracle's settings.
    is_running || { echo "start it first" >&2; exit 1; }
    environment
    exec $PY "$HERE/functions_index.py" ;;
  run)
    prepare
    exec "${srv[@]}" ;;
  stop)
    if is_running; then
      pid=$(cat "$STATE/pid"); kill "$pid"
      for _ in $(seq 1 100); do alive "$pid" || break; sleep 0.05; done
      # setsid made pid a process group: -pid also reaches gunicorn's workers
      if alive "$pid"; then kill -9 -- -"$pid"; fi
      echo "stopped pid $pid"
    fi
    rm -rf "$STATE" ;;
  *) echo "usage: $0 start|run|stop|index [PORT]" >&2; exit 2 ;;
esac
