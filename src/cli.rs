//! The command line: `tollgate [run] --config FILE`, `tollgate check --config FILE`,
//! `tollgate explain ...`, `tollgate limits get|reset|override|suggest ...`, `tollgate health [--url URL]`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "tollgate",
    version,
    about = "An HTTP reverse proxy with built-in, Redis-backed throttling"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the proxy (the default when no command is given).
    Run(RunArgs),
    /// Validate a configuration file and print a summary; exit 2 if it is invalid.
    Check(CheckArgs),
    /// Show what tollgate would do with a request: route, identity, limits and store keys.
    Explain(ExplainArgs),
    /// Read or reset one caller's limits ("someone is being blocked").
    #[command(subcommand)]
    Limits(LimitsCommand),
    /// Ask a running instance whether it is ready (GET /readyz on its admin listener): exit 0
    /// on a 2xx answer, 1 otherwise with the reason. A health check that needs no curl.
    Health(HealthArgs),
}

#[derive(Debug, Subcommand)]
pub enum LimitsCommand {
    /// What is left of each limit for the caller on the route (consumes nothing).
    Get(LimitsArgs),
    /// Give the caller its full quota back on every limit and tier of the route (or on the
    /// limit `--limit-name` names), on every replica sharing the store.
    Reset(ResetArgs),
    /// Give the caller a different limit on the route for a while (`--limit N` or
    /// `--multiply X`, `--for 24h`; on one limit with `--limit-name`, else every limit scaled
    /// in proportion), on every replica sharing the store; `--dry-run` shows what each limit
    /// would become; `--delete` ends it.
    Override(OverrideArgs),
    /// The temporary overrides in force, fleet-wide: who set them and when they end.
    Overrides(OverridesArgs),
    /// What callers really send per route (peak per-minute and per-second rates), and the
    /// limits that would have refused at most 0.1 % and 1 % of them, with the YAML to set
    /// them; asked of a running instance's admin listener (GET /limits/suggest).
    Suggest(SuggestArgs),
}

#[derive(Debug, Args)]
pub struct SuggestArgs {
    /// The configuration file (for the `admin` address).
    #[arg(long, short = 'c', env = "TOLLGATE_CONFIG")]
    pub config: PathBuf,
    /// A running instance's admin listener, e.g. http://10.0.0.5:9901 (default: the config's
    /// `admin` address).
    #[arg(long)]
    pub admin: Option<String>,
    /// How far back: `1h` (this clock hour and the previous one) or `24h`.
    #[arg(long, default_value = "24h")]
    pub window: String,
    /// That instance's own record only, rather than the fleet's (merged through Redis).
    #[arg(long)]
    pub local: bool,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ResetArgs {
    #[command(flatten)]
    pub target: LimitsArgs,
    /// Reset only the limit of this name (default: every limit of the route).
    #[arg(long, value_name = "NAME")]
    pub limit_name: Option<String>,
}

#[derive(Debug, Args)]
pub struct OverridesArgs {
    /// The configuration file.
    #[arg(long, short = 'c', env = "TOLLGATE_CONFIG")]
    pub config: PathBuf,
    /// A running instance's admin listener, e.g. http://10.0.0.5:9901 (default: the config's
    /// `admin` address). Used when limits live in memory; with Redis the store is read directly.
    #[arg(long)]
    pub admin: Option<String>,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct OverrideArgs {
    #[command(flatten)]
    pub target: LimitsArgs,
    /// Change only the limit of this name (default: every limit, in proportion for --limit).
    #[arg(long, value_name = "NAME")]
    pub limit_name: Option<String>,
    /// Show what each limit would become, change nothing.
    #[arg(long, conflicts_with = "delete")]
    pub dry_run: bool,
    /// The limit named by --limit-name becomes N units per period; without a name, the
    /// caller's shortest-period limit becomes N and the others are scaled as much.
    #[arg(long, value_name = "N", conflicts_with_all = ["multiply", "delete"], required_unless_present_any = ["multiply", "delete"])]
    pub limit: Option<String>,
    /// The caller's limits are multiplied by X (e.g. 10, or 0.5 to lower them).
    #[arg(long, value_name = "X", conflicts_with = "delete")]
    pub multiply: Option<String>,
    /// How long the override lasts (e.g. 30m, 24h, 7d; at most 366d).
    #[arg(
        long = "for",
        value_name = "DURATION",
        required_unless_present = "delete",
        conflicts_with = "delete"
    )]
    pub duration: Option<String>,
    /// End the caller's override on the route now.
    #[arg(long)]
    pub delete: bool,
}

#[derive(Debug, Args)]
pub struct LimitsArgs {
    /// The configuration file.
    #[arg(long, short = 'c', env = "TOLLGATE_CONFIG")]
    pub config: PathBuf,
    /// The route's name.
    #[arg(long)]
    pub route: String,
    /// The value the caller presents for the route's key (an API key, a user id, a client
    /// IP...), or its short form as tollgate shows it (`sha256:<12 hex>`).
    #[arg(long)]
    pub identity: String,
    /// A running instance's admin listener, e.g. http://10.0.0.5:9901 (default: the config's
    /// `admin` address). Used when limits live in memory; with Redis the store is read directly.
    #[arg(long)]
    pub admin: Option<String>,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// The configuration file.
    #[arg(long, short = 'c', env = "TOLLGATE_CONFIG")]
    pub config: PathBuf,
    /// The request method.
    #[arg(short = 'X', long = "request", default_value = "GET")]
    pub method: String,
    /// A request header, `Name: value` (repeatable).
    #[arg(short = 'H', long = "header")]
    pub headers: Vec<String>,
    /// The address the request comes from (the TCP peer). Behind a trusted proxy, pass the
    /// proxy's address and an X-Forwarded-For header.
    #[arg(long, default_value = "127.0.0.1")]
    pub client_ip: std::net::IpAddr,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
    /// Also read the current state from the store (remaining, reset) without consuming.
    #[arg(long)]
    pub live: bool,
    /// The URL or path, e.g. https://api.example.com/api/posts/1 or /login?user=x
    pub url: String,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The configuration file.
    #[arg(long, short = 'c', env = "TOLLGATE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Log format; the filter comes from TOLLGATE_LOG (RUST_LOG syntax, default "info").
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The configuration file.
    #[arg(long, short = 'c', env = "TOLLGATE_CONFIG")]
    pub config: PathBuf,
}

/// Where `tollgate health` asks when neither `--url` nor a configuration is given.
pub const DEFAULT_HEALTH_URL: &str = "http://127.0.0.1:9901/readyz";

#[derive(Debug, Args)]
pub struct HealthArgs {
    /// The URL to ask (plain http://). Default: /readyz on the configuration's `admin`
    /// address when a configuration is given, else http://127.0.0.1:9901/readyz.
    #[arg(long)]
    pub url: Option<String>,
    /// The configuration file whose `admin` address is asked (ignored with --url).
    #[arg(long, short = 'c', env = "TOLLGATE_CONFIG")]
    pub config: Option<PathBuf>,
    /// How long to wait for the whole answer.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}
