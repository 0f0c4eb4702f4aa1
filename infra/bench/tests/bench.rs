//! The benchmark program on the local emulator: the meter bills real requests by DynamoDB's and SQS's
//! rules, a small run yields every figure summary.json promises, and a small backlog is recovered
//! (whether each sweep returned before its deadline is a figure of the report, measured on this
//! machine: the deadline logic itself is tested on a clock that does not depend on it).

use aws_sdk_dynamodb::types::AttributeValue;
use stepline_bench::meter::Meter;
use stepline_bench::{analysis, coldstart, pricing, recovery, report, scale, workload};
use stepline_local::{fresh_stage, LocalStack, Template};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn meter_bills_puts_by_item_size_and_index_key_changes() -> anyhow::Result<()> {
    stepline_local::needs_emulator!();
    let local = LocalStack::up(&fresh_stage("bench-meter")).await?;
    let template = Template::load(&Template::default_path())?;
    let meter = Meter::new(workload::table_infos(&local, &template));
    let dynamodb = meter.clients(&local.sdk).dynamodb;
    let table = local.stack.table("ExecutionTable")?.to_string();
    let put = |due: Option<&str>, pad: usize, condition: Option<&str>| {
        let mut request = dynamodb
            .put_item()
            .table_name(&table)
            .item("pk", AttributeValue::S("exec#meter".into()))
            .item("pad", AttributeValue::S("x".repeat(pad)));
        if let Some(due) = due {
            request = request
                .item("dueShard", AttributeValue::S("s1".into()))
                .item("dueAt", AttributeValue::N(due.into()));
        }
        if let Some(condition) = condition {
            request = request.condition_expression(condition);
        }
        request.send()
    };
    put(Some("1000"), 1500, None).await?; // new item, 2 KB units, index entry created
    put(Some("1000"), 100, None).await?; // smaller, but the old item was 1.5 KB; index key unchanged
    put(Some("2000"), 100, None).await?; // index key moved: delete + put
    put(None, 100, None).await?; // leaves the index
    let failed = put(None, 100, Some("attribute_not_exists(pk)")).await;
    assert!(failed.is_err(), "the condition fails");
    let (calls, _) = meter.take();
    let puts: Vec<_> = calls.iter().filter(|c| c.operation == "PutItem").collect();
    assert_eq!(puts.len(), 5);
    let index: Vec<u64> = puts.iter().map(|c| c.index_writes).collect();
    assert_eq!(index, vec![1, 0, 2, 1, 0]);
    let base: Vec<u64> = puts
        .iter()
        .map(|c| c.write_units - c.index_writes)
        .collect();
    assert_eq!(
        base,
        vec![2, 2, 1, 1, 1],
        "the larger of old and new item, also when the condition fails"
    );
    assert_eq!(puts[4].status, 400);
    // "pk" + "exec#meter", "pad" + 1,500 bytes, "dueShard" + "s1", "dueAt" + the number 1000 (2 bytes).
    assert_eq!(
        puts[0].item_bytes,
        (2 + 10) + (3 + 1500) + (8 + 2) + (5 + 2)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_run_yields_every_summary_figure() -> anyhow::Result<()> {
    stepline_local::full_tier_only!(
        "a whole benchmark run, with the function binaries' cold starts"
    );
    stepline_local::needs_emulator!();
    let work = workload::Workload {
        executions: 6,
        light: 2,
        steps: 3,
        payload_bytes: 50,
        // Enough hops that the first reply of each completion instance (which reads the sealing key
        // once) cannot make the median.
        sequential: 5,
        loaded: 6,
        loaded_rounds: 2,
        lifecycle_events: false,
        completions: 4,
    };
    let measured = workload::run(work).await?;
    let prices = pricing::US_EAST_1;
    let cost = analysis::cost(&measured, &prices);
    assert_eq!(cost.steps, 18);
    let light = analysis::cost_light(&measured, &prices);
    assert_eq!(light.steps, 6);
    assert!(light.coordinator_usd_per_million_steps > 0.0);
    // Every step commits at least once; start and the first launch add two writes per execution.
    assert!(
        (1.0..=2.0).contains(&cost.dynamodb_writes_per_step),
        "{cost:?}"
    );
    assert!(cost.item_bytes_max > 0 && cost.item_bytes_max < 4096);
    assert!(cost.coordinator_usd_per_million_steps > 0.0);
    assert!(cost
        .lines
        .iter()
        .any(|l| l.side == "coordinator" && l.operation == "PutItem"));
    assert!(cost
        .lines
        .iter()
        .any(|l| l.side == "worker" && l.operation == "SendMessageBatch"));
    // The split by function adds up to the coordinator's figure, and names the functions that did the
    // work: the submit, the completion and the event sources' polling.
    let split: f64 = cost.by_function.values().sum();
    assert!(
        (split - cost.coordinator_usd_per_million_steps).abs() < 1e-6,
        "{:?} against {}",
        cost.by_function,
        cost.coordinator_usd_per_million_steps
    );
    for function in ["api", "completion", "polling"] {
        assert!(
            cost.by_function.get(function).is_some_and(|usd| *usd > 0.0),
            "{function} in {:?}",
            cost.by_function
        );
    }

    let path = analysis::critical_path(&measured);
    assert_eq!(
        path.median_calls, 2,
        "over four completion instances, a reply commits on its sealed record then sends: {path:?}"
    );
    assert_eq!(
        path.histogram.values().sum::<u64>(),
        10,
        "two hops per execution"
    );
    assert!(path.typical.ends_with("SendMessageBatch"), "{path:?}");

    let latency = analysis::latency(&measured);
    assert_eq!(latency.hops, 10);
    assert_eq!(
        latency.ping_pongs, 10,
        "as many bare round trips as hops, in the same run"
    );
    assert!(latency.ratio > 0.0);
    let sustained = analysis::latency_sustained(&measured);
    assert_eq!(
        (sustained.hops, sustained.ping_pongs),
        (24, 24),
        "at sustained load too, as many bare round trips as hops, over both rounds: {sustained:?}"
    );
    assert!(sustained.ratio > 0.0 && sustained.p99_ratio > 0.0);
    assert_eq!(latency.completion_batch_mean, 1.0, "one reply at a time");
    assert!(sustained.completion_batch_mean >= 1.0, "{sustained:?}");

    // Cold start of the debug binaries (the benchmark proper uses the release build).
    for (binary, _) in coldstart::BINARIES {
        stepline_local::binaries::path(binary)?;
    }
    let cold = coldstart::measure(&stepline_local::binaries::dir(), 1).await?;
    assert_eq!(cold.binaries.len(), coldstart::BINARIES.len());
    assert!(cold
        .binaries
        .iter()
        .all(|b| b.bytes > 0 && b.peak_rss_kib > 0));
    assert!(cold.init_ms_max > 0.0);

    let schedule = recovery::Schedule::of(&Template::load(&Template::default_path())?)?;
    let model = scale::Model::deployed(schedule, cost.index_writes_per_step * work.steps as f64, 1);
    let rows = scale::table(&model, &[1_000], &[1, 4]);
    let summary = report::summary(&report::Figures {
        mode: "test",
        work,
        prices,
        cost: &cost,
        cost_light: &light,
        cost_with_events: &cost,
        cost_long: &cost,
        long_steps: work.steps,
        lengths: &[analysis::Length::of(work.steps, work.executions, &cost)],
        path: &path,
        latency: &latency,
        latency_sustained: &sustained,
        cold: &cold,
        model: &model,
        rows: &rows,
        sweeper: None,
        fan_out: None,
        elapsed_s: 0.0,
    });
    for (key, _, _) in report::TARGETS {
        assert!(summary[key].is_number(), "{key} is a number in {summary}");
    }
    let markdown = report::markdown(&summary);
    for (_, label, _) in report::TARGETS {
        assert!(markdown.contains(label), "{label}");
    }
    assert!(
        markdown.contains("By function, at sustained load"),
        "{markdown}"
    );
    assert!(markdown.contains("completion $"), "{markdown}");

    // The doc update replaces only the marked section.
    let doc = std::env::temp_dir().join(format!("bench-doc-{}.md", uuid::Uuid::new_v4()));
    std::fs::write(
        &doc,
        format!("before\n{}\nold\n{}\nafter\n", report::START, report::END),
    )?;
    report::update_doc(&doc, "new figures")?;
    let text = std::fs::read_to_string(&doc)?;
    assert!(text.starts_with("before\n") && text.ends_with("after\n"));
    assert!(text.contains("new figures") && !text.contains("old"));
    let _ = std::fs::remove_file(doc);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_backlog_is_recovered_and_poison_is_pushed_back() -> anyhow::Result<()> {
    stepline_local::needs_emulator!();
    let schedule = recovery::Schedule::of(&Template::load(&Template::default_path())?)?;
    let budget_ms = schedule.timeout_ms;
    let backlog = recovery::backlog(200, schedule).await?;
    assert_eq!(backlog.claim_period_s, schedule.period_s);
    assert_eq!(backlog.leased, 200, "{backlog:?}");
    let claimed: usize = backlog.sweeps.iter().map(|s| s.report.claimed).sum();
    assert_eq!(claimed, 200, "each execution claimed once: {backlog:?}");
    assert!(backlog
        .sweeps
        .iter()
        .all(|s| s.launched == s.report.claimed));

    let poison = recovery::poison(20, 3, budget_ms).await?;
    assert_eq!(poison.first.report.deferred, 20, "{poison:?}");
    assert_eq!(poison.pushed_back, 20, "{poison:?}");
    assert_eq!(
        poison.good_in_shard_leased, poison.good_in_shard,
        "the good executions behind the poison were claimed in the first sweep: {poison:?}"
    );
    // Every good execution is claimed once, by the first sweep or, when a busy machine made that
    // sweep stop at its time budget, by the next (how many a sweep gets through in its budget is
    // the benchmark's figure, not a test's).
    assert_eq!(
        poison.first.report.claimed + poison.second.report.claimed,
        poison.good,
        "{poison:?}"
    );
    assert_eq!(
        (poison.second.report.failed, poison.second.report.deferred),
        (0, 0),
        "{poison:?}"
    );

    let run = recovery::Recovery {
        emulator: String::new(),
        backlog,
        poison,
        elapsed_s: 0.0,
    };
    let markdown = report::recovery_markdown(&serde_json::to_value(&run)?);
    assert!(markdown.contains("| Sweeps needed |"), "{markdown}");
    let doc = std::env::temp_dir().join(format!("bench-recovery-{}.md", uuid::Uuid::new_v4()));
    let text = format!(
        "{}\nold results\n{}\n{}\nold\n{}\n",
        report::START,
        report::END,
        report::RECOVERY_START,
        report::RECOVERY_END
    );
    std::fs::write(&doc, text)?;
    report::update_section(
        &doc,
        report::RECOVERY_START,
        report::RECOVERY_END,
        &markdown,
    )?;
    let text = std::fs::read_to_string(&doc)?;
    assert!(text.contains("old results") && text.contains("| Sweeps needed |"));
    let _ = std::fs::remove_file(doc);
    Ok(())
}
