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

use serde_json::{json, Value};

use super::caller::{CallerError, Control};
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
static MEMORY: Mutex<VecDeque<Value>> = Mutex::new(VecDeque::new());

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
        parameters: Value,
    ) -> Result<(), CallerError> {
        let entry = json!({
            "at": humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
            "who": who.as_str(),
            "action": action,
            "route": route,
            "identity": self.shown(route).value(raw),
            "parameters": parameters,
            "replica": replica(),
        });
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
                            .arg(entry.to_string()),
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
    pub async fn audit_trail(&self, count: usize) -> Result<Vec<Value>, CallerError> {
        match &self.redis {
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
                Ok(entries
                    .into_iter()
                    .rev()
                    .filter_map(|(id, fields)| {
                        let at = fields.iter().position(|f| f == "entry")?;
                        let mut entry: Value = serde_json::from_str(fields.get(at + 1)?).ok()?;
                        entry["id"] = Value::String(id);
                        Some(entry)
                    })
                    .collect())
            }
            None => {
                let trail = MEMORY.lock().unwrap_or_else(|p| p.into_inner());
                Ok(trail
                    .iter()
                    .skip(trail.len().saturating_sub(count))
                    .cloned()
                    .collect())
            }
        }
    }
}

/// The trail as text, one line per entry.
pub fn trail_text(entries: &[Value]) -> String {
    if entries.is_empty() {
        return "no operator actions recorded\n".to_owned();
    }
    let mut out = String::new();
    for e in entries {
        let parameters = e["parameters"]
            .as_object()
            .map(|p| {
                p.iter()
                    .filter(|(_, v)| !v.is_null())
                    .map(|(k, v)| {
                        format!("{k}={}", v.as_str().map_or(v.to_string(), str::to_owned))
                    })
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default();
        out.push_str(&format!(
            "{}  {:<8}  {:<16}  route {} identity {}{}{}\n",
            e["at"].as_str().unwrap_or("?"),
            e["who"].as_str().unwrap_or("?"),
            e["action"].as_str().unwrap_or("?"),
            e["route"].as_str().unwrap_or("?"),
            e["identity"].as_str().unwrap_or("?"),
            if parameters.is_empty() { "" } else { "  " },
            parameters
        ));
    }
    out
}
