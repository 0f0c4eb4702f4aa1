#!/usr/bin/env bash
# Builds every function of template.yaml for Lambda (provided.al2023, arm64) with cargo-lambda,
# cross-compiling with Zig, both pinned and installed from PyPI into a project-local virtualenv
# (.venv-lambda, seconds), with the Rust target added by rustup. Each function's package is the one
# its CodeUri names; its bootstrap lands in target/lambda/<binary>/bootstrap, where `sam deploy` and
# the deploy-build test (infra/local/tests/deploy_build.rs) find it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
venv=.venv-lambda
cargo_lambda_version=1.9.2
zig_version=0.17.0
if ! "$venv/bin/cargo-lambda" lambda --version 2>/dev/null | grep -q "$cargo_lambda_version" ||
  ! "$venv/bin/python" -c "import ziglang" 2>/dev/null; then
  echo "build-lambdas: installing cargo-lambda==$cargo_lambda_version and ziglang==$zig_version into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check \
    "cargo-lambda==$cargo_lambda_version" "ziglang==$zig_version"
fi
rustup target add aarch64-unknown-linux-gnu >&2
# cargo-lambda is a cargo subcommand and finds Zig through `python -m ziglang`: both on the PATH.
export PATH="$PWD/$venv/bin:$PATH"
# The packages of the template's Rust functions (BuildMethod rust-cargolambda), by their CodeUri.
packages=()
for dir in $(awk '/BuildMethod: rust-cargolambda/ { rust = 1 } rust && /CodeUri:/ { print $2; rust = 0 }' template.yaml | sort -u); do
  packages+=(-p "$(awk -F'"' '/^name = / { print $2; exit }' "$dir/Cargo.toml")")
done
echo "build-lambdas: cargo lambda build --release --arm64 ${packages[*]}" >&2
cargo lambda build --release --arm64 "${packages[@]}"
ls -l target/lambda/*/bootstrap >&2
# With STEPLINE_LEAN_TARGET=1 (CI), the cross build's intermediates go: only the bootstraps are used.
if [ "${STEPLINE_LEAN_TARGET:-}" = 1 ]; then
  rm -rf target/aarch64-unknown-linux-gnu
fi
