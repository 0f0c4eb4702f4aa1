#!/usr/bin/env bash
# Builds every function for Lambda (provided.al2023, arm64) with cargo-lambda, cross-compiling with Zig
# from PyPI (`ziglang`), into target/lambda/<function>/bootstrap. Installs both if missing (cargo-lambda
# takes a while to build the first time).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
venv=.venv-zig
if [ ! -f "$venv/.ready" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check ziglang
  touch "$venv/.ready"
fi
# cargo-lambda finds Zig through `python -m ziglang`.
export PATH="$PWD/$venv/bin:$PATH"
command -v cargo-lambda >/dev/null || cargo install cargo-lambda --locked
cargo lambda build --release --arm64 --workspace
ls -l target/lambda/*/bootstrap
