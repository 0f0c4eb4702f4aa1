#!/usr/bin/env bash
# Starts the local emulator if needed, provisions a fresh stage of template.yaml, submits executions of
# the example pipeline and drives them to completion. Exits 0 only if every execution SUCCEEDED.
# Arguments go to `stepline-local demo` (e.g. --executions 20).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
infra/emulator.sh start
eval "$(infra/emulator.sh env)"
cargo run --quiet -p stepline-local -- demo "$@"
