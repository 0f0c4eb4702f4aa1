//! Pipeline files: a pipeline defined in YAML or JSON (JSON is YAML), as `stepline validate` and
//! `stepline releases register --file` read it and a worker reads its own definition. The fields are
//! those of [`StepDef`] (camelCase); `docs/schemas/pipeline.schema.json` describes them for editors.
//! A file names no release: the release version is given when it is registered.
//!
//! Every error names the field and the line: unknown fields and wrong types from the parser, and each
//! of the definition's [`Problem`]s located in the text.

use serde::Deserialize;

use super::contract::Contract;
use super::pipeline::{PipelineDef, Problem, StepDef};

/// A pipeline file's content.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PipelineFile {
    /// The schema an editor validates the file with (ignored here).
    #[serde(default, rename = "$schema")]
    _schema: Option<String>,
    pipeline_id: String,
    steps: Vec<StepDef>,
}

/// Why a pipeline file was refused (code `INVALID_PIPELINE`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PipelineFileError {
    /// The text does not parse, has an unknown field or a value of the wrong type.
    #[error("line {line}, column {column}: {message}")]
    Syntax {
        line: usize,
        column: usize,
        message: String,
    },
    /// It parses, but the definition is not one the coordinator can run.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<Located>),
}

impl PipelineFileError {
    /// The error's stable code.
    pub const CODE: &'static str = "INVALID_PIPELINE";
}

/// A definition problem and the line of the file it is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    pub line: Option<usize>,
    pub problem: Problem,
}

impl std::fmt::Display for Located {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            Some(line) => write!(f, "line {line}: {}", self.problem),
            None => write!(f, "{}", self.problem),
        }
    }
}

/// Reads a pipeline file as the definition of release `release_version` (checked: a definition the
/// coordinator can run).
pub fn parse(text: &str, release_version: &str) -> Result<PipelineDef, PipelineFileError> {
    let file: PipelineFile = serde_yaml_ng::from_str(text).map_err(|e| {
        let (line, column) = e
            .location()
            .map(|l| (l.line(), l.column()))
            .unwrap_or((1, 1));
        // The parser's text ends with the location, given separately here.
        let message = e.to_string();
        let message = match message.rfind(" at line ") {
            Some(at) => message[..at].to_string(),
            None => message,
        };
        PipelineFileError::Syntax {
            line,
            column,
            message,
        }
    })?;
    let definition = PipelineDef::new(file.pipeline_id, release_version, file.steps);
    let problems: Vec<Located> = definition
        .problems()
        .into_iter()
        // A file names no release: the caller's is checked where it is given.
        .filter(|p| !release_version.is_empty() || p.field != "releaseVersion")
        .map(|problem| Located {
            line: locate(text, &definition, &problem),
            problem,
        })
        .collect();
    if problems.is_empty() {
        Ok(definition)
    } else {
        Err(PipelineFileError::Invalid(problems))
    }
}

/// The contract of a pipeline file (its release does not enter the contract).
pub fn contract(text: &str) -> Result<Contract, PipelineFileError> {
    parse(text, "").map(|definition| Contract::of(&definition))
}

/// The line (1-based) a problem is about: the field's key within its step (from the line of the
/// step's `id` to the next step's), else the step's `id` line; the top-level key for the pipeline's.
fn locate(text: &str, definition: &PipelineDef, problem: &Problem) -> Option<usize> {
    let lines: Vec<&str> = text.lines().collect();
    let key = problem.field.rsplit('.').next().unwrap_or(problem.field);
    let Some(step) = problem.step else {
        return lines.iter().position(|l| has_key(l, key)).map(|i| i + 1);
    };
    // Each step's start: the next line, in order, whose `id` is that step's.
    let mut starts = Vec::new();
    let mut from = 0;
    for s in definition.steps.iter().take(step + 2) {
        let found = (from..lines.len()).find(|&i| is_id_of(lines[i], &s.id));
        match found {
            Some(i) => {
                starts.push(i);
                from = i + 1;
            }
            None => break,
        }
    }
    let start = *starts.get(step)?;
    let end = starts.get(step + 1).copied().unwrap_or(lines.len());
    let found = (start..end).find(|&i| has_key(lines[i], key));
    Some(found.unwrap_or(start) + 1)
}

/// Whether `line` has the key `key` (`key:`, `"key":`, `'key':`).
fn has_key(line: &str, key: &str) -> bool {
    line.match_indices(key).any(|(at, _)| {
        let before = line[..at].chars().next_back();
        let after = &line[at + key.len()..];
        let (before_ok, after) = match before {
            Some(q @ ('"' | '\'')) => (true, after.strip_prefix(q).unwrap_or("?")),
            Some(c) => (!(c.is_alphanumeric() || c == '_' || c == '.'), after),
            None => (true, after),
        };
        before_ok && after.trim_start().starts_with(':')
    })
}

/// Whether `line` gives a step the id `id`.
fn is_id_of(line: &str, id: &str) -> bool {
    line.match_indices("id").any(|(at, _)| {
        has_key(&line[at.saturating_sub(1)..], "id")
            && line[at + 2..]
                .trim_start_matches(['"', '\''])
                .trim_start()
                .strip_prefix(':')
                .map(|value| {
                    let value = value.trim_start().trim_start_matches(['"', '\'']);
                    value.starts_with(id)
                        && !value[id.len()..]
                            .starts_with(|c: char| c.is_alphanumeric() || c == '-' || c == '_')
                })
                .unwrap_or(false)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::{RetryPolicy, StepKind};

    const SHOP: &str = "\
pipelineId: shop
steps:
  - id: check
    queue: shop-requests
    timeoutSecs: 30
    retry:
      maxAttempts: 4
      initialDelayMs: 200
      nonRetryable: [OUT_OF_STOCK]
  - id: approve
    kind: await
    queue: shop-approvals
    interactions: [manager]
  - id: ship
    queue: shop-requests
";

    #[test]
    fn a_file_reads_as_the_definition_its_builder_makes() {
        let retry = RetryPolicy {
            max_attempts: 4,
            initial_delay_ms: 200,
            ..RetryPolicy::default()
        };
        let steps = [
            StepDef::task("check", "shop-requests")
                .timeout_secs(30)
                .retry(retry)
                .non_retryable(["OUT_OF_STOCK"]),
            StepDef::await_step("approve", "shop-approvals").interactions(["manager"]),
            StepDef::task("ship", "shop-requests"),
        ];
        let built = PipelineDef::new("shop", "3", steps);
        assert_eq!(parse(SHOP, "3").unwrap(), built);
        assert_eq!(
            contract(SHOP).unwrap().contract_version,
            Contract::of(&built).contract_version
        );
        let json = serde_json::json!({
            "pipelineId": "shop",
            "steps": serde_json::to_value(&built.steps).unwrap(),
        });
        assert_eq!(
            parse(&serde_json::to_string_pretty(&json).unwrap(), "3").unwrap(),
            built,
            "the same pipeline in JSON"
        );
    }

    #[test]
    fn an_unknown_field_is_named_with_its_line() {
        let text = SHOP.replace("      maxAttempts: 4", "      maxAttempt: 4");
        match parse(&text, "1").unwrap_err() {
            PipelineFileError::Syntax { line, message, .. } => {
                assert_eq!(line, 7, "{message}");
                assert!(message.contains("unknown field `maxAttempt`"), "{message}");
            }
            other => panic!("{other}"),
        }
        let text = SHOP.replace("kind: await", "kind: wait");
        let error = parse(&text, "1").unwrap_err();
        assert!(
            matches!(&error, PipelineFileError::Syntax { line: 11, message, .. } if message.contains("wait")),
            "{error}"
        );
    }

    #[test]
    fn definition_problems_name_the_field_and_line() {
        let text = SHOP.replace("maxAttempts: 4", "maxAttempts: 0").replace(
            "  - id: ship\n    queue: shop-requests\n",
            "  - id: ship\n    queue: \"\"\n    timeoutSecs: 0\n",
        );
        let PipelineFileError::Invalid(problems) = parse(&text, "1").unwrap_err() else {
            panic!("expected definition problems");
        };
        let shown: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "line 7: steps[0].retry.maxAttempts: must be at least 1",
                "line 15: steps[2].queue: step \"ship\" has no queue",
                "line 16: steps[2].timeoutSecs: must be at least 1",
            ]
        );
    }

    #[test]
    fn a_duplicate_step_is_located_at_its_second_occurrence() {
        let text = SHOP.replace("id: ship", "id: check");
        let PipelineFileError::Invalid(problems) = parse(&text, "1").unwrap_err() else {
            panic!("expected definition problems");
        };
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].line, Some(14));
        assert!(problems[0].problem.message.contains("duplicate"));
    }

    #[test]
    fn a_json_file_is_located_too() {
        let text = "{\n  \"pipelineId\": \"p\",\n  \"steps\": [\n    {\"id\": \"a\", \"queue\": \"q\"},\n    {\n      \"id\": \"b\",\n      \"kind\": \"fanOut\",\n      \"queue\": \"\",\n      \"childPipeline\": \"c\",\n      \"maxConcurrency\": 0\n    }\n  ]\n}\n";
        let PipelineFileError::Invalid(problems) = parse(text, "1").unwrap_err() else {
            panic!("expected definition problems");
        };
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].line, Some(10));
        assert_eq!(problems[0].problem.path(), "steps[1].maxConcurrency");
        let ok = text.replace("\"maxConcurrency\": 0", "\"maxConcurrency\": 2");
        let def = parse(&ok, "1").unwrap();
        assert_eq!(def.steps[1].kind, StepKind::FanOut);
    }
}
