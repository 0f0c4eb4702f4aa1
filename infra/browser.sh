#!/usr/bin/env bash
# Installs the browser the console's end-to-end test drives: Debian's Chromium and its WebDriver
# (packages chromium and chromium-driver: /usr/bin/chromium, /usr/bin/chromedriver). Does nothing when
# both are there.
set -euo pipefail
if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
  exit 0
fi
sudo=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "browser: run as root or install chromium and chromium-driver" >&2; exit 1; }
  sudo="sudo"
fi
echo "browser: installing chromium and chromium-driver" >&2
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get install -y --no-install-recommends chromium chromium-driver >/dev/null \
  || { $sudo apt-get update >/dev/null && $sudo apt-get install -y --no-install-recommends chromium chromium-driver >/dev/null; }
/usr/bin/chromium --version >&2
