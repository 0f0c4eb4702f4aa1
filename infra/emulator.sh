#!/usr/bin/env bash
# Local AWS emulator (moto server) in a project-local virtualenv, started through infra/moto_server.py,
# which makes moto's conditional writes and queue deletes atomic as they are on AWS.
#
#   infra/emulator.sh start    install if needed, start on 127.0.0.1:$STEPLINE_EMULATOR_PORT (or reuse a running one)
#   infra/emulator.sh stop     stop the server this script started on that port
#   infra/emulator.sh status   exit 0 when the endpoint answers
#   infra/emulator.sh env      print the environment to export (eval "$(infra/emulator.sh env)")
#
# When AWS_ENDPOINT_URL is already set (for example to LocalStack), `start` only checks that it answers.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
state="$root/.local"
port="${STEPLINE_EMULATOR_PORT:-5055}"
moto_version="5.2.5"
mkdir -p "$state"

endpoint() {
  if [ -n "${AWS_ENDPOINT_URL:-}" ]; then echo "$AWS_ENDPOINT_URL"; else echo "http://127.0.0.1:$port"; fi
}

answers() {
  # moto answers GET / on its root; LocalStack answers /_localstack/health. Any HTTP answer will do.
  curl -s -o /dev/null --max-time 2 "$(endpoint)/" 2>/dev/null
}

install() {
  if [ -x "$venv/bin/moto_server" ] && "$venv/bin/python" -c "import moto, sys; sys.exit(moto.__version__ != '$moto_version')" 2>/dev/null; then
    return
  fi
  echo "emulator: installing moto[server]==$moto_version into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "moto[server]==$moto_version"
}

start() {
  # The virtualenv serves more than the server: the Python worker's tests run its interpreter (boto3).
  install
  if answers; then
    echo "emulator: reusing $(endpoint)" >&2
    return
  fi
  if [ -n "${AWS_ENDPOINT_URL:-}" ]; then
    echo "emulator: AWS_ENDPOINT_URL=$AWS_ENDPOINT_URL does not answer; start it first" >&2
    exit 1
  fi
  echo "emulator: starting moto server on 127.0.0.1:$port" >&2
  nohup "$venv/bin/python" "$root/infra/moto_server.py" -H 127.0.0.1 -p "$port" > "$state/moto-$port.log" 2>&1 &
  echo $! > "$state/moto-$port.pid"
  for _ in $(seq 1 100); do
    if answers; then echo "emulator: ready" >&2; return; fi
    sleep 0.2
  done
  echo "emulator: moto did not answer within 20 s; see $state/moto-$port.log" >&2
  exit 1
}

stop() {
  if [ -f "$state/moto-$port.pid" ]; then
    kill "$(cat "$state/moto-$port.pid")" 2>/dev/null || true
    rm -f "$state/moto-$port.pid"
  fi
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  status) answers ;;
  env)
    echo "export AWS_ENDPOINT_URL=$(endpoint)"
    echo "export AWS_REGION=${AWS_REGION:-us-east-1}"
    echo "export AWS_DEFAULT_REGION=${AWS_REGION:-us-east-1}"
    echo "export AWS_ACCESS_KEY_ID=${AWS_ACCESS_KEY_ID:-test}"
    echo "export AWS_SECRET_ACCESS_KEY=${AWS_SECRET_ACCESS_KEY:-test}"
    ;;
  *) echo "usage: $0 start|stop|status|env" >&2; exit 2 ;;
esac
