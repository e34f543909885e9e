//! Holding concurrency slots for the life of a request: the guard keeps the leases alive
//! (refreshing them before their TTL for long requests) and gives them back before the
//! response's last frame reaches the client ([`crate::body::BeforeEnd`]: a keep-alive client's next request
//! finds its slot free), or in the background when dropped first (the client went away).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::body::Finish;
use crate::limit::{Lease, Store};

pub struct LeaseGuard {
    /// Where the leases were taken (two stores only for a route mixing local and global
    /// concurrency limits; releasing an unknown lease is harmless).
    stores: Vec<Store>,
    leases: Vec<Lease>,
    refresher: Option<tokio::task::JoinHandle<()>>,
}

impl LeaseGuard {
    pub fn new(stores: Vec<Store>, leases: Vec<Lease>) -> Self {
        let ttl_us = leases.iter().map(|l| l.params.period_us).min().unwrap_or(0);
        let every = Duration::from_micros((ttl_us / 3).max(1_000) as u64);
        let refresher = {
            let stores = stores.clone();
            let leases = leases.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
                loop {
                    tick.tick().await;
                    for store in &stores {
                        if let Err(e) = store.refresh(&leases).await {
                            tracing::debug!(cause = %crate::error::chain(&e), "could not refresh concurrency leases");
                        }
                    }
                }
            })
        };
        LeaseGuard {
            stores,
            leases,
            refresher: Some(refresher),
        }
    }
}

impl LeaseGuard {
    /// One guard holding the leases of both (a request counted on more than one route).
    pub fn joined(
        a: Option<Box<LeaseGuard>>,
        b: Option<Box<LeaseGuard>>,
    ) -> Option<Box<LeaseGuard>> {
        let (mut a, mut b) = match (a, b) {
            (Some(a), Some(b)) => (a, b),
            (a, b) => return a.or(b),
        };
        for guard in [&mut a, &mut b] {
            if let Some(refresher) = guard.refresher.take() {
                refresher.abort();
            }
        }
        let mut stores = std::mem::take(&mut a.stores);
        stores.append(&mut b.stores);
        let mut leases = std::mem::take(&mut a.leases);
        leases.append(&mut b.leases);
        Some(Box::new(LeaseGuard::new(stores, leases)))
    }

    /// Gives the slots back and waits until the stores have them (each call bounded by its
    /// store's timeout): a client that has the whole response finds its slot free.
    pub async fn release(mut self) {
        if let Some(refresher) = self.refresher.take() {
            refresher.abort();
        }
        let stores = std::mem::take(&mut self.stores);
        let leases = std::mem::take(&mut self.leases);
        for store in stores {
            if let Err(e) = store.release(&leases).await {
                tracing::debug!(cause = %crate::error::chain(&e), "could not release concurrency leases; they expire after their TTL");
            }
        }
    }
}

/// Released before the response's last frame goes on (see [`crate::body::BeforeEnd`]).
impl Finish for LeaseGuard {
    fn finish(self) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(self.release())
    }
}

impl Drop for LeaseGuard {
    /// Dropped before its release (the response failed, or nobody waits for its end): given
    /// back in the background.
    fn drop(&mut self) {
        if let Some(refresher) = self.refresher.take() {
            refresher.abort();
        }
        let stores = std::mem::take(&mut self.stores);
        let leases = std::mem::take(&mut self.leases);
        if stores.is_empty() {
            return;
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                for store in stores {
                    if let Err(e) = store.release(&leases).await {
                        tracing::debug!(cause = %crate::error::chain(&e), "could not release concurrency leases; they expire after their TTL");
                    }
                }
            });
        }
    }
}
