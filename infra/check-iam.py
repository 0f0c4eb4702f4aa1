#!/usr/bin/env python3
"""Least-privilege check of template.yaml.

Every function's policies must name their actions and resources: no wildcard (`*` or `?`) in any Action
or Resource an Allow statement grants (a documented exception needs an entry in the resource's
`Metadata.IamExceptions` with a reason, naming the wildcard action or the end of the resource it allows),
no Allow with NotAction, NotResource or NotPrincipal, and only resource-scoped SAM policy templates
(listed below, each granting a fixed small set of actions on one named resource). The same holds for the
IAM policies, roles, users and groups the template declares, and for the resource policies of queues,
topics, buckets, secrets and event buses; a resource policy (or a role's trust policy) must also not
allow everyone (`Principal: "*"` or `{"AWS": "*"}`) without a Condition. Deny statements only take away,
so their wildcards (and `Principal: "*"`, the way "deny everyone but X" is written) are fine.
Exits non-zero with one line per violation.
"""
import json
import sys

import yaml

# SAM policy templates that grant a fixed, small set of actions on the one resource they name.
SCOPED_TEMPLATES = {
    "SQSSendMessagePolicy": "sqs:SendMessage* on one queue",
    "SQSPollerPolicy": "receive/delete/change visibility on one queue",
    "EventBridgePutEventsPolicy": "events:PutEvents on one bus",
}

WILDCARDS = ("*", "?")

# Resource policies: the property that holds each type's policy document.
RESOURCE_POLICIES = {
    "AWS::SQS::QueuePolicy": "PolicyDocument",
    "AWS::SNS::TopicPolicy": "PolicyDocument",
    "AWS::S3::BucketPolicy": "PolicyDocument",
    "AWS::SecretsManager::ResourcePolicy": "ResourcePolicy",
}
# Identity policies declared on their own.
IDENTITY_POLICIES = (
    "AWS::IAM::Policy",
    "AWS::IAM::ManagedPolicy",
    "AWS::IAM::RolePolicy",
    "AWS::IAM::UserPolicy",
    "AWS::IAM::GroupPolicy",
)
# Identities with inline `Policies: [{PolicyName, PolicyDocument}]` and `ManagedPolicyArns`.
IDENTITIES = ("AWS::IAM::Role", "AWS::IAM::User", "AWS::IAM::Group")


class Loader(yaml.SafeLoader):
    """Reads CloudFormation short-form tags (!Ref, !GetAtt, !Sub, ...) as plain values."""


def _tag(loader, suffix, node):
    if isinstance(node, yaml.ScalarNode):
        return {suffix: loader.construct_scalar(node)}
    if isinstance(node, yaml.SequenceNode):
        return {suffix: loader.construct_sequence(node)}
    return {suffix: loader.construct_mapping(node)}


Loader.add_multi_constructor("!", _tag)


def load(stream):
    """A template from YAML text or an open file, short-form tags read as `{tag: value}`."""
    return yaml.load(stream, Loader=Loader)


def strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from strings(v)


def wild(text):
    return any(w in text for w in WILDCARDS)


def _as_list(value):
    return value if isinstance(value, list) else [value]


def _branches(statement):
    """The statements an `Fn::If` (or `!If`) in a Statement list may stand for; else the statement."""
    if isinstance(statement, dict) and len(statement) == 1:
        (key, value), = statement.items()
        if key in ("Fn::If", "If") and isinstance(value, list) and len(value) == 3:
            return [
                s
                for branch in value[1:]
                if branch != {"Ref": "AWS::NoValue"}
                for s in _branches(branch)
            ]
    return [statement]


def _allowed(key, text, exceptions):
    """Whether a documented exception allows this wildcard: an action exception names the whole
    action; a resource exception names the end of the resource, before which there is no wildcard."""
    if key == "Action":
        return text in exceptions["action"]
    return any(
        text.endswith(e) and not wild(text[: len(text) - len(e)]) for e in exceptions["resource"]
    )


def check_statement(where, statement, exceptions, problems, kind="identity"):
    """One statement. `kind`: "identity" (a role's own policy), "resource" (a resource policy),
    "trust" (a role's assume-role policy, which names no Resource) or "bus-legacy" (an event bus
    policy's Action/Principal/Condition properties, which apply to the bus itself)."""
    for statement in _branches(statement):
        if not isinstance(statement, dict) or statement.get("Effect") not in ("Allow", "Deny"):
            problems.append(f"{where}: a statement without Effect Allow or Deny cannot be checked: {statement!r}")
            continue
        if statement["Effect"] == "Deny":
            continue
        for key in ("NotAction", "NotResource", "NotPrincipal"):
            if key in statement:
                problems.append(f"{where}: an Allow statement with {key} (name what it allows instead)")
        for key in ("Action", "Resource"):
            for text in strings(statement.get(key, [])):
                if wild(text) and not _allowed(key, text, exceptions):
                    problems.append(f"{where}: {key} {text!r} has a wildcard")
        if kind in ("identity", "resource") and not statement.get("Resource"):
            problems.append(f"{where}: an Allow statement without a Resource")
        if kind in ("resource", "trust", "bus-legacy") and not statement.get("Condition"):
            principal = statement.get("Principal")
            if principal == "*" or (
                isinstance(principal, dict) and "*" in _as_list(principal.get("AWS"))
            ):
                problems.append(f"{where}: an Allow to every principal without a Condition")


def check_document(where, document, exceptions, problems, kind):
    """A policy document: a mapping (or JSON text) with a Statement (one statement or a list)."""
    if isinstance(document, str):
        try:
            document = json.loads(document)
        except ValueError:
            problems.append(f"{where}: a policy document that is not JSON cannot be checked")
            return
    if not isinstance(document, dict) or "Statement" not in document:
        problems.append(f"{where}: a policy document without a Statement cannot be checked: {document!r}")
        return
    for statement in _as_list(document["Statement"]):
        check_statement(where, statement, exceptions, problems, kind)


def _exceptions(resource):
    # Each exception names the wildcard action it allows (`action`) or the end of a resource ARN
    # (`resource`, e.g. the key prefix of objects whose names are not known in advance).
    found = {"action": set(), "resource": set()}
    for e in resource.get("Metadata", {}).get("IamExceptions", []):
        if e.get("reason"):
            for key in found:
                if e.get(key):
                    found[key].add(e[key])
    return found


def check_function(name, props, exceptions, problems):
    policies = props.get("Policies", [])
    # SAM takes one policy (a name or a document) as well as a list of them.
    for policy in policies if isinstance(policies, list) else [policies]:
        if isinstance(policy, str):
            problems.append(f"{name}: managed policy {policy!r} (name its actions instead)")
        elif isinstance(policy, dict) and "Statement" in policy:
            check_document(name, policy, exceptions, problems, "identity")
        elif isinstance(policy, dict):
            for template_name in policy:
                if template_name not in SCOPED_TEMPLATES:
                    problems.append(f"{name}: policy template {template_name} grants more than the function uses")
        else:
            problems.append(f"{name}: policy {policy!r} cannot be checked")
    if props.get("Role"):
        problems.append(f"{name}: an external Role cannot be checked")
    if "AssumeRolePolicyDocument" in props:
        check_document(name, props["AssumeRolePolicyDocument"], exceptions, problems, "trust")


def check_event_bus_policy(name, props, exceptions, problems):
    if "Statement" in props:
        for statement in _as_list(props["Statement"]):
            check_statement(name, statement, exceptions, problems, "resource")
    if "Policy" in props:
        check_document(name, props["Policy"], exceptions, problems, "resource")
    if "Action" in props or "Principal" in props:
        # The older form: one grant of Action to Principal (an account, or "*") on this bus.
        statement = {"Effect": "Allow", "Action": props.get("Action", [])}
        if props.get("Principal") == "*":
            statement["Principal"] = "*"
        if props.get("Condition"):
            statement["Condition"] = props["Condition"]
        check_statement(name, statement, exceptions, problems, "bus-legacy")


def check_template(template):
    """Every least-privilege problem in a loaded template, one line each (empty: none)."""
    problems = []
    for name, resource in (template.get("Resources") or {}).items():
        kind = resource.get("Type")
        props = resource.get("Properties") or {}
        exceptions = _exceptions(resource)
        if kind == "AWS::Serverless::Function":
            check_function(name, props, exceptions, problems)
        elif kind in IDENTITY_POLICIES:
            check_document(name, props.get("PolicyDocument"), exceptions, problems, "identity")
        elif kind in IDENTITIES:
            for policy in props.get("Policies", []):
                where = f"{name} {policy.get('PolicyName', '')}".rstrip()
                check_document(where, policy.get("PolicyDocument"), exceptions, problems, "identity")
            for arn in props.get("ManagedPolicyArns", []):
                problems.append(f"{name}: managed policy {arn!r} (name its actions instead)")
            if "AssumeRolePolicyDocument" in props:
                check_document(name, props["AssumeRolePolicyDocument"], exceptions, problems, "trust")
        elif kind in RESOURCE_POLICIES:
            check_document(name, props.get(RESOURCE_POLICIES[kind]), exceptions, problems, "resource")
        elif kind == "AWS::Events::EventBusPolicy":
            check_event_bus_policy(name, props, exceptions, problems)
    return problems


def main(path):
    with open(path) as f:
        template = load(f)
    problems = check_template(template)
    checked = sum(
        1 for r in (template.get("Resources") or {}).values() if r.get("Type") == "AWS::Serverless::Function"
    )
    for p in problems:
        print(p)
    if problems:
        print(f"least privilege: {len(problems)} problem(s)")
        return 1
    print(f"least privilege: {checked} functions checked, no wildcard, only scoped policy templates")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "template.yaml"))
