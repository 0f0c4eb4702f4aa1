#!/usr/bin/env bash
# LocalStack on the host (no Docker), serving SQS, EventBridge, S3 and Secrets Manager, in a project-local virtualenv;
# DynamoDB stays on moto (infra/emulator.sh), because LocalStack's DynamoDB needs DynamoDB Local, which
# it downloads at first use. The SDK routes each service to its own endpoint
# (AWS_ENDPOINT_URL_DYNAMODB beside AWS_ENDPOINT_URL), so nothing in the code knows which emulator runs.
#
#   infra/localstack.sh start    install if needed, start on 127.0.0.1:$STEPLINE_LOCALSTACK_PORT (or reuse a running one)
#   infra/localstack.sh stop     stop the server this script started on that port
#   infra/localstack.sh status   exit 0 when SQS, EventBridge and S3 are available
#   infra/localstack.sh env      print the environment to export: LocalStack for everything, moto for
#                                DynamoDB (eval "$(infra/localstack.sh env)"; start infra/emulator.sh too)
#
# LocalStack needs Python 3.13: taken from $STEPLINE_PYTHON, else python3.13 on the PATH or in pyenv.
set -euo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/server.sh" localstack localstack "${STEPLINE_LOCALSTACK_PORT:-4566}" .venv-localstack
version="2026.3.0"
# Each pin was found by a start that failed without it.
pins=("cbor2<5.7" "pyopenssl==24.2.1" "cryptography==43.0.3" "service_identity<24.2")
services="sqs,events,s3,secretsmanager"

endpoint() { echo "http://127.0.0.1:$port"; }

ready() {
  local health
  health="$(curl -s --max-time 2 "$(endpoint)/_localstack/health" 2>/dev/null)" || return 1
  python3 - "$health" <<'EOF'
import json, sys
services = json.loads(sys.argv[1]).get("services", {})
sys.exit(0 if all(services.get(s) in ("available", "running") for s in ("sqs", "events", "s3")) else 1)
EOF
}

python313() {
  if [ -n "${STEPLINE_PYTHON:-}" ]; then echo "$STEPLINE_PYTHON"; return; fi
  local candidate
  for candidate in "$(command -v python3.13 2>/dev/null || true)" "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.13*/bin/python3.13; do
    if [ -n "$candidate" ] && [ -x "$candidate" ] && "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 13))' 2>/dev/null; then
      echo "$candidate"
      return
    fi
  done
  echo "localstack: Python 3.13 not found (set STEPLINE_PYTHON)" >&2
  exit 1
}

install() {
  local marker="$venv/.stepline-localstack"
  if [ -f "$marker" ] && [ "$(cat "$marker")" = "$version ${pins[*]}" ]; then
    return
  fi
  local python
  python="$(python313)"
  echo "localstack: installing localstack-core $version into $venv (with $python)" >&2
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "localstack-core[runtime]==$version"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "${pins[@]}" 2>&1 | grep -v -i "joserfc" >&2 || true
  "$venv/bin/python" -c 'import localstack.runtime.main' || { echo "localstack: install is broken" >&2; exit 1; }
  echo "$version ${pins[*]}" > "$marker"
}

start() {
  if ready; then
    echo "localstack: reusing $(endpoint)" >&2
    return
  fi
  install
  echo "localstack: starting $services on 127.0.0.1:$port" >&2
  launch env SERVICES="$services" GATEWAY_LISTEN="127.0.0.1:$port" \
    LOCALSTACK_VOLUME_DIR="$state/localstack-$port" DISABLE_EVENTS=1 DNS_ADDRESS=0 \
    "$venv/bin/python" -m localstack.runtime.main
  await_ready 300 0.5 exits && return
  if ! running; then
    echo "localstack: exited; see $(logfile)" >&2
    tail -20 "$(logfile)" >&2
    exit 1
  fi
  echo "localstack: not ready within 150 s; see $(logfile)" >&2
  exit 1
}

stop() { stop_server; }

print_env() {
  # moto's environment, its endpoint kept for DynamoDB alone.
  echo "export AWS_ENDPOINT_URL=$(endpoint)"
  AWS_ENDPOINT_URL="" "$root/infra/emulator.sh" env | sed 's/^export AWS_ENDPOINT_URL=/export AWS_ENDPOINT_URL_DYNAMODB=/'
}

main "$@"
