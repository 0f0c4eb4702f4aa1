#!/usr/bin/env bash
# The whole test suite, in two lanes, each against real local emulators started by the project's own
# scripts:
#   all         unit, simulation and end-to-end tests, every service on moto (infra/emulator.sh; or on
#               the emulator AWS_ENDPOINT_URL names when it is set)
#   localstack  the end-to-end suites again, with SQS, EventBridge and S3 from LocalStack on the host
#               (infra/localstack.sh) and DynamoDB from moto
# The pure unit and simulation tests run in the first lane only. Installs the browser the console's test
# drives (infra/browser.sh). STEPLINE_LANES chooses the lanes (default "all localstack"); extra
# arguments go to `cargo test`. Each lane ends with a line counting its tests.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
lanes="${STEPLINE_LANES:-all localstack}"
logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT

# The end-to-end suites: every test target of the packages whose tests talk to an emulator (the root
# suite, the local tools, the CLI, the benchmark), chosen by name within the whole workspace so that the
# first lane's build serves. `atomicity` races writers on DynamoDB only, which is moto's in both lanes.
end_to_end=()
for file in tests/*.rs infra/local/tests/*.rs infra/cli/tests/*.rs infra/bench/tests/*.rs; do
  target="$(basename "$file" .rs)"
  [ "$target" = atomicity ] || end_to_end+=(--test "$target")
done

infra/browser.sh
infra/emulator.sh start
eval "$(infra/emulator.sh env)"

failed=()
lane() {
  local name="$1"
  shift
  echo "== lane $name: cargo test $*" >&2
  local status=0
  cargo test --no-fail-fast "$@" 2>&1 | tee "$logs/$name.log" || status=$?
  awk -v lane="$name" -v status="$status" '
    /^test result:/ { passed += $4; failed += $6; ignored += $8 }
    END { printf "== lane %s: %d passed, %d failed, %d ignored (%s)\n", lane, passed, failed, ignored, status == 0 ? "green" : "RED, exit " status }
  ' "$logs/$name.log" | tee -a "$logs/summary" >&2
  return "$status"
}

for name in $lanes; do
  case "$name" in
    all) lane all --workspace "$@" || failed+=(all) ;;
    localstack)
      infra/localstack.sh start
      (eval "$(infra/localstack.sh env)" && lane localstack --workspace "${end_to_end[@]}" "$@") || failed+=(localstack)
      ;;
    *) echo "test: unknown lane $name (all, localstack)" >&2; exit 2 ;;
  esac
done

cat "$logs/summary" >&2
if [ "${#failed[@]}" -gt 0 ]; then
  echo "== failed lanes: ${failed[*]}" >&2
  exit 1
fi
