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
use aws_sdk_dynamodb::config::ConfigBag;
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
pub(crate) struct PolicyLookup<'a> {
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
    let text = include_str!("../../../cli/templates/template.yaml")
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

    /// The ARN of a secret named by ARN or by name (a secret of the stack: its ARN carries a suffix
    /// the name does not tell).
    pub(crate) fn secret_arn(&self, id: &str) -> String {
        self.secrets
            .get(id)
            .cloned()
            .unwrap_or_else(|| id.to_string())
    }

    /// Whether `arn` is one of the stack's own queues.
    pub(crate) fn is_stack_queue(&self, arn: &str) -> bool {
        self.queues.values().any(|a| a == arn)
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

mod checker;
mod evaluate;
mod policies;
mod requests;

pub use checker::*;
pub use evaluate::*;
pub use policies::*;
pub use requests::*;

#[cfg(test)]
mod tests;
