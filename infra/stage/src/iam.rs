//! IAM as AWS evaluates it, for stages on an emulator (moto and LocalStack enforce none): every AWS
//! call a function of the template makes is checked against that function's policies in
//! template.yaml and against the template's resource policies, and a call AWS would deny fails here
//! too, and is recorded.
//!
//! - [`Principal`]: a function's identity statements (its inline documents and the SAM policy
//!   templates it names, expanded as SAM expands them) and the resource-policy statements whose
//!   principal covers it.
//! - [`requests_of`]: what IAM authorizes for one serialized HTTP request (action, resource ARN,
//!   condition keys), read from the request as it is sent, never from what the code meant.
//! - [`evaluate`]: AWS's logic within one account: an explicit deny in any statement wins; otherwise
//!   the call is allowed iff some identity or resource statement allows it.
//! - [`Checker`]: the SDK interceptor applying it to every request of a function's clients.
//!
//! Fail closed, loudly: an unknown SAM policy template, condition operator or condition key, and a
//! call this module cannot read, are errors or denials, never passes.
//!
//! Not modelled: permission boundaries, SCPs, session policies (the template has none), and SAM's
//! implicit permissions (the SQS event-source poller's receive and delete, the basic execution role's
//! logs): those calls are the Lambda service's, not the function code's, so they are left out.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::{Arc, Mutex};

use anyhow::{anyhow, bail, Context as _, Result};
use aws_sdk_dynamodb::config::interceptors::{
    BeforeDeserializationInterceptorContextRef, BeforeTransmitInterceptorContextRef,
};
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_dynamodb::error::BoxError;
use aws_smithy_types::config_bag::{Storable, StoreReplace};
use serde_json::{json, Map, Value as Json};
use serde_yaml_ng::Value;
use stepline::aws::Clients;

use crate::stack::{Physical, Stack};
use crate::template::{resolve, scalar, Lookup, Template};

// ------------------------------------------------------------------------------------------- accounts

/// Region and account of a service's resources in the stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Home {
    pub region: String,
    pub account: String,
}

/// The partition, regions and accounts the stage's resources live in, from their own ARNs, so that
/// the ARNs derived from requests are those the template resolves to. Each emulator has an account of
/// its own (moto's 123456789012, LocalStack's 000000000000) and a stage may mix them, hence one home
/// per service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accounts {
    pub partition: String,
    /// The account `AWS::AccountId` names (DynamoDB's, else the first found): the functions' own.
    pub default: Home,
    services: BTreeMap<String, Home>,
}

impl Accounts {
    pub fn of_stack(stack: &Stack) -> Result<Self> {
        let mut partition = None;
        let mut services = BTreeMap::new();
        let mut first = None;
        for physical in stack.resources.values() {
            let arn = match physical {
                Physical::Table { arn, .. }
                | Physical::Queue { arn, .. }
                | Physical::Bus { arn, .. }
                | Physical::Secret { arn, .. } => arn,
                // Bucket ARNs carry neither region nor account.
                Physical::Bucket { .. } => continue,
            };
            let Some([_, part, service, region, account, _]) = arn_parts(arn) else {
                continue;
            };
            if region.is_empty() || account.is_empty() {
                continue;
            }
            let home = Home {
                region: region.to_string(),
                account: account.to_string(),
            };
            partition.get_or_insert_with(|| part.to_string());
            first.get_or_insert_with(|| home.clone());
            services.entry(service.to_string()).or_insert(home);
        }
        let default = services
            .get("dynamodb")
            .cloned()
            .or(first)
            .ok_or_else(|| anyhow!("the stack has no resource ARN to read its account from"))?;
        Ok(Self {
            partition: partition.unwrap_or_else(|| "aws".into()),
            default,
            services,
        })
    }

    /// One region and account for every service.
    pub fn single(partition: &str, region: &str, account: &str) -> Self {
        Self {
            partition: partition.into(),
            default: Home {
                region: region.into(),
                account: account.into(),
            },
            services: BTreeMap::new(),
        }
    }

    pub fn home(&self, service: &str) -> &Home {
        self.services.get(service).unwrap_or(&self.default)
    }

    /// `arn:<partition>:<service>:<region>:<account>:<rest>` in the service's home.
    fn arn(&self, service: &str, rest: &str) -> String {
        let home = self.home(service);
        format!(
            "arn:{}:{service}:{}:{}:{rest}",
            self.partition, home.region, home.account
        )
    }

    /// The role SAM creates for `function` (`<Function>Role`; CloudFormation's name carries a random
    /// suffix, which nothing here depends on).
    pub fn role_arn(&self, stage: &str, function: &str) -> String {
        format!(
            "arn:{}:iam::{}:role/stepline-{stage}-{function}Role",
            self.partition, self.default.account
        )
    }
}

/// The six parts of an ARN (the last keeps its colons).
fn arn_parts(arn: &str) -> Option<[&str; 6]> {
    let mut parts = arn.splitn(6, ':');
    let out = [
        parts.next()?,
        parts.next()?,
        parts.next()?,
        parts.next()?,
        parts.next()?,
        parts.next()?,
    ];
    (out[0] == "arn").then_some(out)
}

/// What the policies' intrinsics resolve against: the stack, plus the pseudo parameters and the
/// functions' roles (`!GetAtt <Function>Role.Arn`) that the stack does not know.
struct PolicyLookup<'a> {
    stack: &'a Stack,
    accounts: &'a Accounts,
    functions: &'a BTreeSet<String>,
    /// Other stacks' exports (`Fn::ImportValue`).
    imports: &'a BTreeMap<String, String>,
}

impl Lookup for PolicyLookup<'_> {
    fn parameter(&self, name: &str) -> Option<String> {
        match name {
            "AWS::AccountId" => Some(self.accounts.default.account.clone()),
            "AWS::Partition" => Some(self.accounts.partition.clone()),
            "AWS::Region" => Some(self.accounts.default.region.clone()),
            "AWS::URLSuffix" => Some("amazonaws.com".into()),
            _ => self.stack.parameter(name),
        }
    }

    fn reference(&self, logical: &str) -> Option<String> {
        self.stack.reference(logical)
    }

    fn attribute(&self, logical: &str, attribute: &str) -> Option<String> {
        self.stack.attribute(logical, attribute).or_else(|| {
            let function = logical.strip_suffix("Role")?;
            (attribute == "Arn" && self.functions.contains(function))
                .then(|| self.accounts.role_arn(&self.stack.stage, function))
        })
    }

    fn import(&self, name: &str) -> Option<String> {
        self.imports.get(name).cloned()
    }
}

/// The template's functions.
fn functions_of(template: &Template) -> BTreeSet<String> {
    template
        .resources()
        .into_iter()
        .filter(|(_, kind, _)| kind == "AWS::Serverless::Function")
        .map(|(id, _, _)| id)
        .collect()
}

/// What a stack of `template` on `stack` exports (`Outputs.*.Export.Name`) for other stacks to import.
fn exports_of(template: &Template, stack: &Stack, accounts: &Accounts) -> BTreeMap<String, String> {
    let functions = functions_of(template);
    let none = BTreeMap::new();
    let lookup = PolicyLookup {
        stack,
        accounts,
        functions: &functions,
        imports: &none,
    };
    let outputs = template.root.get("Outputs").and_then(Value::as_mapping);
    outputs
        .into_iter()
        .flatten()
        .filter_map(|(_, output)| {
            let name = resolve(output.get("Export")?.get("Name")?, &lookup).ok()?;
            let value = resolve(output.get("Value")?, &lookup).ok()?;
            Some((name, value))
        })
        .collect()
}

/// The worker stack `stepline init` writes, rendered for a worker named `name`.
fn worker_stack_template(name: &str) -> Result<Template> {
    let text = include_str!("../../cli/templates/template.yaml")
        .replace("{{name}}", name)
        .replace("{{runtime}}", "provided.al2023")
        .replace("{{handler}}", "bootstrap");
    Template::parse(&text).context("the worker stack template")
}

// -------------------------------------------------------------------------------------------- catalog

/// What requests name, mapped to what policies name: queue URLs to ARNs, tables to their hash keys.
#[derive(Debug, Clone)]
pub struct Catalog {
    pub accounts: Accounts,
    /// Queue URL → ARN.
    queues: BTreeMap<String, String>,
    /// Table name → hash key attribute of the table and of each index.
    tables: BTreeMap<String, TableKeys>,
    buckets: BTreeSet<String>,
    /// Secret name → ARN (whose last part carries a suffix a request by name does not tell).
    secrets: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct TableKeys {
    hash: String,
    indexes: BTreeMap<String, String>,
}

impl Catalog {
    pub fn new(template: &Template, stack: &Stack, accounts: Accounts) -> Result<Self> {
        let mut catalog = Self {
            accounts,
            queues: BTreeMap::new(),
            tables: BTreeMap::new(),
            buckets: BTreeSet::new(),
            secrets: BTreeMap::new(),
        };
        for physical in stack.resources.values() {
            match physical {
                Physical::Secret { name, arn } => {
                    catalog.secrets.insert(name.clone(), arn.clone());
                }
                Physical::Queue { url, arn, .. } => {
                    catalog.queues.insert(url.clone(), arn.clone());
                }
                Physical::Bucket { name, .. } => {
                    catalog.buckets.insert(name.clone());
                }
                _ => {}
            }
        }
        for (logical, kind, props) in template.resources() {
            if kind != "AWS::DynamoDB::Table" {
                continue;
            }
            let Some(Physical::Table { name, .. }) = stack.resources.get(&logical) else {
                continue;
            };
            let mut keys = TableKeys {
                hash: hash_key(&props).with_context(|| format!("table {logical}"))?,
                indexes: BTreeMap::new(),
            };
            for (list, own_hash) in [
                ("GlobalSecondaryIndexes", false),
                ("LocalSecondaryIndexes", true),
            ] {
                for index in props
                    .get(list)
                    .and_then(Value::as_sequence)
                    .into_iter()
                    .flatten()
                {
                    let index_name = index
                        .get("IndexName")
                        .and_then(scalar)
                        .ok_or_else(|| anyhow!("table {logical}: an index without IndexName"))?;
                    let hash = if own_hash {
                        keys.hash.clone()
                    } else {
                        hash_key(index).with_context(|| format!("index {index_name}"))?
                    };
                    keys.indexes.insert(index_name, hash);
                }
            }
            catalog.tables.insert(name.clone(), keys);
        }
        Ok(catalog)
    }

    /// The ARN of a queue by URL: the stack's, else read from the URL (`/<account>/<name>`).
    fn queue_arn(&self, url: &str) -> Result<String, String> {
        if let Some(arn) = self.queues.get(url) {
            return Ok(arn.clone());
        }
        let (_, path, _) = split_uri(url);
        match path.trim_matches('/').split('/').collect::<Vec<_>>()[..] {
            [account, name] if !account.is_empty() && !name.is_empty() => {
                let region = &self.accounts.home("sqs").region;
                let partition = &self.accounts.partition;
                Ok(format!("arn:{partition}:sqs:{region}:{account}:{name}"))
            }
            _ => Err(format!("a queue URL without /<account>/<name>: {url}")),
        }
    }
}

fn hash_key(props: &Value) -> Result<String> {
    props
        .get("KeySchema")
        .and_then(Value::as_sequence)
        .into_iter()
        .flatten()
        .find(|k| k.get("KeyType").and_then(Value::as_str) == Some("HASH"))
        .and_then(|k| k.get("AttributeName").and_then(scalar))
        .ok_or_else(|| anyhow!("no HASH key in its KeySchema"))
}

// ------------------------------------------------------------------------------------------- policies

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    Allow,
    Deny,
}

/// `Action`/`NotAction` or `Resource`/`NotResource`.
#[derive(Debug, Clone)]
struct Names {
    negated: bool,
    patterns: Vec<String>,
}

/// One `operator: {key: values}` of a Condition block.
#[derive(Debug, Clone)]
struct Condition {
    operator: String,
    key: String,
    values: Vec<String>,
}

/// One statement of a policy, its intrinsics resolved.
#[derive(Debug, Clone)]
pub struct Statement {
    /// The policy it belongs to, e.g. `CompletionFunction policy 3 (SQSSendMessagePolicy)`.
    pub policy: String,
    /// Its Sid, else `statement <n>` (from 1).
    pub label: String,
    pub effect: Effect,
    actions: Names,
    resources: Names,
    conditions: Vec<Condition>,
}

impl Statement {
    fn parse(statement: &Json, policy: &str, index: usize, resource_policy: bool) -> Result<Self> {
        let here = || format!("{policy}, statement {}", index + 1);
        let object = statement
            .as_object()
            .ok_or_else(|| anyhow!("{}: not a mapping", here()))?;
        for key in object.keys() {
            match key.as_str() {
                "Sid" | "Effect" | "Action" | "NotAction" | "Resource" | "NotResource"
                | "Condition" => {}
                "Principal" if resource_policy => {}
                other => bail!("{}: element {other} is not supported", here()),
            }
        }
        let effect = match object.get("Effect").and_then(Json::as_str) {
            Some("Allow") => Effect::Allow,
            Some("Deny") => Effect::Deny,
            other => bail!("{}: Effect {other:?}", here()),
        };
        let names = |positive: &str, negative: &str| -> Result<Names> {
            let (negated, value) = match (object.get(positive), object.get(negative)) {
                (Some(v), None) => (false, v),
                (None, Some(v)) => (true, v),
                _ => bail!("{}: exactly one of {positive} and {negative}", here()),
            };
            let patterns = strings(value).with_context(here)?;
            if let Some(p) = patterns.iter().find(|p| p.contains("${")) {
                bail!("{}: policy variables are not supported ({p})", here());
            }
            Ok(Names { negated, patterns })
        };
        let mut conditions = Vec::new();
        if let Some(block) = object.get("Condition") {
            let block = block
                .as_object()
                .ok_or_else(|| anyhow!("{}: Condition is not a mapping", here()))?;
            for (operator, keys) in block {
                let keys = keys
                    .as_object()
                    .ok_or_else(|| anyhow!("{}: Condition {operator} is not a mapping", here()))?;
                for (key, values) in keys {
                    let values = strings(values).with_context(here)?;
                    if let Some(v) = values.iter().find(|v| v.contains("${")) {
                        bail!("{}: policy variables are not supported ({v})", here());
                    }
                    conditions.push(Condition {
                        operator: operator.clone(),
                        key: key.to_ascii_lowercase(),
                        values,
                    });
                }
            }
        }
        Ok(Self {
            policy: policy.to_string(),
            label: object
                .get("Sid")
                .and_then(Json::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| format!("statement {}", index + 1)),
            effect,
            actions: names("Action", "NotAction")?,
            resources: names("Resource", "NotResource")?,
            conditions,
        })
    }

    /// Whether the statement matches the request: action, resource and every condition.
    fn matches(&self, request: &Request, context: &Context) -> Result<bool, String> {
        let action = self
            .actions
            .patterns
            .iter()
            .any(|p| glob(p, &request.action, true));
        if action == self.actions.negated {
            return Ok(false);
        }
        let resource = self
            .resources
            .patterns
            .iter()
            .any(|p| request.resource_matches(p));
        if resource == self.resources.negated {
            return Ok(false);
        }
        for condition in &self.conditions {
            if !condition.holds(context)? {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// A string or a list of strings.
fn strings(value: &Json) -> Result<Vec<String>> {
    match value {
        Json::String(s) => Ok(vec![s.clone()]),
        Json::Array(items) => items
            .iter()
            .map(|item| {
                item.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| anyhow!("{item} is not a string"))
            })
            .collect(),
        other => bail!("{other} is neither a string nor a list of strings"),
    }
}

/// The statements of a policy document (`{Statement: [...]}` or `{Statement: {...}}`).
fn document_statements(document: &Json) -> Result<Vec<Json>> {
    match document.get("Statement") {
        Some(Json::Array(items)) => Ok(items.clone()),
        Some(one @ Json::Object(_)) => Ok(vec![one.clone()]),
        _ => bail!("a policy document without Statement"),
    }
}

/// A template value with its intrinsic functions resolved, every scalar as a string (as IAM reads
/// them).
fn resolve_document(value: &Value, lookup: &dyn Lookup) -> Result<Json> {
    Ok(match value {
        Value::Null => Json::Null,
        Value::Tagged(_) => Json::String(resolve(value, lookup)?),
        Value::Mapping(map) if is_intrinsic(map) => Json::String(resolve(value, lookup)?),
        Value::Mapping(map) => {
            let mut out = Map::new();
            for (key, value) in map {
                let key = scalar(key).ok_or_else(|| anyhow!("a non-scalar key {key:?}"))?;
                out.insert(key, resolve_document(value, lookup)?);
            }
            Json::Object(out)
        }
        Value::Sequence(items) => Json::Array(
            items
                .iter()
                .map(|item| resolve_document(item, lookup))
                .collect::<Result<_>>()?,
        ),
        scalar_value => Json::String(scalar(scalar_value).unwrap_or_default()),
    })
}

fn is_intrinsic(map: &serde_yaml_ng::Mapping) -> bool {
    map.len() == 1
        && map
            .keys()
            .next()
            .and_then(Value::as_str)
            .is_some_and(|k| k == "Ref" || k.starts_with("Fn::"))
}

/// The policy document SAM expands policy template `name` with `parameters` to (from SAM's
/// samtranslator/policy_templates_data/policy_templates.json, checked against aws/serverless-
/// application-model at 603eb020). Only the templates this project uses (and the secret reader it
/// may use next); any other is an error.
pub fn sam_policy_template(name: &str, parameters: &Json, accounts: &Accounts) -> Result<Json> {
    let expected: &[&str] = match name {
        "SQSSendMessagePolicy" | "SQSPollerPolicy" => &["QueueName"],
        "EventBridgePutEventsPolicy" => &["EventBusName"],
        "AWSSecretsManagerGetSecretValuePolicy" => &["SecretArn"],
        other => bail!(
            "SAM policy template {other} is not known to the IAM checker: add its expansion from \
             SAM's policy_templates.json to iam::sam_policy_template"
        ),
    };
    let given: BTreeSet<&str> = parameters
        .as_object()
        .ok_or_else(|| anyhow!("{name}: parameters are not a mapping"))?
        .keys()
        .map(String::as_str)
        .collect();
    if given != expected.iter().copied().collect() {
        bail!("{name} takes parameters {expected:?}, given {given:?}");
    }
    let parameter = |key: &str| -> Result<&str> {
        parameters[key]
            .as_str()
            .ok_or_else(|| anyhow!("{name}: {key} is not a string"))
    };
    Ok(match name {
        "SQSSendMessagePolicy" => json!({"Statement": [{
            "Effect": "Allow",
            "Action": ["sqs:SendMessage*"],
            "Resource": accounts.arn("sqs", parameter("QueueName")?),
        }]}),
        "SQSPollerPolicy" => json!({"Statement": [{
            "Effect": "Allow",
            "Action": [
                "sqs:ChangeMessageVisibility",
                "sqs:ChangeMessageVisibilityBatch",
                "sqs:DeleteMessage",
                "sqs:DeleteMessageBatch",
                "sqs:GetQueueAttributes",
                "sqs:ReceiveMessage",
            ],
            "Resource": accounts.arn("sqs", parameter("QueueName")?),
        }]}),
        "AWSSecretsManagerGetSecretValuePolicy" => json!({"Statement": [{
            "Effect": "Allow",
            "Action": ["secretsmanager:GetSecretValue"],
            "Resource": parameter("SecretArn")?,
        }]}),
        _ => json!({"Statement": [{
            "Effect": "Allow",
            "Action": "events:PutEvents",
            "Resource": accounts.arn("events", &format!("event-bus/{}", parameter("EventBusName")?)),
        }]}),
    })
}

/// A resource policy: the resources it governs (ARN patterns) and its statements that name the
/// principal.
#[derive(Debug, Clone)]
struct ResourcePolicy {
    governs: Vec<String>,
    statements: Vec<Statement>,
}

/// A function's role as IAM sees it: its identity statements and the resource-policy statements
/// whose principal covers it.
#[derive(Debug, Clone)]
pub struct Principal {
    pub function: String,
    pub role_arn: String,
    pub account: String,
    statements: Vec<Statement>,
    resource_policies: Vec<ResourcePolicy>,
}

/// A policy document as given to [`Principal::new`].
pub struct Document {
    pub name: String,
    pub document: Json,
}

/// A resource policy as given to [`Principal::new`]: its name, the ARN patterns of what it governs and
/// its document (statements carry a `Principal`).
pub struct ResourceDocument {
    pub name: String,
    pub governs: Vec<String>,
    pub document: Json,
}

impl Principal {
    /// From documents whose intrinsics are resolved already. Statements of `resources` whose
    /// principal does not cover this role (another account, a service) are left out.
    pub fn new(
        function: &str,
        role_arn: &str,
        account: &str,
        identity: Vec<Document>,
        resources: Vec<ResourceDocument>,
    ) -> Result<Self> {
        let mut statements = Vec::new();
        for Document { name, document } in identity {
            for (index, statement) in document_statements(&document)?.iter().enumerate() {
                statements.push(Statement::parse(statement, &name, index, false)?);
            }
        }
        let mut resource_policies = Vec::new();
        for ResourceDocument {
            name,
            governs,
            document,
        } in resources
        {
            let mut policy = ResourcePolicy {
                governs,
                statements: Vec::new(),
            };
            for (index, statement) in document_statements(&document)?.iter().enumerate() {
                let principal = statement
                    .get("Principal")
                    .ok_or_else(|| anyhow!("{name}, statement {}: no Principal", index + 1))?;
                if covers(principal, role_arn, account)
                    .with_context(|| format!("{name}, statement {}", index + 1))?
                {
                    policy
                        .statements
                        .push(Statement::parse(statement, &name, index, true)?);
                }
            }
            resource_policies.push(policy);
        }
        Ok(Self {
            function: function.to_string(),
            role_arn: role_arn.to_string(),
            account: account.to_string(),
            statements,
            resource_policies,
        })
    }

    /// This principal with the statements of `resources` (resource policies attached outside the
    /// template) that cover it added.
    pub fn with_resources(&self, resources: Vec<ResourceDocument>) -> Result<Self> {
        let extra = Self::new(
            &self.function,
            &self.role_arn,
            &self.account,
            Vec::new(),
            resources,
        )?;
        let mut principal = self.clone();
        principal.resource_policies.extend(extra.resource_policies);
        Ok(principal)
    }

    /// Function `logical` of `template` on `stack`: its `Policies` (inline documents and SAM policy
    /// templates) and the template's bucket and queue policies.
    pub fn of_function(
        template: &Template,
        stack: &Stack,
        catalog: &Catalog,
        logical: &str,
    ) -> Result<Self> {
        Self::of_function_importing(template, stack, catalog, logical, &BTreeMap::new())
    }

    /// [`Principal::of_function`] of a stack that imports `imports` (other stacks' exports).
    fn of_function_importing(
        template: &Template,
        stack: &Stack,
        catalog: &Catalog,
        logical: &str,
        imports: &BTreeMap<String, String>,
    ) -> Result<Self> {
        let accounts = &catalog.accounts;
        let functions = functions_of(template);
        if !functions.contains(logical) {
            bail!("the template has no function {logical}");
        }
        let lookup = PolicyLookup {
            stack,
            accounts,
            functions: &functions,
            imports,
        };
        let props = &template.root["Resources"][logical]["Properties"];
        if props.get("Role").is_some() {
            bail!(
                "{logical}: a Role of its own is not supported by the IAM checker (only Policies)"
            );
        }
        if template.global_function_property("Policies").is_some() {
            bail!("Globals.Function.Policies is not supported by the IAM checker");
        }
        let policies = match props.get("Policies") {
            None => Vec::new(),
            Some(Value::Sequence(items)) => items.clone(),
            Some(one) => vec![one.clone()],
        };
        let mut identity = Vec::new();
        for (n, policy) in policies.iter().enumerate() {
            let here = format!("{logical} policy {}", n + 1);
            let map = policy.as_mapping().ok_or_else(|| {
                anyhow!(
                    "{here}: {policy:?} (managed policies are not supported by the IAM checker)"
                )
            })?;
            let document = if map.contains_key("Statement") {
                Document {
                    name: here.clone(),
                    document: resolve_document(policy, &lookup).context(here)?,
                }
            } else {
                let (name, parameters) = match map.iter().next() {
                    Some((name, parameters)) if map.len() == 1 => (name, parameters),
                    _ => bail!("{here}: neither a document nor one SAM policy template"),
                };
                let name = name.as_str().ok_or_else(|| anyhow!("{here}: {name:?}"))?;
                let parameters = resolve_document(parameters, &lookup).context(here.clone())?;
                Document {
                    name: format!("{here} ({name})"),
                    document: sam_policy_template(name, &parameters, accounts).context(here)?,
                }
            };
            identity.push(document);
        }
        let role_arn = accounts.role_arn(&stack.stage, logical);
        let resources = resource_documents(template, &lookup, catalog, &role_arn)?;
        Self::new(
            logical,
            &role_arn,
            &accounts.default.account,
            identity,
            resources,
        )
    }
}

/// The template's resource policies on what the functions call: bucket policies and queue policies.
/// Statements are resolved one by one, their Principal first, so a statement for a service (whose
/// conditions may name what the stage does not provision, like a rule's ARN) is left out unresolved.
fn resource_documents(
    template: &Template,
    lookup: &PolicyLookup<'_>,
    catalog: &Catalog,
    role_arn: &str,
) -> Result<Vec<ResourceDocument>> {
    let account = &catalog.accounts.default.account;
    let partition = &catalog.accounts.partition;
    let mut out = Vec::new();
    for (logical, kind, props) in template.resources() {
        let governs = match kind.as_str() {
            "AWS::S3::BucketPolicy" => {
                let bucket = resolve(
                    props
                        .get("Bucket")
                        .ok_or_else(|| anyhow!("{logical}: no Bucket"))?,
                    lookup,
                )?;
                vec![
                    format!("arn:{partition}:s3:::{bucket}"),
                    format!("arn:{partition}:s3:::{bucket}/*"),
                ]
            }
            "AWS::SQS::QueuePolicy" => props
                .get("Queues")
                .and_then(Value::as_sequence)
                .ok_or_else(|| anyhow!("{logical}: no Queues"))?
                .iter()
                .map(|queue| {
                    let url = resolve(queue, lookup)?;
                    catalog
                        .queue_arn(&url)
                        .map_err(|e| anyhow!("{logical}: {e}"))
                })
                .collect::<Result<_>>()?,
            // Resource policies on services the functions call, which this module does not read yet.
            "AWS::Events::EventBusPolicy" | "AWS::SecretsManager::ResourcePolicy" => {
                bail!("{logical}: {kind} is not modelled by the IAM checker")
            }
            _ => continue,
        };
        let document = props
            .get("PolicyDocument")
            .ok_or_else(|| anyhow!("{logical}: no PolicyDocument"))?;
        let statements = match document.get("Statement") {
            Some(Value::Sequence(items)) => items.clone(),
            Some(one) => vec![one.clone()],
            None => bail!("{logical}: no Statement"),
        };
        let mut kept = Vec::new();
        for (index, statement) in statements.iter().enumerate() {
            let here = || format!("{logical}, statement {}", index + 1);
            let principal = statement.get("Principal").ok_or_else(|| {
                anyhow!("{}: no Principal (NotPrincipal is not supported)", here())
            })?;
            let principal = resolve_document(principal, lookup).with_context(here)?;
            if covers(&principal, role_arn, account).with_context(here)? {
                kept.push(resolve_document(statement, lookup).with_context(here)?);
            }
        }
        out.push(ResourceDocument {
            name: logical,
            governs,
            document: json!({ "Statement": kept }),
        });
    }
    Ok(out)
}

/// Whether a statement's Principal covers `role_arn` of `account`: everyone, the account (which
/// stands for every principal of it), or the role itself. Services and other accounts do not.
fn covers(principal: &Json, role_arn: &str, account: &str) -> Result<bool> {
    let names = match principal {
        Json::String(s) if s == "*" => return Ok(true),
        Json::Object(map) => map,
        other => bail!("Principal {other} is not supported"),
    };
    for (kind, values) in names {
        match kind.as_str() {
            "AWS" => {
                let root = format!(":iam::{account}:root");
                if strings(values)?
                    .iter()
                    .any(|v| v == "*" || v == account || v == role_arn || v.ends_with(&root))
                {
                    return Ok(true);
                }
            }
            "Service" | "Federated" | "CanonicalUser" => {}
            other => bail!("Principal {other} is not supported"),
        }
    }
    Ok(false)
}

// ------------------------------------------------------------------------------------ request context

/// Condition keys of a request. A key is either known (with its values, or known to be absent) or
/// not modelled by this module, and a condition on an unmodelled key is an error: never a guess.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Context {
    values: BTreeMap<String, Vec<String>>,
    modelled: BTreeSet<String>,
}

/// Keys that carry a set of values (conditions on them need `ForAllValues:` or `ForAnyValue:`).
const MULTIVALUED: &[&str] = &[
    "dynamodb:leadingkeys",
    "dynamodb:attributes",
    "aws:tagkeys",
    "aws:calledvia",
];

impl Context {
    pub fn set(&mut self, key: &str, value: impl Into<String>) {
        self.set_all(key, [value.into()]);
    }

    pub fn set_all(&mut self, key: &str, values: impl IntoIterator<Item = String>) {
        let key = key.to_ascii_lowercase();
        self.values
            .insert(key.clone(), values.into_iter().collect());
        self.modelled.insert(key);
    }

    /// Known to be absent from the request.
    pub fn absent(&mut self, key: &str) {
        let key = key.to_ascii_lowercase();
        self.values.remove(&key);
        self.modelled.insert(key);
    }

    /// The key's values (`None`: absent), or an error for a key not modelled.
    fn get(&self, key: &str) -> Result<Option<&[String]>, String> {
        match self.values.get(key) {
            Some(values) if !values.is_empty() => Ok(Some(values)),
            _ if self.modelled.contains(key) => Ok(None),
            _ => Err(format!(
                "condition key {key} is not modelled by the IAM checker for this request"
            )),
        }
    }

    /// The service's keys (not the global `aws:` ones) that have values, for reports.
    pub fn service_keys(&self) -> Vec<(String, Vec<String>)> {
        self.values
            .iter()
            .filter(|(k, v)| !k.starts_with("aws:") && !v.is_empty())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

const OPERATORS: &[&str] = &[
    "StringEquals",
    "StringNotEquals",
    "StringEqualsIgnoreCase",
    "StringNotEqualsIgnoreCase",
    "StringLike",
    "StringNotLike",
    "ArnEquals",
    "ArnLike",
    "ArnNotEquals",
    "ArnNotLike",
    "Bool",
    "NumericEquals",
    "NumericNotEquals",
    "NumericLessThan",
    "NumericLessThanEquals",
    "NumericGreaterThan",
    "NumericGreaterThanEquals",
];

/// A negated operator holds when the key is absent (AWS: "if the key is not present, a negated
/// operator such as StringNotLike returns true").
fn negated(operator: &str) -> bool {
    operator.contains("Not")
}

impl Condition {
    fn holds(&self, context: &Context) -> Result<bool, String> {
        enum Set {
            All,
            Any,
        }
        let (set, rest) = if let Some(rest) = self.operator.strip_prefix("ForAllValues:") {
            (Some(Set::All), rest)
        } else if let Some(rest) = self.operator.strip_prefix("ForAnyValue:") {
            (Some(Set::Any), rest)
        } else {
            (None, self.operator.as_str())
        };
        let (operator, if_exists) = match rest.strip_suffix("IfExists") {
            Some(operator) => (operator, true),
            None => (rest, false),
        };
        if operator == "Null" {
            if set.is_some() || if_exists {
                return Err(format!("{} is not a valid operator", self.operator));
            }
            let absent = match &self.values[..] {
                [v] if v.eq_ignore_ascii_case("true") => true,
                [v] if v.eq_ignore_ascii_case("false") => false,
                other => return Err(format!("Null {}: {other:?}", self.key)),
            };
            return Ok(context.get(&self.key)?.is_none() == absent);
        }
        if !OPERATORS.contains(&operator) {
            return Err(format!(
                "condition operator {} is not implemented by the IAM checker",
                self.operator
            ));
        }
        let values = context.get(&self.key)?;
        match set {
            None => {
                if MULTIVALUED.contains(&self.key.as_str()) {
                    return Err(format!(
                        "{} is multivalued: its condition needs ForAllValues: or ForAnyValue:",
                        self.key
                    ));
                }
                match values {
                    None => Ok(if_exists || negated(operator)),
                    Some([value]) => test(operator, value, &self.values),
                    Some(many) => Err(format!("{} has several values: {many:?}", self.key)),
                }
            }
            // True for an absent key or an empty set.
            Some(Set::All) => values
                .unwrap_or_default()
                .iter()
                .try_fold(true, |ok, v| Ok(ok && test(operator, v, &self.values)?)),
            // False for an absent key or an empty set.
            Some(Set::Any) => match values {
                None => Ok(if_exists),
                Some(values) => values
                    .iter()
                    .try_fold(false, |ok, v| Ok(ok || test(operator, v, &self.values)?)),
            },
        }
    }
}

/// One value of the request against the condition's values (any of them matching).
fn test(operator: &str, value: &str, policy: &[String]) -> Result<bool, String> {
    let any = |f: &dyn Fn(&str) -> bool| policy.iter().any(|p| f(p));
    let numeric = |p: &str| -> Result<f64, String> {
        p.parse::<f64>()
            .map_err(|_| format!("{operator}: {p} is not a number"))
    };
    let number = value.parse::<f64>().ok();
    let compare = |f: fn(f64, f64) -> bool| -> Result<bool, String> {
        let mut out = false;
        for p in policy {
            let p = numeric(p)?;
            out |= number.is_some_and(|n| f(n, p));
        }
        Ok(out)
    };
    Ok(match operator {
        "StringEquals" => any(&|p| p == value),
        "StringNotEquals" => !any(&|p| p == value),
        "StringEqualsIgnoreCase" => any(&|p| p.to_lowercase() == value.to_lowercase()),
        "StringNotEqualsIgnoreCase" => !any(&|p| p.to_lowercase() == value.to_lowercase()),
        "StringLike" => any(&|p| glob(p, value, false)),
        "StringNotLike" => !any(&|p| glob(p, value, false)),
        "ArnEquals" | "ArnLike" => any(&|p| arn_like(p, value)),
        "ArnNotEquals" | "ArnNotLike" => !any(&|p| arn_like(p, value)),
        "Bool" => {
            if let Some(p) = policy
                .iter()
                .find(|p| !p.eq_ignore_ascii_case("true") && !p.eq_ignore_ascii_case("false"))
            {
                return Err(format!("Bool: {p} is not true or false"));
            }
            any(&|p| p.eq_ignore_ascii_case(value))
        }
        "NumericEquals" => compare(|a, b| a == b)?,
        "NumericNotEquals" => !compare(|a, b| a == b)?,
        "NumericLessThan" => compare(|a, b| a < b)?,
        "NumericLessThanEquals" => compare(|a, b| a <= b)?,
        "NumericGreaterThan" => compare(|a, b| a > b)?,
        "NumericGreaterThanEquals" => compare(|a, b| a >= b)?,
        other => return Err(format!("condition operator {other} is not implemented")),
    })
}

/// `*` (any run of characters) and `?` (one character) wildcards.
pub fn glob(pattern: &str, text: &str, ignore_case: bool) -> bool {
    let fold = |c: char| {
        if ignore_case {
            c.to_ascii_lowercase()
        } else {
            c
        }
    };
    let p: Vec<char> = pattern.chars().map(fold).collect();
    let t: Vec<char> = text.chars().map(fold).collect();
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((s, mark)) = star {
            pi = s + 1;
            ti = mark + 1;
            star = Some((s, mark + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// ArnLike/ArnEquals: each of the six colon-separated parts matched on its own, wildcards allowed.
fn arn_like(pattern: &str, arn: &str) -> bool {
    match (arn_parts(pattern), arn_parts(arn)) {
        (Some(p), Some(a)) => p.iter().zip(a.iter()).all(|(p, a)| glob(p, a, false)),
        _ => false,
    }
}

// -------------------------------------------------------------------------------------- evaluation

/// One authorization IAM makes for a call (a batch or transaction makes one per table and action).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub action: String,
    pub resource: String,
    pub context: Context,
    /// A Secrets Manager secret outside the stack named by name, not ARN: its ARN is `resource` plus
    /// `-` and six characters the request does not tell (matched by a policy naming that ARN, or a
    /// pattern any such suffix satisfies).
    secret_by_name: bool,
}

impl Request {
    pub fn new(action: impl Into<String>, resource: impl Into<String>, context: Context) -> Self {
        Self {
            action: action.into(),
            resource: resource.into(),
            context,
            secret_by_name: false,
        }
    }

    fn resource_matches(&self, pattern: &str) -> bool {
        if glob(pattern, &self.resource, false) {
            return true;
        }
        if !self.secret_by_name {
            return false;
        }
        // The secret's full ARN: a literal one with this name, or a pattern that any six-character
        // suffix satisfies (probed with one).
        let prefix = format!("{}-", self.resource);
        let literal = !pattern.contains(['*', '?'])
            && pattern.len() == prefix.len() + 6
            && pattern.starts_with(&prefix);
        literal || glob(pattern, &format!("{prefix}AbCdEf"), false)
    }
}

/// What IAM decides for a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allowed,
    /// No statement allows it.
    ImplicitDeny,
    /// A Deny statement matches: its policy and its Sid (or `statement <n>`).
    ExplicitDeny {
        policy: String,
        statement: String,
    },
}

impl Decision {
    /// AWS's wording, more or less.
    pub fn reason(&self) -> String {
        match self {
            Decision::Allowed => "allowed".into(),
            Decision::ImplicitDeny => {
                "no identity-based or resource-based policy allows the action".into()
            }
            Decision::ExplicitDeny { policy, statement } => {
                format!("explicit deny in {policy} ({statement})")
            }
        }
    }
}

/// Evaluates `request` made by `principal` as IAM does within one account: a matching Deny in any
/// identity or resource statement denies; otherwise a matching Allow in either allows; otherwise the
/// request is implicitly denied. A statement that cannot be evaluated (an unmodelled key or operator)
/// is an error unless a Deny already decides.
pub fn evaluate(principal: &Principal, request: &Request) -> Result<Decision, String> {
    let mut context = request.context.clone();
    context.set("aws:PrincipalArn", principal.role_arn.clone());
    context.set("aws:PrincipalAccount", principal.account.clone());
    let resource_statements = principal
        .resource_policies
        .iter()
        .filter(|policy| {
            policy
                .governs
                .iter()
                .any(|pattern| glob(pattern, &request.resource, false))
        })
        .flat_map(|policy| &policy.statements);
    let mut allowed = false;
    let mut error = None;
    for statement in principal.statements.iter().chain(resource_statements) {
        match statement.matches(request, &context) {
            Ok(false) => {}
            Ok(true) if statement.effect == Effect::Deny => {
                return Ok(Decision::ExplicitDeny {
                    policy: statement.policy.clone(),
                    statement: statement.label.clone(),
                })
            }
            Ok(true) => allowed = true,
            Err(e) => {
                error.get_or_insert_with(|| {
                    format!("{} ({}): {e}", statement.policy, statement.label)
                });
            }
        }
    }
    match error {
        Some(e) => Err(e),
        None if allowed => Ok(Decision::Allowed),
        None => Ok(Decision::ImplicitDeny),
    }
}

// ------------------------------------------------------------------------------- reading a request

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
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }

    /// Region and service of the SigV4 credential scope (`Credential=<key>/<date>/<region>/<service>/
    /// aws4_request`): which service the request is for, as signed.
    fn scope(&self) -> Option<(String, String)> {
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
fn split_uri(uri: &str) -> (&str, &str, &str) {
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

fn percent_decode(text: &str) -> String {
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
fn key_value(value: &Json) -> Option<String> {
    ["S", "N", "B"]
        .iter()
        .find_map(|t| value.get(t).and_then(Json::as_str))
        .map(str::to_string)
}

fn dynamodb(
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
fn query_hash_value(body: &Json, hash: &str) -> Result<String, String> {
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
fn split_and(expression: &str) -> Vec<String> {
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

fn sqs(
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

fn events(
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

fn secrets(
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
const S3_SUBRESOURCES: &[&str] = &[
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

fn s3(call: &HttpCall, catalog: &Catalog, mut context: Context) -> Result<Request, String> {
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

/// A call AWS would deny.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Denial {
    pub function: String,
    pub action: String,
    pub resource: String,
    /// The request's service condition keys (e.g. `dynamodb:LeadingKeys`), for the reader.
    pub keys: Vec<(String, Vec<String>)>,
    pub reason: String,
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "AccessDenied: {} is not authorized to perform {} on {}",
            self.function, self.action, self.resource
        )?;
        for (key, values) in &self.keys {
            write!(f, " [{key}={}]", values.join(","))?;
        }
        write!(f, ": {}", self.reason)
    }
}

/// The distinct denials of `denials`, each with how often it happened, one a line.
pub fn report(denials: &[Denial]) -> String {
    let mut counts: BTreeMap<&Denial, usize> = BTreeMap::new();
    for denial in denials {
        *counts.entry(denial).or_default() += 1;
    }
    let mut out = format!(
        "IAM: {} call(s) that AWS would deny, by template.yaml's policies ({} distinct):",
        denials.len(),
        counts.len()
    );
    for (denial, count) in counts {
        out.push_str(&format!("\n  {count} x {denial}"));
    }
    out
}

// ------------------------------------------------------------------------------------ interceptor

/// The SDK interceptor checking every request of one function's clients.
#[derive(Clone)]
pub struct Checker {
    principal: Arc<Principal>,
    catalog: Arc<Catalog>,
    denials: Arc<Mutex<Vec<Denial>>>,
    worker_queues: Arc<WorkerQueues>,
}

/// Queues outside the template are worker stacks' request queues (`stepline init`), each with that
/// stack's queue policy: the coordinator roles it names may send to it. The roles of those functions.
#[derive(Debug, Default)]
pub struct WorkerQueues {
    senders: Vec<String>,
}

impl WorkerQueues {
    /// The queue policy a worker stack gives each queue of `requests` that is not the template's.
    fn documents(&self, requests: &[Request], catalog: &Catalog) -> Vec<ResourceDocument> {
        let ours: BTreeSet<&String> = catalog.queues.values().collect();
        let outside: BTreeSet<&String> = requests
            .iter()
            .filter(|r| r.action.starts_with("sqs:") && !ours.contains(&r.resource))
            .map(|r| &r.resource)
            .collect();
        outside
            .into_iter()
            .map(|arn| ResourceDocument {
                name: format!("worker stack queue policy of {arn}"),
                governs: vec![arn.clone()],
                document: json!({
                    "Version": "2012-10-17",
                    "Statement": [{
                        "Sid": "CoordinatorSends",
                        "Effect": "Allow",
                        "Principal": {"AWS": self.senders},
                        "Action": ["sqs:SendMessage", "sqs:GetQueueUrl"],
                        "Resource": arn,
                    }],
                }),
            })
            .collect()
    }
}

/// The roles a worker stack's request queue policy lets send to it, as the worker stack template
/// (`stepline init`) imports them: `${CoordinatorStack}-<Name>RoleArn` is function `<Name>Function`.
pub fn worker_queue_senders() -> Vec<String> {
    let template = include_str!("../../cli/templates/template.yaml");
    template
        .split("${CoordinatorStack}-")
        .skip(1)
        .filter_map(|rest| {
            let name = rest.split('"').next()?.strip_suffix("RoleArn")?;
            Some(format!("{name}Function"))
        })
        .collect()
}

impl fmt::Debug for Checker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Checker({})", self.principal.function)
    }
}

/// An allowed read of an object the function could not list: if S3 answers 404, AWS would answer
/// 403 (without s3:ListBucket on the bucket, S3 does not tell whether a key exists).
#[derive(Debug, Clone)]
struct ReadWithoutList(Denial);

impl Storable for ReadWithoutList {
    type Storer = StoreReplace<Self>;
}

impl Checker {
    pub fn new(
        principal: Arc<Principal>,
        catalog: Arc<Catalog>,
        denials: Arc<Mutex<Vec<Denial>>>,
    ) -> Self {
        Self {
            principal,
            catalog,
            denials,
            worker_queues: Arc::default(),
        }
    }

    /// This checker, taking queues outside the template for worker stacks' (see [`WorkerQueues`]).
    pub fn with_worker_queues(mut self, worker_queues: Arc<WorkerQueues>) -> Self {
        self.worker_queues = worker_queues;
        self
    }

    fn denial(&self, request: Option<&Request>, reason: String) -> Denial {
        Denial {
            function: self.principal.function.clone(),
            action: request.map_or_else(|| "?".into(), |r| r.action.clone()),
            resource: request.map_or_else(|| "?".into(), |r| r.resource.clone()),
            keys: request.map_or_else(Vec::new, |r| r.context.service_keys()),
            reason,
        }
    }

    /// Decides a call: `Err` with the denial when AWS would deny it; `Ok(Some)` for an object read
    /// whose 404 AWS would turn into a 403.
    pub fn check(&self, call: &HttpCall) -> Result<Option<Denial>, Denial> {
        let requests = requests_of(call, &self.catalog)
            .map_err(|why| self.denial(None, format!("unrecognised call: {why}")))?;
        if requests.is_empty() {
            return Err(self.denial(None, "unrecognised call: it names nothing".into()));
        }
        let attached = self.worker_queues.documents(&requests, &self.catalog);
        let with_attached;
        let principal = if attached.is_empty() {
            &*self.principal
        } else {
            with_attached = self
                .principal
                .with_resources(attached)
                .map_err(|e| self.denial(None, format!("attached policies: {e:#}")))?;
            &with_attached
        };
        for request in &requests {
            match evaluate(principal, request) {
                Ok(Decision::Allowed) => {}
                Ok(decision) => return Err(self.denial(Some(request), decision.reason())),
                Err(e) => return Err(self.denial(Some(request), format!("cannot evaluate: {e}"))),
            }
        }
        let read = requests.iter().find(|r| r.action == "s3:GetObject");
        Ok(read.and_then(|read| {
            let (bucket, _) = read.resource.split_once('/')?;
            let list = Request::new("s3:ListBucket", bucket, requests_base(read));
            match evaluate(principal, &list) {
                Ok(Decision::Allowed) => None,
                _ => Some(self.denial(
                    Some(read),
                    format!(
                        "the object does not exist, and without s3:ListBucket on {bucket} AWS answers \
                         403 AccessDenied, not 404 NoSuchKey"
                    ),
                )),
            }
        }))
    }

    fn record(&self, denial: Denial) -> BoxError {
        tracing::error!(
            function = %denial.function,
            action = %denial.action,
            resource = %denial.resource,
            keys = ?denial.keys,
            reason = %denial.reason,
            "IAM: AWS would deny this call"
        );
        let message = denial.to_string();
        self.denials
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(denial);
        message.into()
    }
}

/// The global keys of a request (for a derived request on the same call).
fn requests_base(request: &Request) -> Context {
    let mut context = request.context.clone();
    context.values.retain(|k, _| k.starts_with("aws:"));
    context.modelled.retain(|k| k.starts_with("aws:"));
    context
}

impl Intercept for Checker {
    fn name(&self) -> &'static str {
        "stepline-iam-check"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let request = context.request();
        let call = HttpCall {
            method: request.method().to_string(),
            uri: request.uri().to_string(),
            headers: request
                .headers()
                .iter()
                .map(|(k, v)| (k.to_ascii_lowercase(), v.to_string()))
                .collect(),
            body: request.body().bytes().unwrap_or_default().to_vec(),
        };
        match self.check(&call) {
            Ok(read) => {
                cfg.interceptor_state()
                    .store_or_unset(read.map(ReadWithoutList));
                Ok(())
            }
            Err(denial) => Err(self.record(denial)),
        }
    }

    fn read_before_deserialization(
        &self,
        context: &BeforeDeserializationInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if context.response().status().as_u16() == 404 {
            if let Some(ReadWithoutList(denial)) = cfg.load::<ReadWithoutList>() {
                return Err(self.record(denial.clone()));
            }
        }
        Ok(())
    }
}

/// `clients`, each with `checker` on every request (after the interceptors they carry already). The
/// one place that lists the services' clients: a new field of `Clients` is one more line here.
pub fn checked_clients(clients: &Clients, checker: &Checker) -> Clients {
    Clients {
        dynamodb: aws_sdk_dynamodb::Client::from_conf(
            clients
                .dynamodb
                .config()
                .to_builder()
                .interceptor(checker.clone())
                .build(),
        ),
        sqs: aws_sdk_sqs::Client::from_conf(
            clients
                .sqs
                .config()
                .to_builder()
                .interceptor(checker.clone())
                .build(),
        ),
        eventbridge: aws_sdk_eventbridge::Client::from_conf(
            clients
                .eventbridge
                .config()
                .to_builder()
                .interceptor(checker.clone())
                .build(),
        ),
        s3: aws_sdk_s3::Client::from_conf(
            clients
                .s3
                .config()
                .to_builder()
                .interceptor(checker.clone())
                .build(),
        ),
        secrets: aws_sdk_secretsmanager::Client::from_conf(
            clients
                .secrets
                .config()
                .to_builder()
                .interceptor(checker.clone())
                .build(),
        ),
    }
}

// ---------------------------------------------------------------------------------------- a stage

/// IAM checking of a stage: each function's principal, what requests name, and the denials seen.
#[derive(Debug)]
pub struct StageIam {
    catalog: Arc<Catalog>,
    principals: BTreeMap<String, Arc<Principal>>,
    denials: Arc<Mutex<Vec<Denial>>>,
    worker_queues: Arc<WorkerQueues>,
    template: Template,
    stack: Stack,
}

/// A worker stack as `stepline init` writes it, deployed beside a stage.
pub struct WorkerStack {
    /// What checks its worker function's calls.
    pub checker: Checker,
    /// The environment that stack gives its worker function.
    pub env: BTreeMap<String, String>,
}

impl StageIam {
    /// Every function's policies of `template`, resolved on `stack` (an error names what cannot be).
    pub fn new(template: &Template, stack: &Stack) -> Result<Self> {
        let accounts = Accounts::of_stack(stack)?;
        let catalog = Arc::new(Catalog::new(template, stack, accounts)?);
        let mut principals = BTreeMap::new();
        for (logical, kind, _) in template.resources() {
            if kind == "AWS::Serverless::Function" {
                let principal = Principal::of_function(template, stack, &catalog, &logical)
                    .with_context(|| format!("IAM policies of {logical}"))?;
                principals.insert(logical, Arc::new(principal));
            }
        }
        let worker_queues = Arc::new(WorkerQueues {
            senders: worker_queue_senders()
                .iter()
                .filter_map(|function| principals.get(function))
                .map(|principal: &Arc<Principal>| principal.role_arn.clone())
                .collect(),
        });
        Ok(Self {
            catalog,
            principals,
            denials: Arc::default(),
            worker_queues,
            template: template.clone(),
            stack: stack.clone(),
        })
    }

    /// The worker stack `stepline init` writes, as if deployed for `request_queue` and its `dlq`
    /// (queues made outside the template), serving `release` of this stage's coordinator: its worker
    /// function's policies (the coordinator's exports imported) with the stack's and this stage's
    /// resource policies (the payload bucket's), and the environment it gives that function.
    pub fn worker_stack(
        &self,
        request_queue: &Physical,
        dlq: &Physical,
        release: &str,
    ) -> Result<WorkerStack> {
        let Physical::Queue { name, .. } = request_queue else {
            bail!("a worker stack's request queue is a queue: {request_queue:?}");
        };
        let accounts = &self.catalog.accounts;
        let template = worker_stack_template("worker")?;
        let coordinator = self
            .stack
            .parameter("AWS::StackName")
            .ok_or_else(|| anyhow!("the stage has no stack name"))?;
        let parameters = BTreeMap::from([
            ("CoordinatorStack".to_string(), coordinator),
            ("ReleaseVersion".to_string(), release.to_string()),
            ("RequestQueueName".to_string(), name.clone()),
        ]);
        let stack = Stack {
            stage: self.stack.stage.clone(),
            parameters,
            resources: BTreeMap::from([
                ("RequestQueue".to_string(), request_queue.clone()),
                ("RequestDeadLetterQueue".to_string(), dlq.clone()),
            ]),
            functions: BTreeMap::new(),
        };
        let imports = exports_of(&self.template, &self.stack, accounts);
        let function = "WorkerFunction";
        let principal =
            Principal::of_function_importing(&template, &stack, &self.catalog, function, &imports)
                .context("the worker stack's function")?;
        // The coordinator stack's resource policies (the payload bucket's) govern the worker too.
        let functions = functions_of(&self.template);
        let none = BTreeMap::new();
        let lookup = PolicyLookup {
            stack: &self.stack,
            accounts,
            functions: &functions,
            imports: &none,
        };
        let stage_policies =
            resource_documents(&self.template, &lookup, &self.catalog, &principal.role_arn)?;
        let principal = principal.with_resources(stage_policies)?;
        let functions = functions_of(&template);
        let lookup = PolicyLookup {
            stack: &stack,
            accounts,
            functions: &functions,
            imports: &imports,
        };
        let variables = template.root["Resources"][function]["Properties"]["Environment"]
            ["Variables"]
            .as_mapping()
            .cloned()
            .unwrap_or_default();
        let mut env = BTreeMap::new();
        for (key, value) in &variables {
            let key = scalar(key).ok_or_else(|| anyhow!("a variable's name: {key:?}"))?;
            let value = resolve(value, &lookup).with_context(|| format!("{function} {key}"))?;
            env.insert(key, value);
        }
        Ok(WorkerStack {
            checker: Checker::new(
                Arc::new(principal),
                self.catalog.clone(),
                self.denials.clone(),
            ),
            env,
        })
    }

    /// The interceptor for `function`'s clients.
    pub fn checker(&self, function: &str) -> Result<Checker> {
        let principal = self
            .principals
            .get(function)
            .ok_or_else(|| anyhow!("the template has no function {function}"))?;
        Ok(Checker::new(
            principal.clone(),
            self.catalog.clone(),
            self.denials.clone(),
        )
        .with_worker_queues(self.worker_queues.clone()))
    }

    pub fn denials(&self) -> Vec<Denial> {
        self.denials
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn take_denials(&self) -> Vec<Denial> {
        std::mem::take(&mut *self.denials.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn string_operators() {
        let equals = json!({"StringEquals": {"s3:prefix": ["a", "b"]}});
        assert_eq!(
            condition(equals.clone(), &[("s3:prefix", &["b"])]),
            Ok(true)
        );
        assert_eq!(
            condition(equals.clone(), &[("s3:prefix", &["c"])]),
            Ok(false)
        );
        // Absent: a positive operator fails; not modelled: an error.
        assert_eq!(condition(equals.clone(), &[("s3:prefix", &[])]), Ok(false));
        assert!(condition(equals, &[]).unwrap_err().contains("not modelled"));
        let not_equals = json!({"StringNotEquals": {"s3:prefix": "a"}});
        assert_eq!(
            condition(not_equals.clone(), &[("s3:prefix", &["a"])]),
            Ok(false)
        );
        assert_eq!(
            condition(not_equals.clone(), &[("s3:prefix", &["z"])]),
            Ok(true)
        );
        // Absent: a negated operator holds.
        assert_eq!(condition(not_equals, &[("s3:prefix", &[])]), Ok(true));
        let ignore_case = json!({"StringEqualsIgnoreCase": {"s3:prefix": "ABC"}});
        assert_eq!(condition(ignore_case, &[("s3:prefix", &["abc"])]), Ok(true));
        let like = json!({"StringLike": {"s3:prefix": "pay*/x?"}});
        assert_eq!(
            condition(like.clone(), &[("s3:prefix", &["payloads/x1"])]),
            Ok(true)
        );
        assert_eq!(
            condition(like, &[("s3:prefix", &["payloads/y1"])]),
            Ok(false)
        );
        let not_like = json!({"StringNotLike": {"s3:prefix": "pay*"}});
        assert_eq!(
            condition(not_like, &[("s3:prefix", &["payloads"])]),
            Ok(false)
        );
    }

    #[test]
    fn bool_null_arn_and_numeric_operators() {
        let tls = json!({"Bool": {"aws:SecureTransport": "false"}});
        assert_eq!(
            condition(tls.clone(), &[("aws:SecureTransport", &["true"])]),
            Ok(false)
        );
        assert_eq!(
            condition(tls.clone(), &[("aws:SecureTransport", &["FALSE"])]),
            Ok(true)
        );
        assert_eq!(condition(tls, &[("aws:SecureTransport", &[])]), Ok(false));
        let bad = json!({"Bool": {"aws:SecureTransport": "maybe"}});
        assert!(condition(bad, &[("aws:SecureTransport", &["true"])]).is_err());

        let null = json!({"Null": {"s3:if-none-match": "true"}});
        assert_eq!(
            condition(null.clone(), &[("s3:if-none-match", &[])]),
            Ok(true)
        );
        assert_eq!(condition(null, &[("s3:if-none-match", &["*"])]), Ok(false));
        let present = json!({"Null": {"s3:if-none-match": "false"}});
        assert_eq!(
            condition(present, &[("s3:if-none-match", &["*"])]),
            Ok(true)
        );

        let source = "arn:aws:events:us-east-1:1:rule/stepline-t-start";
        let arn_equals = json!({"ArnEquals": {"aws:SourceArn": source}});
        assert_eq!(
            condition(arn_equals, &[("aws:SourceArn", &[source])]),
            Ok(true)
        );
        let arn_like = json!({"ArnLike": {"aws:SourceArn": "arn:aws:events:*:1:rule/*"}});
        assert_eq!(
            condition(arn_like.clone(), &[("aws:SourceArn", &[source])]),
            Ok(true)
        );
        assert_eq!(
            condition(arn_like, &[("aws:SourceArn", &["arn:aws:sns:x:1:rule/a"])]),
            Ok(false)
        );
        let arn_not = json!({"ArnNotLike": {"aws:SourceArn": "arn:aws:events:*:1:rule/*"}});
        assert_eq!(condition(arn_not, &[("aws:SourceArn", &[])]), Ok(true));

        let numeric = json!({"NumericLessThanEquals": {"s3:max-keys": "10"}});
        assert_eq!(
            condition(numeric.clone(), &[("s3:max-keys", &["10"])]),
            Ok(true)
        );
        assert_eq!(condition(numeric, &[("s3:max-keys", &["11"])]), Ok(false));
    }

    #[test]
    fn if_exists_holds_for_an_absent_key_only() {
        let equals = json!({"StringEqualsIfExists": {"s3:prefix": "a"}});
        assert_eq!(condition(equals.clone(), &[("s3:prefix", &[])]), Ok(true));
        assert_eq!(
            condition(equals.clone(), &[("s3:prefix", &["a"])]),
            Ok(true)
        );
        assert_eq!(condition(equals, &[("s3:prefix", &["b"])]), Ok(false));
    }

    #[test]
    fn set_qualifiers_follow_aws() {
        let all = json!({"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": ["coordinator"]}});
        let key = "dynamodb:LeadingKeys";
        assert_eq!(condition(all.clone(), &[(key, &["coordinator"])]), Ok(true));
        assert_eq!(
            condition(all.clone(), &[(key, &["coordinator", "pipeline#a"])]),
            Ok(false)
        );
        // ForAllValues holds for an absent key or an empty set.
        assert_eq!(condition(all, &[(key, &[])]), Ok(true));
        let any = json!({"ForAnyValue:StringLike": {"dynamodb:LeadingKeys": ["pipeline#*"]}});
        assert_eq!(
            condition(any.clone(), &[(key, &["coordinator", "pipeline#a"])]),
            Ok(true)
        );
        assert_eq!(
            condition(any.clone(), &[(key, &["coordinator"])]),
            Ok(false)
        );
        // ForAnyValue fails for an absent key.
        assert_eq!(condition(any, &[(key, &[])]), Ok(false));
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
        let allow_only = principal(
            json!({"Statement": {"Effect": "Allow", "Action": "sqs:*", "Resource": "*"}}),
        );
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
        assert_eq!(
            get[0].resource,
            "arn:aws:dynamodb:us-east-1:123456789012:table/t"
        );
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
            "arn:aws:dynamodb:us-east-1:123456789012:table/t/index/by-shard"
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
        let batch = requests_of(
            &signed(
                "sqs",
                Some("AmazonSQS.SendMessageBatch"),
                json!({"QueueUrl": "http://127.0.0.1:5055/123456789012/q", "Entries": []}),
            ),
            &catalog,
        )
        .unwrap();
        assert_eq!(batch[0].action, "sqs:SendMessage");
        assert_eq!(batch[0].resource, "arn:aws:sqs:us-east-1:123456789012:q");
        // A queue outside the stack: its ARN from its URL.
        let other = requests_of(
            &signed(
                "sqs",
                Some("AmazonSQS.ReceiveMessage"),
                json!({"QueueUrl": "http://localhost:4566/000000000000/notices"}),
            ),
            &catalog,
        )
        .unwrap();
        assert_eq!(
            other[0].resource,
            "arn:aws:sqs:us-east-1:000000000000:notices"
        );
        let url = requests_of(
            &signed(
                "sqs",
                Some("AmazonSQS.GetQueueUrl"),
                json!({"QueueName": "q"}),
            ),
            &catalog,
        )
        .unwrap();
        assert_eq!(url[0].action, "sqs:GetQueueUrl");
        assert_eq!(url[0].resource, "arn:aws:sqs:us-east-1:123456789012:q");

        let events = requests_of(
            &signed(
                "events",
                Some("AWSEvents.PutEvents"),
                json!({"Entries": [{"EventBusName": "stepline-t"}, {"Source": "x"},
                    {"EventBusName": "arn:aws:events:us-east-1:123456789012:event-bus/stepline-t"}]}),
            ),
            &catalog,
        )
        .unwrap();
        let buses: Vec<&str> = events.iter().map(|r| r.resource.as_str()).collect();
        assert_eq!(
            buses,
            [
                "arn:aws:events:us-east-1:123456789012:event-bus/default",
                "arn:aws:events:us-east-1:123456789012:event-bus/stepline-t",
            ]
        );

        let by_name = requests_of(
            &signed(
                "secretsmanager",
                Some("secretsmanager.GetSecretValue"),
                json!({"SecretId": "stepline-t-seal"}),
            ),
            &catalog,
        )
        .unwrap();
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
        let known = requests_of(
            &signed(
                "secretsmanager",
                Some("secretsmanager.GetSecretValue"),
                json!({"SecretId": "known"}),
            ),
            &catalog,
        )
        .unwrap();
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
            ..signed("sqs", Some("AmazonSQS.SendMessage"), json!({}))
        };
        assert!(requests_of(&unsigned, &catalog).is_err());
    }

    #[test]
    fn s3_requests_carry_if_none_match_or_its_absence() {
        let catalog = catalog();
        let put = |headers: &[(&str, &str)]| {
            let uri = "http://127.0.0.1:5055/b/payloads/e%201/abc?x-id=PutObject";
            requests_of(&call("s3", None, "PUT", uri, headers, Json::Null), &catalog)
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

        let s3 = |method: &str, uri: &str| {
            requests_of(&call("s3", None, method, uri, &[], Json::Null), &catalog)
        };
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
                    let name = name("TableName");
                    Physical::Table {
                        arn: format!("arn:aws:dynamodb:us-east-1:{ACCOUNT}:table/{name}"),
                        name,
                    }
                }
                "AWS::SQS::Queue" => {
                    let name = name("QueueName");
                    Physical::Queue {
                        url: format!("http://127.0.0.1:5055/{ACCOUNT}/{name}"),
                        arn: format!("arn:aws:sqs:us-east-1:{ACCOUNT}:{name}"),
                        name,
                    }
                }
                "AWS::Events::EventBus" => {
                    let name = name("Name");
                    Physical::Bus {
                        arn: format!("arn:aws:events:us-east-1:{ACCOUNT}:event-bus/{name}"),
                        name,
                    }
                }
                "AWS::SecretsManager::Secret" => {
                    let name = name("Name");
                    Physical::Secret {
                        arn: format!(
                            "arn:aws:secretsmanager:us-east-1:{ACCOUNT}:secret:{name}-AbCdEf"
                        ),
                        name,
                    }
                }
                "AWS::S3::Bucket" => {
                    let name = format!("stepline-t-{}", logical.to_lowercase());
                    Physical::Bucket {
                        arn: format!("arn:aws:s3:::{name}"),
                        name,
                    }
                }
                _ => continue,
            };
            stack.resources.insert(logical, physical);
        }
        (template, stack)
    }

    #[test]
    fn the_project_template_decides_as_aws_would() {
        let (template, stack) = project();
        let iam = StageIam::new(&template, &stack).expect("every function's policies resolve");
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
        let overwrite = call("s3", None, "PUT", &object, &[], Json::Null);
        let denied = check("LaunchFunction", overwrite).unwrap_err();
        assert!(
            denied
                .reason
                .contains("PayloadBucketPolicy (PayloadObjectsAreImmutable)"),
            "{denied}"
        );
        let create = call(
            "s3",
            None,
            "PUT",
            &object,
            &[("If-None-Match", "*")],
            Json::Null,
        );
        assert_eq!(check("LaunchFunction", create.clone()), Ok(None));
        assert!(check("ClaimFunction", create)
            .unwrap_err()
            .reason
            .contains("no identity-based"));
        // A read is allowed; its 404 would be AWS's 403 (no s3:ListBucket).
        let read = call(
            "s3",
            None,
            "GET",
            &object.replace("PutObject", "GetObject"),
            &[],
            Json::Null,
        );
        let missing = check("LaunchFunction", read).unwrap();
        assert!(missing.unwrap().reason.contains("403"));

        let send = |queue: &str| {
            let url = format!("http://127.0.0.1:5055/{ACCOUNT}/stepline-t-{queue}");
            signed(
                "sqs",
                Some("AmazonSQS.SendMessage"),
                json!({"QueueUrl": url, "MessageBody": "{}"}),
            )
        };
        assert_eq!(check("LaunchFunction", send("orders-request")), Ok(None));
        assert!(check("OrderWorkerFunction", send("launch")).is_err());
        assert_eq!(check("OrderWorkerFunction", send("reply")), Ok(None));
        let receive = signed(
            "sqs",
            Some("AmazonSQS.ReceiveMessage"),
            json!({"QueueUrl": format!("http://127.0.0.1:5055/{ACCOUNT}/stepline-t-execution-dlq")}),
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

        // The sealing key's secret: the coordinator functions only, by ARN or name.
        if let Some(Physical::Secret { name, arn }) = stack.resources.get("SealKeySecret") {
            for id in [name, arn] {
                let read = signed(
                    "secretsmanager",
                    Some("secretsmanager.GetSecretValue"),
                    json!({ "SecretId": id }),
                );
                assert_eq!(check("ClaimFunction", read.clone()), Ok(None));
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
        let (template, stack) = project();
        let iam = StageIam::new(&template, &stack).expect("every function's policies resolve");
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
            let read = signed(
                "secretsmanager",
                Some("secretsmanager.GetSecretValue"),
                json!({ "SecretId": arn }),
            );
            for function in [
                "ClaimFunction",
                "LaunchFunction",
                "CompletionFunction",
                "RedriveFunction",
                "ApiFunction",
                "OperatorApiFunction",
            ] {
                assert_eq!(check(function, read.clone()), Ok(None), "{function}");
            }
            for function in ["AdminApiFunction", "OrderWorkerFunction"] {
                assert!(check(function, read.clone()).is_err(), "{function}");
            }
        } else {
            panic!("the template has a SealKeySecret");
        }
        // A worker stack's queue policy names every function that sends requests to workers.
        let senders = worker_queue_senders();
        for function in [
            "LaunchFunction",
            "CompletionFunction",
            "RedriveFunction",
            "ApiFunction",
            "OperatorApiFunction",
        ] {
            assert!(senders.contains(&function.to_string()), "{senders:?}");
        }
        // A queue outside the template is a worker stack's: only the roles its policy names send.
        let outside = signed(
            "sqs",
            Some("AmazonSQS.SendMessage"),
            json!({"QueueUrl": format!("http://127.0.0.1:5055/{ACCOUNT}/someones-requests"),
                "MessageBody": "{}"}),
        );
        assert_eq!(check("LaunchFunction", outside.clone()), Ok(None));
        assert_eq!(check("OperatorApiFunction", outside.clone()), Ok(None));
        assert!(check("ClaimFunction", outside.clone()).is_err());
        assert!(check("AdminApiFunction", outside.clone()).is_err());
        assert!(check("OrderWorkerFunction", outside).is_err());
    }

    #[test]
    fn a_generated_worker_stack_is_checked_against_its_own_policies() {
        let (template, stack) = project();
        let iam = StageIam::new(&template, &stack).expect("every function's policies resolve");
        let queue = |name: &str| Physical::Queue {
            url: format!("http://127.0.0.1:5055/{ACCOUNT}/{name}"),
            arn: format!("arn:aws:sqs:us-east-1:{ACCOUNT}:{name}"),
            name: name.into(),
        };
        let worker = iam
            .worker_stack(&queue("shop-requests"), &queue("shop-requests-dlq"), "3")
            .expect("the worker stack resolves");
        // The environment it gives its function: the coordinator's exports, imported.
        assert_eq!(worker.env["RELEASE_VERSION"], "3");
        assert_eq!(
            worker.env["REPLY_QUEUE_URL"],
            format!("http://127.0.0.1:5055/{ACCOUNT}/stepline-t-reply")
        );
        assert_eq!(worker.env["PAYLOAD_BUCKET"], "stepline-t-payloadbucket");
        assert!(worker.env["REQUEST_DLQ_URL"].ends_with("/shop-requests-dlq"));
        let check = |call: HttpCall| worker.checker.check(&call);
        let send = |queue: &str, operation: &str| {
            signed(
                "sqs",
                Some(&format!("AmazonSQS.{operation}")),
                json!({"QueueUrl": format!("http://127.0.0.1:5055/{ACCOUNT}/{queue}"),
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
        let object = "http://127.0.0.1:5055/stepline-t-payloadbucket/payloads/e/abc?x-id=PutObject"
            .to_string();
        let overwrite = call("s3", None, "PUT", &object, &[], Json::Null);
        assert!(check(overwrite)
            .unwrap_err()
            .reason
            .contains("PayloadObjectsAreImmutable"));
        let create = call(
            "s3",
            None,
            "PUT",
            &object,
            &[("If-None-Match", "*")],
            Json::Null,
        );
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
}
