//! Reaching a stage that is already deployed: found whole (each resource looked up), or by the names
//! its template gives.

use std::collections::BTreeSet;

use super::*;

impl Stack {
    /// Finds an already deployed stage of `template` (by the names the template gives it) without
    /// creating anything, each resource found and its URL and ARN read: how a local run reaches a
    /// stack on AWS or on an emulator.
    pub async fn lookup(sdk: &SdkConfig, template: &Template, stage: &str) -> Result<Stack> {
        let mut stack = Stack::names(template, stage)?;
        let dynamodb = aws_sdk_dynamodb::Client::new(sdk);
        let sqs = aws_sdk_sqs::Client::new(sdk);
        let secrets = aws_sdk_secretsmanager::Client::new(sdk);
        let missing = |what: &str, name: &str| format!("stage {stage}: {what} {name} not found");
        for physical in stack.resources.values_mut() {
            match physical {
                Physical::Table { name, arn } => {
                    let found = dynamodb.describe_table().table_name(&*name).send().await;
                    let table = found.with_context(|| missing("table", name))?.table;
                    *arn = table.and_then(|t| t.table_arn).unwrap_or_default();
                }
                Physical::Queue { name, url, arn } => {
                    let found = sqs.get_queue_url().queue_name(&*name).send().await;
                    let found = found.with_context(|| missing("queue", name))?.queue_url;
                    *url = found.unwrap_or_default();
                    *arn = queue_arn(&sqs, url).await?;
                }
                Physical::Secret { name, arn } => {
                    let found = secrets.describe_secret().secret_id(&*name).send().await;
                    let found = found.with_context(|| missing("secret", name))?.arn;
                    *arn = found.unwrap_or_default();
                }
                Physical::Bus { .. } | Physical::Bucket { .. } => {}
            }
        }
        stack.resolve_functions(template)?;
        Ok(stack)
    }

    /// A deployed stage of `template` reached by the names the template gives its resources, with
    /// no call made: how the operator CLI reaches a stack, so that each command pays only for the
    /// calls it makes. A queue's `!Ref` is its name until resolved (see
    /// [`Stack::resolve_queues_of`]; the SQS adapters also resolve a name at its first use), a
    /// secret's is its name (Secrets Manager takes either), and ARNs are left empty.
    pub fn by_names(template: &Template, stage: &str) -> Result<Stack> {
        let mut stack = Stack::names(template, stage)?;
        stack.resolve_functions(template)?;
        Ok(stack)
    }

    /// In a stack reached by names, resolves the URLs of the queues `function`'s environment names
    /// (one `GetQueueUrl` each), and that environment with them.
    pub async fn resolve_queues_of(
        &mut self,
        sqs: &aws_sdk_sqs::Client,
        template: &Template,
        function: &str,
    ) -> Result<()> {
        let named: BTreeSet<String> = self.function(function)?.env.values().cloned().collect();
        let stage = self.stage.clone();
        for physical in self.resources.values_mut() {
            if let Physical::Queue { name, url, .. } = physical {
                if named.contains(name.as_str()) && url == name {
                    let found = sqs.get_queue_url().queue_name(&*name).send().await;
                    let found = found.with_context(|| format!("stage {stage}: queue {name}"))?;
                    *url = found.queue_url.unwrap_or_default();
                }
            }
        }
        self.resolve_functions(template)
    }

    /// The resources of `template` under `stage`, by their names alone.
    fn names(template: &Template, stage: &str) -> Result<Stack> {
        let mut stack = Stack::named(stage, template.parameter_defaults());
        for (logical, kind, props) in &template.resources() {
            let name_of = |key: &str| resolved(props, key, &stack).context(logical.clone());
            let physical = match kind.as_str() {
                "AWS::DynamoDB::Table" => Physical::Table {
                    name: name_of("TableName")?,
                    arn: String::new(),
                },
                "AWS::SQS::Queue" => {
                    let name = name_of("QueueName")?;
                    Physical::Queue {
                        url: name.clone(),
                        name,
                        arn: String::new(),
                    }
                }
                "AWS::Events::EventBus" => Physical::Bus {
                    name: name_of("Name")?,
                    arn: String::new(),
                },
                "AWS::S3::Bucket" => bucket_of(&stack, logical, props)?,
                "AWS::SecretsManager::Secret" => {
                    let name = name_of("Name")?;
                    Physical::Secret {
                        arn: name.clone(),
                        name,
                    }
                }
                _ => continue,
            };
            stack.resources.insert(logical.clone(), physical);
        }
        Ok(stack)
    }
}
