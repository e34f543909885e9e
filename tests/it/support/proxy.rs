//! Starts tollgate in-process on 127.0.0.1:0 from YAML text (usually rendered by the builders
//! in config.rs: `proxy(config().upstream(&url)...)`), and clients to talk to it.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use tollgate::server::Server;

pub type ClientBody = BoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

pub fn proxy(yaml: impl Into<String>) -> ProxyBuilder {
    ProxyBuilder { yaml: yaml.into() }
}

pub struct ProxyBuilder {
    yaml: String,
}

pub struct ProxyHandle {
    pub addr: SocketAddr,
    pub admin: Option<SocketAddr>,
    /// The running proxy, to ask its store's health without an admin listener.
    pub running: tollgate::proxy::Proxy,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    pub task: Option<tokio::task::JoinHandle<()>>,
}

/// Starts tollgate from a configuration file (so it watches the file for reloads).
pub async fn proxy_from_file(path: &Path) -> ProxyHandle {
    let config =
        tollgate::config::load(path).unwrap_or_else(|e| panic!("test config invalid:\n{e}"));
    start_config(config).await
}

async fn start_config(config: tollgate::config::Config) -> ProxyHandle {
    let server = Server::bind(Arc::new(config)).await.expect("bind");
    let addrs = server.local_addrs();
    let admin = server.admin_addr();
    let running = server.proxy();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.run(async move {
        let _ = rx.await;
    }));
    ProxyHandle {
        addr: addrs[0],
        admin,
        running,
        shutdown: Some(tx),
        task: Some(task),
    }
}

impl ProxyBuilder {
    pub async fn start(self) -> ProxyHandle {
        let config = tollgate::config::parse(Path::new("test.yaml"), &self.yaml, |name| {
            std::env::var(name).ok()
        })
        .unwrap_or_else(|e| panic!("test config invalid:\n{e}\n---\n{}", self.yaml));
        start_config(config).await
    }
}

impl ProxyHandle {
    /// Waits (at most 5 s) until its admin listener's `/readyz` answers a bare `ready`: a Redis
    /// store connects in the background (`/readyz` is 503 until its first attempt ends), and
    /// with `on_error: allow` or `local` an instance whose store failed is ready with a second
    /// line saying so.
    pub async fn wait_ready(&self) {
        let admin = self.admin.expect("an admin listener");
        let mut last = String::new();
        for _ in 0..250 {
            let response = http1_client()
                .request(get(&format!("http://{admin}/readyz")))
                .await
                .unwrap();
            let status = response.status();
            last = text(response).await;
            if status == http::StatusCode::OK && last == "ready\n" {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        panic!("the proxy never became ready: {last:?}");
    }

    /// Waits (at most 10 s) until its Redis store has connected and answers, so the next
    /// request is decided by Redis and not by `on_error`, and its deny cache remembers
    /// denials (the store connects in the background, and the cache waits for its reset
    /// watch's first read; how long that takes depends on how busy the machine is). Returns
    /// at once with the memory store.
    pub async fn wait_store(&self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let health = self.running.store_health();
            let up = health.connected && health.up && !health.breaker_open;
            if !health.shared || up && self.running.remembers_denials() {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the store never connected: {health:?}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Starts a graceful shutdown; await `task` to see it finish.
    pub fn shutdown(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

pub fn http1_client() -> Client<HttpConnector, ClientBody> {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

pub fn h2c_client() -> Client<HttpConnector, ClientBody> {
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build(HttpConnector::new())
}

pub fn body(bytes: impl Into<Bytes>) -> ClientBody {
    Full::new(bytes.into()).map_err(|e| match e {}).boxed()
}

pub fn get(url: &str) -> Request<ClientBody> {
    Request::get(url).body(body(Bytes::new())).unwrap()
}

pub async fn text(response: Response<hyper::body::Incoming>) -> String {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// `method` to `url` with `headers` and an empty body over a fresh HTTP/1.1 client: the
/// answer's status, headers and body as text.
pub async fn exchange(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
) -> (http::StatusCode, http::HeaderMap, String) {
    let mut request = Request::builder().method(method).uri(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = http1_client()
        .request(request.body(body("")).unwrap())
        .await
        .unwrap();
    let (status, headers) = (response.status(), response.headers().clone());
    (status, headers, text(response).await)
}
