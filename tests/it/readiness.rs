//! Readiness follows the store with no traffic at all: with `on_error: deny`, `/readyz` turns
//! 503 within about a second of Redis going away (a quiet instance must not report ready while
//! it would refuse every request) and 200 again once Redis is back.

use std::time::{Duration, Instant};

use crate::support::*;
use http::StatusCode;

async fn readyz(proxy: &ProxyHandle) -> StatusCode {
    let url = format!("http://{}/readyz", proxy.admin.expect("admin listener"));
    let response = http1_client().request(get(&url)).await.unwrap();
    let status = response.status();
    let _ = text(response).await;
    status
}

/// Polls `/readyz` until it answers `want`; returns how long that took (fails past `limit`).
async fn until_readyz(proxy: &ProxyHandle, want: StatusCode, limit: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let got = readyz(proxy).await;
        if got == want {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < limit,
            "/readyz stayed {got} for {limit:?}, wanted {want}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn readyz_follows_redis_with_no_traffic_when_on_error_is_deny() {
    let mut redis = RedisServer::start();
    let up = upstream().start().await;
    let yaml = config()
        .upstream(&up.url())
        .admin("127.0.0.1:0")
        .store(store::redis(&redis.url()).timeout("100ms").on_error("deny"))
        .route(
            route("api")
                .prefix("/")
                .limit(limit::fixed_window(100, "24h")),
        );
    let proxy = proxy(yaml).start().await;
    until_readyz(&proxy, StatusCode::OK, Duration::from_secs(10)).await;

    // Killed while no request flows: readiness notices by itself.
    redis.stop();
    let took = until_readyz(
        &proxy,
        StatusCode::SERVICE_UNAVAILABLE,
        Duration::from_millis(1_500),
    )
    .await;
    eprintln!("/readyz turned 503 {took:?} after Redis was killed");

    redis.restart();
    until_readyz(&proxy, StatusCode::OK, Duration::from_secs(5)).await;
    // And it stays ready: the background check keeps answering.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert_eq!(readyz(&proxy).await, StatusCode::OK);
}
