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

. "$(dirname "${BASH_SOURCE[0]}")/server.sh" emulator moto "${STEPLINE_EMULATOR_PORT:-5055}" .venv
moto_version="5.2.5"

endpoint() {
  if [ -n "${AWS_ENDPOINT_URL:-}" ]; then echo "$AWS_ENDPOINT_URL"; else echo "http://127.0.0.1:$port"; fi
}

ready() {
  # moto answers GET / on its root; LocalStack answers /_localstack/health. Any HTTP answer will do.
  http_answers "$(endpoint)/"
}

installed() {
  [ -x "$venv/bin/moto_server" ] && "$venv/bin/python" -c "import moto, sys; sys.exit(moto.__version__ != '$moto_version')"
}

start() {
  # The virtualenv serves more than the server: the Python worker's tests run its interpreter (boto3).
  venv_install "$venv" "moto[server]==$moto_version"
  if ready; then
    echo "emulator: reusing $(endpoint)" >&2
    return
  fi
  if [ -n "${AWS_ENDPOINT_URL:-}" ]; then
    echo "emulator: AWS_ENDPOINT_URL=$AWS_ENDPOINT_URL does not answer; start it first" >&2
    exit 1
  fi
  echo "emulator: starting moto server on 127.0.0.1:$port" >&2
  launch "$venv/bin/python" "$root/infra/moto_server.py" -H 127.0.0.1 -p "$port"
  await_ready 100 0.2 || {
    echo "emulator: moto did not answer within 20 s; see $(logfile)" >&2
    exit 1
  }
}

stop() { stop_server; }

print_env() {
  echo "export AWS_ENDPOINT_URL=$(endpoint)"
  echo "export AWS_REGION=${AWS_REGION:-us-east-1}"
  echo "export AWS_DEFAULT_REGION=${AWS_REGION:-us-east-1}"
  echo "export AWS_ACCESS_KEY_ID=${AWS_ACCESS_KEY_ID:-test}"
  echo "export AWS_SECRET_ACCESS_KEY=${AWS_SECRET_ACCESS_KEY:-test}"
}

main "$@"
