#!/usr/bin/env bash
# The Debian package, for real: `cargo deb` builds it (from the test build's binary), dpkg
# installs it, systemd-analyze verifies the installed unit, the installed binary answers
# --version and --print-config (reading the conffile), then `dpkg -r` keeps only the conffile
# and `dpkg -P` leaves nothing of it behind: no file, no user. Needs root (dpkg -i) and
# cargo-deb; scripts/test.sh, which runs it, installs cargo-deb when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "package test: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || fail "dpkg -i needs root: run scripts/test.sh as root (CI does)"
if dpkg-query -W statsd-redis >/dev/null 2>&1; then
  fail "statsd-redis is installed on this machine already; this test installs and purges its own (dpkg -P statsd-redis first)"
fi

out=$(mktemp -d)
# Where systemd runs, the package's postinst would start the service (on 8125 and 9102, against
# the machine's Redis, its cleaner trimming what it finds there): invoke-rc.d's policy forbids
# starting anything while the test runs (deb-systemd-invoke asks it), unless a policy is in
# place already.
policy=/usr/sbin/policy-rc.d
own_policy=false
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && own_policy=true
fi
trap 'dpkg -P statsd-redis >/dev/null 2>&1 || true; rm -rf "$out"; $own_policy && rm -f "$policy"' EXIT
# The binary the tests just built (dev profile; built here when missing): the package's layout is
# what is tested here, and building it again with the binary's own features would take a minute;
# a release package is `cargo deb` alone.
[ -x target/debug/statsd-redis ] || cargo build --quiet --bin statsd-redis
cargo deb --quiet --profile dev --no-build --fast --output "$out" 2>&1 | grep -v "dev profile\|debug symbols\|profiles" || true
deb=$(ls "$out"/statsd-redis_*.deb) || fail "cargo deb made no package"

# Every file and directory named after the package, and its user and group.
traces() {
  find /etc /usr /var/lib /run -xdev -iname '*statsd-redis*' 2>/dev/null | sort
  getent passwd statsd-redis || true
  getent group statsd-redis || true
}
before=$(traces)

dpkg -i "$deb" >/dev/null
[ -x /usr/bin/statsd-redis ] || fail "no /usr/bin/statsd-redis"
dpkg-query -W -f='${Conffiles}\n' statsd-redis | grep -q ' /etc/statsd-redis/config.toml ' \
  || fail "/etc/statsd-redis/config.toml is not a conffile"
getent passwd statsd-redis >/dev/null || fail "no system user statsd-redis"
[ "$(id -u statsd-redis)" -lt 1000 ] || fail "statsd-redis is not a system user"
unit=/usr/lib/systemd/system/statsd-redis.service
said=$(systemd-analyze verify "$unit" 2>&1) || fail "systemd-analyze verify $unit: $said"
# What it says of other units on the machine (another package's obsolete settings) is not ours.
said=$(printf '%s\n' "$said" | grep -v '^/' | grep -v '^$' || true; printf '%s\n' "$said" | grep "^$unit" || true)
[ -z "$said" ] || fail "systemd-analyze verify $unit: $said"
/usr/bin/statsd-redis --version | grep -q '^statsd-redis ' || fail "--version"
# Without --config the agent reads /etc/statsd-redis/config.toml: the conffile as installed.
sed -i 's/^sample_count = .*/sample_count = 77/' /etc/statsd-redis/config.toml
grep -q '^sample_count = 77' /etc/statsd-redis/config.toml || fail "the conffile has no sample_count line to change"
runuser -u statsd-redis -- /usr/bin/statsd-redis --print-config | grep -q '^sample_count = 77$' \
  || fail "--print-config, run as the user, does not read the installed configuration"

dpkg -r statsd-redis >/dev/null
[ ! -e /usr/bin/statsd-redis ] || fail "dpkg -r left the binary"
[ ! -e "$unit" ] || fail "dpkg -r left the unit"
[ -e /etc/statsd-redis/config.toml ] || fail "dpkg -r removed the changed conffile"
dpkg -P statsd-redis >/dev/null
after=$(traces)
[ "$before" = "$after" ] || fail "dpkg -P left behind: $(diff <(echo "$before") <(echo "$after") || true)"
echo "package test: $(basename "$deb") installed, verified, removed and purged cleanly"
