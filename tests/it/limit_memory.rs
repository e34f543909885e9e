//! The memory store through the public API: idle keys are evicted so memory stays bounded.

use std::sync::Arc;

use tollgate::limit::clock::ManualClock;
use tollgate::limit::memory::MemoryStore;
use tollgate::limit::{Algorithm, Check, Params, Store};

const SEC: i64 = 1_000_000;

#[tokio::test]
async fn idle_keys_are_evicted_after_their_ttl() {
    let clock = Arc::new(ManualClock::new(1_763_000_000 * SEC));
    let memory = MemoryStore::with_clock(clock.clone());
    let store = Store::Memory(memory.clone());
    let keys: Vec<String> = (0..300).map(|i| format!("user:{i}")).collect();
    for (i, key) in keys.iter().enumerate() {
        let algorithm = Algorithm::ALL[i % 6];
        let params = Params {
            algorithm,
            limit: 10,
            period_us: 10 * SEC,
            burst: 10,
            cost: 1,
            calendar: None,
        };
        let d = store
            .decide(&[Check {
                key,
                params,
                shadow: false,
                block_us: 0,
            }])
            .await
            .unwrap();
        assert!(d.allowed);
    }
    assert_eq!(memory.len(), 300);
    memory.sweep();
    assert_eq!(memory.len(), 300, "nothing has expired yet");
    // Every TTL is at most two periods (sliding_window keeps "previous" for a window).
    clock.advance(20 * SEC);
    memory.sweep();
    assert_eq!(memory.len(), 0);
    assert!(memory.is_empty());
}
