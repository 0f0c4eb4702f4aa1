#!/usr/bin/env bash
# Deploys the stack with SAM (the functions build with cargo-lambda: BuildMethod rust-cargolambda).
#   infra/deploy.sh            guided first deployment (asks for the stack name, region, Stage, ...)
#   infra/deploy.sh --no-guided  later deployments with the saved samconfig.toml
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
command -v sam >/dev/null || { echo "deploy: install the AWS SAM CLI first (pip install aws-sam-cli)" >&2; exit 1; }
command -v cargo-lambda >/dev/null || { echo "deploy: install cargo-lambda first (infra/build-lambdas.sh does)" >&2; exit 1; }
sam build --beta-features
if [ "${1:-}" = "--no-guided" ]; then
  sam deploy
else
  sam deploy --guided
fi
