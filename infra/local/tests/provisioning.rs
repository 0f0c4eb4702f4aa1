//! The local provisioning and the template must not drift: every table, queue, bus and rule the
//! template declares exists after provisioning, under the template's name, with the template's keys,
//! indexes, visibility timeouts, redrive policies and targets.

use std::collections::BTreeMap;

use anyhow::Result;
use aws_sdk_sqs::types::QueueAttributeName;
use stepline_local::stack::Physical;
use stepline_local::template::{resolve, scalar};
use stepline_local::{fresh_stage, LocalStack, Template};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provisioning_creates_every_resource_of_the_template_as_declared() -> Result<()> {
    stepline_local::needs_emulator!();
    let params: BTreeMap<String, String> =
        [("QueueVisibilitySeconds".to_string(), "42".to_string())].into();
    let local = LocalStack::up_with(&fresh_stage("prov"), &params).await?;
    let template = Template::load(&Template::default_path())?;
    let dynamodb = aws_sdk_dynamodb::Client::new(&local.sdk);
    let events = aws_sdk_eventbridge::Client::new(&local.sdk);
    let mut checked = BTreeMap::<String, usize>::new();

    for (logical, kind, props) in template.resources() {
        match kind.as_str() {
            "AWS::DynamoDB::Table" => {
                let name = resolve(&props["TableName"], &local.stack)?;
                assert_eq!(local.stack.table(&logical)?, name);
                let table = dynamodb
                    .describe_table()
                    .table_name(&name)
                    .send()
                    .await?
                    .table
                    .unwrap();
                let keys: Vec<String> = table
                    .key_schema()
                    .iter()
                    .map(|k| k.attribute_name().to_string())
                    .collect();
                let declared: Vec<String> = props["KeySchema"]
                    .as_sequence()
                    .unwrap()
                    .iter()
                    .map(|k| scalar(&k["AttributeName"]).unwrap())
                    .collect();
                assert_eq!(keys, declared, "{logical} keys");
                let indexes: Vec<String> = table
                    .global_secondary_indexes()
                    .iter()
                    .filter_map(|i| i.index_name().map(str::to_string))
                    .collect();
                let declared: Vec<String> = props
                    .get("GlobalSecondaryIndexes")
                    .and_then(|g| g.as_sequence())
                    .into_iter()
                    .flatten()
                    .map(|i| scalar(&i["IndexName"]).unwrap())
                    .collect();
                assert_eq!(indexes, declared, "{logical} indexes");
            }
            "AWS::SQS::Queue" => {
                let name = resolve(&props["QueueName"], &local.stack)?;
                let (provisioned, _) = local.stack.queue(&logical)?;
                assert_eq!(provisioned, name);
                let attrs = local
                    .queue_attributes(&logical, &[QueueAttributeName::All])
                    .await?;
                if let Some(visibility) = props.get("VisibilityTimeout") {
                    assert_eq!(
                        attrs
                            .get(&QueueAttributeName::VisibilityTimeout)
                            .map(String::as_str),
                        Some(resolve(visibility, &local.stack)?.as_str()),
                        "{logical} visibility"
                    );
                    assert_eq!(
                        resolve(visibility, &local.stack)?,
                        "42",
                        "parameters reach the queues"
                    );
                }
                if let Some(redrive) = props.get("RedrivePolicy") {
                    let policy: serde_json::Value =
                        serde_json::from_str(&attrs[&QueueAttributeName::RedrivePolicy])?;
                    assert_eq!(
                        policy["deadLetterTargetArn"],
                        resolve(&redrive["deadLetterTargetArn"], &local.stack)?
                    );
                    assert_eq!(
                        policy["maxReceiveCount"].to_string().trim_matches('"'),
                        scalar(&redrive["maxReceiveCount"]).unwrap()
                    );
                }
            }
            "AWS::Events::EventBus" => {
                let name = resolve(&props["Name"], &local.stack)?;
                assert!(
                    matches!(local.stack.resources.get(&logical), Some(Physical::Bus { name: n, .. }) if *n == name)
                );
                events.describe_event_bus().name(&name).send().await?;
            }
            "AWS::Events::Rule" => {
                let name = resolve(&props["Name"], &local.stack)?;
                let bus = resolve(&props["EventBusName"], &local.stack)?;
                let rule = events.describe_rule().name(&name).event_bus_name(&bus);
                let rule = rule.send().await?;
                assert!(rule.event_pattern().is_some(), "{logical} has its pattern");
                let targets = events
                    .list_targets_by_rule()
                    .rule(&name)
                    .event_bus_name(&bus);
                assert_eq!(
                    targets.send().await?.targets().len(),
                    props["Targets"].as_sequence().unwrap().len(),
                    "{logical} targets"
                );
            }
            "AWS::Serverless::Function" => {
                let spec = local.stack.function(&logical)?;
                let declared = props
                    .get("Events")
                    .and_then(|e| e.as_mapping())
                    .into_iter()
                    .flatten()
                    .filter(|(_, e)| e["Type"].as_str() == Some("SQS"))
                    .count();
                assert_eq!(spec.sqs.len(), declared, "{logical} SQS sources");
            }
            _ => continue,
        }
        *checked.entry(kind).or_default() += 1;
    }
    assert!(
        checked["AWS::DynamoDB::Table"] >= 2 && checked["AWS::SQS::Queue"] >= 10,
        "{checked:?}"
    );
    assert!(
        checked["AWS::Events::Rule"] >= 1 && checked["AWS::Serverless::Function"] >= 5,
        "{checked:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provisioning_an_existing_stage_with_other_parameters_reuses_its_queues_unchanged(
) -> Result<()> {
    stepline_local::needs_emulator!();
    let stage = fresh_stage("reprov");
    let params: BTreeMap<String, String> =
        [("QueueVisibilitySeconds".to_string(), "30".to_string())].into();
    let first = LocalStack::up_with(&stage, &params).await?;
    let again = LocalStack::up(&stage).await?;
    for (logical, physical) in &first.stack.resources {
        let Physical::Queue { url, arn, .. } = physical else {
            continue;
        };
        let (_, reused) = again.stack.queue(logical)?;
        assert_eq!(reused, url, "{logical} is the same queue");
        assert!(
            matches!(&again.stack.resources[logical], Physical::Queue { arn: a, .. } if a == arn)
        );
    }
    let attrs = again
        .queue_attributes(
            "OrderRequestQueue",
            &[QueueAttributeName::VisibilityTimeout],
        )
        .await?;
    assert_eq!(
        attrs
            .get(&QueueAttributeName::VisibilityTimeout)
            .map(String::as_str),
        Some("30"),
        "the existing queue keeps the visibility it was created with"
    );
    Ok(())
}
