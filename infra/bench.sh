#!/usr/bin/env bash
# Benchmarks (see BENCHMARKS.md). Quick mode by default; `--full` for the long run; other arguments go
# to stepline-bench (`cargo run -p stepline-bench -- --help`).
#
# Starts the emulator, builds the release function binaries (the cold-start figures are theirs), runs
# the benchmark program, writes target/bench/summary.json and the results section of BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ -z "${AWS_ENDPOINT_URL:-}" ]; then
  # An emulator of its own, started fresh: one that has served a test suite holds hundreds of tables
  # and queues and answers several times slower.
  export STEPLINE_EMULATOR_PORT="${STEPLINE_BENCH_PORT:-5065}"
  infra/emulator.sh stop
  infra/emulator.sh start
  trap 'infra/emulator.sh stop' EXIT
fi
eval "$(infra/emulator.sh env)"
cargo build --release --bins \
  -p launch -p completion -p claim -p api -p redrive \
  -p order-worker -p restaurant-approval -p csv-payments
cargo run --profile bench-run -p stepline-bench -- --update-doc BENCHMARKS.md "$@"
