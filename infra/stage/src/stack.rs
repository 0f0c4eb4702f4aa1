//! Provisions the template's tables, queues (DLQs first) and event bus on whatever `AWS_ENDPOINT_URL`
//! points at, under a stage name, and resolves each function's environment and event sources from the
//! same template. Provisioning is idempotent: existing tables and queues are reused as they are, even
//! when the parameters differ from those they were created with.

use std::collections::{BTreeMap, HashMap};

use anyhow::{anyhow, bail, Context, Result};
use aws_config::SdkConfig;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType, Projection,
    ProjectionType, ScalarAttributeType, TableStatus, TimeToLiveSpecification,
};
use aws_sdk_eventbridge::error::SdkError;
use aws_sdk_eventbridge::operation::create_event_bus::CreateEventBusError;
use aws_sdk_secretsmanager::operation::create_secret::CreateSecretError;
use aws_sdk_sqs::types::QueueAttributeName;
use serde::Serialize;
use serde_yaml_ng::Value;

use crate::template::{resolve, scalar, Lookup, Template};

mod find;

/// A provisioned resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Physical {
    Table {
        name: String,
        arn: String,
    },
    Queue {
        name: String,
        /// Its URL; its name in a stack reached by names (see [`Stack::by_names`]).
        url: String,
        arn: String,
    },
    Bus {
        name: String,
        arn: String,
    },
    Bucket {
        name: String,
        arn: String,
    },
    Secret {
        name: String,
        arn: String,
    },
}

/// An SQS event source of a function.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SqsSource {
    pub queue: String,
    pub queue_url: String,
    pub queue_arn: String,
    pub batch_size: i32,
}

/// A function as the local runner sees it: its resolved environment and its triggers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FunctionSpec {
    pub env: BTreeMap<String, String>,
    pub sqs: Vec<SqsSource>,
    pub schedules: Vec<String>,
}

/// The provisioned stack.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Stack {
    pub stage: String,
    pub parameters: BTreeMap<String, String>,
    pub resources: BTreeMap<String, Physical>,
    pub functions: BTreeMap<String, FunctionSpec>,
}

impl Lookup for Stack {
    fn parameter(&self, name: &str) -> Option<String> {
        match name {
            "AWS::StackName" => Some(format!("stepline-{}", self.stage)),
            "AWS::Region" => {
                Some(std::env::var("AWS_REGION").unwrap_or_else(|_| "us-east-1".into()))
            }
            _ => self.parameters.get(name).cloned(),
        }
    }

    fn reference(&self, logical: &str) -> Option<String> {
        Some(match self.resources.get(logical)? {
            Physical::Table { name, .. }
            | Physical::Bus { name, .. }
            | Physical::Bucket { name, .. } => name.clone(),
            Physical::Queue { url, .. } => url.clone(),
            // As CloudFormation: a secret's `!Ref` is its ARN.
            Physical::Secret { arn, .. } => arn.clone(),
        })
    }

    fn attribute(&self, logical: &str, attribute: &str) -> Option<String> {
        let resource = self.resources.get(logical)?;
        Some(match (resource, attribute) {
            (
                Physical::Table { arn, .. }
                | Physical::Queue { arn, .. }
                | Physical::Bus { arn, .. }
                | Physical::Bucket { arn, .. }
                | Physical::Secret { arn, .. },
                "Arn",
            ) => arn.clone(),
            (Physical::Queue { name, .. }, "QueueName") => name.clone(),
            (Physical::Queue { url, .. }, "QueueUrl") => url.clone(),
            (Physical::Bus { name, .. }, "Name") => name.clone(),
            _ => return None,
        })
    }
}

impl Stack {
    /// Provisions every table, queue and bus of `template` under `stage`.
    pub async fn provision(sdk: &SdkConfig, template: &Template, stage: &str) -> Result<Stack> {
        Self::provision_with(sdk, template, stage, &BTreeMap::new()).await
    }

    /// Provisions with some template parameters overridden (as `sam deploy --parameter-overrides`).
    pub async fn provision_with(
        sdk: &SdkConfig,
        template: &Template,
        stage: &str,
        overrides: &BTreeMap<String, String>,
    ) -> Result<Stack> {
        let mut parameters = template.parameter_defaults();
        for (name, value) in overrides {
            anyhow::ensure!(
                parameters.contains_key(name),
                "the template has no parameter {name}"
            );
            parameters.insert(name.clone(), value.clone());
        }
        let mut stack = Stack::named(stage, parameters);
        let dynamodb = aws_sdk_dynamodb::Client::new(sdk);
        let sqs = aws_sdk_sqs::Client::new(sdk);
        let events = aws_sdk_eventbridge::Client::new(sdk);
        let resources = template.resources();

        for (logical, kind, props) in &resources {
            if kind == "AWS::DynamoDB::Table" {
                let name = resolved(props, "TableName", &stack)
                    .with_context(|| format!("table {logical}"))?;
                let table = create_table(&dynamodb, name, props)
                    .await
                    .with_context(|| format!("creating table {logical}"))?;
                stack.resources.insert(logical.clone(), table);
            }
        }
        // Queues without a redrive policy (the DLQs) first, so redrive targets resolve.
        let queues: Vec<_> = resources
            .iter()
            .filter(|(_, kind, _)| kind == "AWS::SQS::Queue")
            .collect();
        for pass in [false, true] {
            for (logical, _, props) in &queues {
                if props.get("RedrivePolicy").is_some() != pass {
                    continue;
                }
                let queue = create_queue(&sqs, &stack, props)
                    .await
                    .with_context(|| format!("creating queue {logical}"))?;
                stack.resources.insert(logical.clone(), queue);
            }
        }
        for (logical, kind, props) in &resources {
            if kind == "AWS::Events::EventBus" {
                let name =
                    resolved(props, "Name", &stack).with_context(|| format!("bus {logical}"))?;
                let created = events.create_event_bus().name(&name).send().await;
                let created = created.map(|out| out.event_bus_arn.unwrap_or_default());
                let exists = |e: &CreateEventBusError| e.is_resource_already_exists_exception();
                let found = async {
                    let found = events.describe_event_bus().name(&name).send().await?;
                    Ok(found.arn.unwrap_or_default())
                };
                let arn = created_or_found(created, exists, found).await?;
                stack
                    .resources
                    .insert(logical.clone(), Physical::Bus { name, arn });
            }
        }
        let s3 = stepline::aws::s3_client(sdk);
        for (logical, kind, props) in &resources {
            if kind == "AWS::S3::Bucket" {
                let bucket = bucket_of(&stack, logical, props)?;
                create_bucket(&s3, &bucket)
                    .await
                    .with_context(|| format!("creating bucket {logical}"))?;
                stack.resources.insert(logical.clone(), bucket);
            }
        }
        let secrets = aws_sdk_secretsmanager::Client::new(sdk);
        for (logical, kind, props) in &resources {
            if kind == "AWS::SecretsManager::Secret" {
                let name =
                    resolved(props, "Name", &stack).with_context(|| format!("secret {logical}"))?;
                let secret = create_secret(&secrets, name)
                    .await
                    .with_context(|| format!("creating secret {logical}"))?;
                stack.resources.insert(logical.clone(), secret);
            }
        }
        for (logical, kind, props) in &resources {
            if kind == "AWS::Events::Rule" {
                create_rule(&events, &stack, props)
                    .await
                    .with_context(|| format!("creating rule {logical}"))?;
            }
        }
        stack.resolve_functions(template)?;
        Ok(stack)
    }

    /// A stack of `stage` with nothing found yet.
    fn named(stage: &str, mut parameters: BTreeMap<String, String>) -> Stack {
        parameters.insert("Stage".into(), stage.to_string());
        Stack {
            stage: stage.to_string(),
            parameters,
            resources: BTreeMap::new(),
            functions: BTreeMap::new(),
        }
    }

    /// Each function's environment and triggers, resolved against the resources found.
    fn resolve_functions(&mut self, template: &Template) -> Result<()> {
        for (logical, kind, props) in &template.resources() {
            if kind == "AWS::Serverless::Function" {
                let spec = function_spec(template, self, props)
                    .with_context(|| format!("resolving function {logical}"))?;
                self.functions.insert(logical.clone(), spec);
            }
        }
        Ok(())
    }

    pub fn function(&self, logical: &str) -> Result<&FunctionSpec> {
        self.functions
            .get(logical)
            .ok_or_else(|| anyhow!("the template has no function {logical}"))
    }

    /// Looks up a function's environment variable (for `from_lookup` configuration readers).
    pub fn env_of<'a>(&'a self, logical: &str) -> Result<impl Fn(&str) -> Option<String> + 'a> {
        let spec = self.function(logical)?;
        Ok(move |name: &str| spec.env.get(name).cloned())
    }

    pub fn queue(&self, logical: &str) -> Result<(&str, &str)> {
        match self.resources.get(logical) {
            Some(Physical::Queue { name, url, .. }) => Ok((name, url)),
            _ => bail!("the stack has no queue {logical}"),
        }
    }

    /// What `!Ref logical` resolves to (a table or bus name, a queue URL).
    pub fn reference_of(&self, logical: &str) -> Result<String> {
        self.reference(logical)
            .ok_or_else(|| anyhow!("the stack has no resource {logical}"))
    }

    pub fn table(&self, logical: &str) -> Result<&str> {
        match self.resources.get(logical) {
            Some(Physical::Table { name, .. }) => Ok(name),
            _ => bail!("the stack has no table {logical}"),
        }
    }
}

fn list<'a>(props: &'a Value, key: &str) -> impl Iterator<Item = &'a Value> {
    props
        .get(key)
        .and_then(Value::as_sequence)
        .into_iter()
        .flatten()
}

/// What the intrinsic at `key` of `props` resolves to.
fn resolved(props: &Value, key: &str, stack: &Stack) -> Result<String> {
    resolve(props.get(key).ok_or_else(|| anyhow!("no {key}"))?, stack)
}

/// An SDK error with its whole chain of causes (its `Display` shows only the outermost).
/// `created`'s value, or, when the call failed because what it creates exists already (`exists`
/// says which service error that is), `found`'s.
async fn created_or_found<T, E, R>(
    created: std::result::Result<T, SdkError<E, R>>,
    exists: impl FnOnce(&E) -> bool,
    found: impl std::future::Future<Output = Result<T>>,
) -> Result<T>
where
    SdkError<E, R>: std::error::Error + Send + Sync + 'static,
{
    match created {
        Ok(value) => Ok(value),
        Err(e) if e.as_service_error().is_some_and(exists) => found.await,
        Err(e) => Err(sdk_error(e)),
    }
}

fn sdk_error<E: std::error::Error + Send + Sync + 'static>(e: E) -> anyhow::Error {
    anyhow!(aws_sdk_sqs::error::DisplayErrorContext(e))
}

/// A scalar property, or `default` when absent.
fn text_or(value: &Value, key: &str, default: &str) -> String {
    value
        .get(key)
        .and_then(scalar)
        .unwrap_or_else(|| default.into())
}

fn text(value: &Value, key: &str) -> Result<String> {
    value
        .get(key)
        .and_then(scalar)
        .ok_or_else(|| anyhow!("missing {key}"))
}

fn key_schema(props: &Value) -> Result<Vec<KeySchemaElement>> {
    list(props, "KeySchema")
        .map(|k| {
            Ok(KeySchemaElement::builder()
                .attribute_name(text(k, "AttributeName")?)
                .key_type(KeyType::from(text(k, "KeyType")?.as_str()))
                .build()?)
        })
        .collect()
}

/// Creates table `name` as `props` declare it (or finds it), once it is ACTIVE.
async fn create_table(
    client: &aws_sdk_dynamodb::Client,
    name: String,
    props: &Value,
) -> Result<Physical> {
    let mut request = client
        .create_table()
        .table_name(&name)
        .billing_mode(BillingMode::from(
            text_or(props, "BillingMode", "PAY_PER_REQUEST").as_str(),
        ))
        .set_key_schema(Some(key_schema(props)?));
    for attr in list(props, "AttributeDefinitions") {
        request = request.attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(text(attr, "AttributeName")?)
                .attribute_type(ScalarAttributeType::from(
                    text(attr, "AttributeType")?.as_str(),
                ))
                .build()?,
        );
    }
    for gsi in list(props, "GlobalSecondaryIndexes") {
        let projection = gsi.get("Projection").cloned().unwrap_or(Value::Null);
        let non_key: Vec<String> = list(&projection, "NonKeyAttributes")
            .filter_map(scalar)
            .collect();
        request = request.global_secondary_indexes(
            GlobalSecondaryIndex::builder()
                .index_name(text(gsi, "IndexName")?)
                .set_key_schema(Some(key_schema(gsi)?))
                .projection(
                    Projection::builder()
                        .projection_type(ProjectionType::from(
                            text_or(&projection, "ProjectionType", "ALL").as_str(),
                        ))
                        .set_non_key_attributes((!non_key.is_empty()).then_some(non_key))
                        .build(),
                )
                .build()?,
        );
    }
    match request.send().await {
        Ok(_) => {}
        Err(e)
            if e.as_service_error()
                .is_some_and(|s| s.is_resource_in_use_exception()) => {}
        Err(e) => return Err(sdk_error(e)),
    }
    // Wait until ACTIVE (immediate on emulators, seconds on AWS).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let arn = loop {
        let table = client
            .describe_table()
            .table_name(&name)
            .send()
            .await?
            .table
            .ok_or_else(|| anyhow!("DescribeTable returned no table"))?;
        if table.table_status == Some(TableStatus::Active) {
            break table.table_arn.unwrap_or_default();
        }
        if std::time::Instant::now() > deadline {
            bail!("table {name} did not become ACTIVE");
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    };
    if let Some(ttl) = props.get("TimeToLiveSpecification") {
        let spec = TimeToLiveSpecification::builder()
            .attribute_name(text(ttl, "AttributeName")?)
            .enabled(ttl.get("Enabled").and_then(Value::as_bool).unwrap_or(true))
            .build()?;
        // Fails when TTL is already enabled with the same attribute: that is the state we want.
        let _ = client
            .update_time_to_live()
            .table_name(&name)
            .time_to_live_specification(spec)
            .send()
            .await;
    }
    Ok(Physical::Table { name, arn })
}

/// Creates (or finds) a worker's request queue `name` with its dead-letter queue `<name>-dlq` (five
/// receives), as a worker stack's template does; returns both URLs.
pub async fn worker_queue(client: &aws_sdk_sqs::Client, name: &str) -> Result<(String, String)> {
    let create = |name: String, attributes: HashMap<QueueAttributeName, String>| async move {
        let out = client
            .create_queue()
            .queue_name(&name)
            .set_attributes(Some(attributes))
            .send()
            .await
            .with_context(|| format!("creating queue {name}"))?;
        anyhow::Ok(out.queue_url.unwrap_or_default())
    };
    let dlq = create(format!("{name}-dlq"), HashMap::new()).await?;
    let dlq_arn = queue_attributes(client, &dlq, &[QueueAttributeName::QueueArn])
        .await?
        .remove(&QueueAttributeName::QueueArn)
        .unwrap_or_default();
    let policy = serde_json::json!({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "5"});
    let url = create(
        name.to_string(),
        HashMap::from([
            (QueueAttributeName::RedrivePolicy, policy.to_string()),
            (QueueAttributeName::VisibilityTimeout, "60".to_string()),
        ]),
    )
    .await?;
    Ok((url, dlq))
}

async fn create_queue(
    client: &aws_sdk_sqs::Client,
    stack: &Stack,
    props: &Value,
) -> Result<Physical> {
    let name = resolved(props, "QueueName", stack)?;
    let mut attributes = HashMap::new();
    if let Some(map) = props.as_mapping() {
        for (key, value) in map {
            let Some(key) = key.as_str() else { continue };
            match key {
                "QueueName" | "Tags" => {}
                "RedrivePolicy" => {
                    let policy = serde_json::json!({
                        "deadLetterTargetArn": resolved(value, "deadLetterTargetArn", stack)?,
                        "maxReceiveCount": text(value, "maxReceiveCount")?,
                    });
                    attributes.insert(QueueAttributeName::RedrivePolicy, policy.to_string());
                }
                other => {
                    attributes.insert(QueueAttributeName::from(other), resolve(value, stack)?);
                }
            }
        }
    }
    let created = client
        .create_queue()
        .queue_name(&name)
        .set_attributes(Some(attributes.clone()))
        .send()
        .await;
    let url = match created {
        Ok(out) => out
            .queue_url
            .ok_or_else(|| anyhow!("CreateQueue returned no URL"))?,
        // CreateQueue only refuses a name whose queue has other attributes. The stage keeps what it
        // was created with: changing a live queue's redrive policy or visibility under the
        // processes and operators using it is not a local tool's call.
        Err(e)
            if e.as_service_error()
                .is_some_and(|s| s.is_queue_name_exists()) =>
        {
            existing_queue(client, &name, &attributes).await?
        }
        Err(e) => return Err(sdk_error(e)),
    };
    let arn = queue_arn(client, &url).await?;
    Ok(Physical::Queue { name, url, arn })
}

/// The URL of an existing queue, left as it is (with a warning showing what it has and was asked).
async fn existing_queue(
    client: &aws_sdk_sqs::Client,
    name: &str,
    asked: &HashMap<QueueAttributeName, String>,
) -> Result<String> {
    let url = client
        .get_queue_url()
        .queue_name(name)
        .send()
        .await
        .map_err(sdk_error)?
        .queue_url
        .ok_or_else(|| anyhow!("GetQueueUrl returned no URL"))?;
    let has: BTreeMap<String, String> = client
        .get_queue_attributes()
        .queue_url(&url)
        .set_attribute_names(Some(asked.keys().cloned().collect()))
        .send()
        .await
        .map_err(sdk_error)?
        .attributes
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    let asked: BTreeMap<String, &String> = asked.iter().map(|(k, v)| (k.to_string(), v)).collect();
    tracing::warn!(
        queue = name,
        has = ?has,
        asked = ?asked,
        "queue exists with other attributes than these parameters give it; left unchanged"
    );
    Ok(url)
}

/// The ARN of a queue, by URL.
pub async fn queue_arn(client: &aws_sdk_sqs::Client, url: &str) -> Result<String> {
    queue_attributes(client, url, &[QueueAttributeName::QueueArn])
        .await?
        .remove(&QueueAttributeName::QueueArn)
        .ok_or_else(|| anyhow!("no QueueArn for {url}"))
}

/// Creates a queue outside the template, with the default attributes; returns its URL and ARN.
pub async fn create_plain_queue(
    client: &aws_sdk_sqs::Client,
    name: &str,
) -> Result<(String, String)> {
    let created = client.create_queue().queue_name(name).send().await;
    let url = created.map_err(sdk_error)?.queue_url.context("queue url")?;
    let arn = queue_arn(client, &url).await?;
    Ok((url, arn))
}

/// Attributes `names` of a queue, by URL (those it has).
pub async fn queue_attributes(
    client: &aws_sdk_sqs::Client,
    url: &str,
    names: &[QueueAttributeName],
) -> Result<HashMap<QueueAttributeName, String>> {
    Ok(client
        .get_queue_attributes()
        .queue_url(url)
        .set_attribute_names(Some(names.to_vec()))
        .send()
        .await?
        .attributes
        .unwrap_or_default())
}

/// An EventBridge rule on a bus with its targets (`PutRule` and `PutTargets` are idempotent).
async fn create_rule(
    client: &aws_sdk_eventbridge::Client,
    stack: &Stack,
    props: &Value,
) -> Result<()> {
    let name = resolved(props, "Name", stack)?;
    let bus = match props.get("EventBusName") {
        Some(v) => resolve(v, stack)?,
        None => "default".into(),
    };
    let pattern = props
        .get("EventPattern")
        .ok_or_else(|| anyhow!("only event-pattern rules are provisioned locally"))?;
    let pattern: serde_json::Value = serde_yaml_ng::from_value(pattern.clone())?;
    client
        .put_rule()
        .name(&name)
        .event_bus_name(&bus)
        .event_pattern(pattern.to_string())
        .send()
        .await
        .map_err(sdk_error)?;
    for target in list(props, "Targets") {
        client
            .put_targets()
            .rule(&name)
            .event_bus_name(&bus)
            .targets(
                aws_sdk_eventbridge::types::Target::builder()
                    .id(text(target, "Id")?)
                    .arn(resolved(target, "Arn", stack)?)
                    .build()?,
            )
            .send()
            .await
            .map_err(sdk_error)?;
    }
    Ok(())
}

fn function_spec(template: &Template, stack: &Stack, props: &Value) -> Result<FunctionSpec> {
    let mut spec = FunctionSpec::default();
    let own_env = props.get("Environment").and_then(|e| e.get("Variables"));
    for vars in [template.global_env(), own_env].into_iter().flatten() {
        if let Some(map) = vars.as_mapping() {
            for (key, value) in map {
                let key = key
                    .as_str()
                    .ok_or_else(|| anyhow!("non-string variable name"))?;
                spec.env.insert(
                    key.to_string(),
                    resolve(value, stack).with_context(|| key.to_string())?,
                );
            }
        }
    }
    if let Some(events) = props.get("Events").and_then(Value::as_mapping) {
        for (_, event) in events {
            let properties = event.get("Properties").cloned().unwrap_or(Value::Null);
            match event.get("Type").and_then(Value::as_str) {
                Some("SQS") => {
                    let arn = resolved(&properties, "Queue", stack).context("SQS event")?;
                    let (queue, url) = stack
                        .resources
                        .iter()
                        .find_map(|(logical, r)| match r {
                            Physical::Queue { arn: a, url, .. } if *a == arn => {
                                Some((logical.clone(), url.clone()))
                            }
                            _ => None,
                        })
                        .ok_or_else(|| anyhow!("no provisioned queue has ARN {arn}"))?;
                    let batch_size = properties
                        .get("BatchSize")
                        .and_then(Value::as_i64)
                        .unwrap_or(10) as i32;
                    spec.sqs.push(SqsSource {
                        queue,
                        queue_url: url,
                        queue_arn: arn,
                        batch_size,
                    });
                }
                Some("Schedule" | "ScheduleV2") => {
                    let expression = properties
                        .get("Schedule")
                        .or_else(|| properties.get("ScheduleExpression"))
                        .and_then(scalar)
                        .unwrap_or_default();
                    spec.schedules.push(expression);
                }
                _ => {}
            }
        }
    }
    Ok(spec)
}

/// Creates the secret `name` with a fresh random text, as the template's `GenerateSecretString`
/// does (64 characters of 256 random bits, here hex), or finds it (its text left as it is).
async fn create_secret(client: &aws_sdk_secretsmanager::Client, name: String) -> Result<Physical> {
    let text = stepline::domain::seal::SealKey::generate().to_hex();
    let request = client.create_secret().name(&name);
    let created = request.secret_string(text).send().await;
    let exists = |e: &CreateSecretError| e.is_resource_exists_exception();
    let found = async {
        let found = client.describe_secret().secret_id(&name).send().await;
        Ok(found.map_err(sdk_error)?.arn)
    };
    let arn = created_or_found(created.map(|out| out.arn), exists, found).await?;
    let arn = arn.ok_or_else(|| anyhow!("secret {name}: no ARN"))?;
    Ok(Physical::Secret { name, arn })
}

/// A bucket's name: its `BucketName`, else made from the stage and logical id (as CloudFormation
/// names a bucket the template leaves unnamed, stably here so that `lookup` finds it again).
fn bucket_of(stack: &Stack, logical: &str, props: &Value) -> Result<Physical> {
    let name = match props.get("BucketName") {
        Some(_) => resolved(props, "BucketName", stack)?,
        None => format!("stepline-{}-{}", stack.stage, logical.to_lowercase()),
    };
    let arn = format!("arn:aws:s3:::{name}");
    Ok(Physical::Bucket { name, arn })
}

async fn create_bucket(s3: &aws_sdk_s3::Client, bucket: &Physical) -> Result<()> {
    let Physical::Bucket { name, .. } = bucket else {
        anyhow::bail!("not a bucket: {bucket:?}");
    };
    let mut create = s3.create_bucket().bucket(name);
    let region = s3.config().region().map(|r| r.to_string());
    if let Some(region) = region.filter(|r| r != "us-east-1") {
        use aws_sdk_s3::types::{BucketLocationConstraint, CreateBucketConfiguration};
        create = create.create_bucket_configuration(
            CreateBucketConfiguration::builder()
                .location_constraint(BucketLocationConstraint::from(region.as_str()))
                .build(),
        );
    }
    match create.send().await {
        Ok(_) => Ok(()),
        Err(e)
            if e.as_service_error().is_some_and(|s| {
                s.is_bucket_already_owned_by_you() || s.is_bucket_already_exists()
            }) =>
        {
            Ok(())
        }
        Err(e) => Err(sdk_error(e)),
    }
}
