# What the scripts that run a local server in the background share (infra/emulator.sh,
# infra/localstack.sh, infra/lossy.sh): the project's paths, the virtualenv install, the pid and log
# files, waiting for the server, stopping it, and the command line. Sourced, not run, as
#
#   . infra/server.sh NAME SERVER PORT VENV
#
# NAME prefixes the messages, SERVER and PORT name the files under .local, VENV is the virtualenv's
# directory under the project. The script then defines `start`, `stop`, `ready` (what `status`
# answers), `print_env` (what `env` prints) and, to install with `venv_install`, `installed`.

name="$1"
server="$2"
port="$3"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/$4"
state="$root/.local"
mkdir -p "$state"

# Exit 0 when URL $1 gives any HTTP answer.
http_answers() {
  curl -s -o /dev/null --max-time 2 "$1" 2>/dev/null
}

# Installs pip requirement $2 into virtualenv $1, unless the script's `installed` says it is there.
venv_install() {
  if installed 2>/dev/null; then
    return
  fi
  echo "$name: installing $2 into $1" >&2
  python3 -m venv "$1"
  "$1/bin/pip" install --quiet --disable-pip-version-check "$2"
}

pidfile() { echo "$state/$server-$port.pid"; }
logfile() { echo "$state/$server-$port.log"; }

# Exit 0 while the process this script started on the port runs.
running() {
  [ -f "$(pidfile)" ] && kill -0 "$(cat "$(pidfile)")" 2>/dev/null
}

# Starts command $@ in the background, its output to the log file and its pid to the pid file.
launch() {
  nohup "$@" > "$(logfile)" 2>&1 &
  echo $! > "$(pidfile)"
}

# Waits for the launched server: up to $1 checks $2 s apart until `ready` succeeds (then says so).
# With `exits` as $3, it stops waiting when the process has exited. Exit 1 when it is not ready.
await_ready() {
  local _
  for _ in $(seq 1 "$1"); do
    if ready; then
      echo "$name: ready" >&2
      return 0
    fi
    if [ "${3:-}" = exits ] && ! running; then
      return 1
    fi
    sleep "$2"
  done
  return 1
}

# Stops the process of the pid file, if this script started one; with `wait` as $1, until it has
# exited (up to 5 s).
stop_server() {
  if [ -f "$(pidfile)" ]; then
    local pid _
    pid="$(cat "$(pidfile)")"
    kill "$pid" 2>/dev/null || true
    if [ "${1:-}" = wait ]; then
      for _ in $(seq 1 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
      done
    fi
    rm -f "$(pidfile)"
  fi
}

# Runs the command line's command: start (the default), stop, status or env.
main() {
  case "${1:-start}" in
    start) start ;;
    stop) stop ;;
    status) ready ;;
    env) print_env ;;
    *) echo "usage: $0 start|stop|status|env" >&2; exit 2 ;;
  esac
}
