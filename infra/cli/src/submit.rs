//! `stepline submit --file inputs.jsonl`: one execution per line, submitted in batches, each on its
//! own idempotency key, so that running the same file again submits nothing twice.

use super::*;

/// Executions submitted per batch (each batch's first requests go out together).
const BATCH: usize = 100;

/// What `submit --file` was asked.
pub(crate) struct FileSubmission {
    pub pipeline: String,
    pub tenant: String,
    pub release: Option<String>,
    /// Each line's key is `<prefix>/<line number>`; the prefix defaults to a digest of the file.
    pub key_prefix: Option<String>,
    pub path: std::path::PathBuf,
}

/// Submits every non-blank line of the file (a JSON input) and reports each one that was refused.
/// Fails when a line is not JSON (before anything is submitted) or when any was refused.
pub(crate) async fn submit_file(
    api: &Coordinator,
    request: FileSubmission,
    out: &Output,
) -> Result<()> {
    let text = std::fs::read(&request.path)
        .with_context(|| format!("reading {}", request.path.display()))?;
    let prefix = request.key_prefix.unwrap_or_else(|| {
        Uuid::new_v5(&Uuid::NAMESPACE_OID, &text)
            .simple()
            .to_string()
    });
    let text = String::from_utf8(text).context("the file is not UTF-8")?;
    let mut inputs = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let input: Value =
            serde_json::from_str(line).with_context(|| format!("line {} is not JSON", n + 1))?;
        inputs.push((n + 1, input));
    }
    let total = inputs.len();
    let (mut submitted, mut duplicates, mut refused) = (0, 0, Vec::new());
    let mut results = Vec::with_capacity(total);
    for chunk in inputs.chunks(BATCH) {
        let requests = chunk
            .iter()
            .map(|(line, input)| SubmitRequest {
                pipeline_id: request.pipeline.clone(),
                release_version: request.release.clone(),
                tenant: request.tenant.clone(),
                input: input.clone(),
                idempotency_key: Some(format!("{prefix}/{line}")),
                parent: None,
            })
            .collect();
        for ((line, _), result) in chunk.iter().zip(api.submit_many(requests).await) {
            match result {
                Ok(done) => {
                    submitted += 1;
                    duplicates += usize::from(done.duplicate);
                    results.push(json!({"line": line, "executionId": done.execution, "duplicate": done.duplicate}));
                }
                Err(e) => {
                    let error = json!({"code": e.code(), "message": e.to_string()});
                    results.push(json!({"line": line, "error": error}));
                    refused.push(format!("line {line}: {} {e}", e.code()));
                }
            }
        }
        eprint!("\rsubmitted {} of {total}", submitted + refused.len());
    }
    eprintln!();
    out.show(&Value::Array(results), || {
        let mut lines = vec![format!(
            "{submitted} submitted ({duplicates} of them already), {} refused",
            refused.len()
        )];
        lines.extend(refused.iter().cloned());
        lines.join("\n")
    });
    if !refused.is_empty() {
        bail!("{} of {total} lines were refused", refused.len());
    }
    Ok(())
}
