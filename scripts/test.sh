#!/usr/bin/env bash
# The whole test suite on a fresh machine (Debian 12 with Rust): installs what the tests need
# when it is missing, then `cargo test` (arguments go to it), then the Debian package's test
# (scripts/package-test.sh). Installing needs root; without it, this names what is missing and
# stops. CI (.ci/run) runs exactly this, then the lint gates.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages: name, and what the tests use them for.
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)   # a private Redis per test
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)        # Cluster and Sentinel set-up
[ -x /usr/bin/chromium ] || missing+=(chromium)                       # the dashboard, headless
python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)    # Python StatsD clients
command -v npm >/dev/null 2>&1 || missing+=(npm)                      # Node's hot-shots client
command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)      # the unit's verify
[ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] || missing+=(faketime)  # clocks
command -v openssl >/dev/null 2>&1 || missing+=(openssl)              # the TLS test's CA
command -v curl >/dev/null 2>&1 || missing+=(curl)                    # graphite-web's harness
command -v htpasswd >/dev/null 2>&1 || missing+=(apache2-utils)       # web_config_file's bcrypt users
# The Graphite API's oracle: Debian's graphite-web reading the same Redis, without the web
# server and the like it recommends.
oracle=()
[ -x /usr/bin/graphite-manage ] || oracle+=(graphite-web)
/usr/bin/python3 -c 'import redis' >/dev/null 2>&1 || oracle+=(python3-redis)
# Whisper files for the importer's test (the library carbon writes them with).
/usr/bin/python3 -c 'import whisper' >/dev/null 2>&1 || oracle+=(python3-whisper)
# The real Etsy stack's carbon (tests/etsy.rs; Etsy's statsd itself comes from npm).
[ -x /usr/bin/carbon-cache ] || oracle+=(graphite-carbon)
# Prometheus 2.42 scraping the HTTP port with basic_auth and tls_config, and its promtool
# judging the web configuration files (without the node exporter it recommends).
command -v promtool >/dev/null 2>&1 || oracle+=(prometheus)

root=false
[ "$(id -u)" -eq 0 ] && root=true
if [ ${#missing[@]} -gt 0 ] || [ ${#oracle[@]} -gt 0 ]; then
  if ! $root; then
    echo "the tests need these Debian packages; install them as root, then run this again:" >&2
    [ ${#missing[@]} -eq 0 ] || echo "  apt-get install -y ${missing[*]}" >&2
    [ ${#oracle[@]} -eq 0 ] || echo "  apt-get install -y --no-install-recommends ${oracle[*]}" >&2
    exit 1
  fi
  echo "installing ${missing[*]} ${oracle[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  [ ${#missing[@]} -eq 0 ] || apt-get install -y -qq "${missing[@]}" >/dev/null
  [ ${#oracle[@]} -eq 0 ] || apt-get install -y -qq --no-install-recommends "${oracle[@]}" >/dev/null
fi
if ! $root; then
  echo "the package test installs a .deb with dpkg -i and needs root: run this as root (\`cargo test\` runs everything else)" >&2
  exit 1
fi
# cargo-deb builds the package; a version known to take the test build's binary. A debug build
# of it: 41 s to compile instead of 2 min, and the package test's `--fast` package is no slower.
if ! cargo deb --version 2>/dev/null | grep -q ' 3\.8\.'; then
  echo "installing cargo-deb"
  cargo install --quiet --locked --debug cargo-deb@3.8.0
fi

cargo test "$@"
scripts/package-test.sh
