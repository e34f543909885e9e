//! Distributed Redis for the scale tests, started by the tests themselves: a Redis Cluster of
//! 3 primaries + 3 replicas (`redis-server --cluster-enabled yes`, `redis-cli --cluster
//! create`) and a Sentinel setup (one master, one replica, three `redis-server --sentinel`).
//!
//! Everything runs on free loopback ports in a private temp dir, with persistence off and short
//! failure-detection times so a failover takes a second or two, and every process is killed on
//! drop. `redis-cli` (installed with redis-server) drives setup and inspection, so the harness
//! does not depend on the client code under test.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::redis::{find_redis_server, free_port};

/// How long a node may be unreachable before the cluster (or a Sentinel) calls it failed.
pub const NODE_TIMEOUT_MS: u64 = 1000;

fn find_redis_cli() -> PathBuf {
    let server = find_redis_server();
    let beside = server.with_file_name("redis-cli");
    if beside.is_file() {
        return beside;
    }
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join("redis-cli"))
                .find(|p| p.is_file())
        })
        .expect("redis-cli not found: it comes with redis-server (Debian package redis-tools)")
}

fn temp_dir(kind: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let dir = std::env::temp_dir().join(format!(
        "tollgate-{kind}-{}-{}-{nanos}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

/// One redis-server (data node or Sentinel), killed on drop.
pub struct Node {
    pub port: u16,
    child: Option<Child>,
    /// How it was started, so [`Node::restart`] can start it again the same way.
    dir: PathBuf,
    args: Vec<String>,
}

impl Node {
    fn spawn(dir: &Path, port: u16, args: &[String]) -> Node {
        Node::try_spawn(dir, port, args).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts redis-server and waits until it listens; an error if it exited first (its
    /// port was taken meanwhile, for one).
    fn try_spawn(dir: &Path, port: u16, args: &[String]) -> Result<Node, String> {
        let child = Command::new(find_redis_server())
            .args(args)
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        let mut node = Node {
            port,
            child: Some(child),
            dir: dir.to_path_buf(),
            args: args.to_vec(),
        };
        node.wait_ping()?;
        Ok(node)
    }

    fn wait_ping(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            // Listening is enough: TLS-only and password-protected nodes refuse a plain PING.
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                self.child = None;
                return Err(format!(
                    "redis-server on port {} exited early ({status})",
                    self.port
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("redis-server on port {} is not listening", self.port);
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// SIGKILL: the node vanishes without a goodbye, as in a crash.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts a killed node again on the same port, with the same arguments (and, for a
    /// cluster node, the same node file: it rejoins as the same node, without its data).
    pub fn restart(&mut self) {
        self.kill();
        let started = Node::spawn(&self.dir, self.port, &self.args);
        self.child = Some(started.into_child());
    }

    fn into_child(mut self) -> Child {
        self.child.take().expect("a started node")
    }

    /// Runs a command through redis-cli on this node.
    pub fn cli(&self, args: &[&str]) -> String {
        cli(self.port, args).unwrap_or_else(|e| panic!("redis-cli -p {}: {e}", self.port))
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One standalone redis-server with extra arguments (TLS, ACL users), in its own temp dir.
pub struct CustomRedis {
    pub node: Node,
    pub dir: PathBuf,
}

impl CustomRedis {
    /// `args` may use `{port}` for the chosen port (e.g. `--tls-port {port}`).
    pub fn start(args: &[&str]) -> CustomRedis {
        let dir = temp_dir("redis");
        let port = free_port();
        let mut all: Vec<String> = vec!["--port".into(), port.to_string()];
        all.extend(
            ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
                .iter()
                .map(|s| s.to_string()),
        );
        all.extend(args.iter().map(|a| a.replace("{port}", &port.to_string())));
        CustomRedis {
            node: Node::spawn(&dir, port, &all),
            dir,
        }
    }
}

impl Drop for CustomRedis {
    fn drop(&mut self) {
        self.node.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `redis-cli -p PORT ARGS...`, trimmed stdout; Err on a failed run or an `ERR` reply.
pub fn cli(port: u16, args: &[&str]) -> Result<String, String> {
    let out = Command::new(find_redis_cli())
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || text.starts_with("ERR") || text.starts_with("Could not connect") {
        return Err(format!(
            "{text}{}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(text)
}

fn wait_until(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if check() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out after {limit:?} waiting for {what}");
}

fn info_field(info: &str, field: &str) -> Option<String> {
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|v| v.trim().to_string())
}

/// A data node's arguments: on 127.0.0.1 at `port`, nothing persisted (its dump file named
/// after the port, so nodes sharing a directory keep apart).
fn data_node_args(port: u16) -> Vec<String> {
    [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dbfilename",
        &format!("dump-{port}.rdb"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// A port for a cluster node whose cluster bus port (the port + 10000) is free too.
fn cluster_port() -> u16 {
    loop {
        let port = free_port();
        let bus = u32::from(port) + 10_000;
        if bus <= u32::from(u16::MAX)
            && std::net::TcpListener::bind(("127.0.0.1", bus as u16)).is_ok()
        {
            return port;
        }
    }
}

/// One cluster-enabled node on a fresh port. A port chosen free can be taken before
/// redis-server binds it (another test's connection gets it as its own local port), and the
/// node then exits at once: it is started again on another port.
fn spawn_cluster_node(dir: &Path) -> Node {
    let mut last_error = String::new();
    for _ in 0..5 {
        let port = cluster_port();
        let mut args = data_node_args(port);
        args.extend([
            "--cluster-enabled".to_string(),
            "yes".into(),
            "--cluster-config-file".into(),
            format!("nodes-{port}.conf"),
            "--cluster-node-timeout".into(),
            NODE_TIMEOUT_MS.to_string(),
            // Any replica may be promoted, however long its link was down.
            "--cluster-replica-validity-factor".into(),
            "0".into(),
        ]);
        match Node::try_spawn(dir, port, &args) {
            Ok(node) => return node,
            Err(e) => last_error = e,
        }
    }
    panic!("no cluster node would start in 5 tries: {last_error}");
}

/// A Redis Cluster: 3 primaries, each with one replica.
pub struct RedisCluster {
    pub nodes: Vec<Node>,
    dir: PathBuf,
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        let dir = temp_dir("cluster");
        let mut nodes = Vec::new();
        for _ in 0..6 {
            nodes.push(spawn_cluster_node(&dir));
        }
        let cluster = RedisCluster { nodes, dir };
        let addrs: Vec<String> = cluster
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new(find_redis_cli())
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        cluster.wait_healthy();
        cluster
    }

    /// Every live node says `cluster_state:ok`, sees 3 primaries, and every replica's link to
    /// its primary is up (so it holds the data and may be promoted).
    pub fn wait_healthy(&self) {
        wait_until("the cluster to be ok", Duration::from_secs(30), || {
            self.nodes.iter().filter(|n| n.is_running()).all(|n| {
                let Ok(info) = cli(n.port, &["CLUSTER", "INFO"]) else {
                    return false;
                };
                let Ok(repl) = cli(n.port, &["INFO", "replication"]) else {
                    return false;
                };
                info_field(&info, "cluster_state").as_deref() == Some("ok")
                    && info_field(&info, "cluster_size").as_deref() == Some("3")
                    && match info_field(&repl, "role").as_deref() {
                        Some("master") => true,
                        Some("slave") => {
                            info_field(&repl, "master_link_status").as_deref() == Some("up")
                        }
                        _ => false,
                    }
            })
        });
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Node::url).collect()
    }

    /// Any live node, for inspection.
    pub fn any(&self) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.is_running())
            .expect("a live node")
    }

    pub fn keyslot(&self, key: &str) -> u16 {
        self.any()
            .cli(&["CLUSTER", "KEYSLOT", key])
            .parse()
            .expect("a slot number")
    }

    /// The port of the primary serving `slot`, as a live node sees it.
    pub fn primary_of_slot(&self, slot: u16) -> u16 {
        self.try_primary_of_slot(slot)
            .unwrap_or_else(|| panic!("no healthy primary serves slot {slot}"))
    }

    /// Like [`RedisCluster::primary_of_slot`], `None` while its primary is failing.
    pub fn try_primary_of_slot(&self, slot: u16) -> Option<u16> {
        let nodes = self.any().cli(&["CLUSTER", "NODES"]);
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 9 || !fields[2].contains("master") || fields[2].contains("fail") {
                continue;
            }
            let owns = fields[8..].iter().any(|range| {
                let (a, b) = range.split_once('-').unwrap_or((range, range));
                match (a.parse::<u16>(), b.parse::<u16>()) {
                    (Ok(a), Ok(b)) => (a..=b).contains(&slot),
                    _ => false,
                }
            });
            if owns {
                let addr = fields[1].split('@').next().unwrap();
                return addr.rsplit(':').next().unwrap().parse().ok();
            }
        }
        None
    }

    pub fn node(&mut self, port: u16) -> &mut Node {
        self.nodes
            .iter_mut()
            .find(|n| n.port == port)
            .expect("a node on that port")
    }

    /// Keys held by every live node whose name starts with `prefix`.
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        let mut keys = Vec::new();
        for n in self.nodes.iter().filter(|n| n.is_running()) {
            let role = cli(n.port, &["ROLE"]).unwrap_or_default();
            if !role.starts_with("master") {
                continue;
            }
            let found = n.cli(&["--scan", "--pattern", &format!("{prefix}*")]);
            keys.extend(found.lines().filter(|l| !l.is_empty()).map(str::to_string));
        }
        keys
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            n.kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One master with one replica, watched by three Sentinels (quorum 2).
pub struct SentinelSetup {
    pub master: Node,
    pub replica: Node,
    pub sentinels: Vec<Node>,
    pub name: String,
    dir: PathBuf,
}

impl SentinelSetup {
    pub fn start() -> SentinelSetup {
        let dir = temp_dir("sentinel");
        let master_port = free_port();
        let master = Node::spawn(&dir, master_port, &data_node_args(master_port));
        let replica_port = free_port();
        let mut args = data_node_args(replica_port);
        args.extend([
            "--replicaof".to_string(),
            "127.0.0.1".to_string(),
            master_port.to_string(),
        ]);
        let replica = Node::spawn(&dir, replica_port, &args);
        wait_until("the replica to sync", Duration::from_secs(20), || {
            cli(replica_port, &["INFO", "replication"])
                .map(|i| info_field(&i, "master_link_status").as_deref() == Some("up"))
                .unwrap_or(false)
        });
        let name = "tollgate-master".to_string();
        let mut sentinels = Vec::new();
        for _ in 0..3 {
            let port = free_port();
            let conf = dir.join(format!("sentinel-{port}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {}\n\
                     sentinel monitor {name} 127.0.0.1 {master_port} 2\n\
                     sentinel down-after-milliseconds {name} {NODE_TIMEOUT_MS}\n\
                     sentinel failover-timeout {name} 5000\n\
                     sentinel parallel-syncs {name} 1\n",
                    dir.display()
                ),
            )
            .expect("write sentinel config");
            let args = vec![conf.display().to_string(), "--sentinel".to_string()];
            sentinels.push(Node::spawn(&dir, port, &args));
        }
        let setup = SentinelSetup {
            master,
            replica,
            sentinels,
            name,
            dir,
        };
        // A failover needs a quorum that knows the replica and each other (found through
        // hello messages on the master, every 2 s).
        wait_until(
            "the Sentinels to know each other and the replica",
            Duration::from_secs(30),
            || {
                setup.sentinels.iter().all(|s| {
                    let Ok(info) = cli(s.port, &["INFO", "sentinel"]) else {
                        return false;
                    };
                    info.contains("status=ok")
                        && info.contains("slaves=1")
                        && info.contains("sentinels=3")
                })
            },
        );
        setup
    }

    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(Node::url).collect()
    }

    /// The master's port according to a live Sentinel.
    pub fn master_port(&self) -> u16 {
        let reply = self.sentinels[0].cli(&["SENTINEL", "get-master-addr-by-name", &self.name]);
        reply
            .lines()
            .nth(1)
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("unexpected get-master-addr-by-name reply: {reply}"))
    }

    /// Waits until the Sentinels have promoted the replica and it acts as master.
    pub fn wait_replica_promoted(&self, limit: Duration) {
        wait_until("the Sentinels to promote the replica", limit, || {
            self.master_port() == self.replica.port
                && cli(self.replica.port, &["ROLE"])
                    .map(|r| r.starts_with("master"))
                    .unwrap_or(false)
        });
    }
}

impl Drop for SentinelSetup {
    fn drop(&mut self) {
        for s in &mut self.sentinels {
            s.kill();
        }
        self.master.kill();
        self.replica.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
