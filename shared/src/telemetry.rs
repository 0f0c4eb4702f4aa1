//! Logging: JSON lines when Lambda's log format is JSON (`AWS_LAMBDA_LOG_FORMAT=JSON`), plain text
//! otherwise; level from `RUST_LOG` (default `info`).

use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

/// Installs the global subscriber writing to stdout, where Lambda collects logs (a second call is a
/// no-op).
pub fn init() {
    init_with(std::io::stdout);
}

/// The same, writing to stderr (command-line tools keep stdout for their output).
pub fn init_to_stderr() {
    init_with(std::io::stderr);
}

fn init_with<W>(writer: W)
where
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let json = std::env::var("AWS_LAMBDA_LOG_FORMAT").is_ok_and(|v| v.eq_ignore_ascii_case("json"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_writer(writer);
    let _ = if json {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.try_init()
    };
}
