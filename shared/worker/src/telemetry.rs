//! Logging: JSON lines when Lambda's log format is JSON (`AWS_LAMBDA_LOG_FORMAT=JSON`), plain text
//! otherwise; level from `RUST_LOG` (default `info`).

use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::prelude::*;

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
    let json = std::env::var("AWS_LAMBDA_LOG_FORMAT").is_ok_and(|v| v.eq_ignore_ascii_case("json"));
    let fmt = tracing_subscriber::fmt::layer()
        .with_target(false)
        .with_writer(writer);
    let registry = tracing_subscriber::registry().with(filter());
    let _ = if json {
        registry.with(fmt.json().flatten_event(true)).try_init()
    } else {
        registry.with(fmt).try_init()
    };
}

/// `RUST_LOG` as `level` or `target=level,...` directives (default `info`). A plain target filter, not
/// `EnvFilter`: it needs no regular-expression engine in the binary.
fn filter() -> Targets {
    std::env::var("RUST_LOG")
        .ok()
        .and_then(|v| v.parse::<Targets>().ok())
        .unwrap_or_else(|| Targets::new().with_default(LevelFilter::INFO))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rust_log_levels_and_directives_parse_without_env_filter() {
        let plain: Targets = "warn".parse().unwrap();
        assert_eq!(plain.default_level(), Some(LevelFilter::WARN));
        let directives: Targets = "info,stepline=debug".parse().unwrap();
        assert!(directives.would_enable("stepline::coordinator", &tracing::Level::DEBUG));
        assert!(!directives.would_enable("hyper", &tracing::Level::DEBUG));
    }
}
