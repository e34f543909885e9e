//! Holding concurrency slots for the life of a request: the guard keeps the leases alive
//! (refreshing them before their TTL for long requests) and gives them back when dropped, which
//! happens when the response body ends or the client goes away.

use std::time::Duration;

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

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        if let Some(refresher) = self.refresher.take() {
            refresher.abort();
        }
        let stores = std::mem::take(&mut self.stores);
        let leases = std::mem::take(&mut self.leases);
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
