//! Test helpers shared by the integration tests: a throwaway real `redis-server`.
//!
//! The Redis store's behaviour (Lua semantics, TIME, NOSCRIPT, timeouts) can only be checked
//! against a real server, so each test starts its own on a free loopback port, with
//! persistence off and a private temp dir, and kills it on drop. A missing binary is a loud
//! failure, never a silent skip, so CI cannot pass without having run these tests.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub struct RedisServer {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    child: Option<Child>,
    /// Arguments after the defaults (which they override): `--requirepass`, `--appendonly`.
    extra: Vec<String>,
}

pub fn find_redis_server() -> PathBuf {
    if let Some(path) = std::env::var_os("REDIS_SERVER") {
        return PathBuf::from(path);
    }
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join("redis-server"))
                .find(|p| p.is_file())
        })
        .expect(
            "redis-server not found: install it (Debian package redis-server) or set REDIS_SERVER",
        )
}

/// A loopback port nothing listens on, for a process a test starts (Redis, a replica, a
/// browser). Taken from 10000..20000, below the kernel's ephemeral range (32768..), so that no
/// outgoing connection's local port and no `127.0.0.1:0` listener of another test can be handed
/// the same port between this check and the process's own bind (which happened: a second
/// Redis failed to bind, and its test talked to another test's server); a Redis Cluster's bus
/// port (+10000) stays below that range too. Each call in this process takes the next port,
/// from a start that differs per process, skipping any in use.
pub fn free_port() -> u16 {
    const FIRST: u32 = 10_000;
    const SPAN: u32 = 10_000;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(2_654_435_761) % SPAN,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    for _ in 0..SPAN {
        let port = (FIRST + NEXT.fetch_add(1, Ordering::Relaxed) % SPAN) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {FIRST}..{}", FIRST + SPAN)
}

impl RedisServer {
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// A server started with `args` after the defaults, e.g. `["--requirepass", "s3cret"]` or
    /// `["--appendonly", "yes"]` (a later setting wins).
    pub fn start_with(args: &[&str]) -> RedisServer {
        static N: AtomicU32 = AtomicU32::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let dir = std::env::temp_dir().join(format!(
            "tollgate-redis-{}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed),
            nanos
        ));
        std::fs::create_dir_all(&dir).expect("create redis temp dir");
        let mut server = RedisServer {
            bin: find_redis_server(),
            dir,
            port: free_port(),
            child: None,
            extra: args.iter().map(|a| a.to_string()).collect(),
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let child = Command::new(&self.bin)
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", self.bin.display()));
        self.child = Some(child);
        self.wait_ready();
        // The server that answered must be this one, not another on a port that was taken
        // between `free_port` and the bind (then this one has exited).
        let pid = self.child.as_ref().map(|c| c.id());
        let answered = self.process_id();
        assert_eq!(
            answered, pid,
            "port {} is answered by another redis-server than the one started",
            self.port
        );
    }

    /// The `process_id` of the server answering on the port (`INFO server`, after `AUTH`
    /// when the server was started with `--requirepass`).
    fn process_id(&self) -> Option<u32> {
        use std::io::BufRead;
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let mut reader = std::io::BufReader::new(s.try_clone().ok()?);
        let mut line = String::new();
        if let Some(i) = self.extra.iter().position(|a| a == "--requirepass") {
            let password = self.extra.get(i + 1)?;
            write!(s, "AUTH {password}\r\n").ok()?;
            reader.read_line(&mut line).ok()?;
        }
        s.write_all(b"INFO server\r\n").ok()?;
        line.clear();
        reader.read_line(&mut line).ok()?;
        let length: usize = line.trim_end().strip_prefix('$')?.parse().ok()?;
        let mut body = vec![0; length + 2];
        reader.read_exact(&mut body).ok()?;
        String::from_utf8_lossy(&body)
            .lines()
            .find_map(|l| l.strip_prefix("process_id:"))
            .and_then(|v| v.trim().parse().ok())
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.ping() {
                return;
            }
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!("redis-server exited early ({status}) on port {}", self.port);
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("redis-server did not answer PING on port {}", self.port);
    }

    fn ping(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
        // A server with a password answers `-NOAUTH ...`: up all the same.
        let mut buf = [0u8; 7];
        s.write_all(b"PING\r\n").is_ok()
            && s.read_exact(&mut buf).is_ok()
            && (&buf == b"+PONG\r\n" || buf.starts_with(b"-NOAUTH"))
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("server running").id();
        let status = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {sig} {pid} failed");
    }

    /// The server process's state letter from /proc (`T` once stopped), for failure messages.
    pub fn state(&self) -> Option<char> {
        let pid = self.child.as_ref()?.id();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat.rsplit_once(") ")?.1.chars().next()
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing answers.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    pub fn resume(&self) {
        self.signal("-CONT");
    }

    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-CONT", &child.id().to_string()])
                .status();
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops and starts again on the same port (all data is lost: persistence is off).
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    /// A plain connection for inspecting keys.
    pub async fn client(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .expect("connect to test redis")
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
