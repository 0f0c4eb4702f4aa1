//! Policies as IAM reads them: statements, the SAM policy templates expanded as SAM expands them,
//! a function's identity and the resource policies whose principal covers it.

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    Allow,
    Deny,
}

/// `Action`/`NotAction` or `Resource`/`NotResource`.
#[derive(Debug, Clone)]
pub(crate) struct Names {
    pub(crate) negated: bool,
    pub(crate) patterns: Vec<String>,
}

/// One `operator: {key: values}` of a Condition block.
#[derive(Debug, Clone)]
pub(crate) struct Condition {
    pub(crate) operator: String,
    pub(crate) key: String,
    pub(crate) values: Vec<String>,
}

/// One statement of a policy, its intrinsics resolved.
#[derive(Debug, Clone)]
pub struct Statement {
    /// The policy it belongs to, e.g. `CompletionFunction policy 3 (SQSSendMessagePolicy)`.
    pub policy: String,
    /// Its Sid, else `statement <n>` (from 1).
    pub label: String,
    pub effect: Effect,
    pub(crate) actions: Names,
    pub(crate) resources: Names,
    pub(crate) conditions: Vec<Condition>,
}

impl Statement {
    pub(crate) fn parse(
        statement: &Json,
        policy: &str,
        index: usize,
        resource_policy: bool,
    ) -> Result<Self> {
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
    pub(crate) fn matches(&self, request: &Request, context: &Context) -> Result<bool, String> {
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
pub(crate) fn strings(value: &Json) -> Result<Vec<String>> {
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
pub(crate) fn document_statements(document: &Json) -> Result<Vec<Json>> {
    match document.get("Statement") {
        Some(Json::Array(items)) => Ok(items.clone()),
        Some(one @ Json::Object(_)) => Ok(vec![one.clone()]),
        _ => bail!("a policy document without Statement"),
    }
}

/// A template value with its intrinsic functions resolved, every scalar as a string (as IAM reads
/// them).
pub(crate) fn resolve_document(value: &Value, lookup: &dyn Lookup) -> Result<Json> {
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

pub(crate) fn is_intrinsic(map: &serde_yaml_ng::Mapping) -> bool {
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
pub(crate) struct ResourcePolicy {
    pub(crate) governs: Vec<String>,
    pub(crate) statements: Vec<Statement>,
}

/// A function's role as IAM sees it: its identity statements and the resource-policy statements
/// whose principal covers it.
#[derive(Debug, Clone)]
pub struct Principal {
    pub function: String,
    pub role_arn: String,
    pub account: String,
    pub(crate) statements: Vec<Statement>,
    pub(crate) resource_policies: Vec<ResourcePolicy>,
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
                let cover = covers(principal, role_arn, account)
                    .with_context(|| format!("{name}, statement {}", index + 1))?;
                let allow = statement.get("Effect").and_then(Json::as_str) == Some("Allow");
                // An Allow to the account grants nothing by itself (the role's own policies
                // decide); a Deny to it denies.
                if cover == Cover::Direct || (cover == Cover::Account && !allow) {
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
    pub(crate) fn of_function_importing(
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
pub(crate) fn resource_documents(
    template: &Template,
    lookup: &PolicyLookup<'_>,
    catalog: &Catalog,
    role_arn: &str,
) -> Result<Vec<ResourceDocument>> {
    let account = &catalog.accounts.default.account;
    let partition = &catalog.accounts.partition;
    let mut out = Vec::new();
    for (logical, kind, props) in template.resources() {
        let required = |key: &str| props.get(key).ok_or_else(|| anyhow!("{logical}: no {key}"));
        let governs = match kind.as_str() {
            "AWS::S3::BucketPolicy" => {
                let bucket = resolve(required("Bucket")?, lookup)?;
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
            "AWS::SecretsManager::ResourcePolicy" => {
                let id = resolve(required("SecretId")?, lookup)?;
                vec![catalog.secret_arn(&id)]
            }
            // Resource policies on services the functions call, which this module does not read yet.
            "AWS::Events::EventBusPolicy" => {
                bail!("{logical}: {kind} is not modelled by the IAM checker")
            }
            _ => continue,
        };
        let property = match kind.as_str() {
            "AWS::SecretsManager::ResourcePolicy" => "ResourcePolicy",
            _ => "PolicyDocument",
        };
        let document = props
            .get(property)
            .ok_or_else(|| anyhow!("{logical}: no {property}"))?;
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
            if covers(&principal, role_arn, account).with_context(here)? != Cover::No {
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

/// How a statement's Principal covers a role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cover {
    /// It does not (another account, a service).
    No,
    /// Everyone, or the role itself: an Allow there grants on its own.
    Direct,
    /// The role's account: on its own, such an Allow grants nothing. It delegates to the account,
    /// whose identity policies must allow too; a Deny there denies every principal of it.
    Account,
}

/// Whether a statement's Principal covers `role_arn` of `account`, and how (see [`Cover`]).
pub(crate) fn covers(principal: &Json, role_arn: &str, account: &str) -> Result<Cover> {
    let names = match principal {
        Json::String(s) if s == "*" => return Ok(Cover::Direct),
        Json::Object(map) => map,
        other => bail!("Principal {other} is not supported"),
    };
    let mut cover = Cover::No;
    for (kind, values) in names {
        match kind.as_str() {
            "AWS" => {
                let root = format!(":iam::{account}:root");
                for value in strings(values)? {
                    if value == "*" || value == role_arn {
                        return Ok(Cover::Direct);
                    }
                    if value == account || value.ends_with(&root) {
                        cover = Cover::Account;
                    }
                }
            }
            "Service" | "Federated" | "CanonicalUser" => {}
            other => bail!("Principal {other} is not supported"),
        }
    }
    Ok(cover)
}

// ------------------------------------------------------------------------------------ request context
