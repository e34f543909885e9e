//! Why the store failed, named: a refused connection, a connection lost (reset), a timeout,
//! failed authentication, a Lua script error, no connection made yet, or something else. One small closed set, so it
//! can be a metric label (`tollgate_store_errors_total{cause}`), a log field and a word in
//! `/readyz`, and an operator reads "refused" (Redis is not running) apart from "timed out"
//! (Redis is running but not answering) and "authentication failed" (the password is wrong)
//! without guessing.

use std::io::ErrorKind as Io;

use redis::{ErrorKind, RedisError, ServerErrorKind};

/// The cause of a store failure (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cause {
    /// Nothing listens at the address (the server is stopped, or the address is wrong).
    Refused,
    /// A connection was lost: reset, closed, broken pipe.
    Reset,
    /// No answer within the store timeout (a frozen or overloaded server, a partition).
    Timeout,
    /// The server refused the credentials (`WRONGPASS`) or wants some (`NOAUTH`).
    AuthFailed,
    /// A Lua script failed inside Redis (a runtime or compile error, `BUSY`).
    ScriptError,
    /// The first connection is still being made: nothing was asked of Redis yet.
    NotConnected,
    /// Anything else (a malformed reply, a server error of another kind).
    Other,
}

impl Cause {
    /// Every cause, in label order: the metric registers one series per cause.
    pub const ALL: [Cause; 7] = [
        Cause::Refused,
        Cause::Reset,
        Cause::Timeout,
        Cause::AuthFailed,
        Cause::ScriptError,
        Cause::NotConnected,
        Cause::Other,
    ];

    /// The metric label and log field value.
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::Refused => "refused",
            Cause::Reset => "reset",
            Cause::Timeout => "timeout",
            Cause::AuthFailed => "auth_failed",
            Cause::ScriptError => "script_error",
            Cause::NotConnected => "not_connected",
            Cause::Other => "other",
        }
    }

    /// The cause in words, as logs and `/readyz` say it.
    pub fn describe(self) -> &'static str {
        match self {
            Cause::Refused => "connection refused",
            Cause::Reset => "connection reset",
            Cause::Timeout => "timed out",
            Cause::AuthFailed => "authentication failed",
            Cause::ScriptError => "script error",
            Cause::NotConnected => "not connected yet",
            Cause::Other => "error",
        }
    }

    /// Index in [`Cause::ALL`] (for arrays of counters and an atomic cell).
    pub fn index(self) -> usize {
        Cause::ALL
            .iter()
            .position(|c| *c == self)
            .expect("every cause is in ALL")
    }

    /// What redis-rs reported, classified.
    pub fn of_redis(e: &RedisError) -> Cause {
        if e.is_connection_refusal() {
            return Cause::Refused;
        }
        if e.is_timeout() {
            return Cause::Timeout;
        }
        if e.kind() == ErrorKind::AuthenticationFailed
            || matches!(e.code(), Some("NOAUTH" | "WRONGPASS"))
        {
            return Cause::AuthFailed;
        }
        if is_script_error(e) {
            return Cause::ScriptError;
        }
        if e.is_connection_dropped() || is_lost(e) {
            return Cause::Reset;
        }
        Cause::Other
    }
}

/// A Lua error: Redis answers `ERR user_script:1: ...` (7.x), `ERR Error running script ...`
/// (6.x) or `ERR Error compiling script ...`; `BUSY` while a script runs too long; `NOSCRIPT`
/// only when the `EVAL` fallback itself failed.
fn is_script_error(e: &RedisError) -> bool {
    match e.kind() {
        ErrorKind::Server(ServerErrorKind::NoScript | ServerErrorKind::ExecAbort) => true,
        ErrorKind::Server(ServerErrorKind::ResponseError) | ErrorKind::Extension => {
            e.code() == Some("BUSY")
                || e.detail()
                    .is_some_and(|d| d.to_ascii_lowercase().contains("script"))
        }
        _ => false,
    }
}

/// An I/O error that ends the connection but that `is_connection_dropped` does not list.
fn is_lost(e: &RedisError) -> bool {
    use std::error::Error;
    e.source()
        .and_then(|s| s.downcast_ref::<std::io::Error>())
        .is_some_and(|io| matches!(io.kind(), Io::WriteZero | Io::Interrupted))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io(kind: Io) -> RedisError {
        RedisError::from(std::io::Error::from(kind))
    }

    /// A server's error line, parsed as redis-rs parses replies.
    fn server(line: &str) -> RedisError {
        let reply = format!("-{line}\r\n");
        match redis::parse_redis_value(reply.as_bytes()) {
            Ok(redis::Value::ServerError(e)) => e.into(),
            other => panic!("{line}: parsed as {other:?}"),
        }
    }

    #[test]
    fn connection_failures_are_told_apart() {
        assert_eq!(Cause::of_redis(&io(Io::ConnectionRefused)), Cause::Refused);
        for kind in [
            Io::ConnectionReset,
            Io::BrokenPipe,
            Io::ConnectionAborted,
            Io::UnexpectedEof,
            Io::NotConnected,
        ] {
            assert_eq!(Cause::of_redis(&io(kind)), Cause::Reset, "{kind:?}");
        }
        assert_eq!(Cause::of_redis(&io(Io::TimedOut)), Cause::Timeout);
        // redis-rs's own "connection closed" errors carry no io::Error.
        let closed = RedisError::from((ErrorKind::Io, "Connection closed"));
        assert_eq!(Cause::of_redis(&closed), Cause::Reset);
    }

    #[test]
    fn authentication_failures_are_named() {
        let wrong = RedisError::from((
            ErrorKind::AuthenticationFailed,
            "Password authentication failed",
        ));
        assert_eq!(Cause::of_redis(&wrong), Cause::AuthFailed);
        assert_eq!(
            Cause::of_redis(&server("NOAUTH Authentication required.")),
            Cause::AuthFailed
        );
        assert_eq!(
            Cause::of_redis(&server(
                "WRONGPASS invalid username-password pair or user is disabled."
            )),
            Cause::AuthFailed
        );
    }

    #[test]
    fn lua_errors_are_script_errors() {
        for line in [
            "ERR user_script:1: Script attempted to access nonexistent global variable 'x' script: 0123, on @user_script:1.",
            "ERR Error running script (call to f_0123): @user_script:1: user_script:1: attempt to call a nil value",
            "ERR Error compiling script (new function): user_script:1: '=' expected near 'x'",
            "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.",
            "NOSCRIPT No matching script. Please use EVAL.",
        ] {
            assert_eq!(Cause::of_redis(&server(line)), Cause::ScriptError, "{line}");
        }
    }

    #[test]
    fn anything_else_is_other() {
        for line in [
            "ERR unknown command 'FOO'",
            "READONLY You can't write against a read only replica.",
            "LOADING Redis is loading the dataset in memory",
        ] {
            assert_eq!(Cause::of_redis(&server(line)), Cause::Other, "{line}");
        }
        let parse = RedisError::from((ErrorKind::Parse, "bad reply"));
        assert_eq!(Cause::of_redis(&parse), Cause::Other);
    }

    #[test]
    fn labels_are_distinct_and_indexed() {
        let labels: std::collections::HashSet<_> = Cause::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(labels.len(), Cause::ALL.len());
        for (i, cause) in Cause::ALL.iter().enumerate() {
            assert_eq!(cause.index(), i);
        }
    }
}
