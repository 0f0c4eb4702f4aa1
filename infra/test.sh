#!/usr/bin/env bash
# The whole test suite: unit, simulation and end-to-end tests against the local AWS emulator.
# Starts the emulator if needed (see infra/emulator.sh) and installs the browser the console's test
# drives (infra/browser.sh); extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
infra/browser.sh
infra/emulator.sh start
eval "$(infra/emulator.sh env)"
cargo test --workspace "$@"
