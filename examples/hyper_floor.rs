//! The least a proxy built on hyper and Tokio spends per request: the yardstick for how much
//! of tollgate's cost is its own and how much is the HTTP stack it is built on.
//!
//! It forwards every request to one plain-HTTP/1.1 upstream and the response back, and does
//! nothing else: no routing, no limits, no hop-by-hop headers, no timeouts, no metrics, no
//! retries. It is built the way tollgate serves: one single-threaded runtime per core, each
//! accepting on the shared listener and keeping its own stack of keep-alive upstream
//! connections (a checkout pops, the end of the response body pushes back).
//!
//! Not a product: `bench/floor.sh` runs it beside nginx and tollgate (docs/performance.md).
//!
//! It reads tollgate's own configuration file (`listen`, `upstream.url` and `workers`, nothing
//! else), so the benchmark scripts can run it in tollgate's place:
//!
//! ```text
//! cargo run --release --example hyper_floor -- --config FILE
//! ```
//! Knob (environment): `FLOOR_EVENT_INTERVAL`, Tokio's default (61) unless set; tollgate
//! uses 4.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

type Pool = Arc<Mutex<Vec<SendRequest<Incoming>>>>;

// The allocator tollgate ships with.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: hyper_floor --config FILE";
    let [flag, path] = args.as_slice() else {
        panic!("{usage}")
    };
    assert_eq!(flag, "--config", "{usage}");
    let config: FloorConfig =
        serde_yaml::from_str(&std::fs::read_to_string(path)?).expect("a tollgate configuration");
    let listen: SocketAddr = config.listen.parse().expect("listen: an address and port");
    let upstream: SocketAddr = config
        .upstream
        .url
        .strip_prefix("http://")
        .and_then(|a| a.trim_end_matches('/').parse().ok())
        .expect("upstream.url: http://ADDRESS:PORT");
    let threads = config
        .workers
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let event_interval = std::env::var("FLOOR_EVENT_INTERVAL")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(61);

    let listener = std::net::TcpListener::bind(listen)?;
    listener.set_nonblocking(true)?;
    let mut joins = Vec::new();
    for _ in 0..threads {
        let listener = listener.try_clone()?;
        joins.push(std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .event_interval(event_interval)
                .build()
                .expect("a runtime");
            runtime.block_on(serve(listener, upstream))
        }));
    }
    for join in joins {
        join.join().expect("a serving thread")?;
    }
    Ok(())
}

/// The part of tollgate's configuration the floor uses; everything else is ignored.
#[derive(serde::Deserialize)]
struct FloorConfig {
    listen: String,
    upstream: FloorUpstream,
    workers: Option<usize>,
}

#[derive(serde::Deserialize)]
struct FloorUpstream {
    url: String,
}

async fn serve(listener: std::net::TcpListener, upstream: SocketAddr) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let pool: Pool = Arc::default();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let pool = pool.clone();
        tokio::spawn(async move {
            let service =
                hyper::service::service_fn(move |request| forward(request, pool.clone(), upstream));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn forward(
    request: Request<Incoming>,
    pool: Pool,
    upstream: SocketAddr,
) -> Result<Response<GiveBack>, Infallible> {
    let mut sender = match checkout(&pool) {
        Some(sender) => sender,
        None => match connect(upstream).await {
            Ok(sender) => sender,
            Err(_) => return Ok(bad_gateway()),
        },
    };
    match sender.send_request(request).await {
        Ok(response) => Ok(response.map(|body| GiveBack {
            body: Some(body),
            sender: Some((sender, pool)),
        })),
        Err(_) => Ok(bad_gateway()),
    }
}

/// The most recently returned connection that is ready; closed ones are dropped, and ones
/// hyper has not yet made ready again stay for later.
fn checkout(pool: &Pool) -> Option<SendRequest<Incoming>> {
    let mut idle = pool.lock().unwrap();
    idle.retain(|sender| !sender.is_closed());
    let ready = idle.iter().rposition(SendRequest::is_ready)?;
    Some(idle.remove(ready))
}

async fn connect(
    upstream: SocketAddr,
) -> Result<SendRequest<Incoming>, Box<dyn std::error::Error + Send + Sync>> {
    let stream = tokio::net::TcpStream::connect(upstream).await?;
    stream.set_nodelay(true)?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    Ok(sender)
}

fn bad_gateway() -> Response<GiveBack> {
    let mut response = Response::new(GiveBack {
        body: None,
        sender: None,
    });
    *response.status_mut() = StatusCode::BAD_GATEWAY;
    response
}

/// The upstream's response body; once it has ended, its connection goes back to the pool
/// (when hyper drops it: hyper stops polling a body whose size it knows once that is sent).
struct GiveBack {
    body: Option<Incoming>,
    sender: Option<(SendRequest<Incoming>, Pool)>,
}

impl Body for GiveBack {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let Some(body) = self.body.as_mut() else {
            return Poll::Ready(None);
        };
        Pin::new(body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.body
            .as_ref()
            .map_or(SizeHint::with_exact(0), Body::size_hint)
    }
}

impl Drop for GiveBack {
    fn drop(&mut self) {
        if self.body.as_ref().is_some_and(Body::is_end_stream) {
            if let Some((sender, pool)) = self.sender.take() {
                pool.lock().unwrap().push(sender);
            }
        }
    }
}
