//! Serving threads: one single-threaded Tokio runtime per core, each accepting on the same
//! listening sockets and serving the connections it accepted from start to end.
//!
//! Why: on Tokio's work-stealing runtime a request's tasks (the client connection, the
//! upstream connection, timers) wander between threads, and every hand-over is a futex
//! wake-up and a cache miss; on a small proxied request that scheduling outweighs the request's
//! own socket I/O (docs/performance-history.md has the measurements). Like nginx's worker
//! processes, a serving thread here owns its connections; its upstream connection pool is its
//! own too (`crate::proxy::upstream` picks it by [`current`]), so a request never crosses
//! threads on the way to the upstream and back. The kernel hands each new connection to
//! whichever thread is first in `accept`, which is the least busy one.
//!
//! Imports nothing from the crate.

use std::cell::Cell;
use std::future::Future;

use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

/// How often a busy serving thread refreshes socket readiness, counted in task polls.
///
/// A busy thread that went on with stale readiness could write a request body into an
/// upstream connection that had already answered and closed, get EPIPE, and turn that answer
/// into a 502 (an early 401 or 413 to an upload: tests/it/connections.rs, tests/it/upstream_pool.rs);
/// the work-stealing runtime hid this by polling the reactor on whichever thread was idle. A
/// plain HTTP/1 upstream's socket keeps such an answer itself (`proxy::early_answer`), so the
/// threads can keep Tokio's default; a TLS or HTTP/2 upstream goes through hyper-util's client,
/// which that wrapper does not cover, and there fresh readiness keeps the window narrow. The
/// default is kept wherever it is safe because refreshing readiness costs a reactor turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// Tokio's default, every 61 polls: every upstream is plain HTTP/1.
    Default,
    /// Every 4 polls: an upstream is TLS or HTTP/2.
    Fresh,
}

impl Readiness {
    fn event_interval(self) -> u32 {
        match self {
            Readiness::Default => 61,
            Readiness::Fresh => 4,
        }
    }
}

/// The most serving threads a process runs (`workers` in the configuration).
pub const MAX_THREADS: usize = 256;

thread_local! {
    static INDEX: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The serving thread this code runs on, `0..count`; 0 on any other thread (the main runtime,
/// tests), which so shares the first thread's resources.
pub fn current() -> usize {
    serving_thread().unwrap_or(0)
}

/// The serving thread this code runs on, or `None` on any other thread.
pub fn serving_thread() -> Option<usize> {
    INDEX.with(Cell::get)
}

/// The number of serving threads to start when the configuration does not say: one per core
/// the process may use.
pub fn default_count() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Running serving threads. Dropping this without [`Workers::stop`] stops them too.
pub struct Workers {
    handles: Vec<Handle>,
    threads: Vec<std::thread::JoinHandle<()>>,
    stop: CancellationToken,
}

impl Workers {
    /// Starts `count` (at least 1) threads, each running its own runtime until stopped.
    pub fn start(count: usize, readiness: Readiness) -> std::io::Result<Workers> {
        let stop = CancellationToken::new();
        let mut workers = Workers {
            handles: Vec::new(),
            threads: Vec::new(),
            stop: stop.clone(),
        };
        for index in 0..count.clamp(1, MAX_THREADS) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .event_interval(readiness.event_interval())
                .build()?;
            workers.handles.push(runtime.handle().clone());
            let stop = stop.clone();
            let thread = std::thread::Builder::new()
                .name(format!("tollgate-w{index}"))
                .spawn(move || {
                    INDEX.with(|i| i.set(Some(index)));
                    runtime.block_on(stop.cancelled());
                    // Dropping the runtime drops whatever tasks it still holds (after a
                    // drain that timed out: the requests that did not finish).
                })?;
            workers.threads.push(thread);
        }
        Ok(workers)
    }

    pub fn count(&self) -> usize {
        self.handles.len()
    }

    /// Runs `make(index)` on every serving thread; the futures may hold thread-bound state
    /// (a listener registered with that thread's reactor).
    pub fn spawn_each<F, Fut>(&self, make: F) -> Vec<tokio::task::JoinHandle<Fut::Output>>
    where
        F: Fn(usize) -> Fut,
        Fut: Future + Send + 'static,
        Fut::Output: Send + 'static,
    {
        self.handles
            .iter()
            .enumerate()
            .map(|(index, handle)| handle.spawn(make(index)))
            .collect()
    }

    /// Stops every thread and waits for them to end.
    pub async fn stop(mut self) {
        self.stop.cancel();
        let threads = std::mem::take(&mut self.threads);
        let _ = tokio::task::spawn_blocking(move || {
            for thread in threads {
                let _ = thread.join();
            }
        })
        .await;
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn each_thread_knows_its_index_and_stops() {
        let workers = Workers::start(3, Readiness::Default).unwrap();
        assert_eq!(workers.count(), 3);
        let seen = workers.spawn_each(|_| async { current() });
        let mut indexes = Vec::new();
        for handle in seen {
            indexes.push(handle.await.unwrap());
        }
        assert_eq!(indexes, vec![0, 1, 2]);
        assert_eq!(current(), 0, "outside the serving threads");
        assert_eq!(serving_thread(), None);
        workers.stop().await;
    }
}
