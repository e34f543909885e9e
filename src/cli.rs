//! The command line: `tollgate [run] --config FILE`, `tollgate check --config FILE`.

use std::path::PathBuf;

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

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}
