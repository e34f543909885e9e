//! The least a proxy built on hyper and Tokio spends per request: the yardstick for how much
//! of tollgate's cost is its own and how much is the HTTP stack it is built on.
//!
//! It forwards every request to one plain-HTTP/1.1 upstream and the response back, and does
//! nothing else: no routing, no limits, no hop-by-hop headers, no timeouts, no metrics, no
//! retries. It is built the way tollgate serves: one single-threaded runtime per core, each
//! accepting on the shared listener and keeping its own stack of keep-alive upstream
//! connections (a checkout pops, the end of the response body pushes back).
//!
//! Not a product: `bench/run.sh` runs it beside nginx and tollgate, and `bench/budget.sh` holds
//! tollgate's instructions per request to a budget against it (docs/performance.md).
//!
//! It reads tollgate's own configuration file (`listen`, `upstream.url` and `workers`, nothing
//! else), so the benchmark scripts can run it in tollgate's place:
//!
//! ```text
//! cargo run --release --example hyper_floor -- --config FILE
//! ```
//! Knob (environment): `FLOOR_EVENT_INTERVAL`, Tokio's default (61) unless set; tollgate
//! uses 4.
//!
//! **The exact floor.** When the configuration has `store.redis.url`, every request whose path
//! starts with `/allowed/` (the benchmark's limited route) first asks Redis, as an exact limit
//! does: one `EVALSHA` of tollgate's own `decide.lua` (one gcra check of 100,000 a second with a
//! burst of 100,000, keyed by `X-User-Id`, like `bench/routes.yaml`'s `allowed`) over one
//! redis-rs `ConnectionManager` per serving thread, and answers 429 when the script denies.
//! Nothing else of a decision (no key building rules, headers, deny cache, breaker, metrics):
//! the least an exact decision costs on hyper, Tokio and redis-rs.

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

/// tollgate's decision script, exactly as its Redis store loads it (the prelude first).
const DECIDE_LUA: &str = concat!(
    include_str!("../src/limit/prelude.lua"),
    "\n",
    include_str!("../src/limit/decide.lua")
);

/// The one check of the benchmark's `allowed` limit, in decide.lua's argument form: gcra,
/// 100,000 per 1,000,000 µs, burst 100,000, cost 1, not shadow, no lease, no block.
const ALLOWED_CHECK: &str = "5 100000 1000000 100000 1 0 0 0";

/// The exact floor's Redis side: the connection of one serving thread and the script's hash.
#[derive(Clone)]
struct Decider {
    redis: RedisConnection,
    sha: Arc<str>,
    key_prefix: Arc<str>,
}

/// How the floor talks to Redis: redis-rs's `ConnectionManager` (what tollgate uses), or
/// `FLOOR_REDIS_CLIENT=lean`: one pipelined socket per thread driven by a task of its own,
/// with redis-rs still encoding the commands and parsing the replies — the measurement of what
/// redis-rs's multiplexing machinery (channel, sink, per-call futures) costs per decision.
#[derive(Clone)]
enum RedisConnection {
    Manager(redis::aio::ConnectionManager),
    Lean(Arc<Mutex<LeanPipeline>>),
}

/// Commands not yet written, and the callers waiting for replies in the order sent.
#[derive(Default)]
struct LeanPipeline {
    unsent: Vec<u8>,
    waiting: std::collections::VecDeque<tokio::sync::oneshot::Sender<redis::Value>>,
    driver: Option<std::task::Waker>,
}

impl LeanPipeline {
    async fn open(client: &redis::Client) -> Arc<Mutex<LeanPipeline>> {
        let info = client.get_connection_info();
        let redis::ConnectionAddr::Tcp(host, port) = info.addr() else {
            panic!("FLOOR_REDIS_CLIENT=lean takes a redis:// URL")
        };
        let stream = tokio::net::TcpStream::connect((host.as_str(), *port))
            .await
            .expect("a connection to store.redis.url");
        stream.set_nodelay(true).expect("TCP_NODELAY");
        let pipeline = Arc::new(Mutex::new(LeanPipeline::default()));
        tokio::spawn(drive(stream, pipeline.clone()));
        pipeline
    }

    async fn call(pipeline: &Mutex<LeanPipeline>, cmd: &redis::Cmd) -> Option<redis::Value> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        {
            let mut state = pipeline.lock().unwrap();
            cmd.write_packed_command(&mut state.unsent);
            state.waiting.push_back(tx);
            if let Some(driver) = state.driver.take() {
                driver.wake();
            }
        }
        rx.await.ok()
    }
}

/// The lean pipeline's task: writes what callers queued, parses replies as they arrive and
/// hands each to the caller next in line.
async fn drive(mut stream: tokio::net::TcpStream, pipeline: Arc<Mutex<LeanPipeline>>) {
    use tokio::io::AsyncWrite;
    use tokio_util::codec::Decoder;
    let mut sending: Vec<u8> = Vec::new();
    let mut received = bytes::BytesMut::with_capacity(64 * 1024);
    let mut codec = redis::ValueCodec::default();
    std::future::poll_fn(|cx| loop {
        if sending.is_empty() {
            let mut state = pipeline.lock().unwrap();
            std::mem::swap(&mut sending, &mut state.unsent);
            if sending.is_empty() {
                state.driver = Some(cx.waker().clone());
            }
        }
        let mut progress = false;
        while !sending.is_empty() {
            match Pin::new(&mut stream).poll_write(cx, &sending) {
                Poll::Ready(Ok(n)) => {
                    sending.drain(..n);
                    progress = true;
                }
                Poll::Ready(Err(_)) => return Poll::Ready(()),
                Poll::Pending => break,
            }
        }
        loop {
            received.reserve(16 * 1024);
            match tokio_util::io::poll_read_buf(Pin::new(&mut stream), cx, &mut received) {
                Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => return Poll::Ready(()),
                Poll::Ready(Ok(_)) => {
                    progress = true;
                    while let Ok(Some(value)) = codec.decode(&mut received) {
                        let next = pipeline.lock().unwrap().waiting.pop_front();
                        if let Some(caller) = next {
                            let _ = caller.send(value.extract_error().unwrap_or(redis::Value::Nil));
                        }
                    }
                }
                Poll::Pending => break,
            }
        }
        if !progress {
            return Poll::Pending;
        }
    })
    .await
}

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
    let redis = config.store.and_then(|store| store.redis).map(|redis| {
        let client = redis::Client::open(redis.url.as_str()).expect("store.redis.url: a Redis URL");
        (client, redis.key_prefix.unwrap_or_default())
    });
    let event_interval = std::env::var("FLOOR_EVENT_INTERVAL")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(61);

    // SIGTERM ends the process through `exit`, so that an instrumented build
    // (`PGO_BUILD=hyper_floor bench/pgo.sh`) writes its profile, as tollgate's drain does.
    std::thread::spawn(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let mut terminate =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("a SIGTERM handler");
            terminate.recv().await;
        });
        std::process::exit(0);
    });

    let listener = std::net::TcpListener::bind(listen)?;
    listener.set_nonblocking(true)?;
    let mut joins = Vec::new();
    for _ in 0..threads {
        let listener = listener.try_clone()?;
        let redis = redis.clone();
        joins.push(std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .event_interval(event_interval)
                .build()
                .expect("a runtime");
            runtime.block_on(async move {
                let decider = match redis {
                    Some((client, key_prefix)) => Some(Decider::connect(client, key_prefix).await),
                    None => None,
                };
                // bench/budget.sh waits for one such line per thread, so that no start-up
                // work lands in what it counts.
                eprintln!("hyper_floor: serving thread ready");
                serve(listener, upstream, decider).await
            })
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
    store: Option<FloorStore>,
}

#[derive(serde::Deserialize)]
struct FloorStore {
    redis: Option<FloorRedis>,
}

#[derive(serde::Deserialize)]
struct FloorRedis {
    url: String,
    key_prefix: Option<String>,
}

#[derive(serde::Deserialize)]
struct FloorUpstream {
    url: String,
}

impl Decider {
    async fn connect(client: redis::Client, key_prefix: String) -> Decider {
        let mut manager = redis::aio::ConnectionManager::new(client.clone())
            .await
            .expect("a connection to store.redis.url");
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(DECIDE_LUA)
            .query_async(&mut manager)
            .await
            .expect("decide.lua loaded");
        let redis = match std::env::var("FLOOR_REDIS_CLIENT").as_deref() {
            Ok("lean") => RedisConnection::Lean(LeanPipeline::open(&client).await),
            _ => RedisConnection::Manager(manager),
        };
        Decider {
            redis,
            sha: sha.into(),
            key_prefix: format!("{key_prefix}floor:").into(),
        }
    }

    /// One exact decision: true when the script allows (its reply starts with " 1"); a
    /// failed call denies, as `on_error: deny` does.
    async fn allows(&self, user: &[u8]) -> bool {
        let mut key = Vec::with_capacity(self.key_prefix.len() + user.len());
        key.extend_from_slice(self.key_prefix.as_bytes());
        key.extend_from_slice(user);
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha.arg(&*self.sha).arg(1).arg(key).arg(ALLOWED_CHECK);
        match &self.redis {
            RedisConnection::Manager(manager) => {
                let reply: redis::RedisResult<Vec<u8>> =
                    evalsha.query_async(&mut manager.clone()).await;
                reply.is_ok_and(|packed| packed.starts_with(b" 1"))
            }
            RedisConnection::Lean(pipeline) => matches!(
                LeanPipeline::call(pipeline, &evalsha).await,
                Some(redis::Value::BulkString(packed)) if packed.starts_with(b" 1")
            ),
        }
    }
}

async fn serve(
    listener: std::net::TcpListener,
    upstream: SocketAddr,
    decider: Option<Decider>,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let pool: Pool = Arc::default();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let pool = pool.clone();
        let decider = decider.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                decide_then_forward(request, pool.clone(), upstream, decider.clone())
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn decide_then_forward(
    request: Request<Incoming>,
    pool: Pool,
    upstream: SocketAddr,
    decider: Option<Decider>,
) -> Result<Response<GiveBack>, Infallible> {
    if let Some(decider) = decider.filter(|_| request.uri().path().starts_with("/allowed/")) {
        let user = request
            .headers()
            .get("x-user-id")
            .map_or(&b""[..], |value| value.as_bytes());
        if !decider.allows(user).await {
            return Ok(answer(StatusCode::TOO_MANY_REQUESTS));
        }
    }
    forward(request, pool, upstream).await
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
            Err(_) => return Ok(answer(StatusCode::BAD_GATEWAY)),
        },
    };
    match sender.send_request(request).await {
        Ok(response) => Ok(response.map(|body| GiveBack {
            body: Some(body),
            sender: Some((sender, pool)),
        })),
        Err(_) => Ok(answer(StatusCode::BAD_GATEWAY)),
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

fn answer(status: StatusCode) -> Response<GiveBack> {
    let mut response = Response::new(GiveBack {
        body: None,
        sender: None,
    });
    *response.status_mut() = status;
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
