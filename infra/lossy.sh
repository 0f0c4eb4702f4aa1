#!/usr/bin/env bash
# A lossy network in front of the AWS emulator: mitmproxy's mitmdump as a reverse proxy, in a
# project-local virtualenv, with the fault-injecting addon infra/lossy_proxy.py (killed responses of
# applied writes, retryable errors answered without forwarding, delays; see that file).
#
#   infra/lossy.sh start    install if needed, start on 127.0.0.1:$STEPLINE_LOSSY_PORT in front of
#                           $STEPLINE_LOSSY_UPSTREAM (or reuse a running one), truncating the fault log
#   infra/lossy.sh stop     stop the proxy this script started on that port
#   infra/lossy.sh status   exit 0 when the proxy answers
#   infra/lossy.sh env      print the environment to export (eval "$(infra/lossy.sh env)")
#
# The faults are read by the addon when the proxy starts: STEPLINE_LOSSY_KILL, STEPLINE_LOSSY_ERROR,
# STEPLINE_LOSSY_DELAY, STEPLINE_LOSSY_DELAY_MS, STEPLINE_LOSSY_SEED, STEPLINE_LOSSY_ONLY; the log of
# every request goes to $STEPLINE_LOSSY_LOG (default .local/lossy-$port.jsonl). A proxy this script
# started with other settings is restarted; one it did not start is reused as it is.
set -euo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/server.sh" lossy lossy "${STEPLINE_LOSSY_PORT:-5070}" .venv-lossy
upstream="${STEPLINE_LOSSY_UPSTREAM:-http://127.0.0.1:${STEPLINE_EMULATOR_PORT:-5055}}"
faults="${STEPLINE_LOSSY_LOG:-$state/lossy-$port.jsonl}"
# 11.0.2 is the last mitmproxy for Python 3.11 (12 needs 3.12).
mitmproxy_version="11.0.2"

endpoint() { echo "http://127.0.0.1:$port"; }

ready() {
  # Any HTTP answer will do: the emulator's through the proxy, or the proxy's own 502 without it.
  http_answers "$(endpoint)/"
}

installed() {
  [ -x "$venv/bin/mitmdump" ] && "$venv/bin/python" -c "import mitmproxy.version as v, sys; sys.exit(v.VERSION != '$mitmproxy_version')"
}

# The settings a proxy was started with, to tell whether a running one can be reused.
settings() {
  local name
  echo "upstream=$upstream log=$faults"
  for name in KILL ERROR DELAY DELAY_MS SEED ONLY; do
    name="STEPLINE_LOSSY_$name"
    echo "$name=${!name:-}"
  done
}

start() {
  venv_install "$venv" "mitmproxy==$mitmproxy_version"
  if ready; then
    if ! running; then
      echo "lossy: reusing $(endpoint), not started here: its faults are those it was started with" >&2
      : > "$faults"
      return
    fi
    if [ "$(settings)" = "$(cat "$state/lossy-$port.settings" 2>/dev/null)" ]; then
      echo "lossy: reusing $(endpoint)" >&2
      : > "$faults"
      return
    fi
    echo "lossy: restarting $(endpoint) with other settings" >&2
    stop
  fi
  mkdir -p "$(dirname "$faults")"
  : > "$faults"
  settings > "$state/lossy-$port.settings"
  echo "lossy: starting mitmdump on 127.0.0.1:$port in front of $upstream (kill ${STEPLINE_LOSSY_KILL:-0.1}," \
    "error ${STEPLINE_LOSSY_ERROR:-0.05}, delay ${STEPLINE_LOSSY_DELAY:-0.1} by ${STEPLINE_LOSSY_DELAY_MS:-0-0} ms)" >&2
  # keep_host_header: the request reaches the emulator as the SDK signed it. Bodies are buffered
  # whole (stream_large_bodies and body_size_limit unset), which the addon needs to read them.
  # confdir keeps mitmproxy's generated CA out of the home directory; lazy connects upstream only
  # for the requests that are forwarded.
  launch env STEPLINE_LOSSY_LOG="$faults" "$venv/bin/mitmdump" \
    --mode "reverse:$upstream" -p "$port" --listen-host 127.0.0.1 \
    -s "$root/infra/lossy_proxy.py" -q \
    --set keep_host_header=true \
    --set connection_strategy=lazy \
    --set confdir="$state/mitmproxy"
  if await_ready 100 0.2 exits; then
    # The probes reached the log: it starts empty once the proxy answers.
    : > "$faults"
    return
  fi
  echo "lossy: mitmdump did not answer within 20 s; see $(logfile)" >&2
  stop
  exit 1
}

stop() {
  if [ -f "$(pidfile)" ]; then
    stop_server wait
    rm -f "$state/lossy-$port.settings"
  fi
}

print_env() {
  echo "export STEPLINE_LOSSY_ENDPOINT=$(endpoint)"
  echo "export STEPLINE_LOSSY_LOG=$faults"
}

main "$@"
