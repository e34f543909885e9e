//! The capacity-limited app of the overload benchmark (`bench/overload.sh`) as a command: the
//! same code as the tests' `tests/it/support/capacity_app.rs` (included here with `#[path]`).
//!
//! ```text
//! cargo run --release --example overload_app -- --listen 127.0.0.1:8081 \
//!     --slots 8 --service 20ms --control 127.0.0.1:8082
//! ```
//!
//! The control listener (plain HTTP, never behind a front) changes the app while it runs and
//! reads its counters:
//! - `GET /set?slots=4&service=40ms&errors=0.1`: any of the three (errors: fraction answering 500)
//! - `GET /release`: ends every open `/stream` response
//! - `GET /stats`: the counters as JSON (`served`, `errors`, `max_waiting`, ...)
//! - `GET /reset`: forgets the high-water marks (`max_waiting`, `max_in_service`)
//! - `GET /drop`: empties the queue (every waiting request answers 500 at once, without a slot)

#[path = "../tests/it/support/capacity_app.rs"]
#[allow(dead_code)]
mod capacity_app;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

use capacity_app::{AppControl, CapacityApp};

#[derive(Parser)]
struct Args {
    /// Where the app listens.
    #[arg(long, default_value = "127.0.0.1:8081")]
    listen: SocketAddr,
    /// Requests served at once.
    #[arg(long, default_value_t = 8)]
    slots: usize,
    /// How long each request holds its slot.
    #[arg(long, default_value = "20ms", value_parser = humantime::parse_duration)]
    service: Duration,
    /// Where the control listener listens.
    #[arg(long, default_value = "127.0.0.1:8082")]
    control: SocketAddr,
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args = Args::parse();
    let app = CapacityApp::start_on(args.listen, args.slots, args.service);
    let control = app.control();
    let listener = tokio::net::TcpListener::bind(args.control)
        .await
        .expect("bind the control listener");
    eprintln!(
        "overload_app: {} slots x {:?} on {}, control on {}",
        args.slots, args.service, app.addr, args.control
    );
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let control = control.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let control = control.clone();
                async move { Ok::<_, Infallible>(command(req, &control)) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn command(req: Request<Incoming>, control: &AppControl) -> Response<Full<Bytes>> {
    let query: HashMap<&str, &str> = req
        .uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .collect();
    let answer = |status: StatusCode, body: String| {
        Response::builder()
            .status(status)
            .body(Full::new(Bytes::from(body + "\n")))
            .unwrap()
    };
    match req.uri().path() {
        "/set" => {
            if let Some(service) = query.get("service") {
                match humantime::parse_duration(service) {
                    Ok(service) => control.set_service_time(service),
                    Err(e) => return answer(StatusCode::BAD_REQUEST, format!("service: {e}")),
                }
            }
            if let Some(errors) = query.get("errors") {
                match errors.parse::<f64>() {
                    Ok(fraction) => control.set_error_fraction(fraction),
                    Err(e) => return answer(StatusCode::BAD_REQUEST, format!("errors: {e}")),
                }
            }
            if let Some(slots) = query.get("slots") {
                match slots.parse() {
                    Ok(slots) => control.set_slots(slots),
                    Err(e) => return answer(StatusCode::BAD_REQUEST, format!("slots: {e}")),
                }
            }
            answer(StatusCode::OK, control.stats().to_json().to_string())
        }
        "/release" => {
            control.release_streams();
            answer(StatusCode::OK, "released".into())
        }
        "/reset" => {
            control.reset_maxima();
            answer(StatusCode::OK, control.stats().to_json().to_string())
        }
        "/drop" => {
            let dropped = control.drop_waiting();
            answer(StatusCode::OK, format!("dropped {dropped}"))
        }
        "/stats" => answer(StatusCode::OK, control.stats().to_json().to_string()),
        _ => answer(
            StatusCode::NOT_FOUND,
            "try /set, /release, /reset, /drop or /stats".into(),
        ),
    }
}
