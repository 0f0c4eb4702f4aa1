#!/usr/bin/env bash
# The test suite, in two tiers, against real local emulators started by the project's own scripts.
#
#   infra/test.sh           the quick tier (the README's test command): every unit, state-machine and
#                           simulation test at quick sizes, the end-to-end tests on moto, and on
#                           LocalStack the tests of the SQS, EventBridge and S3 adapters
#   infra/test.sh --full    the full tier (CI): everything at soak size, every end-to-end test in both
#                           lanes, the browser, the Rust guide, peak memory, the benchmark's run, and
#                           the deploy build (infra/build-lambdas.sh) checked
#
# Lanes, in order (STEPLINE_LANES chooses some; default "sim moto localstack", and "lossy" in the full tier):
#   sim         the library's own tests (pure: no emulator), CPU-bound
#   moto        every other test, every service on moto (infra/emulator.sh; or on the emulator
#               AWS_ENDPOINT_URL names when it is set)
#   localstack  end-to-end tests again, SQS, EventBridge and S3 from LocalStack on the host
#               (infra/localstack.sh), DynamoDB from moto
#   lossy       the lossy-network test (tests/lossy.rs) on moto, the functions' calls through a proxy
#               that kills applied writes' responses, answers throttling and 5xx, and delays
#               (infra/lossy.sh; 10 % of writes' responses killed)
#
# Every run takes a fresh seed for its simulations and campaigns, printed first: STEPLINE_SEED=<seed>
# reproduces the run's schedules. What a tier runs and at which sizes is the tests' own
# (STEPLINE_TIER; stepline_local::testing): a test left out of the quick tier says so, and the run
# lists it. Extra arguments go to `cargo nextest run`. Ends with each lane's count and time, and the
# ten slowest test files.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

tier=quick
if [ "${1:-}" = --full ]; then
  tier=full
  shift
fi
default_lanes="sim moto localstack"
if [ "$tier" = full ]; then default_lanes+=" lossy"; fi
lanes="${STEPLINE_LANES:-$default_lanes}"
seed="${STEPLINE_SEED:-$(od -An -N5 -tu8 /dev/urandom | tr -d ' ')}"
export STEPLINE_TIER="$tier" STEPLINE_SEED="$seed" STEPLINE_REQUIRE_EMULATOR=1
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}" NEXTEST_HIDE_PROGRESS_BAR=1
logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT
began=$SECONDS
echo "== tier $tier, seed $seed (reproduce: STEPLINE_SEED=$seed infra/test.sh$([ "$tier" = full ] && echo ' --full'))" >&2

# Whether a lane is chosen.
chosen() { [[ " $lanes " == *" $1 "* ]]; }
# Records a phase's time (seconds since `mark`).
mark() { phase_began=$SECONDS; }
took() { echo "$1 $((SECONDS - phase_began))" >> "$logs/phases"; }

# The end-to-end tests on LocalStack. The full tier: every integration test outside the library but
# `atomicity` (it races writers on DynamoDB only, which is moto's in both lanes), the deploy build's
# check and the plain file commands. The quick tier: the suites whose subject is an SQS, EventBridge
# or S3 adapter: runs and dead letters on SQS, event triggers and lifecycle events on EventBridge,
# every function binary on real events, claim checks and batches in S3 and SQS, a fan-out read from S3.
# The library's crates: unit tests, the state machine and the fault campaign, no emulator.
library='package(stepline) | package(stepline-domain) | package(stepline-core) | package(stepline-worker) | package(stepline-sim)'
localstack_full="kind(test) & !($library) & "'!binary(atomicity) & !binary(deploy_build) & !binary(files) & !binary(lossy)'
localstack_quick='binary(emulator) | binary(triggers) | binary(lifecycle) | binary(binaries)
  | (binary(limits) & test(/claim_checked|megabytes|split_into_batches|300_kb/))
  | (binary(fan_out) & test(/payload_bucket/))'

mark
command -v cargo-nextest >/dev/null || cargo install cargo-nextest --locked
if [ "$tier" = full ]; then
  infra/browser.sh
  infra/build-lambdas.sh
fi
chosen moto || chosen localstack || chosen lossy && infra/emulator.sh start
# The API fuzz test's schemathesis (infra/local/tests/api_fuzz.rs).
chosen moto || chosen localstack && infra/fuzzer.sh
eval "$(infra/emulator.sh env)"
chosen localstack && infra/localstack.sh start
# The binaries the tests run (functions, CLI, local runner) are built here, with the tests.
cargo build --workspace --bins --tests
took setup

failed=()
lane() {
  local name="$1"
  shift
  echo "== lane $name: cargo nextest run $*" >&2
  export STEPLINE_SKIPPED="$logs/$name.skipped"
  : > "$STEPLINE_SKIPPED"
  mark
  local status=0
  cargo nextest run --profile "$tier" --no-fail-fast "$@" || status=$?
  took "$name"
  cp "target/nextest/$tier/junit.xml" "$logs/$name.xml" 2>/dev/null || true
  python3 infra/test-report.py lane "$name" "$status" "$logs/$name.xml" "$STEPLINE_SKIPPED" \
    | tee -a "$logs/summary" >&2
  return "$status"
}

if chosen sim; then
  lane sim --workspace -E "$library" --test-threads 2 "$@" || failed+=(sim)
fi
if chosen moto; then
  lane moto --workspace -E "!($library) & !binary(lossy)" "$@" || failed+=(moto)
fi
if chosen localstack; then
  filter="$localstack_quick"
  [ "$tier" = full ] && filter="$localstack_full"
  (eval "$(infra/localstack.sh env)" && lane localstack --workspace -E "$filter" "$@") || failed+=(localstack)
fi

if chosen lossy; then
  (STEPLINE_LOSSY_UPSTREAM="$AWS_ENDPOINT_URL" STEPLINE_LOSSY_KILL=0.1 STEPLINE_LOSSY_ERROR=0.05 \
    STEPLINE_LOSSY_DELAY=0.1 \
    STEPLINE_LOSSY_DELAY_MS=0-1000 infra/lossy.sh start &&
    eval "$(infra/lossy.sh env)" && lane lossy --workspace -E 'binary(lossy)' "$@") || failed+=(lossy)
  infra/lossy.sh stop || true
fi

echo "total $((SECONDS - began))" >> "$logs/phases"
python3 infra/test-report.py end "$tier" "$logs/phases" "$logs"/*.xml >&2 || true
cat "$logs/summary" >&2
if [ "${#failed[@]}" -gt 0 ]; then
  echo "== failed lanes: ${failed[*]}" >&2
  exit 1
fi
