//! Pipeline files and their JSON Schema (`docs/schemas/pipeline.schema.json`, for editors) agree: the
//! repository's pipeline files pass both the schema and the reader, a step with every field set passes
//! the schema, and what the reader refuses for its shape the schema refuses too.

use std::path::{Path, PathBuf};

use boon::{Compiler, SchemaIndex, Schemas};
use serde_json::{json, Value};
use stepline::domain::{PipelineDef, RetryPolicy, StepDef};
use stepline::pipeline_file;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn schema() -> (Schemas, SchemaIndex) {
    let path = root().join("docs/schemas/pipeline.schema.json");
    let mut schemas = Schemas::new();
    let index = Compiler::new()
        .compile(
            path.canonicalize()
                .expect("the schema")
                .to_str()
                .expect("a UTF-8 path"),
            &mut schemas,
        )
        .unwrap_or_else(|e| panic!("the pipeline schema does not compile: {e:#}"));
    (schemas, index)
}

fn valid(value: &Value) -> Result<(), String> {
    let (schemas, index) = schema();
    schemas.validate(value, index).map_err(|e| format!("{e:#}"))
}

/// The repository's pipeline files: the example's and the one `stepline init` writes.
fn files() -> Vec<(String, String)> {
    let template = std::fs::read_to_string(root().join("infra/cli/templates/pipeline.yaml"))
        .expect("the init template");
    let example = std::fs::read_to_string(root().join("examples/python-worker/pipeline.yaml"))
        .expect("the Python example's pipeline");
    vec![
        ("init template".into(), template.replace("{{name}}", "shop")),
        ("python example".into(), example),
    ]
}

#[test]
fn the_repositorys_pipeline_files_pass_the_schema_and_the_reader() {
    for (name, text) in files() {
        let value: Value = serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        valid(&value).unwrap_or_else(|e| panic!("{name}: {e}"));
        pipeline_file::parse(&text, "1").unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn every_field_a_step_has_is_in_the_schema() {
    let definition = PipelineDef::new(
        "p",
        "1",
        [
            StepDef::task("a", "q")
                .types("in/1", "out/1")
                .timeout_secs(9)
                .retry(RetryPolicy::doubling(4, 100, 800))
                .non_retryable(["BAD"]),
            StepDef::await_step("b", "q").interactions(["chef", "owner"]),
            StepDef::fan_out("c", "child")
                .tolerating(Some(2), Some(10.0))
                .max_concurrency(5),
        ],
    );
    let file = json!({"pipelineId": "p", "steps": definition.steps});
    valid(&file).unwrap_or_else(|e| panic!("{e}\n{file:#}"));
    let text = serde_json::to_string(&file).unwrap();
    assert_eq!(pipeline_file::parse(&text, "1").unwrap(), definition);
}

#[test]
fn what_the_reader_refuses_for_its_shape_the_schema_refuses() {
    let step = |extra: Value| {
        let mut step = json!({"id": "a", "queue": "q"});
        step.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        json!({"pipelineId": "p", "steps": [step]})
    };
    let cases = [
        step(json!({"retrys": {}})),
        step(json!({"kind": "wait"})),
        step(json!({"timeoutSecs": "soon"})),
        step(json!({"retry": {"maxAttempt": 3}})),
        json!({"pipelineId": "p", "release": "1", "steps": [{"id": "a", "queue": "q"}]}),
        json!({"pipelineId": "p", "steps": "a"}),
        json!({"steps": [{"id": "a", "queue": "q"}]}),
    ];
    for case in cases {
        assert!(valid(&case).is_err(), "the schema accepts {case}");
        let text = serde_json::to_string(&case).unwrap();
        assert!(
            pipeline_file::parse(&text, "1").is_err(),
            "the reader accepts {case}"
        );
    }
}
