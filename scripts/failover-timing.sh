#!/usr/bin/env bash
# How long the agent stops writing when Redis fails over or reshards under a steady load, and
# whether it still writes every count exactly once: a cluster master and a Sentinel master
# SIGKILLed under load, and a reshard of 1024 slots under load, each on a fresh private
# topology set up by the tests' own harness. What it measures is at the top of
# examples/failover_timing.rs.
#
#   scripts/failover-timing.sh [runs=3] [seconds=20] [series=2000] [rate=20000] [scenarios=cluster,sentinel,reshard]
#
# KEEP=DIR keeps every run's files (agent logs, totals) there.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin statsd-redis --example loadgen --example failover_timing
exec target/release/examples/failover_timing "$@"
