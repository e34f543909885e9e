//! Per-key FIFO turns for `on_limit: delay`, so delayed requests of one caller go in the order
//! they arrived (tokio's Mutex is fair). Entries disappear when nobody waits on them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::OwnedMutexGuard;

#[derive(Default)]
pub struct KeyedQueues {
    queues: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// Holding this is this request's turn; dropping it passes the turn on.
pub struct Turn {
    _guard: OwnedMutexGuard<()>,
}

impl KeyedQueues {
    pub async fn lock(&self, key: String) -> Turn {
        let queue = {
            let mut queues = self.queues.lock().expect("queue map poisoned");
            // Drop queues nobody holds or waits on, so the map stays as small as the set of
            // callers currently being delayed.
            queues.retain(|_, q| Arc::strong_count(q) > 1);
            queues.entry(key).or_default().clone()
        };
        Turn {
            _guard: queue.lock_owned().await,
        }
    }
}
