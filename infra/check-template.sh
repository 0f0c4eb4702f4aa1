#!/usr/bin/env bash
# Offline template checks: cfn-lint and `sam validate --lint`, from a project-local virtualenv.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
venv=.venv-lint
if [ ! -x "$venv/bin/cfn-lint" ] || [ ! -x "$venv/bin/sam" ]; then
  echo "template checks: installing cfn-lint and aws-sam-cli into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check cfn-lint aws-sam-cli
fi
export AWS_DEFAULT_REGION="${AWS_DEFAULT_REGION:-us-east-1}" SAM_CLI_TELEMETRY=0
"$venv/bin/cfn-lint" template.yaml
"$venv/bin/sam" validate --lint -t template.yaml
"$venv/bin/python" infra/test_check_iam.py
"$venv/bin/python" infra/check-iam.py template.yaml
# The check must be able to fail: a template with wildcards and a broad policy template is refused.
if "$venv/bin/python" infra/check-iam.py infra/testdata/wildcard-policy.yaml > /dev/null; then
  echo "template checks: the least-privilege check accepted a wildcard policy" >&2
  exit 1
fi
# The worker stacks `stepline init` writes pass the same checks, in both languages.
generated=$(mktemp -d)
trap 'rm -rf "$generated"' EXIT
for lang in python rust; do
  cargo run --quiet -p stepline-cli --bin stepline -- init "shop-$lang" --lang "$lang" \
    --dir "$generated/$lang" > /dev/null
  "$venv/bin/cfn-lint" "$generated/$lang/template.yaml"
  "$venv/bin/sam" validate --lint -t "$generated/$lang/template.yaml"
  "$venv/bin/python" infra/check-iam.py "$generated/$lang/template.yaml"
done
echo "template checks: cfn-lint, sam validate --lint and least privilege passed (and on stepline init's worker stacks)"
