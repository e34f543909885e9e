//! The `tollgate` binary: parses the command line, sets up logging, loads the configuration
//! and runs the server until SIGTERM or SIGINT.
//!
//! Exit codes: 0 normal, 2 invalid configuration, 1 any other failure.

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use tollgate::cli::{Cli, Command, ExplainArgs, LimitsArgs, LimitsCommand, LogFormat, RunArgs};
use tollgate::cli::{HealthArgs, OverrideArgs, OverridesArgs, SuggestArgs, DEFAULT_HEALTH_URL};
use tollgate::config;
use tollgate::server::Server;

// mimalloc instead of glibc's malloc: allocation is a large share of a small proxied request,
// and mimalloc's is cheaper, for a few MiB more at rest (idle connections hold no buffers, so
// that stays small).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Check(args)) => check(&args.config),
        Some(Command::Explain(args)) => explain(args),
        Some(Command::Limits(LimitsCommand::Get(args))) => {
            limits(args, tollgate::limits_cli::Action::Get)
        }
        Some(Command::Limits(LimitsCommand::Reset(args))) => limits(
            args.target,
            tollgate::limits_cli::Action::Reset {
                limit_name: args.limit_name,
            },
        ),
        Some(Command::Limits(LimitsCommand::Overrides(args))) => limits_overrides(args),
        Some(Command::Limits(LimitsCommand::Override(args))) => limits_override(args),
        Some(Command::Limits(LimitsCommand::Suggest(args))) => limits_suggest(args),
        Some(Command::Health(args)) => health(args),
        Some(Command::Run(args)) => run(args),
        None => run(cli.run),
    }
}

/// The validated configuration, or exit code 2 with every problem printed.
fn load_config(path: &std::path::Path) -> Result<config::Config, ExitCode> {
    config::load(path).map_err(|errors| {
        eprintln!("{errors}");
        ExitCode::from(2)
    })
}

/// The main thread's runtime, or exit code 1 with the reason printed. It runs the commands and,
/// for `run`, what is not a client connection (the admin listener, reloads, the store's
/// connections and background rounds): requests are served on threads of their own
/// (`tollgate::workers`), so one thread is enough here.
fn new_runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("tollgate: cannot start the runtime: {e}");
            ExitCode::from(1)
        })
}

fn check(path: &std::path::Path) -> ExitCode {
    match config::load(path) {
        Ok(config) => {
            print!("{}", tollgate::summary::check(&config));
            ExitCode::SUCCESS
        }
        Err(errors) => {
            eprintln!("{errors}");
            ExitCode::from(2)
        }
    }
}

fn explain(args: ExplainArgs) -> ExitCode {
    let config = match load_config(&args.config) {
        Ok(config) => config,
        Err(code) => return code,
    };
    let described = tollgate::explain::Described {
        method: args.method,
        url: args.url,
        headers: args.headers,
        peer: args.client_ip,
    };
    let parts = match tollgate::explain::request_parts(&described) {
        Ok(parts) => parts,
        Err(e) => {
            eprintln!("tollgate explain: {e}");
            return ExitCode::from(2);
        }
    };
    let mut explanation = tollgate::explain::explain(&config, &parts, described.peer);
    if args.live {
        let runtime = match new_runtime() {
            Ok(rt) => rt,
            Err(code) => return code,
        };
        if let Err(e) = runtime.block_on(tollgate::explain::live(&config, &mut explanation)) {
            eprintln!("tollgate explain --live: {e}");
            return ExitCode::from(1);
        }
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&explanation.json()).expect("JSON")
        );
    } else {
        print!("{}", explanation.text());
    }
    ExitCode::SUCCESS
}

fn limits(args: LimitsArgs, action: tollgate::limits_cli::Action) -> ExitCode {
    let config = match load_config(&args.config) {
        Ok(config) => config,
        Err(code) => return code,
    };
    let runtime = match new_runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let answer = runtime.block_on(tollgate::limits_cli::run(
        &config,
        action.clone(),
        &args.route,
        &args.identity,
        args.admin.as_deref(),
    ));
    let answer = match answer {
        Ok(answer) => answer,
        Err(failure) => {
            eprintln!("tollgate limits: {}", failure.message);
            return ExitCode::from(if failure.usage { 2 } else { 1 });
        }
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&answer.json()).expect("JSON")
        );
    } else {
        print!("{}", answer.text());
    }
    ExitCode::SUCCESS
}

/// `tollgate limits overrides`: the overrides in force, as text or JSON.
fn limits_overrides(args: OverridesArgs) -> ExitCode {
    let (config, runtime) = match config_and_runtime(&args.config) {
        Ok(both) => both,
        Err(code) => return code,
    };
    let answer = runtime.block_on(tollgate::limits_cli::overrides(
        &config,
        args.admin.as_deref(),
    ));
    print_answer(
        "overrides",
        answer,
        args.json,
        tollgate::control::results::OverridesList::text,
    )
}

/// `tollgate limits suggest`: the running instance's report, as text or JSON; exit 2 for a
/// usage error (a bad window, no admin address), 1 when the instance cannot be asked.
fn limits_suggest(args: SuggestArgs) -> ExitCode {
    let (config, runtime) = match config_and_runtime(&args.config) {
        Ok(both) => both,
        Err(code) => return code,
    };
    let answer = runtime.block_on(tollgate::limits_cli::suggest(
        &config,
        args.admin.as_deref(),
        &args.window,
        args.local,
    ));
    print_answer(
        "suggest",
        answer,
        args.json,
        tollgate::suggest::advice::text,
    )
}

/// The configuration at `path` and a runtime to run a command in, or the exit code of why not.
fn config_and_runtime(
    path: &std::path::Path,
) -> Result<(config::Config, tokio::runtime::Runtime), ExitCode> {
    Ok((load_config(path)?, new_runtime()?))
}

/// A `tollgate limits COMMAND` answer printed as JSON or by `text`: exit 0; or its failure on
/// stderr: exit 2 for a usage error, 1 otherwise.
fn print_answer<T: serde::Serialize>(
    command: &str,
    answer: Result<T, tollgate::limits_cli::Failure>,
    json: bool,
    text: fn(&T) -> String,
) -> ExitCode {
    match answer {
        Ok(value) if json => {
            // Through `Value`, keys in name order, as the admin endpoint prints it.
            let value = tollgate::control::results::to_json(&value);
            println!(
                "{}",
                serde_json::to_string_pretty(&value).unwrap_or_default()
            );
            ExitCode::SUCCESS
        }
        Ok(value) => {
            print!("{}", text(&value));
            ExitCode::SUCCESS
        }
        Err(failure) => {
            eprintln!("tollgate limits {command}: {}", failure.message);
            ExitCode::from(if failure.usage { 2 } else { 1 })
        }
    }
}

/// `tollgate limits override`: the arguments checked as the admin endpoint checks them (exit 2
/// with what is allowed), then as `limits`.
fn limits_override(args: OverrideArgs) -> ExitCode {
    use tollgate::control::overrides::{parse_for, parse_limit, parse_multiply};
    use tollgate::limits_cli::Action;
    use tollgate::throttle::overrides::Adjust;
    let action = if args.delete {
        Ok(Action::Unoverride {
            limit_name: args.limit_name.clone(),
        })
    } else {
        let adjust = match (&args.limit, &args.multiply) {
            (Some(n), _) => parse_limit(n).map(Adjust::Limit),
            (_, Some(f)) => parse_multiply(f).map(Adjust::Multiply),
            (None, None) => Err("give --limit N or --multiply X".to_owned()),
        };
        let duration = parse_for(args.duration.as_deref().unwrap_or_default());
        let (limit_name, dry_run) = (args.limit_name.clone(), args.dry_run);
        adjust.and_then(|adjust| {
            duration.map(|duration| {
                Action::Override(tollgate::control::overrides::Request {
                    adjust,
                    duration,
                    limit_name,
                    dry_run,
                    who: tollgate::control::audit::Who::Cli,
                })
            })
        })
    };
    match action {
        Ok(action) => limits(args.target, action),
        Err(why) => {
            eprintln!("tollgate limits override: {}", why.replace('`', ""));
            ExitCode::from(2)
        }
    }
}

/// `tollgate health`: exit 0 when the URL answers 2xx, 1 otherwise (never 2: container
/// engines reserve it), with one line saying why.
fn health(args: HealthArgs) -> ExitCode {
    let url = match (args.url, args.config) {
        (Some(url), _) => url,
        (None, None) => DEFAULT_HEALTH_URL.to_owned(),
        (None, Some(path)) => match config::load(&path).map(|config| config.admin) {
            Ok(Some(address)) => {
                format!("http://{}/readyz", tollgate::limits_cli::reachable(address))
            }
            Ok(None) => {
                eprintln!(
                    "tollgate health: {} has no `admin` listener: pass --url",
                    path.display()
                );
                return ExitCode::from(1);
            }
            Err(_) => {
                eprintln!(
                    "tollgate health: {} is not a valid configuration (see `tollgate check`), so its admin address is unknown",
                    path.display()
                );
                return ExitCode::from(1);
            }
        },
    };
    let runtime = match new_runtime() {
        Ok(rt) => rt,
        Err(_) => return ExitCode::from(1),
    };
    match runtime.block_on(probe(&url, args.timeout)) {
        Ok(answer) => {
            println!("{url}: {answer}");
            ExitCode::SUCCESS
        }
        Err(why) => {
            eprintln!("tollgate health: {why}");
            ExitCode::from(1)
        }
    }
}

/// GETs `url` within `timeout`: Ok with the status and the body's first line on a 2xx answer,
/// otherwise Err with the same or with why there was no answer.
async fn probe(url: &str, timeout: std::time::Duration) -> Result<String, String> {
    use http_body_util::{BodyExt, Empty};
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("`{url}` is not a URL: {e}"))?;
    if uri.scheme_str() != Some("http") {
        return Err(format!(
            "`{url}`: only http:// URLs (the admin listener speaks plain HTTP)"
        ));
    }
    let request = http::Request::get(uri)
        .body(Empty::<bytes::Bytes>::new())
        .map_err(|e| format!("`{url}` is not a usable URL: {e}"))?;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    let exchange = async {
        let response = client.request(request).await.map_err(|e| causes(&e))?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| causes(&e))?
            .to_bytes();
        Ok::<_, String>((status, body))
    };
    let (status, body) = tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| {
            format!(
                "{url} did not answer within {}",
                humantime::format_duration(timeout)
            )
        })?
        .map_err(|e| format!("cannot reach {url}: {e}"))?;
    let text = String::from_utf8_lossy(&body);
    let first_line = text.lines().next().unwrap_or("").trim();
    let answer = if first_line.is_empty() {
        status.to_string()
    } else {
        format!("{status}: {first_line}")
    };
    if status.is_success() {
        Ok(answer)
    } else {
        Err(format!("{url} answered {answer}"))
    }
}

/// An error and its causes as one sentence, joined with ": ".
fn causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn run(args: RunArgs) -> ExitCode {
    // Held to the end of `run`: dropping it writes out whatever lines are still queued.
    let _log_writer = init_logging(args.log_format);
    let Some(path) = args.config else {
        eprintln!("tollgate: no configuration: pass --config FILE or set TOLLGATE_CONFIG");
        return ExitCode::from(2);
    };
    let config = match load_config(&path) {
        Ok(config) => Arc::new(config),
        Err(code) => return code,
    };
    let runtime = match new_runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    runtime.block_on(async move {
        // Handlers first: a signal that arrives once the port answers must drain, not kill.
        let shutdown = shutdown_signal();
        // Likewise SIGHUP (reload): registering a handler now replaces the default action
        // (terminate) for the life of the process; the reload watcher listens for it later.
        let _ = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup());
        let server = match Server::bind(config).await {
            Ok(server) => server,
            Err(e) => {
                eprintln!("tollgate: {e}");
                return ExitCode::from(1);
            }
        };
        server.run(shutdown).await;
        ExitCode::SUCCESS
    })
}

/// Installs the SIGTERM and SIGINT handlers now (must be called inside the runtime) and
/// returns a future that resolves on the first of them.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("installing a SIGINT handler");
    async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = int.recv() => tracing::info!("SIGINT received"),
        }
    }
}

/// Log lines (the access log among them) are formatted on the thread that logs and written
/// to stderr by a thread of their own, in batches: a busy proxy would otherwise make one
/// `write` system call per request on its request path. Never lossy: if the queue is full
/// the logging thread waits, as it would on a direct write to a slow stderr.
fn init_logging(format: LogFormat) -> tracing_appender::non_blocking::WorkerGuard {
    use std::io::IsTerminal;
    let filter = match std::env::var("TOLLGATE_LOG") {
        Err(_) => tracing_subscriber::EnvFilter::new("info"),
        Ok(text) => tracing_subscriber::EnvFilter::try_new(&text).unwrap_or_else(|e| {
            eprintln!(
                "tollgate: TOLLGATE_LOG={text:?} is not a valid filter ({e}); logging at info"
            );
            tracing_subscriber::EnvFilter::new("info")
        }),
    };
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(false)
        // The queue is allocated whole up front: 8,192 lines (about 200 KB) absorb any burst
        // between two batch writes; the default (128,000) would reserve about 4 MB for nothing.
        .buffered_lines_limit(8_192)
        .thread_name("tollgate-log")
        .finish(std::io::BufWriter::new(std::io::stderr()));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Colour only for a person at a terminal, never into files or container logs.
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(writer);
    match format {
        LogFormat::Text => builder.init(),
        // A traced request's lines carry its ids in `span` (the request's `tracing` span);
        // there are no nested spans, so the list would only repeat it.
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_span_list(false)
            .init(),
    }
    guard
}
