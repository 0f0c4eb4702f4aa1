//! What IAM authorizes for one serialized HTTP request: action, resource ARN and condition keys,
//! read from DynamoDB, SQS, EventBridge, Secrets Manager and S3 requests as they are sent.

use super::*;

/// An HTTP request as it is sent.
#[derive(Debug, Clone, Default)]
pub struct HttpCall {
    pub method: String,
    pub uri: String,
    /// Lowercase names.
    pub headers: BTreeMap<String, String>,
    pub body: Vec<u8>,
}

impl HttpCall {
    /// The operation the call asks for: its `X-Amz-Target` (`DynamoDB_20120810.PutItem`,
    /// `AmazonSQS.SendMessage`), or for S3 (REST) one named by its method (`s3.GetObject`,
    /// `s3.PutObject`, `s3.<METHOD>`).
    pub fn operation(&self) -> String {
        match self.header("x-amz-target") {
            Some(target) => target.to_string(),
            None => match self.method.as_str() {
                "GET" => "s3.GetObject".to_string(),
                "PUT" => "s3.PutObject".to_string(),
                other => format!("s3.{other}"),
            },
        }
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }

    /// Region and service of the SigV4 credential scope (`Credential=<key>/<date>/<region>/<service>/
    /// aws4_request`): which service the request is for, as signed.
    pub(crate) fn scope(&self) -> Option<(String, String)> {
        let authorization = self.header("authorization")?;
        let credential = authorization.split("Credential=").nth(1)?;
        let credential = credential.split([',', ' ']).next()?;
        let parts: Vec<&str> = credential.split('/').collect();
        match parts[..] {
            [.., region, service, "aws4_request"] => Some((region.into(), service.into())),
            _ => None,
        }
    }
}

/// Host, path and query of a URI (`scheme://host/path?query`, or a bare path).
pub(crate) fn split_uri(uri: &str) -> (&str, &str, &str) {
    let rest = uri.split_once("://").map_or(uri, |(_, rest)| rest);
    let (host, path_query) = if uri.contains("://") {
        match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        }
    } else {
        ("", rest)
    };
    let (path, query) = path_query.split_once('?').unwrap_or((path_query, ""));
    (host, path, query)
}

pub(crate) fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What IAM authorizes for one HTTP request, read from the request itself: its signing scope (the
/// service), `x-amz-target` (the operation of the JSON protocols), body, method and path. A request
/// this cannot read is an error (the caller denies it as unrecognised).
pub fn requests_of(call: &HttpCall, catalog: &Catalog) -> Result<Vec<Request>, String> {
    let (region, service) = call
        .scope()
        .ok_or_else(|| format!("an unsigned request: {} {}", call.method, call.uri))?;
    let mut base = Context::default();
    // Lambda's SDK talks to the services over HTTPS; the emulator's plain HTTP is the test's transport,
    // not the code's.
    base.set("aws:SecureTransport", "true");
    base.set("aws:RequestedRegion", region);
    base.set("aws:ViaAWSService", "false");
    // A function calling a service itself: no service acts on its behalf.
    for key in [
        "aws:SourceArn",
        "aws:SourceAccount",
        "aws:SourceOrgID",
        "aws:CalledVia",
    ] {
        base.absent(key);
    }
    let target = call.header("x-amz-target");
    let body = || -> Result<Json, String> {
        serde_json::from_slice(&call.body).map_err(|e| format!("a body that is not JSON: {e}"))
    };
    let operation = |prefix: &str| -> Result<&str, String> {
        target
            .and_then(|t| t.strip_prefix(prefix))
            .ok_or_else(|| format!("{service}: x-amz-target {target:?}"))
    };
    match (service.as_str(), target) {
        ("dynamodb", Some(_)) => {
            dynamodb(operation("DynamoDB_20120810.")?, &body()?, catalog, &base)
        }
        ("sqs", Some(_)) => sqs(operation("AmazonSQS.")?, &body()?, catalog, &base),
        ("events", Some(_)) => events(operation("AWSEvents.")?, &body()?, catalog, &base),
        ("secretsmanager", Some(_)) => {
            secrets(operation("secretsmanager.")?, &body()?, catalog, &base)
        }
        ("s3", None) => s3(call, catalog, base).map(|r| vec![r]),
        _ => Err(format!(
            "{service} request {} {} (x-amz-target {target:?})",
            call.method, call.uri
        )),
    }
}

/// A DynamoDB attribute value as text (`S`, `N` or `B`).
pub(crate) fn key_value(value: &Json) -> Option<String> {
    ["S", "N", "B"]
        .iter()
        .find_map(|t| value.get(t).and_then(Json::as_str))
        .map(str::to_string)
}

pub(crate) fn dynamodb(
    operation: &str,
    body: &Json,
    catalog: &Catalog,
    base: &Context,
) -> Result<Vec<Request>, String> {
    // (table as in the request, index, action) → partition-key values (`None`: the table is not the
    // template's, so its key schema is unknown).
    type Touches = BTreeMap<(String, Option<String>, String), Option<BTreeSet<String>>>;
    let mut touches: Touches = BTreeMap::new();
    let table_name = |table: &str| -> String {
        table
            .rsplit_once(":table/")
            .map_or(table, |(_, name)| name)
            .to_string()
    };
    let hash_of = |table: &str, index: Option<&str>| -> Option<String> {
        let keys = catalog.tables.get(&table_name(table))?;
        match index {
            None => Some(keys.hash.clone()),
            Some(index) => keys.indexes.get(index).cloned(),
        }
    };
    let mut touch = |table: &str,
                     index: Option<&str>,
                     action: &str,
                     key: Option<Result<String, String>>|
     -> Result<(), String> {
        let entry = touches
            .entry((
                table.to_string(),
                index.map(str::to_string),
                action.to_string(),
            ))
            .or_insert_with(|| Some(BTreeSet::new()));
        match key {
            Some(value) => {
                let value = value?;
                if let Some(set) = entry {
                    set.insert(value);
                }
            }
            None => *entry = None,
        }
        Ok(())
    };
    let string = |value: &Json, field: &str| -> Result<String, String> {
        value[field]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("{operation} without {field}"))
    };
    // The partition-key value of an item or key (`None`: unknown key schema).
    let leading = |table: &str, item: &Json| -> Option<Result<String, String>> {
        let hash = hash_of(table, None)?;
        Some(
            key_value(&item[&hash])
                .ok_or_else(|| format!("{operation} on {table} without its key {hash}")),
        )
    };
    match operation {
        "GetItem" | "DeleteItem" | "UpdateItem" | "PutItem" => {
            let table = string(body, "TableName")?;
            let field = if operation == "PutItem" {
                "Item"
            } else {
                "Key"
            };
            let key = leading(&table, &body[field]);
            touch(&table, None, &format!("dynamodb:{operation}"), key)?;
        }
        "Query" => {
            let table = string(body, "TableName")?;
            let index = body["IndexName"].as_str();
            let key = hash_of(&table, index).map(|hash| query_hash_value(body, &hash));
            touch(&table, index, "dynamodb:Query", key)?;
        }
        "Scan" => {
            let table = string(body, "TableName")?;
            // A Scan names no partition key: the key is absent from its context.
            touch(
                &table,
                body["IndexName"].as_str(),
                "dynamodb:Scan",
                Some(Ok(String::new())),
            )?;
        }
        "BatchGetItem" | "BatchWriteItem" => {
            let items = body["RequestItems"]
                .as_object()
                .ok_or_else(|| format!("{operation} without RequestItems"))?;
            let action = format!("dynamodb:{operation}");
            for (table, spec) in items {
                let keys: Vec<&Json> = if operation == "BatchGetItem" {
                    spec["Keys"].as_array().into_iter().flatten().collect()
                } else {
                    let writes = spec.as_array().into_iter().flatten();
                    writes
                        .map(|w| match (w.get("PutRequest"), w.get("DeleteRequest")) {
                            (Some(put), _) => &put["Item"],
                            (_, Some(delete)) => &delete["Key"],
                            _ => &Json::Null,
                        })
                        .collect()
                };
                if keys.is_empty() {
                    touch(table, None, &action, Some(Ok(String::new())))?;
                }
                for key in keys {
                    touch(table, None, &action, leading(table, key))?;
                }
            }
        }
        "TransactWriteItems" | "TransactGetItems" => {
            let items = body["TransactItems"]
                .as_array()
                .ok_or_else(|| format!("{operation} without TransactItems"))?;
            // Each item is authorized as its own action (DynamoDB: "Using IAM with transactions").
            for item in items {
                let (kind, spec) = item
                    .as_object()
                    .and_then(|o| o.iter().next())
                    .ok_or_else(|| format!("{operation}: an empty item"))?;
                let (action, field) = match kind.as_str() {
                    "Put" => ("dynamodb:PutItem", "Item"),
                    "Update" => ("dynamodb:UpdateItem", "Key"),
                    "Delete" => ("dynamodb:DeleteItem", "Key"),
                    "ConditionCheck" => ("dynamodb:ConditionCheckItem", "Key"),
                    "Get" => ("dynamodb:GetItem", "Key"),
                    other => return Err(format!("{operation}: item {other}")),
                };
                let table = string(spec, "TableName")?;
                touch(&table, None, action, leading(&table, &spec[field]))?;
            }
        }
        other => return Err(format!("DynamoDB {other}")),
    }
    Ok(touches
        .into_iter()
        .map(|((table, index, action), keys)| {
            let mut resource = if table.starts_with("arn:") {
                table
            } else {
                catalog.accounts.arn("dynamodb", &format!("table/{table}"))
            };
            if let Some(index) = index {
                resource = format!("{resource}/index/{index}");
            }
            let mut context = base.clone();
            if let Some(keys) = keys {
                context.set_all(
                    "dynamodb:LeadingKeys",
                    keys.into_iter().filter(|k| !k.is_empty()),
                );
            }
            Request::new(action, resource, context)
        })
        .collect())
}

/// The value a Query binds its partition key `hash` to: `KeyConditionExpression` (`#n = :v` or
/// `hash = :v`, names and values through the expression maps) or the legacy `KeyConditions`.
pub(crate) fn query_hash_value(body: &Json, hash: &str) -> Result<String, String> {
    if let Some(expression) = body["KeyConditionExpression"].as_str() {
        let name_of = |token: &str| -> Option<String> {
            match token.strip_prefix('#') {
                Some(_) => body["ExpressionAttributeNames"][token]
                    .as_str()
                    .map(str::to_string),
                None => Some(token.to_string()),
            }
        };
        for clause in split_and(expression) {
            let clause = clause.trim().trim_matches(['(', ')']).trim();
            let Some((left, right)) = clause.split_once('=') else {
                continue;
            };
            if left.ends_with(['<', '>', '!']) {
                continue;
            }
            let (left, right) = (left.trim(), right.trim());
            for (attribute, value) in [(left, right), (right, left)] {
                if value.starts_with(':') && name_of(attribute).as_deref() == Some(hash) {
                    return key_value(&body["ExpressionAttributeValues"][value])
                        .ok_or_else(|| format!("Query: no value for {value}"));
                }
            }
        }
        return Err(format!("Query: no equality on {hash} in {expression:?}"));
    }
    let condition = &body["KeyConditions"][hash];
    match condition["ComparisonOperator"].as_str() {
        Some("EQ") => key_value(&condition["AttributeValueList"][0])
            .ok_or_else(|| "Query: KeyConditions without a value".to_string()),
        _ => Err(format!("Query without a condition on {hash}")),
    }
}

/// The clauses of a key condition, split on `AND` (any case, between spaces).
pub(crate) fn split_and(expression: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    for word in expression.split_whitespace() {
        if word.eq_ignore_ascii_case("and") {
            out.push(String::new());
        } else {
            let last = out.last_mut().expect("one at least");
            last.push(' ');
            last.push_str(word);
        }
    }
    out
}

pub(crate) fn sqs(
    operation: &str,
    body: &Json,
    catalog: &Catalog,
    base: &Context,
) -> Result<Vec<Request>, String> {
    // The batch operations are authorized as their single-message actions (SQS: "permissions for
    // SendMessageBatch ... are the same as for SendMessage"; IAM has no sqs:SendMessageBatch).
    let action = match operation {
        "SendMessageBatch" => "SendMessage",
        "DeleteMessageBatch" => "DeleteMessage",
        "ChangeMessageVisibilityBatch" => "ChangeMessageVisibility",
        other => other,
    };
    let resource = match operation {
        "GetQueueUrl" => {
            let name = body["QueueName"]
                .as_str()
                .ok_or("GetQueueUrl without QueueName")?;
            let home = catalog.accounts.home("sqs");
            let account = body["QueueOwnerAWSAccountId"]
                .as_str()
                .unwrap_or(&home.account);
            format!(
                "arn:{}:sqs:{}:{account}:{name}",
                catalog.accounts.partition, home.region
            )
        }
        "ListQueues" | "CreateQueue" | "ListDeadLetterSourceQueues" => {
            return Err(format!("SQS {operation}"))
        }
        _ => {
            let url = body["QueueUrl"]
                .as_str()
                .ok_or_else(|| format!("SQS {operation} without QueueUrl"))?;
            catalog.queue_arn(url)?
        }
    };
    Ok(vec![Request::new(
        format!("sqs:{action}"),
        resource,
        base.clone(),
    )])
}

pub(crate) fn events(
    operation: &str,
    body: &Json,
    catalog: &Catalog,
    base: &Context,
) -> Result<Vec<Request>, String> {
    if operation != "PutEvents" {
        return Err(format!("EventBridge {operation}"));
    }
    let entries = body["Entries"]
        .as_array()
        .ok_or("PutEvents without Entries")?;
    let buses: BTreeSet<String> = entries
        .iter()
        .map(|entry| {
            let bus = entry["EventBusName"].as_str().unwrap_or("default");
            if bus.starts_with("arn:") {
                bus.to_string()
            } else {
                catalog.accounts.arn("events", &format!("event-bus/{bus}"))
            }
        })
        .collect();
    Ok(buses
        .into_iter()
        .map(|bus| Request::new("events:PutEvents", bus, base.clone()))
        .collect())
}

pub(crate) fn secrets(
    operation: &str,
    body: &Json,
    catalog: &Catalog,
    base: &Context,
) -> Result<Vec<Request>, String> {
    if !matches!(operation, "GetSecretValue" | "DescribeSecret") {
        return Err(format!("Secrets Manager {operation}"));
    }
    let id = body["SecretId"]
        .as_str()
        .ok_or_else(|| format!("{operation} without SecretId"))?;
    // A secret of the stack named by name: its ARN.
    let id = catalog.secrets.get(id).map_or(id, String::as_str);
    let mut request = Request::new(
        format!("secretsmanager:{operation}"),
        if id.starts_with("arn:") {
            id.to_string()
        } else {
            catalog
                .accounts
                .arn("secretsmanager", &format!("secret:{id}"))
        },
        base.clone(),
    );
    request.secret_by_name = !id.starts_with("arn:");
    Ok(vec![request])
}

/// Query parameters of S3 naming a sub-resource (ACLs, tags, multipart parts, versions...): each is
/// an action of its own, which the code does not call.
pub(crate) const S3_SUBRESOURCES: &[&str] = &[
    "acl",
    "tagging",
    "attributes",
    "uploadId",
    "uploads",
    "partNumber",
    "versionId",
    "versions",
    "torrent",
    "retention",
    "legal-hold",
    "restore",
    "select",
    "delete",
    "location",
    "policy",
    "lifecycle",
    "cors",
    "versioning",
    "encryption",
    "website",
    "logging",
    "notification",
    "replication",
    "object-lock",
    "ownershipControls",
    "publicAccessBlock",
    "accelerate",
    "requestPayment",
    "analytics",
    "inventory",
    "metrics",
    "intelligent-tiering",
];

pub(crate) fn s3(
    call: &HttpCall,
    catalog: &Catalog,
    mut context: Context,
) -> Result<Request, String> {
    let (host, path, query) = split_uri(&call.uri);
    let virtual_host = catalog
        .buckets
        .iter()
        .find(|b| host.starts_with(&format!("{b}.")));
    let (bucket, key) = match virtual_host {
        Some(bucket) => (bucket.clone(), percent_decode(path.trim_start_matches('/'))),
        None => {
            let path = path.trim_start_matches('/');
            let (bucket, key) = path.split_once('/').unwrap_or((path, ""));
            (percent_decode(bucket), percent_decode(key))
        }
    };
    let query: BTreeMap<String, String> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect();
    let unrecognised = || format!("S3 {} {}", call.method, call.uri);
    if bucket.is_empty() || query.keys().any(|k| S3_SUBRESOURCES.contains(&k.as_str())) {
        return Err(unrecognised());
    }
    let partition = &catalog.accounts.partition;
    let object = format!("arn:{partition}:s3:::{bucket}/{key}");
    let bucket_arn = format!("arn:{partition}:s3:::{bucket}");
    let mut header_key = |key: &str, header: &str| match call.header(header) {
        Some(value) => context.set(key, value),
        None => context.absent(key),
    };
    let (action, resource) = match (call.method.as_str(), key.is_empty()) {
        ("GET" | "HEAD", false) => ("s3:GetObject", object),
        ("PUT", false) if call.header("x-amz-copy-source").is_none() => {
            header_key("s3:if-none-match", "if-none-match");
            header_key("s3:if-match", "if-match");
            header_key("s3:x-amz-acl", "x-amz-acl");
            header_key(
                "s3:x-amz-server-side-encryption",
                "x-amz-server-side-encryption",
            );
            context.set("s3:ObjectCreationOperation", "true");
            ("s3:PutObject", object)
        }
        ("DELETE", false) => ("s3:DeleteObject", object),
        ("GET", true) if query.get("list-type").map(String::as_str) == Some("2") => {
            for name in ["prefix", "delimiter", "max-keys"] {
                match query.get(name) {
                    Some(value) => context.set(&format!("s3:{name}"), value.clone()),
                    None => context.absent(&format!("s3:{name}")),
                }
            }
            ("s3:ListBucket", bucket_arn)
        }
        // HeadBucket is authorized as s3:ListBucket.
        ("HEAD", true) => ("s3:ListBucket", bucket_arn),
        _ => return Err(unrecognised()),
    };
    Ok(Request::new(action, resource, context))
}

// --------------------------------------------------------------------------------------- denials
