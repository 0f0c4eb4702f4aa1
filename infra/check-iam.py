#!/usr/bin/env python3
"""Least-privilege check of template.yaml.

Every function's policies must name their actions and resources: no `*` in any Action or Resource
(a documented exception needs an entry in the function's `Metadata.IamExceptions` with a reason, naming
the wildcard action or the end of the resource it allows), and
only resource-scoped SAM policy templates (listed below, each granting a fixed small set of actions on
one named resource). Exits non-zero with one line per violation.
"""
import sys

import yaml

# SAM policy templates that grant a fixed, small set of actions on the one resource they name.
SCOPED_TEMPLATES = {
    "SQSSendMessagePolicy": "sqs:SendMessage* on one queue",
    "SQSPollerPolicy": "receive/delete/change visibility on one queue",
    "EventBridgePutEventsPolicy": "events:PutEvents on one bus",
}


class Loader(yaml.SafeLoader):
    """Reads CloudFormation short-form tags (!Ref, !GetAtt, !Sub, ...) as plain values."""


def _tag(loader, suffix, node):
    if isinstance(node, yaml.ScalarNode):
        return {suffix: loader.construct_scalar(node)}
    if isinstance(node, yaml.SequenceNode):
        return {suffix: loader.construct_sequence(node)}
    return {suffix: loader.construct_mapping(node)}


Loader.add_multi_constructor("!", _tag)


def strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from strings(v)


def check_statement(where, statement, exceptions, problems):
    for key in ("Action", "Resource"):
        for text in strings(statement.get(key, [])):
            if "*" in text and not any(text == e or text.endswith(e) for e in exceptions):
                problems.append(f"{where}: {key} {text!r} has a wildcard")
    if statement.get("Effect") == "Allow" and not statement.get("Resource"):
        problems.append(f"{where}: an Allow statement without a Resource")


def main(path):
    with open(path) as f:
        template = yaml.load(f, Loader=Loader)
    problems = []
    checked = 0
    for name, resource in template.get("Resources", {}).items():
        kind = resource.get("Type")
        props = resource.get("Properties", {})
        # Each exception names the wildcard text it allows (`action`) or the end of a resource ARN
        # (`resource`, e.g. the key prefix of objects whose names are not known in advance).
        exceptions = {
            e.get("action") or e.get("resource"): e["reason"]
            for e in resource.get("Metadata", {}).get("IamExceptions", [])
            if e.get("reason") and (e.get("action") or e.get("resource"))
        }
        if kind == "AWS::Serverless::Function":
            checked += 1
            for policy in props.get("Policies", []):
                if isinstance(policy, str):
                    problems.append(f"{name}: managed policy {policy!r} (name its actions instead)")
                elif "Statement" in policy:
                    for statement in policy["Statement"]:
                        check_statement(name, statement, exceptions, problems)
                else:
                    for template_name in policy:
                        if template_name not in SCOPED_TEMPLATES:
                            problems.append(f"{name}: policy template {template_name} grants more than the function uses")
            if props.get("Role"):
                problems.append(f"{name}: an external Role cannot be checked")
        elif kind in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy", "AWS::SQS::QueuePolicy"):
            for statement in props.get("PolicyDocument", {}).get("Statement", []):
                check_statement(name, statement, exceptions, problems)
    for p in problems:
        print(p)
    if problems:
        print(f"least privilege: {len(problems)} problem(s)")
        return 1
    print(f"least privilege: {checked} functions checked, no wildcard, only scoped policy templates")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "template.yaml"))
