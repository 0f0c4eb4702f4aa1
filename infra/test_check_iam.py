#!/usr/bin/env python3
"""Tests of infra/check-iam.py: each rule refuses its bad case and accepts a good one.

Run: python3 infra/test_check_iam.py
"""
import importlib.util
import json
import pathlib
import subprocess
import sys
import unittest

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
_spec = importlib.util.spec_from_file_location("check_iam", HERE / "check-iam.py")
check_iam = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_iam)


def problems(text):
    """The problems the check finds in a template given as YAML text."""
    return check_iam.check_template(check_iam.load(text))


def function(*statements, exceptions=""):
    """A template with one function whose one inline policy holds these statements (YAML)."""
    body = "".join(f"            - {s}\n" for s in statements)
    return (
        "Resources:\n"
        "  Fn:\n"
        "    Type: AWS::Serverless::Function\n"
        f"{exceptions}"
        "    Properties:\n"
        "      Policies:\n"
        "        - Statement:\n"
        f"{body}"
    )


def resource_policy(kind, key, statement, extra=""):
    return (
        "Resources:\n"
        "  Policy:\n"
        f"    Type: {kind}\n"
        "    Properties:\n"
        f"{extra}"
        f"      {key}:\n"
        "        Version: '2012-10-17'\n"
        "        Statement:\n"
        f"          - {statement}\n"
    )


PAYLOADS = (
    "    Metadata:\n"
    "      IamExceptions:\n"
    "        - resource: /payloads/*\n"
    "          reason: content-addressed keys\n"
)


class NotActionNotResource(unittest.TestCase):
    def assertRefusedFor(self, element, text):
        """The check of template `text` finds a problem naming `element`."""
        found = problems(text)
        self.assertTrue(any(element in p for p in found), found)

    def test_allow_with_not_action_is_refused(self):
        self.assertRefusedFor("NotAction", function("{Effect: Allow, NotAction: iam:*, Resource: !GetAtt T.Arn}"))

    def test_allow_with_not_resource_is_refused(self):
        self.assertRefusedFor("NotResource", function(
            "{Effect: Allow, Action: sqs:SendMessage, NotResource: !GetAtt Q.Arn}"))

    def test_allow_with_not_principal_is_refused(self):
        self.assertRefusedFor("NotPrincipal", resource_policy(
            "AWS::SQS::QueuePolicy", "PolicyDocument",
            "{Effect: Allow, NotPrincipal: {AWS: '123456789012'}, Action: sqs:SendMessage, "
            "Resource: !GetAtt Q.Arn}"))

    def test_deny_with_not_action_or_not_resource_passes(self):
        self.assertEqual(problems(function(
            "{Effect: Allow, Action: sqs:SendMessage, Resource: !GetAtt Q.Arn}",
            "{Effect: Deny, NotAction: sqs:SendMessage, Resource: !GetAtt Q.Arn}",
            "{Effect: Deny, Action: sqs:*, NotResource: !GetAtt Q.Arn}",
        )), [])

    def test_not_action_in_a_resource_policy_is_refused(self):
        self.assertRefusedFor("NotAction", resource_policy(
            "AWS::S3::BucketPolicy", "PolicyDocument",
            "{Effect: Allow, Principal: {AWS: '123456789012'}, NotAction: s3:DeleteObject, "
            "Resource: !Sub '${B.Arn}/x'}"))


class Wildcards(unittest.TestCase):
    def test_star_and_question_mark_in_actions_are_refused(self):
        for action in ("sqs:*", "sqs:Send*", "sqs:SendMessag?", "s3:?etObject"):
            with self.subTest(action=action):
                found = problems(function(f"{{Effect: Allow, Action: '{action}', Resource: !GetAtt Q.Arn}}"))
                self.assertEqual(found, [f"Fn: Action {action!r} has a wildcard"])

    def test_star_and_question_mark_in_resources_are_refused(self):
        for resource in ("*", "arn:aws:sqs:us-east-1:1:queue-?", "arn:aws:s3:::b/other/*"):
            with self.subTest(resource=resource):
                found = problems(function(f"{{Effect: Allow, Action: s3:GetObject, Resource: '{resource}'}}"))
                self.assertEqual(found, [f"Fn: Resource {resource!r} has a wildcard"])

    def test_question_mark_inside_a_sub_is_refused(self):
        found = problems(function("{Effect: Allow, Action: s3:GetObject, Resource: !Sub '${B.Arn}/payload?/x'}"))
        self.assertEqual(len(found), 1, found)

    def test_documented_resource_exception_passes(self):
        self.assertEqual(problems(function(
            "{Effect: Allow, Action: [s3:GetObject, s3:PutObject], Resource: !Sub '${B.Arn}/payloads/*'}",
            exceptions=PAYLOADS)), [])
        # The worker stack's form: the ARN through a !Sub with a variable map.
        self.assertEqual(problems(function(
            "{Effect: Allow, Action: s3:GetObject, Resource: !Sub ['arn:${AWS::Partition}:s3:::${B}/payloads/*', "
            "{B: {'Fn::ImportValue': !Sub '${Stack}-Bucket'}}]}",
            exceptions=PAYLOADS)), [])

    def test_exception_does_not_cover_other_wildcards(self):
        for resource in ("arn:aws:s3:::*/payloads/*", "arn:aws:s3:::b?/payloads/*", "arn:aws:s3:::b/payloads/?"):
            with self.subTest(resource=resource):
                found = problems(function(
                    f"{{Effect: Allow, Action: s3:GetObject, Resource: '{resource}'}}", exceptions=PAYLOADS))
                self.assertEqual(found, [f"Fn: Resource {resource!r} has a wildcard"])

    def test_resource_exception_does_not_cover_actions(self):
        found = problems(function("{Effect: Allow, Action: 's3:*', Resource: !Sub '${B.Arn}/payloads/*'}",
                                  exceptions=PAYLOADS.replace("/payloads/*", "'*'")))
        self.assertEqual(found, ["Fn: Action 's3:*' has a wildcard"])

    def test_documented_action_exception_passes(self):
        exceptions = (
            "    Metadata:\n"
            "      IamExceptions:\n"
            "        - action: xray:Put*\n"
            "          reason: the X-Ray daemon's calls\n"
        )
        self.assertEqual(problems(function(
            "{Effect: Allow, Action: xray:Put*, Resource: !GetAtt Q.Arn}", exceptions=exceptions)), [])
        without_reason = exceptions.replace("          reason: the X-Ray daemon's calls\n", "")
        self.assertEqual(len(problems(function(
            "{Effect: Allow, Action: xray:Put*, Resource: !GetAtt Q.Arn}", exceptions=without_reason))), 1)

    def test_wildcards_in_deny_and_conditions_pass(self):
        self.assertEqual(problems(function(
            "{Effect: Allow, Action: dynamodb:PutItem, Resource: !GetAtt T.Arn, "
            "Condition: {'ForAllValues:StringLike': {'dynamodb:LeadingKeys': ['workers#*']}}}",
            "{Effect: Deny, Action: 's3:*', Resource: '*'}",
        )), [])

    def test_allow_without_resource_is_refused(self):
        self.assertEqual(problems(function("{Effect: Allow, Action: sqs:SendMessage}")),
                         ["Fn: an Allow statement without a Resource"])


class ResourcePolicies(unittest.TestCase):
    GOOD = ("{Effect: Allow, Principal: {AWS: !GetAtt Role.Arn}, Action: s3:GetObject, "
            "Resource: !Sub '${B.Arn}/x'}")
    WIDE = ("{Effect: Allow, Principal: {AWS: !GetAtt Role.Arn}, Action: 's3:*', "
            "Resource: !Sub '${B.Arn}/x'}")

    def each_kind(self):
        yield "AWS::S3::BucketPolicy", "PolicyDocument", "      Bucket: !Ref B\n"
        yield "AWS::SQS::QueuePolicy", "PolicyDocument", "      Queues: [!Ref Q]\n"
        yield "AWS::SNS::TopicPolicy", "PolicyDocument", "      Topics: [!Ref T]\n"
        yield "AWS::SecretsManager::ResourcePolicy", "ResourcePolicy", "      SecretId: !Ref S\n"

    def test_each_kind_is_checked(self):
        for kind, key, extra in self.each_kind():
            with self.subTest(kind=kind):
                self.assertEqual(problems(resource_policy(kind, key, self.GOOD, extra)), [])
                self.assertEqual(problems(resource_policy(kind, key, self.WIDE, extra)),
                                 ["Policy: Action 's3:*' has a wildcard"])

    def test_allow_to_everyone_without_condition_is_refused(self):
        for principal in ("'*'", "{AWS: '*'}", "{AWS: ['123456789012', '*']}"):
            for kind, key, extra in self.each_kind():
                with self.subTest(kind=kind, principal=principal):
                    statement = (f"{{Effect: Allow, Principal: {principal}, Action: s3:GetObject, "
                                 "Resource: !Sub '${B.Arn}/x'}")
                    self.assertEqual(problems(resource_policy(kind, key, statement, extra)),
                                     ["Policy: an Allow to every principal without a Condition"])

    def test_allow_to_everyone_with_condition_passes(self):
        statement = ("{Effect: Allow, Principal: '*', Action: sqs:SendMessage, Resource: !GetAtt Q.Arn, "
                     "Condition: {ArnEquals: {'aws:SourceArn': !GetAtt Rule.Arn}}}")
        self.assertEqual(problems(resource_policy("AWS::SQS::QueuePolicy", "PolicyDocument", statement)), [])

    def test_allow_to_a_service_passes(self):
        statement = ("{Effect: Allow, Principal: {Service: events.amazonaws.com}, Action: sqs:SendMessage, "
                     "Resource: !GetAtt Q.Arn, Condition: {ArnEquals: {'aws:SourceArn': !GetAtt Rule.Arn}}}")
        self.assertEqual(problems(resource_policy("AWS::SQS::QueuePolicy", "PolicyDocument", statement)), [])

    def test_deny_to_everyone_passes(self):
        # The project's secret policy: deny everyone but the coordinator's roles.
        statement = ("{Effect: Deny, Principal: '*', Action: secretsmanager:GetSecretValue, Resource: '*', "
                     "Condition: {ArnNotEquals: {'aws:PrincipalArn': [!GetAtt A.Arn]}}}")
        self.assertEqual(problems(resource_policy(
            "AWS::SecretsManager::ResourcePolicy", "ResourcePolicy", statement)), [])
        statement = "{Effect: Deny, Principal: {AWS: '*'}, Action: 's3:*', Resource: '*'}"
        self.assertEqual(problems(resource_policy("AWS::S3::BucketPolicy", "PolicyDocument", statement)), [])

    def test_secret_policy_resource_star_needs_an_exception(self):
        statement = "{Effect: Allow, Principal: {AWS: !GetAtt R.Arn}, Action: secretsmanager:GetSecretValue, Resource: '*'}"
        text = resource_policy("AWS::SecretsManager::ResourcePolicy", "ResourcePolicy", statement)
        self.assertEqual(problems(text), ["Policy: Resource '*' has a wildcard"])
        documented = text.replace(
            "    Properties:\n",
            "    Metadata:\n      IamExceptions:\n        - resource: '*'\n"
            "          reason: in a secret's policy, * is that secret\n    Properties:\n")
        self.assertEqual(problems(documented), [])

    def test_policy_document_as_json_text(self):
        document = json.dumps({"Statement": [{"Effect": "Allow", "Principal": "*", "Action": "s3:GetObject",
                                              "Resource": "arn:aws:s3:::b/x"}]})
        template = {"Resources": {"Policy": {"Type": "AWS::S3::BucketPolicy",
                                             "Properties": {"PolicyDocument": document}}}}
        self.assertEqual(check_iam.check_template(template),
                         ["Policy: an Allow to every principal without a Condition"])

    def test_unreadable_documents_are_refused(self):
        for document in ({"Fn::If": ["C", {}, {}]}, "not json", None):
            with self.subTest(document=document):
                template = {"Resources": {"P": {"Type": "AWS::S3::BucketPolicy",
                                                "Properties": {"PolicyDocument": document}}}}
                self.assertEqual(len(check_iam.check_template(template)), 1)


class EventBusPolicies(unittest.TestCase):
    def bus(self, props):
        return {"Resources": {"BusPolicy": {"Type": "AWS::Events::EventBusPolicy",
                                            "Properties": {"EventBusName": "bus", "StatementId": "s", **props}}}}

    GOOD = {"Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::123456789012:root"},
            "Action": "events:PutEvents", "Resource": "arn:aws:events:us-east-1:1:event-bus/bus"}

    def test_statement_form(self):
        self.assertEqual(check_iam.check_template(self.bus({"Statement": self.GOOD})), [])
        wide = {**self.GOOD, "Action": "events:*"}
        self.assertEqual(check_iam.check_template(self.bus({"Statement": wide})),
                         ["BusPolicy: Action 'events:*' has a wildcard"])
        everyone = {**self.GOOD, "Principal": "*"}
        self.assertEqual(check_iam.check_template(self.bus({"Statement": everyone})),
                         ["BusPolicy: an Allow to every principal without a Condition"])
        not_action = {k: v for k, v in self.GOOD.items() if k != "Action"} | {"NotAction": "events:PutRule"}
        self.assertTrue(check_iam.check_template(self.bus({"Statement": not_action})))

    def test_policy_form(self):
        for policy in ({"Version": "2012-10-17", "Statement": [self.GOOD]},
                       json.dumps({"Version": "2012-10-17", "Statement": [self.GOOD]})):
            self.assertEqual(check_iam.check_template(self.bus({"Policy": policy})), [])
        everyone = {"Statement": [{**self.GOOD, "Principal": {"AWS": "*"}}]}
        self.assertEqual(check_iam.check_template(self.bus({"Policy": everyone})),
                         ["BusPolicy: an Allow to every principal without a Condition"])

    def test_legacy_form(self):
        self.assertEqual(check_iam.check_template(self.bus(
            {"Action": "events:PutEvents", "Principal": "123456789012"})), [])
        self.assertEqual(check_iam.check_template(self.bus({"Action": "events:PutEvents", "Principal": "*"})),
                         ["BusPolicy: an Allow to every principal without a Condition"])
        condition = {"Type": "StringEquals", "Key": "aws:PrincipalOrgID", "Value": "o-1"}
        self.assertEqual(check_iam.check_template(self.bus(
            {"Action": "events:PutEvents", "Principal": "*", "Condition": condition})), [])


class Functions(unittest.TestCase):
    def test_scoped_templates_pass_and_broad_ones_are_refused(self):
        text = (
            "Resources:\n  Fn:\n    Type: AWS::Serverless::Function\n    Properties:\n      Policies:\n"
            "        - SQSSendMessagePolicy: {QueueName: !GetAtt Q.QueueName}\n"
            "        - SQSPollerPolicy: {QueueName: !GetAtt Q.QueueName}\n"
            "        - EventBridgePutEventsPolicy: {EventBusName: !Ref Bus}\n"
        )
        self.assertEqual(problems(text), [])
        self.assertEqual(problems(text + "        - DynamoDBCrudPolicy: {TableName: !Ref T}\n"),
                         ["Fn: policy template DynamoDBCrudPolicy grants more than the function uses"])
        self.assertEqual(problems(text + "        - AmazonS3FullAccess\n"),
                         ["Fn: managed policy 'AmazonS3FullAccess' (name its actions instead)"])

    def test_policies_as_one_document_or_one_name(self):
        one_document = {"Resources": {"Fn": {"Type": "AWS::Serverless::Function", "Properties": {
            "Policies": {"Statement": {"Effect": "Allow", "NotAction": "iam:*", "Resource": "arn:x"}}}}}}
        self.assertTrue(any("NotAction" in p for p in check_iam.check_template(one_document)))
        one_name = {"Resources": {"Fn": {"Type": "AWS::Serverless::Function", "Properties": {
            "Policies": "AdministratorAccess"}}}}
        self.assertEqual(check_iam.check_template(one_name),
                         ["Fn: managed policy 'AdministratorAccess' (name its actions instead)"])

    def test_statements_under_an_if_are_checked(self):
        text = function("!If [Cond, {Effect: Allow, Action: 'sqs:*', Resource: !GetAtt Q.Arn}, !Ref AWS::NoValue]")
        self.assertEqual(problems(text), ["Fn: Action 'sqs:*' has a wildcard"])
        text = function("!If [Cond, {Effect: Allow, Action: sqs:SendMessage, Resource: !GetAtt Q.Arn}, "
                        "!Ref AWS::NoValue]")
        self.assertEqual(problems(text), [])

    def test_a_statement_without_effect_is_refused(self):
        self.assertEqual(len(problems(function("{Action: 'sqs:*', Resource: '*'}"))), 1)

    def test_external_role_is_refused(self):
        text = "Resources:\n  Fn:\n    Type: AWS::Serverless::Function\n    Properties:\n      Role: !GetAtt R.Arn\n"
        self.assertEqual(problems(text), ["Fn: an external Role cannot be checked"])


class IamResources(unittest.TestCase):
    def test_policy_and_managed_policy(self):
        for kind in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy", "AWS::IAM::RolePolicy"):
            with self.subTest(kind=kind):
                good = ("{Effect: Allow, Action: sqs:SendMessage, Resource: !GetAtt Q.Arn}")
                self.assertEqual(problems(resource_policy(kind, "PolicyDocument", good)), [])
                bad = "{Effect: Allow, NotAction: iam:*, NotResource: !GetAtt Q.Arn}"
                found = problems(resource_policy(kind, "PolicyDocument", bad))
                self.assertTrue(any("NotAction" in p for p in found) and any("NotResource" in p for p in found),
                                found)

    def test_role(self):
        role = {"Type": "AWS::IAM::Role", "Properties": {
            "AssumeRolePolicyDocument": {"Statement": [{
                "Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}, "Action": "sts:AssumeRole"}]},
            "Policies": [{"PolicyName": "p", "PolicyDocument": {"Statement": [{
                "Effect": "Allow", "Action": "sqs:SendMessage", "Resource": "arn:aws:sqs:us-east-1:1:q"}]}}]}}
        self.assertEqual(check_iam.check_template({"Resources": {"Role": role}}), [])
        role["Properties"]["Policies"][0]["PolicyDocument"]["Statement"][0]["Action"] = "sqs:Send?essage"
        role["Properties"]["AssumeRolePolicyDocument"]["Statement"][0]["Principal"] = {"AWS": "*"}
        role["Properties"]["ManagedPolicyArns"] = ["arn:aws:iam::aws:policy/AdministratorAccess"]
        self.assertEqual(sorted(check_iam.check_template({"Resources": {"Role": role}})), sorted([
            "Role p: Action 'sqs:Send?essage' has a wildcard",
            "Role: an Allow to every principal without a Condition",
            "Role: managed policy 'arn:aws:iam::aws:policy/AdministratorAccess' (name its actions instead)",
        ]))


class ProjectTemplates(unittest.TestCase):
    """The templates CI checks pass; the refused fixture is refused (as infra/check-template.sh runs)."""

    def test_project_template_passes(self):
        with open(ROOT / "template.yaml") as f:
            self.assertEqual(check_iam.check_template(check_iam.load(f)), [])

    def test_worker_stack_template_passes(self):
        # Rendered as `stepline init` fills it (infra/cli/src/init.rs).
        text = (ROOT / "infra/cli/templates/template.yaml").read_text()
        for lang, runtime, handler in (("python", "python3.12", "worker.handler"),
                                       ("rust", "provided.al2023", "bootstrap")):
            with self.subTest(lang=lang):
                filled = (text.replace("{{name}}", f"shop-{lang}").replace("{{runtime}}", runtime)
                          .replace("{{handler}}", handler))
                self.assertEqual(check_iam.check_template(check_iam.load(filled)), [])

    def test_cli_refuses_the_fixture_and_accepts_the_template(self):
        refused = subprocess.run([sys.executable, str(HERE / "check-iam.py"), "infra/testdata/wildcard-policy.yaml"],
                                 cwd=ROOT, capture_output=True, text=True)
        self.assertEqual(refused.returncode, 1, refused.stdout)
        self.assertIn("least privilege: 3 problem(s)", refused.stdout)
        accepted = subprocess.run([sys.executable, str(HERE / "check-iam.py"), "template.yaml"],
                                  cwd=ROOT, capture_output=True, text=True)
        self.assertEqual(accepted.returncode, 0, accepted.stdout)


if __name__ == "__main__":
    unittest.main()
