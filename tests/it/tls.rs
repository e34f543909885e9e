//! TLS listeners: a certificate made at test time, real rustls clients negotiating h2 or
//! http/1.1 by ALPN, and a bad key refused at start-up.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::support::*;
use http::Version;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tempfile::TempDir;
use tollgate::server::{Server, StartError};

/// A self-signed certificate for `localhost`, written as PEM files.
struct TestCert {
    _dir: TempDir,
    cert: PathBuf,
    key: PathBuf,
    der: CertificateDer<'static>,
}

fn make_cert() -> TestCert {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let dir = TempDir::new().unwrap();
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    std::fs::write(&cert, certified.cert.pem()).unwrap();
    std::fs::write(&key, certified.key_pair.serialize_pem()).unwrap();
    TestCert {
        _dir: dir,
        cert,
        key,
        der: certified.cert.der().clone(),
    }
}

/// A fresh certificate, an upstream, and a proxy listening with TLS in front of it.
async fn tls_proxy() -> (TestCert, Upstream, ProxyHandle) {
    let cert = make_cert();
    let up = upstream().start().await;
    let proxy = proxy(tls_listener(&up.url(), &cert.cert, &cert.key))
        .start()
        .await;
    (cert, up, proxy)
}

/// A TLS listener on 127.0.0.1:0 with this certificate and key, in front of `upstream_url`.
fn tls_listener(upstream_url: &str, cert: &Path, key: &Path) -> Config {
    config().upstream(upstream_url).listen_tls(
        "127.0.0.1:0",
        &cert.display().to_string(),
        &key.display().to_string(),
    )
}

/// A client config trusting only `cert`, offering the given ALPN protocols.
fn client_config(cert: &TestCert, alpn: &[&[u8]]) -> ClientConfig {
    let mut roots = RootCertStore::empty();
    roots.add(cert.der.clone()).unwrap();
    let mut config =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    config
}

fn https_url(port: u16, path: &str) -> String {
    format!("https://localhost:{port}{path}")
}

async fn echo(response: http::Response<hyper::body::Incoming>) -> serde_json::Value {
    serde_json::from_str(&text(response).await).unwrap()
}

/// What the server picks when the client offers exactly `alpn`.
/// A TLS connection to the proxy on `port`, offering `alpn`.
async fn tls_connect(
    cert: &TestCert,
    port: u16,
    alpn: &[&[u8]],
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client_config(cert, alpn)));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .expect("TLS handshake")
}

async fn negotiated_alpn(cert: &TestCert, port: u16, alpn: &[&[u8]]) -> Option<Vec<u8>> {
    let tls = tls_connect(cert, port, alpn).await;
    tls.get_ref().1.alpn_protocol().map(|p| p.to_vec())
}

#[tokio::test]
async fn h2_by_alpn_is_served_as_http2_and_forwarded_as_https() {
    let (cert, _up, proxy) = tls_proxy().await;
    let port = proxy.addr.port();
    assert_eq!(
        negotiated_alpn(&cert, port, &[b"h2"]).await.as_deref(),
        Some(&b"h2"[..])
    );

    // enable_http2() alone: ALPN offers only "h2".
    let connector = HttpsConnectorBuilder::new()
        .with_tls_config(client_config(&cert, &[]))
        .https_only()
        .enable_http2()
        .build();
    let client: Client<_, ClientBody> = Client::builder(TokioExecutor::new()).build(connector);
    let response = client
        .request(get(&https_url(port, "/echo?tls=1")))
        .await
        .expect("h2 request over TLS");
    assert_eq!(response.status(), 200);
    assert_eq!(response.version(), Version::HTTP_2);
    let echo = echo(response).await;
    assert_eq!(echo["uri"], "/echo?tls=1");
    assert_eq!(echo["headers"]["x-forwarded-proto"][0], "https");
    assert_eq!(echo["headers"]["host"][0], format!("localhost:{port}"));
}

#[tokio::test]
async fn http11_by_alpn_is_served_as_http11() {
    let (cert, _up, proxy) = tls_proxy().await;
    let port = proxy.addr.port();
    assert_eq!(
        negotiated_alpn(&cert, port, &[b"http/1.1"])
            .await
            .as_deref(),
        Some(&b"http/1.1"[..])
    );

    // The builder leaves ALPN empty for HTTP/1-only; build the connector from a config that
    // offers exactly "http/1.1".
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    let connector: HttpsConnector<HttpConnector> =
        HttpsConnector::from((http, client_config(&cert, &[b"http/1.1"])));
    let client: Client<_, ClientBody> = Client::builder(TokioExecutor::new()).build(connector);
    let response = client
        .request(get(&https_url(port, "/echo")))
        .await
        .expect("HTTP/1.1 request over TLS");
    assert_eq!(response.status(), 200);
    assert_eq!(response.version(), Version::HTTP_11);
    let echo = echo(response).await;
    assert_eq!(echo["headers"]["x-forwarded-proto"][0], "https");
}

#[tokio::test]
async fn websocket_over_tls_is_tunnelled() {
    // TLS connections are upgraded by hyper (plain ones are handed over by the connection).
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let (cert, _up, proxy) = tls_proxy().await;
    let port = proxy.addr.port();
    let tls = tls_connect(&cert, port, &[b"http/1.1"]).await;
    let (mut ws, response) =
        tokio_tungstenite::client_async(format!("wss://localhost:{port}/ws"), tls)
            .await
            .expect("websocket handshake over TLS");
    assert_eq!(response.status(), 101);
    for message in ["over", "tls"] {
        ws.send(Message::text(message)).await.unwrap();
        let echoed = ws.next().await.unwrap().unwrap();
        assert_eq!(echoed.into_text().unwrap().as_str(), message);
    }
    ws.close(None).await.unwrap();
}

/// Sends `head` on a fresh HTTP/1.1 TLS connection and returns everything the proxy answers
/// before it closes.
async fn http11_over_tls(cert: &TestCert, port: u16, head: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tls = tls_connect(cert, port, &[b"http/1.1"]).await;
    // The proxy may answer and close before it has read all of an oversized head.
    let _ = tls.write_all(head).await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        tls.read_to_end(&mut answer),
    )
    .await;
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn oversized_request_head_over_tls_is_431_and_the_proxy_serves_on() {
    let (cert, _up, proxy) = tls_proxy().await;
    let port = proxy.addr.port();
    let big = "a".repeat(100 * 1024);
    let head = format!("GET /echo HTTP/1.1\r\nhost: localhost\r\nx-big: {big}\r\n\r\n");
    let answer = http11_over_tls(&cert, port, head.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");

    let answer = http11_over_tls(
        &cert,
        port,
        b"GET /echo HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[tokio::test]
async fn oversized_request_headers_over_tls_h2_are_431_and_the_proxy_serves_on() {
    let (cert, _up, proxy) = tls_proxy().await;
    let port = proxy.addr.port();
    let connector = HttpsConnectorBuilder::new()
        .with_tls_config(client_config(&cert, &[]))
        .https_only()
        .enable_http2()
        .build();
    let client: Client<_, ClientBody> = Client::builder(TokioExecutor::new()).build(connector);
    let mut request = get(&https_url(port, "/echo"));
    request
        .headers_mut()
        .insert("x-big", "a".repeat(100 * 1024).parse().unwrap());
    let refused = client
        .request(request)
        .await
        .expect("an answer, not a reset");
    assert_eq!(refused.status(), 431);

    let response = client
        .request(get(&https_url(port, "/echo")))
        .await
        .expect("h2 request over TLS");
    assert_eq!(response.status(), 200);
}

#[tokio::test]
async fn idle_tls_connections_close_at_once_when_the_server_drains() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (cert, _up, mut proxy) = tls_proxy().await;
    let port = proxy.addr.port();
    // One connection silent since its handshake, one idle after a keep-alive request.
    let mut silent = tls_connect(&cert, port, &[b"http/1.1"]).await;
    let mut kept = tls_connect(&cert, port, &[b"http/1.1"]).await;
    kept.write_all(b"GET /echo HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut head = [0u8; 12];
    kept.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;

    proxy.shutdown();
    // Well within the default shutdown_timeout: nothing is in flight, so nothing is waited for.
    tokio::time::timeout(
        std::time::Duration::from_secs(5),
        proxy.task.take().unwrap(),
    )
    .await
    .expect("server exits at once")
    .unwrap();
    for (name, tls) in [("silent", &mut silent), ("kept alive", &mut kept)] {
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(
            std::time::Duration::from_secs(1),
            tls.read_to_end(&mut rest),
        )
        .await;
        assert!(closed.is_ok(), "the {name} connection is closed");
    }
}

#[tokio::test]
async fn a_bad_key_file_is_a_tls_start_error() {
    let cert = make_cert();
    std::fs::write(&cert.key, "this is not a PEM private key\n").unwrap();
    let yaml = tls_listener("http://127.0.0.1:9", &cert.cert, &cert.key);
    let config = tollgate::config::parse(Path::new("tls.yaml"), &yaml.yaml(), |_| None).unwrap();
    match Server::bind(Arc::new(config)).await {
        Err(StartError::Tls { address, message }) => {
            assert_eq!(address.ip().to_string(), "127.0.0.1");
            assert!(
                message.contains(&cert.key.display().to_string()),
                "names the key file: {message}"
            );
        }
        Err(other) => panic!("expected StartError::Tls, got {other}"),
        Ok(_) => panic!("a bad key must not start"),
    }
}

/// A private CA and a certificate it signed for 127.0.0.1, as PEM files.
struct PrivateCa {
    _dir: TempDir,
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

fn private_ca() -> PrivateCa {
    let dir = TempDir::new().unwrap();
    write_private_ca(dir.path(), &[("app", &["127.0.0.1"], "app")]);
    PrivateCa {
        ca: dir.path().join("ca.pem"),
        cert: dir.path().join("app.pem"),
        key: dir.path().join("app.key"),
        _dir: dir,
    }
}

/// An https:// upstream whose certificate a private CA signed is verified against `ca_file`,
/// over HTTP/1.1 and HTTP/2 (ALPN); without `ca_file` the public roots refuse it and the
/// client gets 502. The https:// upstream is a second proxy with a TLS listener in front of
/// the test upstream.
#[tokio::test]
async fn an_https_upstream_behind_a_private_ca_is_verified_with_ca_file() {
    let up = upstream().start().await;
    let pki = private_ca();
    let app = proxy(tls_listener(&up.url(), &pki.cert, &pki.key))
        .start()
        .await;
    let app_url = format!("https://127.0.0.1:{}", app.addr.port());
    let client = http1_client();
    for http2 in [false, true] {
        let trusting = proxy(
            config()
                .upstream(&app_url)
                .upstream_http2(http2)
                .ca_file(&pki.ca.display().to_string()),
        )
        .start()
        .await;
        let response = client
            .request(get(&trusting.url("/echo?via=private-ca")))
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "http2: {http2}");
        let echo = echo(response).await;
        assert_eq!(echo["uri"], "/echo?via=private-ca");
        // The TLS proxy in front of the test upstream saw an https request (and, not trusting
        // the first proxy, replaced its X-Forwarded-Proto).
        assert_eq!(
            echo["headers"]["x-forwarded-proto"],
            serde_json::json!(["https"])
        );
    }
    let public_roots = proxy(config().upstream(&app_url)).start().await;
    let response = client
        .request(get(&public_roots.url("/echo")))
        .await
        .unwrap();
    assert_eq!(response.status(), 502);
}

/// `ca_file` is checked with the configuration: on an http:// upstream, a missing file and a
/// file without certificates are refused with the field's line and column.
#[test]
fn a_ca_file_that_cannot_be_used_is_refused_where_it_is_written() {
    let pki = private_ca();
    let dir = TempDir::new().unwrap();
    let not_pem = dir.path().join("not.pem");
    std::fs::write(&not_pem, "hello\n").unwrap();
    let refused = |url: &str, file: &Path| {
        let yaml = format!(
            "listen: 127.0.0.1:0\nupstream:\n  url: {url}\n  ca_file: \"{}\"\n",
            file.display()
        );
        tollgate::config::parse(Path::new("t.yaml"), &yaml, |_| None)
            .expect_err("the configuration should be refused")
            .to_string()
    };
    let http = refused("http://127.0.0.1:3000", &pki.ca);
    assert!(
        http.contains("t.yaml:4:") && http.contains("upstream.ca_file: only an https:// upstream"),
        "{http}"
    );
    let missing = refused("https://127.0.0.1:3000", &dir.path().join("absent.pem"));
    assert!(
        missing.contains("t.yaml:4:") && missing.contains("cannot read the CA certificates"),
        "{missing}"
    );
    let empty = refused("https://127.0.0.1:3000", &not_pem);
    assert!(
        empty.contains("t.yaml:4:") && empty.contains("no PEM certificate found"),
        "{empty}"
    );
}
