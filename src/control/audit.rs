//! The audit trail of operator actions: every reset, override and override removal, whether
//! through the admin API or straight to Redis from the command line, with who did it, when,
//! on which route and identity, and with which parameters.
//!
//! With a Redis store the trail is the stream `<key_prefix>audit`, capped at about
//! [`CAPACITY`] entries (`XADD ... MAXLEN ~`), so every replica shows the same trail, whoever
//! wrote it. With a memory store it is this process's memory, the last [`CAPACITY`] entries,
//! gone with the process (as the limits' own state is).

use std::collections::VecDeque;
use std::sync::Mutex;

use super::caller::{CallerError, Control};
use super::results::{AuditEntry, AuditParameters, AuditTrail};
use crate::limit::Store;

/// About how many entries the trail keeps (Redis trims to at least this many).
pub const CAPACITY: usize = 1000;
/// Entries `GET /limits/audit` shows unless `?limit=` says otherwise.
pub const DEFAULT_SHOWN: usize = 100;

/// The stream holding the trail: outside every limit's key space.
pub fn stream_key(prefix: &str) -> String {
    format!("{prefix}audit")
}

/// Who acted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Who {
    /// The admin API, with the bearer token of `admin.token_env`.
    Token,
    /// The admin API on a loopback listener without a token configured.
    Loopback,
    /// `tollgate limits` writing to Redis itself.
    Cli,
}

impl Who {
    pub fn as_str(self) -> &'static str {
        match self {
            Who::Token => "token",
            Who::Loopback => "loopback",
            Who::Cli => "cli",
        }
    }
}

/// The trail of a memory store: this process's.
static MEMORY: Mutex<VecDeque<AuditEntry>> = Mutex::new(VecDeque::new());

/// Names this process in the trail: the host (from `HOSTNAME`, as containers set it) and pid.
pub(super) fn replica() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_default();
    if host.is_empty() {
        format!("pid {}", std::process::id())
    } else {
        format!("{host} pid {}", std::process::id())
    }
}

impl Control {
    /// Writes one entry to the trail, the identity as `route` shows it
    /// ([`super::shown::Shown`]).
    pub async fn audit(
        &self,
        who: Who,
        action: &str,
        route: &str,
        raw: &[u8],
        parameters: AuditParameters,
    ) -> Result<(), CallerError> {
        let entry = AuditEntry {
            at: humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
            who: who.as_str().to_owned(),
            action: action.to_owned(),
            route: route.to_owned(),
            identity: self.shown(route).value(raw),
            parameters,
            replica: replica(),
            id: None,
        };
        match &self.redis {
            Some(cell) => {
                let Some(Store::Redis(redis)) = cell.get() else {
                    return Err(CallerError::NotConnected);
                };
                redis
                    .command::<String>(
                        redis::cmd("XADD")
                            .arg(stream_key(&self.throttle.key_prefix))
                            .arg("MAXLEN")
                            .arg("~")
                            .arg(CAPACITY)
                            .arg("*")
                            .arg("entry")
                            .arg(serde_json::to_string(&entry).expect("JSON")),
                    )
                    .await?;
            }
            None => {
                let mut trail = MEMORY.lock().unwrap_or_else(|p| p.into_inner());
                if trail.len() >= CAPACITY {
                    trail.pop_front();
                }
                trail.push_back(entry);
            }
        }
        Ok(())
    }

    /// The last `count` entries, oldest first.
    pub async fn audit_trail(&self, count: usize) -> Result<AuditTrail, CallerError> {
        let entries = match &self.redis {
            Some(cell) => {
                let Some(Store::Redis(redis)) = cell.get() else {
                    return Err(CallerError::NotConnected);
                };
                let entries: Vec<(String, Vec<String>)> = redis
                    .command(
                        redis::cmd("XREVRANGE")
                            .arg(stream_key(&self.throttle.key_prefix))
                            .arg("+")
                            .arg("-")
                            .arg("COUNT")
                            .arg(count),
                    )
                    .await?;
                entries
                    .into_iter()
                    .rev()
                    .filter_map(|(id, fields)| {
                        let at = fields.iter().position(|f| f == "entry")?;
                        let mut entry: AuditEntry =
                            serde_json::from_str(fields.get(at + 1)?).ok()?;
                        entry.id = Some(id);
                        Some(entry)
                    })
                    .collect()
            }
            None => {
                let trail = MEMORY.lock().unwrap_or_else(|p| p.into_inner());
                trail
                    .iter()
                    .skip(trail.len().saturating_sub(count))
                    .cloned()
                    .collect()
            }
        };
        Ok(AuditTrail { entries })
    }
}
