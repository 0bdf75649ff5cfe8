//! Test harness: private Redis topologies on loopback TCP ports picked free at start, for the
//! tests that break Redis on purpose. [`Cluster`] is a Redis Cluster of three masters with one
//! replica each; [`Sentinels`] is a master with two replicas watched by three sentinels. Every
//! process is a redis-server child of the test with its own temp dir and no persistence, killed
//! on drop.
//!
//! After a reshard, a kill or a restart, Redis settles by gossip and elections that take their
//! own time, so the helpers here poll (every 50 ms, bounded, with a panic naming what never
//! happened) instead of sleeping, and they ask the nodes rather than remember who is master: a
//! failover changes that behind the harness's back.

use std::collections::{BTreeMap, HashMap};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::{claim_port, free_port};

const POLL: Duration = Duration::from_millis(50);

/// How long a topology may take to form, and a reshard's new owners to reach every node.
const SETTLE: Duration = Duration::from_secs(30);

const MASTER_NAME: &str = "mymaster";

/// A cluster node listens on `port` and on `port + 10000` for its bus.
const BUS_OFFSET: u16 = 10000;

/// One redis-server (or sentinel) child: its port, its dir and the arguments it was first started
/// with, so that it can be started again exactly the same way. Killed on drop.
struct Proc {
    port: u16,
    args: Vec<String>,
    child: Option<Child>,
    /// Dropped after the child is killed (fields drop after `Drop::drop`).
    _dir: tempfile::TempDir,
}

impl Proc {
    /// Starts redis-server with `args(port, dir)` on a port picked free, not in `taken` and, for
    /// cluster nodes, with `port + bus` free and clear of `taken` too. A port picked free can be
    /// taken before the server binds it (by a parallel test, or as the source port of some
    /// connection), so a server that cannot bind is started again on another port.
    fn start(taken: &[u16], bus: u16, args: impl Fn(u16, &Path) -> Vec<String>) -> Proc {
        let mut last = String::new();
        for _ in 0..5 {
            let port = pick_port(taken, bus);
            let dir = tempfile::tempdir().expect("temp dir");
            let mut proc = Proc {
                port,
                args: args(port, dir.path()),
                child: None,
                _dir: dir,
            };
            match proc.spawn() {
                Ok(()) => return proc,
                Err(e) => last = e,
            }
        }
        panic!("could not start redis-server on a free port; last: {last}")
    }

    /// Starts the child and waits until it answers on its port (checked by pid: the port might
    /// be another server's); `Err` if the child exits first, as when its port is taken.
    fn spawn(&mut self) -> Result<(), String> {
        let mut child = Command::new("redis-server")
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start redis-server ({e}): the tests need Debian's redis-server and \
                     redis-tools packages (apt-get install -y redis-server redis-tools)"
                )
            });
        let pid = child.id().to_string();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!(
                    "redis-server on port {} exited at start ({status})",
                    self.port
                ));
            }
            if info(self.port, "server").is_ok_and(|i| i.get("process_id") == Some(&pid)) {
                self.child = Some(child);
                return Ok(());
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "redis-server on port {} did not answer within 10 s",
                    self.port
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL, as a crash would: no shutdown, no last words to the replicas.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn alive(&self) -> bool {
        self.child.is_some()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A connection to 127.0.0.1:`port` that gives up rather than hang a test: 2 s to connect,
/// 10 s per reply.
fn connect(port: u16) -> Result<redis::Connection, String> {
    let client =
        redis::Client::open(format!("redis://127.0.0.1:{port}")).map_err(|e| e.to_string())?;
    let conn = client
        .get_connection_with_timeout(Duration::from_secs(2))
        .map_err(|e| format!("port {port}: {e}"))?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .and_then(|()| conn.set_write_timeout(Some(Duration::from_secs(10))))
        .map_err(|e| e.to_string())?;
    Ok(conn)
}

fn conn_or_panic(port: u16) -> redis::Connection {
    connect(port).unwrap_or_else(|e| panic!("cannot connect to 127.0.0.1:{port}: {e}"))
}

/// Runs `check` every [`POLL`] until it returns `Ok`; after `timeout` panics with `what` and the
/// last reason `check` gave.
fn wait_for<T>(timeout: Duration, what: &str, mut check: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        match check() {
            Ok(t) => return t,
            Err(why) if Instant::now() >= deadline => {
                panic!("timed out after {timeout:?} waiting for {what}; last: {why}")
            }
            Err(_) => std::thread::sleep(POLL),
        }
    }
}

/// The `field:value` lines of an `INFO` or `CLUSTER INFO` reply.
fn parse_info(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter_map(|l| l.trim().split_once(':'))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn info(port: u16, section: &str) -> Result<HashMap<String, String>, String> {
    info_on(&mut connect(port)?, section).map_err(|e| format!("port {port}: {e}"))
}

fn info_on(c: &mut redis::Connection, section: &str) -> Result<HashMap<String, String>, String> {
    let text: String = redis::cmd("INFO")
        .arg(section)
        .query(c)
        .map_err(|e| e.to_string())?;
    Ok(parse_info(&text))
}

/// `Ok` once `port` is a replica of `master` with its link up.
fn replica_link_up(port: u16, master: u16) -> Result<(), String> {
    let repl = info(port, "replication")?;
    let field = |k: &str| repl.get(k).map(String::as_str).unwrap_or("?");
    if field("role") == "slave"
        && field("master_port") == master.to_string()
        && field("master_link_status") == "up"
    {
        Ok(())
    } else {
        Err(format!(
            "port {port}: role:{} master_port:{} master_link_status:{}",
            field("role"),
            field("master_port"),
            field("master_link_status")
        ))
    }
}

/// A redis-server on 127.0.0.1:`port`, in `dir`, without persistence, plus `extra`. A full sync
/// to a replica starts at once, not after the default 5 s wait for more replicas
/// (`repl-diskless-sync-delay`): start-up and a replica's return after a failover are that much
/// faster, and nothing else changes.
fn server_args(port: u16, dir: &Path, extra: &[&str]) -> Vec<String> {
    let dir = dir.display().to_string();
    let port = port.to_string();
    [
        "--port",
        &port,
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--daemonize",
        "no",
        "--dir",
        &dir,
        "--repl-diskless-sync-delay",
        "0",
    ]
    .iter()
    .chain(extra)
    .map(|a| a.to_string())
    .collect()
}

/// A free port not in `taken`. With `bus` (cluster nodes), `port + bus` is free too (and claimed:
/// no other test is handed it) and neither number is another node's port or bus port.
fn pick_port(taken: &[u16], bus: u16) -> u16 {
    for _ in 0..1000 {
        let p = free_port();
        let clash = |q: u16| q == p || (bus > 0 && (q + bus == p || p + bus == q));
        if p < 65535 - bus
            && !taken.iter().any(|&q| clash(q))
            && (bus == 0
                || (TcpListener::bind(("127.0.0.1", p + bus)).is_ok() && claim_port(p + bus)))
        {
            return p;
        }
    }
    panic!(
        "found no free port (with port+{bus} free) below {}",
        65535 - bus
    )
}

/// Runs `redis-cli args`; panics with its output unless it succeeds.
fn redis_cli(args: &[String]) -> Output {
    let out = Command::new("redis-cli")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run redis-cli ({e}): the tests need Debian's redis-server and \
                 redis-tools packages (apt-get install -y redis-server redis-tools)"
            )
        });
    if !out.status.success() {
        panic!(
            "redis-cli {} failed ({}):\n{}\n{}",
            args.join(" "),
            out.status,
            tail(&String::from_utf8_lossy(&out.stdout), 40),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out
}

/// The last `n` lines of `text`: reshard prints a line per key batch moved.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// One node's view of the slots: `(first, last, owner's port)` ranges, sorted.
type SlotOwners = Vec<(u16, u16, u16)>;

/// One line of `CLUSTER NODES`.
struct NodeLine {
    port: u16,
    flags: String,
    /// Slot ranges owned; `[slot->-id]` / `[slot-<-id]` (open slots) are in `open`.
    slots: Vec<(u16, u16)>,
    open: Vec<String>,
}

fn parse_cluster_nodes(text: &str) -> Vec<NodeLine> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 8 {
                return None;
            }
            // 127.0.0.1:30001@40001[,hostname]
            let port = fields[1]
                .split('@')
                .next()?
                .rsplit_once(':')?
                .1
                .parse()
                .ok()?;
            let mut slots = Vec::new();
            let mut open = Vec::new();
            for s in &fields[8..] {
                if s.starts_with('[') {
                    open.push(s.to_string());
                } else if let Some((a, b)) = s.split_once('-') {
                    slots.push((a.parse().ok()?, b.parse().ok()?));
                } else {
                    let n = s.parse().ok()?;
                    slots.push((n, n));
                }
            }
            Some(NodeLine {
                port,
                flags: fields[2].to_string(),
                slots,
                open,
            })
        })
        .collect()
}

/// A Redis Cluster of its own: 3 masters and 3 replicas on 127.0.0.1, node timeout 2 s, so a
/// killed master is failed over in a few seconds. The tests check what the agent wrote through
/// reshards and failovers, so reads here go to whichever master owns the key's slot now. Every
/// node is killed on drop.
pub struct Cluster {
    nodes: Vec<Proc>,
    /// For each killed master, its replicas just before the kill: one of them takes over.
    orphans: HashMap<u16, Vec<u16>>,
}

impl Cluster {
    /// Starts six nodes, joins them with `redis-cli --cluster create`, and returns once every
    /// node serves all 16384 slots with the same owners and every replica is in sync.
    pub fn start() -> Cluster {
        let mut nodes: Vec<Proc> = Vec::new();
        for _ in 0..6 {
            let taken: Vec<u16> = nodes.iter().map(|n| n.port).collect();
            nodes.push(Proc::start(&taken, BUS_OFFSET, |port, dir| {
                server_args(
                    port,
                    dir,
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        &format!("nodes-{port}.conf"),
                        "--cluster-node-timeout",
                        "2000",
                    ],
                )
            }));
        }
        let ports: Vec<u16> = nodes.iter().map(|n| n.port).collect();
        let cluster = Cluster {
            nodes,
            orphans: HashMap::new(),
        };
        let mut args = vec!["--cluster".to_string(), "create".into()];
        args.extend(ports.iter().map(|p| format!("127.0.0.1:{p}")));
        args.extend(["--cluster-replicas", "1", "--cluster-yes"].map(String::from));
        redis_cli(&args);
        cluster.wait_settled(SETTLE, "the cluster to form");
        cluster
    }

    /// Every node, `redis://127.0.0.1:P`: a cluster client's seeds.
    pub fn seeds(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}", n.port))
            .collect()
    }

    /// The ports of the nodes started and not killed.
    pub fn live(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| n.alive())
            .map(|n| n.port)
            .collect()
    }

    /// The live nodes that say they are masters now, by port.
    pub fn masters(&self) -> Vec<u16> {
        self.live()
            .into_iter()
            .filter(|&p| {
                info(p, "replication").is_ok_and(|i| i.get("role").is_some_and(|r| r == "master"))
            })
            .collect()
    }

    /// A live node that says it replicates `master_port`.
    pub fn replica_of(&self, master_port: u16) -> Option<u16> {
        self.replicas_of(master_port).into_iter().next()
    }

    fn replicas_of(&self, master_port: u16) -> Vec<u16> {
        let master = master_port.to_string();
        self.live()
            .into_iter()
            .filter(|&p| {
                info(p, "replication").is_ok_and(|i| {
                    i.get("role").is_some_and(|r| r == "slave")
                        && i.get("master_port") == Some(&master)
                })
            })
            .collect()
    }

    /// A connection to one node.
    pub fn conn(&self, port: u16) -> redis::Connection {
        conn_or_panic(port)
    }

    /// The node's cluster id (`CLUSTER MYID`), which `redis-cli --cluster` wants.
    pub fn node_id(&self, port: u16) -> String {
        redis::cmd("CLUSTER")
            .arg("MYID")
            .query(&mut self.conn(port))
            .unwrap_or_else(|e| panic!("CLUSTER MYID on {port}: {e}"))
    }

    /// The master serving `key`'s slot right now: the one that answers for it instead of
    /// redirecting (`MOVED`). While the slot migrates, that is still the source, which may answer
    /// `ASK` for keys already moved; [`Cluster::query`] follows that.
    pub fn node_of_key(&self, key: &str) -> u16 {
        let mut last = String::new();
        for _ in 0..50 {
            for start in self.live() {
                let mut port = start;
                for _hop in 0..5 {
                    let mut c = match connect(port) {
                        Ok(c) => c,
                        Err(e) => {
                            last = e;
                            break;
                        }
                    };
                    match redis::cmd("EXISTS").arg(key).query::<i64>(&mut c) {
                        Ok(_) => return port,
                        Err(e) if e.code() == Some("ASK") => return port,
                        Err(e) => match redirect_port(&e) {
                            Some(to) => port = to,
                            None => {
                                last = format!("port {port}: {e}");
                                break;
                            }
                        },
                    }
                }
            }
            std::thread::sleep(POLL);
        }
        panic!("no live node serves key {key:?}; last: {last}")
    }

    /// Runs `cmd` (about `key` alone) on the master serving `key`'s slot, following `ASK` during
    /// a migration and retrying `MOVED` while a new owner spreads.
    pub fn query<T: redis::FromRedisValue>(&self, key: &str, cmd: &redis::Cmd) -> T {
        let mut last = String::new();
        for _ in 0..50 {
            let port = self.node_of_key(key);
            let mut c = match connect(port) {
                Ok(c) => c,
                Err(e) => {
                    last = e;
                    std::thread::sleep(POLL);
                    continue;
                }
            };
            match cmd.query::<T>(&mut c) {
                Ok(t) => return t,
                Err(e) if e.code() == Some("ASK") => {
                    let to = redirect_port(&e).expect("ASK names a node");
                    let mut c = self.conn(to);
                    redis::cmd("ASKING")
                        .query::<()>(&mut c)
                        .unwrap_or_else(|e| panic!("ASKING on {to}: {e}"));
                    match cmd.query::<T>(&mut c) {
                        Ok(t) => return t,
                        Err(e) => last = format!("port {to} after ASK: {e}"),
                    }
                }
                // A new owner spreading, a failover under way, a node just gone.
                Err(e)
                    if matches!(
                        e.code(),
                        Some("MOVED" | "CLUSTERDOWN" | "TRYAGAIN" | "LOADING")
                    ) || e.is_io_error() =>
                {
                    last = format!("port {port}: {e}")
                }
                Err(e) => panic!("{key}: port {port}: {e}"),
            }
            std::thread::sleep(POLL);
        }
        panic!("{key}: no node would run the command; last: {last}")
    }

    pub fn hgetall(&self, key: &str) -> Vec<(String, String)> {
        self.query(key, redis::cmd("HGETALL").arg(key))
    }

    /// The whole sorted set, lowest score first.
    pub fn zrange_withscores(&self, key: &str) -> Vec<(String, f64)> {
        self.query(
            key,
            redis::cmd("ZRANGE")
                .arg(key)
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES"),
        )
    }

    pub fn get_string(&self, key: &str) -> Option<String> {
        self.query(key, redis::cmd("GET").arg(key))
    }

    /// Moves `slots` slots, with their keys, from master `from_port` to master `to_port` with
    /// `redis-cli --cluster reshard`; returns once every node agrees on the new owners, so the
    /// next reshard or check does not trip on gossip still under way.
    pub fn reshard(&self, from_port: u16, to_port: u16, slots: u32) {
        // redis-cli refuses to reshard a cluster whose nodes disagree.
        self.wait_settled(SETTLE, "the cluster to settle before a reshard");
        let (from, to) = (self.node_id(from_port), self.node_id(to_port));
        let args: Vec<String> = [
            "--cluster",
            "reshard",
            &format!("127.0.0.1:{from_port}"),
            "--cluster-from",
            &from,
            "--cluster-to",
            &to,
            "--cluster-slots",
            &slots.to_string(),
            "--cluster-pipeline",
            "100",
            "--cluster-yes",
        ]
        .map(String::from)
        .into();
        redis_cli(&args);
        self.wait_settled(SETTLE, "every node to learn the reshard");
    }

    /// `redis-cli --cluster check`: panics with its output unless all 16384 slots are covered,
    /// the nodes agree on their owners and no slot is left migrating or importing.
    pub fn check(&self) {
        // The check compares every node's view; let gossip finish first. A cluster that never
        // settles is reported by the check itself, with its details.
        let _ = self.settled_within(SETTLE);
        let master = *self
            .masters()
            .first()
            .expect("a live master to run the check from");
        let out = Command::new("redis-cli")
            .args(["--cluster", "check", &format!("127.0.0.1:{master}")])
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let lower = text.to_lowercase();
        let ok = out.status.success()
            && text.contains("[OK] All 16384 slots covered.")
            && text.contains("[OK] All nodes agree about slots configuration.")
            && !text.contains("[WARNING]")
            && !text.contains("[ERR]")
            && !lower.contains("migrating")
            && !lower.contains("importing");
        assert!(ok, "redis-cli --cluster check found problems:\n{text}");
    }

    /// Keys stored on more than one master (by `SCAN` of every live master): after a reshard
    /// each key must live on its slot's owner alone.
    pub fn keys_on_two_masters(&self) -> Vec<String> {
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        for port in self.masters() {
            let mut c = self.conn(port);
            let mut cursor = 0u64;
            loop {
                let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("COUNT")
                    .arg(1000)
                    .query(&mut c)
                    .unwrap_or_else(|e| panic!("SCAN on {port}: {e}"));
                for k in keys {
                    *seen
                        .entry(String::from_utf8_lossy(&k).into_owned())
                        .or_default() += 1;
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        seen.into_iter()
            .filter(|&(_, n)| n > 1)
            .map(|(k, _)| k)
            .collect()
    }

    /// SIGKILLs one node. A master's replicas are noted first, for [`Cluster::wait_failover`].
    pub fn kill(&mut self, port: u16) {
        let replicas = self.replicas_of(port);
        if !replicas.is_empty() {
            self.orphans.insert(port, replicas);
        }
        self.node_mut(port).kill();
    }

    /// Stops (SIGSTOP) or continues (SIGCONT) one node: a master that stalls, or a replica that
    /// lags, with everything sent to it waiting in its socket.
    pub fn pause(&mut self, port: u16, paused: bool) {
        let node = self.node_mut(port);
        let pid = node.child.as_ref().expect("a live node").id();
        let signal = if paused { libc::SIGSTOP } else { libc::SIGCONT };
        // SAFETY: signalling a child process of this test.
        unsafe { libc::kill(pid as i32, signal) };
    }

    /// Starts a killed node again, on its port and dir (its `nodes.conf` kept): a master whose
    /// slots a replica took over comes back as that replica's replica.
    pub fn restart(&mut self, port: u16) {
        let node = self.node_mut(port);
        node.kill();
        node.spawn()
            .unwrap_or_else(|e| panic!("cannot restart {port}: {e}"));
    }

    /// Waits until a replica of the killed master `old_master` has taken over (it says it is a
    /// master) and every live node is back to `cluster_state:ok` with all slots on live nodes;
    /// returns the new master.
    pub fn wait_failover(&self, old_master: u16, timeout: Duration) -> u16 {
        let candidates = self
            .orphans
            .get(&old_master)
            .unwrap_or_else(|| panic!("{old_master} was not a killed master with a replica"));
        wait_for(
            timeout,
            &format!("a replica of {old_master} to take over"),
            || {
                let new = candidates
                    .iter()
                    .copied()
                    .find(|&p| {
                        info(p, "replication")
                            .is_ok_and(|i| i.get("role").is_some_and(|r| r == "master"))
                    })
                    .ok_or_else(|| format!("no replica of {old_master} is master yet"))?;
                self.settled()?;
                Ok(new)
            },
        )
    }

    fn node_mut(&mut self, port: u16) -> &mut Proc {
        self.nodes
            .iter_mut()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!("no cluster node on port {port}"))
    }

    fn wait_settled(&self, timeout: Duration, what: &str) {
        wait_for(timeout, what, || self.settled());
    }

    fn settled_within(&self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.settled() {
                Err(_) if Instant::now() < deadline => std::thread::sleep(POLL),
                r => return r,
            }
        }
    }

    /// `Ok` when every live node says `cluster_state:ok` with 16384 slots ok, every live node
    /// sees the same owner for every slot and that owner is live, no slot is open, and every
    /// live replica's link to its master is up.
    fn settled(&self) -> Result<(), String> {
        let live = self.live();
        let mut agreed: Option<(u16, SlotOwners)> = None;
        for &port in &live {
            let mut c = connect(port)?;
            let text: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query(&mut c)
                .map_err(|e| format!("port {port}: {e}"))?;
            let ci = parse_info(&text);
            let field = |k: &str| ci.get(k).map(String::as_str).unwrap_or("?");
            if field("cluster_state") != "ok" || field("cluster_slots_ok") != "16384" {
                return Err(format!(
                    "port {port}: cluster_state:{} cluster_slots_ok:{}",
                    field("cluster_state"),
                    field("cluster_slots_ok")
                ));
            }
            let text: String = redis::cmd("CLUSTER")
                .arg("NODES")
                .query(&mut c)
                .map_err(|e| format!("port {port}: {e}"))?;
            let mut owners: SlotOwners = Vec::new();
            for n in parse_cluster_nodes(&text) {
                if !n.open.is_empty() {
                    return Err(format!(
                        "port {port}: {} has open slots {:?}",
                        n.port, n.open
                    ));
                }
                if !n.slots.is_empty() && !live.contains(&n.port) {
                    return Err(format!(
                        "port {port}: dead node {} ({}) still owns slots",
                        n.port, n.flags
                    ));
                }
                owners.extend(n.slots.iter().map(|&(a, b)| (a, b, n.port)));
            }
            owners.sort_unstable();
            let covered: u32 = owners.iter().map(|&(a, b, _)| u32::from(b - a) + 1).sum();
            if covered != 16384 {
                return Err(format!("port {port}: sees {covered} slots owned"));
            }
            match &agreed {
                None => agreed = Some((port, owners)),
                Some((first, theirs)) if *theirs != owners => {
                    return Err(format!("ports {first} and {port} disagree on slot owners"));
                }
                Some(_) => {}
            }
            let repl = info_on(&mut c, "replication").map_err(|e| format!("port {port}: {e}"))?;
            if repl.get("role").map(String::as_str) == Some("slave")
                && repl.get("master_link_status").map(String::as_str) != Some("up")
            {
                return Err(format!(
                    "replica {port}: master_link_status:{:?}",
                    repl.get("master_link_status")
                ));
            }
        }
        Ok(())
    }
}

/// The port a `MOVED` or `ASK` error points to.
fn redirect_port(e: &redis::RedisError) -> Option<u16> {
    e.redirect_node()?.0.rsplit_once(':')?.1.parse().ok()
}

/// A master with two replicas and three sentinels (quorum 2) of its own, on 127.0.0.1. A master
/// down for 2 s is failed over; the tests kill it and bring it back to check that the agent
/// follows the sentinels. Every server and sentinel is killed on drop.
pub struct Sentinels {
    /// The master first, then its two replicas (roles change with failovers).
    servers: Vec<Proc>,
    sentinels: Vec<Proc>,
}

impl Sentinels {
    /// Starts the servers, waits for both replicas to sync, then starts the sentinels and waits
    /// until each reports the master, both replicas and the other two sentinels.
    pub fn start() -> Sentinels {
        let mut servers = vec![Proc::start(&[], 0, |port, dir| server_args(port, dir, &[]))];
        let master = servers[0].port;
        for _ in 0..2 {
            let taken: Vec<u16> = servers.iter().map(|n| n.port).collect();
            servers.push(Proc::start(&taken, 0, |port, dir| {
                server_args(
                    port,
                    dir,
                    &["--replicaof", "127.0.0.1", &master.to_string()],
                )
            }));
        }
        let mut ports: Vec<u16> = servers.iter().map(|n| n.port).collect();
        for &replica in &ports[1..] {
            wait_for(SETTLE, "the replicas to sync", || {
                replica_link_up(replica, master)
            });
        }
        // Started after the replicas are in sync, so the sentinels' first INFO of the master
        // lists both (the next one is 10 s later).
        let mut sentinels = Vec::new();
        for _ in 0..3 {
            let sentinel = Proc::start(&ports, 0, |port, dir| {
                // A sentinel rewrites its config file, so it must be a file of its own.
                // down-after-milliseconds is 2000, not 1000: right after a failover a sentinel
                // that learns the new master from the others resets its link, may wait up to
                // 1 s (its reconnect period) before it pings the new master, and counts the
                // silence from the reset. With 1000 it sometimes declares the new master down
                // and fails over a second time (seen here about once in 20 runs).
                let conf = dir.join("sentinel.conf");
                let text = format!(
                    "port {port}\n\
                     bind 127.0.0.1\n\
                     dir {dir}\n\
                     sentinel monitor {MASTER_NAME} 127.0.0.1 {master} 2\n\
                     sentinel down-after-milliseconds {MASTER_NAME} 2000\n\
                     sentinel failover-timeout {MASTER_NAME} 5000\n\
                     sentinel parallel-syncs {MASTER_NAME} 1\n",
                    dir = dir.display()
                );
                std::fs::write(&conf, text).expect("write sentinel.conf");
                vec![conf.display().to_string(), "--sentinel".into()]
            });
            ports.push(sentinel.port);
            sentinels.push(sentinel);
        }
        let topology = Sentinels { servers, sentinels };
        for s in topology.sentinel_ports() {
            wait_for(SETTLE, "the sentinels to see the whole topology", || {
                let mut c = connect(s)?;
                let addr = get_master_addr(&mut c)?;
                if addr != Some(master) {
                    return Err(format!("sentinel {s}: master {addr:?}"));
                }
                let fields: Vec<String> = redis::cmd("SENTINEL")
                    .arg("MASTER")
                    .arg(MASTER_NAME)
                    .query(&mut c)
                    .map_err(|e| format!("sentinel {s}: {e}"))?;
                let fields: HashMap<&str, &str> = fields
                    .chunks(2)
                    .filter_map(|kv| Some((kv.first()?.as_str(), kv.get(1)?.as_str())))
                    .collect();
                let (others, slaves) =
                    (fields.get("num-other-sentinels"), fields.get("num-slaves"));
                if others == Some(&"2") && slaves == Some(&"2") {
                    Ok(())
                } else {
                    Err(format!(
                        "sentinel {s}: num-other-sentinels {others:?}, num-slaves {slaves:?}"
                    ))
                }
            });
        }
        topology
    }

    /// `127.0.0.1:S` for every sentinel, as the agent's configuration takes them.
    pub fn sentinel_addrs(&self) -> Vec<String> {
        self.sentinel_ports()
            .into_iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect()
    }

    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|s| s.port).collect()
    }

    /// The ports of the master and its replicas (roles change with failovers).
    pub fn server_ports(&self) -> Vec<u16> {
        self.servers.iter().map(|s| s.port).collect()
    }

    pub fn master_name(&self) -> &str {
        MASTER_NAME
    }

    /// The master the live sentinels report now (the most common answer).
    pub fn master_port(&self) -> u16 {
        let mut votes: BTreeMap<u16, usize> = BTreeMap::new();
        for s in self.sentinels.iter().filter(|s| s.alive()) {
            if let Ok(Some(p)) = connect(s.port).and_then(|mut c| get_master_addr(&mut c)) {
                *votes.entry(p).or_default() += 1;
            }
        }
        votes
            .into_iter()
            .max_by_key(|&(_, n)| n)
            .map(|(p, _)| p)
            .expect("no sentinel reports a master")
    }

    /// A connection to one server or sentinel.
    pub fn conn(&self, port: u16) -> redis::Connection {
        conn_or_panic(port)
    }

    /// SIGKILLs one server or sentinel.
    pub fn kill(&mut self, port: u16) {
        self.proc_mut(port).kill();
    }

    /// Starts a killed server or sentinel again, on its port and dir with its original
    /// arguments. A server that was master comes back as an empty master; the sentinels then make
    /// it a replica of the new one (see [`Sentinels::wait_replica_of`]).
    pub fn restart(&mut self, port: u16) {
        let proc = self.proc_mut(port);
        proc.kill();
        proc.spawn()
            .unwrap_or_else(|e| panic!("cannot restart {port}: {e}"));
    }

    /// Waits until every live sentinel reports the same master, other than `old`, and that
    /// server's `ROLE` says master; returns it.
    pub fn wait_new_master(&self, old: u16, timeout: Duration) -> u16 {
        wait_for(
            timeout,
            &format!("the sentinels to replace master {old}"),
            || {
                let mut reported = None;
                for s in self.sentinels.iter().filter(|s| s.alive()) {
                    let p = connect(s.port).and_then(|mut c| get_master_addr(&mut c))?;
                    match (p, reported) {
                        (Some(p), None) => reported = Some(p),
                        (p, Some(r)) if p == Some(r) => {}
                        (p, r) => return Err(format!("sentinel {}: {p:?}, another {r:?}", s.port)),
                    }
                }
                let new = reported.ok_or("no live sentinel")?;
                if new == old {
                    return Err(format!("sentinels still report {old}"));
                }
                let role: Vec<redis::Value> = redis::cmd("ROLE")
                    .query(&mut connect(new)?)
                    .map_err(|e| format!("ROLE on {new}: {e}"))?;
                match role.first() {
                    Some(redis::Value::BulkString(r)) if r == b"master" => Ok(new),
                    Some(redis::Value::SimpleString(r)) if r == "master" => Ok(new),
                    r => Err(format!("{new}: ROLE {r:?}")),
                }
            },
        )
    }

    /// Waits until `port` is a replica of `master` with its link up.
    pub fn wait_replica_of(&self, port: u16, master: u16, timeout: Duration) {
        wait_for(timeout, &format!("{port} to replicate {master}"), || {
            replica_link_up(port, master)
        });
    }

    fn proc_mut(&mut self, port: u16) -> &mut Proc {
        self.servers
            .iter_mut()
            .chain(self.sentinels.iter_mut())
            .find(|p| p.port == port)
            .unwrap_or_else(|| panic!("no server or sentinel on port {port}"))
    }
}

/// `SENTINEL get-master-addr-by-name`: the master's port, `None` if the sentinel knows none.
fn get_master_addr(c: &mut redis::Connection) -> Result<Option<u16>, String> {
    let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
        .arg("GET-MASTER-ADDR-BY-NAME")
        .arg(MASTER_NAME)
        .query(c)
        .map_err(|e| e.to_string())?;
    Ok(addr.map(|(_, p)| p))
}
