use super::*;

const ACCOUNT: &str = "123456789012";
const ROLE: &str = "arn:aws:iam::123456789012:role/fn";

fn accounts() -> Accounts {
    Accounts::single("aws", "us-east-1", ACCOUNT)
}

fn principal(identity: Json) -> Principal {
    with_resource_policy(identity, Vec::new())
}

fn with_resource_policy(identity: Json, resources: Vec<ResourceDocument>) -> Principal {
    Principal::new(
        "Fn",
        ROLE,
        ACCOUNT,
        vec![Document {
            name: "inline".into(),
            document: identity,
        }],
        resources,
    )
    .unwrap()
}

fn context(pairs: &[(&str, &[&str])]) -> Context {
    let mut context = Context::default();
    for (key, values) in pairs {
        context.set_all(key, values.iter().map(|v| v.to_string()));
    }
    context
}

/// Whether a statement with `condition` allows a request with `pairs` in its context.
fn condition(condition: Json, pairs: &[(&str, &[&str])]) -> Result<bool, String> {
    let principal = principal(json!({"Statement": [{
        "Effect": "Allow", "Action": "s3:GetObject", "Resource": "*", "Condition": condition,
    }]}));
    let request = Request::new("s3:GetObject", "arn:aws:s3:::b/k", context(pairs));
    evaluate(&principal, &request).map(|d| d == Decision::Allowed)
}

fn signed(service: &str, target: Option<&str>, body: Json) -> HttpCall {
    call(service, target, "POST", "http://127.0.0.1:5055/", &[], body)
}

fn call(
    service: &str,
    target: Option<&str>,
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
    body: Json,
) -> HttpCall {
    let mut all = BTreeMap::from([(
        "authorization".to_string(),
        format!(
            "AWS4-HMAC-SHA256 Credential=test/20261201/us-east-1/{service}/aws4_request, \
             SignedHeaders=host, Signature=00"
        ),
    )]);
    if let Some(target) = target {
        all.insert("x-amz-target".into(), target.into());
    }
    for (k, v) in headers {
        all.insert(k.to_ascii_lowercase(), v.to_string());
    }
    HttpCall {
        method: method.into(),
        uri: uri.into(),
        headers: all,
        body: if body.is_null() {
            Vec::new()
        } else {
            body.to_string().into_bytes()
        },
    }
}

/// A catalog with table `t` (hash `pk`, index `by-shard` on `shard`), table `u` (hash `id`),
/// queue `q` and bucket `b`.
fn catalog() -> Catalog {
    Catalog {
        accounts: accounts(),
        queues: BTreeMap::from([(
            "http://127.0.0.1:5055/123456789012/q".to_string(),
            "arn:aws:sqs:us-east-1:123456789012:q".to_string(),
        )]),
        tables: BTreeMap::from([
            (
                "t".to_string(),
                TableKeys {
                    hash: "pk".into(),
                    indexes: BTreeMap::from([("by-shard".to_string(), "shard".to_string())]),
                },
            ),
            (
                "u".to_string(),
                TableKeys {
                    hash: "id".into(),
                    indexes: BTreeMap::new(),
                },
            ),
        ]),
        buckets: BTreeSet::from(["b".to_string()]),
        secrets: BTreeMap::from([(
            "known".to_string(),
            "arn:aws:secretsmanager:us-east-1:123456789012:secret:known-Zz9Yy8".to_string(),
        )]),
    }
}

fn dynamodb_requests(operation: &str, body: Json) -> Vec<Request> {
    let target = format!("DynamoDB_20120810.{operation}");
    requests_of(&signed("dynamodb", Some(&target), body), &catalog()).unwrap()
}

fn leading_keys(request: &Request) -> Vec<String> {
    request
        .context
        .get("dynamodb:leadingkeys")
        .unwrap()
        .map(<[String]>::to_vec)
        .unwrap_or_default()
}

#[test]
fn globs_match_as_iam_does() {
    assert!(glob("sqs:SendMessage*", "sqs:SendMessageBatch", false));
    assert!(glob("sqs:sendmessage*", "sqs:SendMessage", true));
    assert!(!glob("sqs:sendmessage*", "sqs:SendMessage", false));
    assert!(glob("a?c*", "abcdef", false));
    assert!(!glob("a?c", "ac", false));
    // A pattern's `*` stays a wildcard where the text has a `*` of its own.
    assert!(glob("a*", "a*b", false));
    assert!(glob("arn:aws:s3:::b/*", "arn:aws:s3:::b/*/k", false));
    assert!(glob("*", "", false));
    assert!(glob(
        "arn:aws:s3:::b/payloads/*",
        "arn:aws:s3:::b/payloads/x/y",
        false
    ));
    assert!(!glob(
        "arn:aws:s3:::b/payloads/*",
        "arn:aws:s3:::b/other",
        false
    ));
    assert!(glob("*a*b*", "xxaxxbxx", false));
    assert!(arn_like(
        "arn:aws:sqs:*:*:q-*",
        "arn:aws:sqs:us-east-1:1:q-1"
    ));
    assert!(!arn_like(
        "arn:aws:sqs:*:*:q-*",
        "arn:aws:sns:us-east-1:1:q-1"
    ));
    assert!(!arn_like("arn:aws:sqs:*", "arn:aws:sqs:us-east-1:1:q"));
}

/// Asserts what a statement with `condition` decides for each set of values of `key` in `cases`.
fn decides(condition_: &Json, key: &str, cases: &[(&[&str], bool)]) {
    for (values, expected) in cases {
        let decided = condition(condition_.clone(), &[(key, values)]);
        assert_eq!(decided, Ok(*expected), "{condition_} with {key}={values:?}");
    }
}

#[test]
fn string_operators() {
    let equals = json!({"StringEquals": {"s3:prefix": ["a", "b"]}});
    // Absent: a positive operator fails; not modelled: an error.
    decides(
        &equals,
        "s3:prefix",
        &[(&["b"], true), (&["c"], false), (&[], false)],
    );
    assert!(condition(equals, &[]).unwrap_err().contains("not modelled"));
    let not_equals = json!({"StringNotEquals": {"s3:prefix": "a"}});
    // Absent: a negated operator holds.
    decides(
        &not_equals,
        "s3:prefix",
        &[(&["a"], false), (&["z"], true), (&[], true)],
    );
    let ignore_case = json!({"StringEqualsIgnoreCase": {"s3:prefix": "ABC"}});
    decides(&ignore_case, "s3:prefix", &[(&["abc"], true)]);
    let like = json!({"StringLike": {"s3:prefix": "pay*/x?"}});
    decides(
        &like,
        "s3:prefix",
        &[(&["payloads/x1"], true), (&["payloads/y1"], false)],
    );
    let not_like = json!({"StringNotLike": {"s3:prefix": "pay*"}});
    decides(&not_like, "s3:prefix", &[(&["payloads"], false)]);
}

#[test]
fn bool_null_arn_and_numeric_operators() {
    let tls = json!({"Bool": {"aws:SecureTransport": "false"}});
    let cases: &[(&[&str], bool)] = &[(&["true"], false), (&["FALSE"], true), (&[], false)];
    decides(&tls, "aws:SecureTransport", cases);
    let bad = json!({"Bool": {"aws:SecureTransport": "maybe"}});
    assert!(condition(bad, &[("aws:SecureTransport", &["true"])]).is_err());

    let null = json!({"Null": {"s3:if-none-match": "true"}});
    decides(&null, "s3:if-none-match", &[(&[], true), (&["*"], false)]);
    let present = json!({"Null": {"s3:if-none-match": "false"}});
    decides(&present, "s3:if-none-match", &[(&["*"], true)]);

    let source = "arn:aws:events:us-east-1:1:rule/stepline-t-start";
    let arn_equals = json!({"ArnEquals": {"aws:SourceArn": source}});
    decides(&arn_equals, "aws:SourceArn", &[(&[source], true)]);
    let arn_like = json!({"ArnLike": {"aws:SourceArn": "arn:aws:events:*:1:rule/*"}});
    let cases: &[(&[&str], bool)] = &[(&[source], true), (&["arn:aws:sns:x:1:rule/a"], false)];
    decides(&arn_like, "aws:SourceArn", cases);
    let arn_not = json!({"ArnNotLike": {"aws:SourceArn": "arn:aws:events:*:1:rule/*"}});
    decides(&arn_not, "aws:SourceArn", &[(&[], true)]);

    let numeric = json!({"NumericLessThanEquals": {"s3:max-keys": "10"}});
    decides(
        &numeric,
        "s3:max-keys",
        &[(&["10"], true), (&["11"], false)],
    );
}

#[test]
fn if_exists_holds_for_an_absent_key_only() {
    let equals = json!({"StringEqualsIfExists": {"s3:prefix": "a"}});
    decides(
        &equals,
        "s3:prefix",
        &[(&[], true), (&["a"], true), (&["b"], false)],
    );
}

#[test]
fn set_qualifiers_follow_aws() {
    let all = json!({"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": ["coordinator"]}});
    let key = "dynamodb:LeadingKeys";
    let both: &[&str] = &["coordinator", "pipeline#a"];
    // ForAllValues holds for an absent key or an empty set.
    decides(
        &all,
        key,
        &[(&["coordinator"], true), (both, false), (&[], true)],
    );
    let any = json!({"ForAnyValue:StringLike": {"dynamodb:LeadingKeys": ["pipeline#*"]}});
    // ForAnyValue fails for an absent key.
    decides(
        &any,
        key,
        &[(both, true), (&["coordinator"], false), (&[], false)],
    );
    // A multivalued key without a qualifier is an error, not a guess.
    let plain = json!({"StringEquals": {"dynamodb:LeadingKeys": ["coordinator"]}});
    assert!(condition(plain, &[(key, &["coordinator"])]).is_err());
}

#[test]
fn what_is_not_implemented_fails_closed() {
    let date = json!({"DateLessThan": {"aws:CurrentTime": "2030-01-01T00:00:00Z"}});
    let error = condition(date, &[("aws:CurrentTime", &["2026-01-01T00:00:00Z"])]);
    assert!(error.unwrap_err().contains("not implemented"));
    // A key the request does not model.
    let ip = json!({"StringEquals": {"aws:SourceVpce": "vpce-1"}});
    assert!(condition(ip, &[]).unwrap_err().contains("not modelled"));
    // An allow elsewhere does not hide the error.
    let principal = principal(json!({"Statement": [
        {"Effect": "Allow", "Action": "*", "Resource": "*"},
        {"Effect": "Allow", "Action": "*", "Resource": "*",
         "Condition": {"IpAddress": {"aws:SourceIp": "10.0.0.0/8"}}},
    ]}));
    let request = Request::new("s3:GetObject", "arn:aws:s3:::b/k", Context::default());
    assert!(evaluate(&principal, &request).is_err());
    // Elements and policy variables not supported.
    let unknown = Principal::new(
        "Fn",
        ROLE,
        ACCOUNT,
        vec![Document {
            name: "p".into(),
            document: json!({"Statement": [{"Effect": "Allow", "Action": "*",
                "Resource": "arn:aws:s3:::b/${aws:username}/*"}]}),
        }],
        Vec::new(),
    );
    assert!(unknown
        .unwrap_err()
        .to_string()
        .contains("policy variables"));
}

#[test]
fn an_explicit_deny_beats_any_allow() {
    let request = Request::new(
        "sqs:SendMessage",
        "arn:aws:sqs:us-east-1:1:q",
        Context::default(),
    );
    let allow_only =
        principal(json!({"Statement": {"Effect": "Allow", "Action": "sqs:*", "Resource": "*"}}));
    assert_eq!(evaluate(&allow_only, &request), Ok(Decision::Allowed));
    let both = principal(json!({"Statement": [
        {"Effect": "Allow", "Action": "sqs:*", "Resource": "*"},
        {"Sid": "NoQ", "Effect": "Deny", "Action": "sqs:SendMessage", "Resource": "arn:aws:sqs:*:*:q"},
    ]}));
    assert_eq!(
        evaluate(&both, &request),
        Ok(Decision::ExplicitDeny {
            policy: "inline".into(),
            statement: "NoQ".into()
        })
    );
    let none = principal(json!({"Statement": []}));
    assert_eq!(evaluate(&none, &request), Ok(Decision::ImplicitDeny));
    // NotAction / NotResource.
    let not = principal(json!({"Statement": [
        {"Effect": "Allow", "NotAction": "sqs:DeleteQueue", "NotResource": "arn:aws:sqs:*:*:other"},
    ]}));
    assert_eq!(evaluate(&not, &request), Ok(Decision::Allowed));
    let delete = Request::new(
        "sqs:DeleteQueue",
        "arn:aws:sqs:us-east-1:1:q",
        Context::default(),
    );
    assert_eq!(evaluate(&not, &delete), Ok(Decision::ImplicitDeny));
}

#[test]
fn a_resource_policy_allows_or_denies_only_what_it_governs_and_whom_it_names() {
    let object = |context| Request::new("s3:GetObject", "arn:aws:s3:::b/k", context);
    let bucket = |statement: Json| ResourceDocument {
        name: "BucketPolicy".into(),
        governs: vec!["arn:aws:s3:::b".into(), "arn:aws:s3:::b/*".into()],
        document: json!({ "Statement": [statement] }),
    };
    let nothing = json!({"Statement": []});
    // Same account: a resource policy naming the role allows without an identity statement.
    let allows = with_resource_policy(
        nothing.clone(),
        vec![bucket(
            json!({"Effect": "Allow", "Principal": {"AWS": ROLE},
            "Action": "s3:GetObject", "Resource": "arn:aws:s3:::b/*"}),
        )],
    );
    assert_eq!(
        evaluate(&allows, &object(Context::default())),
        Ok(Decision::Allowed)
    );
    // A statement for a service does not cover the function.
    let service = with_resource_policy(
        nothing,
        vec![bucket(
            json!({"Effect": "Allow", "Principal": {"Service": "events.amazonaws.com"},
            "Action": "s3:GetObject", "Resource": "arn:aws:s3:::b/*"}),
        )],
    );
    assert_eq!(
        evaluate(&service, &object(Context::default())),
        Ok(Decision::ImplicitDeny)
    );
    // An Allow to the account delegates to it: the role's own policies must allow as well.
    for principal in [
        json!(ACCOUNT),
        json!(format!("arn:aws:iam::{ACCOUNT}:root")),
    ] {
        let statement = json!({"Effect": "Allow", "Principal": {"AWS": principal},
            "Action": "s3:GetObject", "Resource": "arn:aws:s3:::b/*"});
        let delegated =
            with_resource_policy(json!({"Statement": []}), vec![bucket(statement.clone())]);
        assert_eq!(
            evaluate(&delegated, &object(Context::default())),
            Ok(Decision::ImplicitDeny),
            "{principal}"
        );
        let granted = with_resource_policy(
            json!({"Statement": [{"Effect": "Allow", "Action": "s3:GetObject", "Resource": "*"}]}),
            vec![bucket(statement)],
        );
        assert_eq!(
            evaluate(&granted, &object(Context::default())),
            Ok(Decision::Allowed)
        );
    }
    // The account principal's Deny applies to the role, despite the identity Allow.
    let denies = with_resource_policy(
        json!({"Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}),
        vec![bucket(
            json!({"Effect": "Deny", "Principal": {"AWS": ACCOUNT},
            "Action": "s3:*", "Resource": "arn:aws:s3:::b/*",
            "Condition": {"Bool": {"aws:SecureTransport": "false"}}}),
        )],
    );
    let mut plain_http = Context::default();
    plain_http.set("aws:SecureTransport", "false");
    assert!(matches!(
        evaluate(&denies, &object(plain_http)),
        Ok(Decision::ExplicitDeny { .. })
    ));
    // Another bucket is not governed by it.
    let mut other = object(Context::default());
    other.resource = "arn:aws:s3:::c/k".into();
    other.context.set("aws:SecureTransport", "false");
    assert_eq!(evaluate(&denies, &other), Ok(Decision::Allowed));
}

#[test]
fn sam_policy_templates_expand_as_sam_does() {
    let queue = json!({"QueueName": "q"});
    let send = sam_policy_template("SQSSendMessagePolicy", &queue, &accounts()).unwrap();
    let poll = sam_policy_template("SQSPollerPolicy", &queue, &accounts()).unwrap();
    let bus = json!({"EventBusName": "stepline-t"});
    let events = sam_policy_template("EventBridgePutEventsPolicy", &bus, &accounts()).unwrap();
    let of = |document: Json| {
        Principal::new(
            "Fn",
            ROLE,
            ACCOUNT,
            vec![Document {
                name: "sam".into(),
                document,
            }],
            Vec::new(),
        )
        .unwrap()
    };
    let decide = |principal: &Principal, action: &str, resource: &str| {
        evaluate(
            principal,
            &Request::new(action, resource, Context::default()),
        )
        .unwrap()
    };
    let q = "arn:aws:sqs:us-east-1:123456789012:q";
    let (send, poll, events) = (of(send), of(poll), of(events));
    assert_eq!(decide(&send, "sqs:SendMessage", q), Decision::Allowed);
    assert_eq!(
        decide(&send, "sqs:ReceiveMessage", q),
        Decision::ImplicitDeny
    );
    assert_eq!(
        decide(
            &send,
            "sqs:SendMessage",
            "arn:aws:sqs:us-east-1:123456789012:q2"
        ),
        Decision::ImplicitDeny
    );
    for action in [
        "sqs:ReceiveMessage",
        "sqs:DeleteMessage",
        "sqs:ChangeMessageVisibility",
        "sqs:GetQueueAttributes",
    ] {
        assert_eq!(decide(&poll, action, q), Decision::Allowed, "{action}");
    }
    assert_eq!(decide(&poll, "sqs:SendMessage", q), Decision::ImplicitDeny);
    let bus_arn = "arn:aws:events:us-east-1:123456789012:event-bus/stepline-t";
    assert_eq!(
        decide(&events, "events:PutEvents", bus_arn),
        Decision::Allowed
    );
    let default_bus = "arn:aws:events:us-east-1:123456789012:event-bus/default";
    assert_eq!(
        decide(&events, "events:PutEvents", default_bus),
        Decision::ImplicitDeny
    );

    let arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:s-AbCdEf";
    let secret = sam_policy_template(
        "AWSSecretsManagerGetSecretValuePolicy",
        &json!({ "SecretArn": arn }),
        &accounts(),
    )
    .unwrap();
    let secret = of(secret);
    assert_eq!(
        decide(&secret, "secretsmanager:GetSecretValue", arn),
        Decision::Allowed
    );
    assert_eq!(
        decide(&secret, "secretsmanager:PutSecretValue", arn),
        Decision::ImplicitDeny
    );

    let unknown = sam_policy_template(
        "DynamoDBCrudPolicy",
        &json!({"TableName": "t"}),
        &accounts(),
    );
    assert!(unknown.unwrap_err().to_string().contains("not known"));
    let wrong = sam_policy_template("SQSPollerPolicy", &json!({"Queue": "q"}), &accounts());
    assert!(wrong.is_err());
}

#[test]
fn leading_keys_come_from_the_request_bodies() {
    let get = dynamodb_requests(
        "GetItem",
        json!({"TableName": "t", "Key": {"pk": {"S": "coordinator"}, "sk": {"S": "key#seal"}}}),
    );
    assert_eq!(get.len(), 1);
    assert_eq!(get[0].action, "dynamodb:GetItem");
    assert_eq!(get[0].resource, arn("dynamodb", "table/t"));
    assert_eq!(leading_keys(&get[0]), ["coordinator"]);

    let put = dynamodb_requests(
        "PutItem",
        json!({"TableName": "t", "Item": {"pk": {"S": "pipeline#orders"}, "body": {"S": "{}"}}}),
    );
    assert_eq!(put[0].action, "dynamodb:PutItem");
    assert_eq!(leading_keys(&put[0]), ["pipeline#orders"]);

    let query = dynamodb_requests(
        "Query",
        json!({"TableName": "t",
            "KeyConditionExpression": "#p = :pk AND begins_with(sk, :prefix)",
            "ExpressionAttributeNames": {"#p": "pk"},
            "ExpressionAttributeValues": {":pk": {"S": "pipeline#a"}, ":prefix": {"S": "x"}}}),
    );
    assert_eq!(leading_keys(&query[0]), ["pipeline#a"]);
    let reversed = dynamodb_requests(
        "Query",
        json!({"TableName": "t", "IndexName": "by-shard",
            "KeyConditionExpression": "(:s = shard) and dueAt <= :now",
            "ExpressionAttributeValues": {":s": {"S": "s3"}, ":now": {"N": "5"}}}),
    );
    assert_eq!(
        reversed[0].resource,
        arn("dynamodb", "table/t/index/by-shard")
    );
    assert_eq!(leading_keys(&reversed[0]), ["s3"]);
    let legacy = dynamodb_requests(
        "Query",
        json!({"TableName": "u", "KeyConditions": {"id": {"ComparisonOperator": "EQ",
            "AttributeValueList": [{"N": "7"}]}}}),
    );
    assert_eq!(leading_keys(&legacy[0]), ["7"]);

    let batch = dynamodb_requests(
        "BatchGetItem",
        json!({"RequestItems": {
            "t": {"Keys": [{"pk": {"S": "a"}}, {"pk": {"S": "b"}}, {"pk": {"S": "a"}}]},
            "u": {"Keys": [{"id": {"S": "c"}}]},
        }}),
    );
    assert_eq!(batch.len(), 2);
    assert!(batch.iter().all(|r| r.action == "dynamodb:BatchGetItem"));
    assert_eq!(leading_keys(&batch[0]), ["a", "b"]);
    assert_eq!(leading_keys(&batch[1]), ["c"]);

    let transaction = dynamodb_requests(
        "TransactWriteItems",
        json!({"TransactItems": [
            {"Put": {"TableName": "t", "Item": {"pk": {"S": "a"}}}},
            {"Put": {"TableName": "t", "Item": {"pk": {"S": "b"}}}},
            {"ConditionCheck": {"TableName": "u", "Key": {"id": {"S": "c"}},
                "ConditionExpression": "attribute_exists(id)"}},
        ]}),
    );
    let actions: Vec<(&str, Vec<String>)> = transaction
        .iter()
        .map(|r| (r.action.as_str(), leading_keys(r)))
        .collect();
    assert_eq!(
        actions,
        [
            ("dynamodb:PutItem", vec!["a".to_string(), "b".to_string()]),
            ("dynamodb:ConditionCheckItem", vec!["c".to_string()]),
        ]
    );

    // A table the template does not declare: its leading keys are not modelled.
    let foreign = dynamodb_requests(
        "GetItem",
        json!({"TableName": "x", "Key": {"k": {"S": "1"}}}),
    );
    assert!(foreign[0].context.get("dynamodb:leadingkeys").is_err());
    // A Scan names none: absent.
    let scan = dynamodb_requests("Scan", json!({"TableName": "t"}));
    assert_eq!(scan[0].context.get("dynamodb:leadingkeys"), Ok(None));
}

#[test]
fn sqs_events_and_secrets_requests() {
    let catalog = catalog();
    let requests = |call: HttpCall| requests_of(&call, &catalog).unwrap();
    let batch = requests(sqs(
        "SendMessageBatch",
        json!({"QueueUrl": "http://127.0.0.1:5055/123456789012/q", "Entries": []}),
    ));
    assert_eq!(batch[0].action, "sqs:SendMessage");
    assert_eq!(batch[0].resource, "arn:aws:sqs:us-east-1:123456789012:q");
    // A queue outside the stack: its ARN from its URL.
    let other = requests(sqs(
        "ReceiveMessage",
        json!({"QueueUrl": "http://localhost:4566/000000000000/notices"}),
    ));
    assert_eq!(
        other[0].resource,
        "arn:aws:sqs:us-east-1:000000000000:notices"
    );
    let url = requests(sqs("GetQueueUrl", json!({"QueueName": "q"})));
    assert_eq!(url[0].action, "sqs:GetQueueUrl");
    assert_eq!(url[0].resource, "arn:aws:sqs:us-east-1:123456789012:q");

    let events = requests(signed(
        "events",
        Some("AWSEvents.PutEvents"),
        json!({"Entries": [{"EventBusName": "stepline-t"}, {"Source": "x"},
            {"EventBusName": "arn:aws:events:us-east-1:123456789012:event-bus/stepline-t"}]}),
    ));
    let buses: Vec<&str> = events.iter().map(|r| r.resource.as_str()).collect();
    assert_eq!(
        buses,
        [
            "arn:aws:events:us-east-1:123456789012:event-bus/default",
            "arn:aws:events:us-east-1:123456789012:event-bus/stepline-t",
        ]
    );

    let by_name = requests(secret_value("stepline-t-seal"));
    let secret = |resource: &str| {
        principal(json!({"Statement": [{"Effect": "Allow",
            "Action": "secretsmanager:GetSecretValue", "Resource": resource}]}))
    };
    let prefix = "arn:aws:secretsmanager:us-east-1:123456789012:secret:stepline-t-seal";
    for allowed in [
        format!("{prefix}-a1B2c3"),
        format!("{prefix}-*"),
        format!("{prefix}*"),
    ] {
        let decision = evaluate(&secret(&allowed), &by_name[0]);
        assert_eq!(decision, Ok(Decision::Allowed), "{allowed}");
    }
    let known = requests(secret_value("known"));
    assert_eq!(
        known[0].resource,
        "arn:aws:secretsmanager:us-east-1:123456789012:secret:known-Zz9Yy8"
    );
    let other = secret(&format!("{prefix}-other-a1B2c3"));
    assert_eq!(evaluate(&other, &by_name[0]), Ok(Decision::ImplicitDeny));

    // Not the JSON protocol, or an operation not modelled: unrecognised.
    let query = HttpCall {
        body: b"Action=SendMessage&QueueUrl=x".to_vec(),
        ..signed("sqs", None, Json::Null)
    };
    assert!(requests_of(&query, &catalog).is_err());
    let describe = signed(
        "dynamodb",
        Some("DynamoDB_20120810.DescribeTable"),
        json!({}),
    );
    assert!(requests_of(&describe, &catalog).is_err());
    let unsigned = HttpCall {
        headers: BTreeMap::new(),
        ..sqs("SendMessage", json!({}))
    };
    assert!(requests_of(&unsigned, &catalog).is_err());
}

#[test]
fn s3_requests_carry_if_none_match_or_its_absence() {
    let catalog = catalog();
    let put = |headers: &[(&str, &str)]| {
        let uri = "http://127.0.0.1:5055/b/payloads/e%201/abc?x-id=PutObject";
        requests_of(&s3_call("PUT", uri, headers), &catalog)
            .unwrap()
            .remove(0)
    };
    let plain = put(&[]);
    assert_eq!(plain.action, "s3:PutObject");
    assert_eq!(plain.resource, "arn:aws:s3:::b/payloads/e 1/abc");
    assert_eq!(plain.context.get("s3:if-none-match"), Ok(None));
    assert_eq!(
        plain.context.get("s3:objectcreationoperation"),
        Ok(Some(&["true".to_string()][..]))
    );
    let create = put(&[("If-None-Match", "*")]);
    assert_eq!(
        create.context.get("s3:if-none-match"),
        Ok(Some(&["*".to_string()][..]))
    );

    let s3 = |method: &str, uri: &str| requests_of(&s3_call(method, uri, &[]), &catalog);
    let get = s3("GET", "http://127.0.0.1:5055/b/payloads/k?x-id=GetObject").unwrap();
    assert_eq!(get[0].action, "s3:GetObject");
    assert_eq!(
        s3("HEAD", "http://127.0.0.1:5055/b/k").unwrap()[0].action,
        "s3:GetObject"
    );
    assert_eq!(
        s3("DELETE", "http://127.0.0.1:5055/b/k").unwrap()[0].action,
        "s3:DeleteObject"
    );
    let list = s3(
        "GET",
        "http://127.0.0.1:5055/b?list-type=2&prefix=payloads%2F",
    )
    .unwrap();
    assert_eq!(
        (list[0].action.as_str(), list[0].resource.as_str()),
        ("s3:ListBucket", "arn:aws:s3:::b")
    );
    assert_eq!(
        list[0].context.get("s3:prefix"),
        Ok(Some(&["payloads/".to_string()][..]))
    );
    // Virtual-hosted style.
    let hosted = s3("GET", "http://b.s3.amazonaws.com/k/x").unwrap();
    assert_eq!(hosted[0].resource, "arn:aws:s3:::b/k/x");
    // Sub-resources and bucket operations are not modelled.
    assert!(s3("PUT", "http://127.0.0.1:5055/b/k?uploadId=1&partNumber=1").is_err());
    assert!(s3("GET", "http://127.0.0.1:5055/b/k?acl").is_err());
    assert!(s3("PUT", "http://127.0.0.1:5055/b").is_err());
    assert!(s3("GET", "http://127.0.0.1:5055/").is_err());
}

/// The URL of queue `name` of the test account.
fn queue_url(name: &str) -> String {
    format!("http://127.0.0.1:5055/{ACCOUNT}/{name}")
}

/// Queue `name` of the test account, as moto names it.
fn queue(name: &str) -> Physical {
    Physical::Queue {
        url: queue_url(name),
        arn: format!("arn:aws:sqs:us-east-1:{ACCOUNT}:{name}"),
        name: name.into(),
    }
}

/// The ARN of `resource` of `service` in the test account.
fn arn(service: &str, resource: &str) -> String {
    format!("arn:aws:{service}:us-east-1:{ACCOUNT}:{resource}")
}

/// The ARN of resource `{kind}{name}` of `service` in the test account, and `name`.
fn with_arn(service: &str, kind: &str, name: String) -> (String, String) {
    (arn(service, &format!("{kind}{name}")), name)
}

/// The functions that seal or open payloads, and send requests to workers.
const SEALERS: [&str; 5] = [
    "LaunchFunction",
    "CompletionFunction",
    "RedriveFunction",
    "ApiFunction",
    "OperatorApiFunction",
];

/// The project's template on a stage `t`, as moto names things.
fn project() -> (Template, Stack) {
    let template = Template::load(&Template::default_path()).unwrap();
    let mut parameters = template.parameter_defaults();
    parameters.insert("Stage".into(), "t".into());
    let mut stack = Stack {
        stage: "t".into(),
        parameters,
        resources: BTreeMap::new(),
        functions: BTreeMap::new(),
    };
    for (logical, kind, props) in template.resources() {
        let name = |key: &str| resolve(&props[key], &stack).unwrap();
        let physical = match kind.as_str() {
            "AWS::DynamoDB::Table" => {
                let (arn, name) = with_arn("dynamodb", "table/", name("TableName"));
                Physical::Table { name, arn }
            }
            "AWS::SQS::Queue" => queue(&name("QueueName")),
            "AWS::Events::EventBus" => {
                let (arn, name) = with_arn("events", "event-bus/", name("Name"));
                Physical::Bus { name, arn }
            }
            "AWS::SecretsManager::Secret" => {
                let (arn, name) = with_arn("secretsmanager", "secret:", name("Name"));
                let arn = format!("{arn}-AbCdEf");
                Physical::Secret { name, arn }
            }
            "AWS::S3::Bucket" => {
                let name = format!("stepline-t-{}", logical.to_lowercase());
                let arn = format!("arn:aws:s3:::{name}");
                Physical::Bucket { name, arn }
            }
            _ => continue,
        };
        stack.resources.insert(logical, physical);
    }
    (template, stack)
}

/// The project's stage `t` and its functions' policies.
fn project_iam() -> (Stack, StageIam) {
    let (template, stack) = project();
    let iam = StageIam::new(&template, &stack).expect("every function's policies resolve");
    (stack, iam)
}

/// A signed SQS `operation` with `body`.
fn sqs(operation: &str, body: Json) -> HttpCall {
    signed("sqs", Some(&format!("AmazonSQS.{operation}")), body)
}

/// A signed read of secret `id` (its name or ARN).
fn secret_value(id: &str) -> HttpCall {
    let body = json!({ "SecretId": id });
    signed(
        "secretsmanager",
        Some("secretsmanager.GetSecretValue"),
        body,
    )
}

/// An S3 `method` on `uri` with `headers`.
fn s3_call(method: &str, uri: &str, headers: &[(&str, &str)]) -> HttpCall {
    call("s3", None, method, uri, headers, Json::Null)
}

#[test]
fn the_project_template_decides_as_aws_would() {
    let (stack, iam) = project_iam();
    let check = |function: &str, call: HttpCall| iam.checker(function).unwrap().check(&call);
    let dynamodb = |operation: &str, body: Json| {
        signed(
            "dynamodb",
            Some(&format!("DynamoDB_20120810.{operation}")),
            body,
        )
    };
    let executions = "stepline-t-executions";
    let releases = "stepline-t-releases";
    let put = |table: &str, pk: &str| {
        dynamodb(
            "PutItem",
            json!({"TableName": table, "Item": {"pk": {"S": pk}, "sk": {"S": "x"}}}),
        )
    };

    assert_eq!(
        check("CompletionFunction", put(executions, "exec#1")),
        Ok(None)
    );
    // Workers have no table at all.
    let worker = check("OrderWorkerFunction", put(releases, "pipeline#orders")).unwrap_err();
    assert_eq!(worker.action, "dynamodb:PutItem");
    assert_eq!(
        worker.resource,
        format!("arn:aws:dynamodb:us-east-1:{ACCOUNT}:table/{releases}")
    );
    assert_eq!(
        worker.keys,
        [(
            "dynamodb:leadingkeys".to_string(),
            vec!["pipeline#orders".to_string()]
        )]
    );
    assert!(worker
        .to_string()
        .starts_with("AccessDenied: OrderWorkerFunction"));
    // The API function reads the registry.
    let registry = dynamodb(
        "GetItem",
        json!({"TableName": releases, "Key": {"pk": {"S": "pipeline#orders"}, "sk": {"S": "x"}}}),
    );
    assert_eq!(check("ApiFunction", registry), Ok(None));
    let list = dynamodb(
        "Query",
        json!({"TableName": executions, "IndexName": "list-index",
            "KeyConditionExpression": "lk = :lk", "ExpressionAttributeValues": {":lk": {"S": "orders#1"}}}),
    );
    assert_eq!(check("ApiFunction", list.clone()), Ok(None));
    assert!(check("LaunchFunction", list).is_err());

    // Payload objects: a write must be a create (the bucket policy's explicit deny).
    let bucket = "stepline-t-payloadbucket";
    let object = format!("http://127.0.0.1:5055/{bucket}/payloads/e/abc?x-id=PutObject");
    let overwrite = s3_call("PUT", &object, &[]);
    let denied = check("LaunchFunction", overwrite).unwrap_err();
    assert!(
        denied
            .reason
            .contains("PayloadBucketPolicy (PayloadObjectsAreImmutable)"),
        "{denied}"
    );
    let create = s3_call("PUT", &object, &[("If-None-Match", "*")]);
    assert_eq!(check("LaunchFunction", create.clone()), Ok(None));
    assert!(check("ClaimFunction", create)
        .unwrap_err()
        .reason
        .contains("no identity-based"));
    // A read is allowed; its 404 would be AWS's 403 (no s3:ListBucket).
    let read = s3_call("GET", &object.replace("PutObject", "GetObject"), &[]);
    let missing = check("LaunchFunction", read).unwrap();
    assert!(missing.unwrap().reason.contains("403"));

    let send = |queue: &str| {
        let url = queue_url(&format!("stepline-t-{queue}"));
        sqs("SendMessage", json!({"QueueUrl": url, "MessageBody": "{}"}))
    };
    assert_eq!(check("LaunchFunction", send("orders-request")), Ok(None));
    assert!(check("OrderWorkerFunction", send("launch")).is_err());
    assert_eq!(check("OrderWorkerFunction", send("reply")), Ok(None));
    let receive = sqs(
        "ReceiveMessage",
        json!({"QueueUrl": queue_url("stepline-t-execution-dlq")}),
    );
    assert_eq!(check("RedriveFunction", receive.clone()), Ok(None));
    assert!(check("CompletionFunction", receive).is_err());

    let put_events = |bus: Option<&str>| {
        let entry = match bus {
            Some(bus) => json!({"EventBusName": bus, "Source": "stepline"}),
            None => json!({"Source": "stepline"}),
        };
        signed(
            "events",
            Some("AWSEvents.PutEvents"),
            json!({ "Entries": [entry] }),
        )
    };
    assert_eq!(
        check("ClaimFunction", put_events(Some("stepline-t"))),
        Ok(None)
    );
    assert!(check("ClaimFunction", put_events(None)).is_err());

    // The sealing key's secret: the functions that seal or open only, by ARN or name.
    if let Some(Physical::Secret { name, arn }) = stack.resources.get("SealKeySecret") {
        for id in [name, arn] {
            let read = secret_value(id);
            assert_eq!(check("CompletionFunction", read.clone()), Ok(None));
            assert!(check("ClaimFunction", read.clone()).is_err());
            assert!(check("OrderWorkerFunction", read).is_err());
        }
    }

    let unknown = check(
        "ClaimFunction",
        dynamodb("DescribeTable", json!({"TableName": executions})),
    );
    assert!(unknown.unwrap_err().reason.starts_with("unrecognised call"));
    assert!(iam.checker("NoSuchFunction").is_err());
}

#[test]
fn each_function_writes_only_its_own_part_of_the_release_table_and_reads_the_keys_it_needs() {
    let (stack, iam) = project_iam();
    let check = |function: &str, call: HttpCall| iam.checker(function).unwrap().check(&call);
    let put = |pk: &str| {
        signed(
            "dynamodb",
            Some("DynamoDB_20120810.PutItem"),
            json!({"TableName": "stepline-t-releases", "Item": {"pk": {"S": pk}, "sk": {"S": "x"}}}),
        )
    };
    // Announcements: the completion function records them in their own partition, and may
    // write nothing else of the release table: not a release or an activation (`pipeline#…`,
    // where announcements once lived and where this check denied them), not a key item.
    assert_eq!(check("CompletionFunction", put("workers#orders")), Ok(None));
    for pk in ["pipeline#orders", "coordinator"] {
        let denied = check("CompletionFunction", put(pk)).unwrap_err();
        assert!(denied.reason.contains("no identity-based"), "{denied}");
    }
    // Releases are the administrator's: neither the submit nor the operate endpoint, nor any
    // other coordinator function, registers or activates one.
    assert_eq!(check("AdminApiFunction", put("pipeline#orders")), Ok(None));
    // ... and only those: not an announcement, not a key item.
    for pk in ["workers#orders", "coordinator"] {
        assert!(check("AdminApiFunction", put(pk)).is_err(), "{pk}");
    }
    for function in [
        "ApiFunction",
        "OperatorApiFunction",
        "ClaimFunction",
        "LaunchFunction",
        "RedriveFunction",
    ] {
        assert!(
            check(function, put("pipeline#orders")).is_err(),
            "{function} may write a release"
        );
    }
    // The sealing keys: whoever seals or opens; not the administrator, not a worker.
    if let Some(Physical::Secret { arn, .. }) = stack.resources.get("SealKeySecret") {
        let read = secret_value(arn);
        for function in SEALERS {
            assert_eq!(check(function, read.clone()), Ok(None), "{function}");
        }
        // The sweeper seals nothing and signs nothing.
        for function in ["ClaimFunction", "AdminApiFunction", "OrderWorkerFunction"] {
            assert!(check(function, read.clone()).is_err(), "{function}");
        }
        // Nor does a principal whose own policies allow everything (an administrator, an
        // operator's credentials): the secret's resource policy denies all but those functions.
        let checker = administrator(&iam);
        let denied = checker.check(&read).unwrap_err();
        assert!(
            denied.reason.contains("OnlyTheCoordinatorReadsTheKey"),
            "{denied}"
        );
        // By name, as the SDK may ask for it, too.
        let by_name = secret_value("stepline-t-seal-key");
        assert!(checker.check(&by_name).is_err());
        assert_eq!(
            iam.checker("LaunchFunction").unwrap().check(&by_name),
            Ok(None)
        );
    } else {
        panic!("the template has a SealKeySecret");
    }
    // A worker stack's queue policy names every function that sends requests to workers.
    let senders = worker_queue_senders();
    for function in SEALERS {
        assert!(senders.contains(&function.to_string()), "{senders:?}");
    }
    // A queue outside the template is nobody's until a worker stack opens it: no coordinator
    // role may send to a mistyped queue, or to another account's.
    let send_to = |account: &str, name: &str| {
        let url = format!("http://127.0.0.1:5055/{account}/{name}");
        sqs("SendMessage", json!({"QueueUrl": url, "MessageBody": "{}"}))
    };
    let outside = send_to(ACCOUNT, "someones-requests");
    assert!(check("LaunchFunction", outside.clone()).is_err());
    // Adopted as a worker stack's request queue: only the roles its policy names send.
    iam.adopt_worker_queue(&queue("someones-requests")).unwrap();
    assert_eq!(check("LaunchFunction", outside.clone()), Ok(None));
    assert_eq!(check("OperatorApiFunction", outside.clone()), Ok(None));
    assert!(check("ClaimFunction", outside.clone()).is_err());
    assert!(check("AdminApiFunction", outside.clone()).is_err());
    assert!(check("OrderWorkerFunction", outside.clone()).is_err());
    assert!(check(
        "LaunchFunction",
        send_to("999999999999", "someones-requests")
    )
    .is_err());
    // Whatever a principal's own policies allow, the queue's policy refuses it.
    let denied = administrator(&iam).check(&outside).unwrap_err();
    assert!(denied.reason.contains("NobodyElseSends"), "{denied}");
    // And only the worker reads it (a request carries the token that answers it).
    let receive = sqs(
        "ReceiveMessage",
        json!({"QueueUrl": queue_url("someones-requests")}),
    );
    let denied = administrator(&iam).check(&receive).unwrap_err();
    assert!(denied.reason.contains("OnlyTheWorkerReads"), "{denied}");
}

/// The checker of a principal of the stage's account whose own policies allow everything (an
/// administrator, an operator's credentials), under the stage's resource policies and its worker
/// stacks' queue policies.
fn administrator(iam: &StageIam) -> Checker {
    let mut administrator = Principal::new(
        "Administrator",
        &format!("arn:aws:iam::{ACCOUNT}:role/administrator"),
        ACCOUNT,
        vec![Document {
            name: "AdministratorAccess".into(),
            document: json!({"Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}),
        }],
        Vec::new(),
    )
    .unwrap();
    // The stage's resource policies as they cover any principal of the account (their statements
    // for everyone).
    administrator.resource_policies = iam.principals["AdminApiFunction"].resource_policies.clone();
    Checker::new(Arc::new(administrator), iam.catalog.clone(), Arc::default())
        .with_worker_queues(iam.worker_queues.clone())
}

#[test]
fn a_generated_worker_stack_is_checked_against_its_own_policies() {
    let (_, iam) = project_iam();
    let worker = iam
        .worker_stack(&queue("shop-requests"), &queue("shop-requests-dlq"), "3")
        .expect("the worker stack resolves");
    // The environment it gives its function: the coordinator's exports, imported.
    assert_eq!(worker.env["RELEASE_VERSION"], "3");
    assert_eq!(worker.env["REPLY_QUEUE_URL"], queue_url("stepline-t-reply"));
    assert_eq!(worker.env["PAYLOAD_BUCKET"], "stepline-t-payloadbucket");
    assert!(worker.env["REQUEST_DLQ_URL"].ends_with("/shop-requests-dlq"));
    let check = |call: HttpCall| worker.checker.check(&call);
    let send = |queue: &str, operation: &str| {
        sqs(
            operation,
            json!({"QueueUrl": queue_url(queue),
                "MessageBody": "{}", "ReceiptHandle": "r", "VisibilityTimeout": 30}),
        )
    };
    assert_eq!(check(send("stepline-t-reply", "SendMessage")), Ok(None));
    assert_eq!(check(send("shop-requests-dlq", "SendMessage")), Ok(None));
    assert_eq!(
        check(send("shop-requests", "ChangeMessageVisibility")),
        Ok(None)
    );
    assert!(check(send("stepline-t-launch", "SendMessage")).is_err());
    assert!(check(send("stepline-t-orders-request", "SendMessage")).is_err());
    // The coordinator's bucket policy governs its payload writes too: creates only.
    let object =
        "http://127.0.0.1:5055/stepline-t-payloadbucket/payloads/e/abc?x-id=PutObject".to_string();
    let overwrite = s3_call("PUT", &object, &[]);
    assert!(check(overwrite)
        .unwrap_err()
        .reason
        .contains("PayloadObjectsAreImmutable"));
    let create = s3_call("PUT", &object, &[("If-None-Match", "*")]);
    assert_eq!(check(create), Ok(None));
    let table = signed(
        "dynamodb",
        Some("DynamoDB_20120810.GetItem"),
        json!({"TableName": "stepline-t-executions", "Key": {"pk": {"S": "exec#1"}}}),
    );
    assert!(check(table).is_err(), "a worker reads no table");
}

#[test]
fn a_report_counts_each_distinct_denial() {
    let denial = Denial {
        function: "CompletionFunction".into(),
        action: "dynamodb:PutItem".into(),
        resource: "arn:aws:dynamodb:us-east-1:1:table/r".into(),
        keys: vec![("dynamodb:leadingkeys".into(), vec!["pipeline#a".into()])],
        reason: "no identity-based or resource-based policy allows the action".into(),
    };
    let text = report(&[denial.clone(), denial.clone()]);
    assert!(text.contains("2 call(s)"), "{text}");
    assert!(text.contains("1 distinct"), "{text}");
    assert!(text.contains(
        "2 x AccessDenied: CompletionFunction is not authorized to perform dynamodb:PutItem on \
         arn:aws:dynamodb:us-east-1:1:table/r [dynamodb:leadingkeys=pipeline#a]"
    ));
}

/// A stage whose queues live in another emulator's account than its tables (LocalStack's SQS
/// beside moto's DynamoDB) takes the outside queues of its queues' account for worker stacks'.
#[test]
fn outside_queues_are_taken_in_the_account_the_stage_s_queues_live_in() {
    const QUEUES: &str = "000000000000";
    let (template, mut stack) = project();
    for physical in stack.resources.values_mut() {
        if let Physical::Queue { url, arn, .. } = physical {
            *url = url.replace(ACCOUNT, QUEUES);
            *arn = arn.replace(ACCOUNT, QUEUES);
        }
    }
    let iam = StageIam::new(&template, &stack).unwrap();
    iam.take_outside_queues_as_worker_stacks().unwrap();
    let check = |function: &str, call: HttpCall| iam.checker(function).unwrap().check(&call);
    let send_to = |account: &str| {
        let url = format!("http://127.0.0.1:5055/{account}/shop-requests");
        sqs("SendMessage", json!({"QueueUrl": url, "MessageBody": "{}"}))
    };
    let url_of = sqs("GetQueueUrl", json!({"QueueName": "shop-requests"}));
    assert_eq!(check("CompletionFunction", url_of.clone()), Ok(None));
    assert_eq!(check("CompletionFunction", send_to(QUEUES)), Ok(None));
    assert!(check("ClaimFunction", url_of).is_err());
    assert!(check("ClaimFunction", send_to(QUEUES)).is_err());
    // The tables' account holds no queue of the stage: its queues are not taken.
    assert!(check("CompletionFunction", send_to(ACCOUNT)).is_err());
}
