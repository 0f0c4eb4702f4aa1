#!/usr/bin/env bash
# Installs the API fuzzer, schemathesis (pinned), into .venv-fuzz: the API fuzz test
# (infra/local/tests/api_fuzz.rs) runs its `st` against `stepline-local run --api`. Does nothing
# when that version is there.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv-fuzz"
version="4.32.5"
if [ -x "$venv/bin/st" ] && [ "$("$venv/bin/st" --version 2>/dev/null | grep -o '[0-9.]*$')" = "$version" ]; then
  exit 0
fi
echo "fuzzer: installing schemathesis==$version into $venv" >&2
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$version"
