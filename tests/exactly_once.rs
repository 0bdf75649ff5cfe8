//! Exactly once under the faults that break naive retries: a copy of a flush delivered after
//! its retry was acknowledged, and a connection that stalls and cuts at random under load.

mod common;

use std::collections::BTreeMap;
use std::net::UdpSocket;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::proxy::{FaultProxy, Mode};
use common::*;
use statsd_redis::config::Config;

fn via_proxy(redis: &RedisServer, proxy: &FaultProxy) -> Config {
    Config {
        redis: format!("redis://{}/0", proxy.addr),
        // Retries come quickly after a stall.
        redis_timeout_ms: 300,
        // Only the flusher talks to Redis: every held write is a flush.
        cleaner_enabled: false,
        ..test_config(redis)
    }
}

/// A first flush through the proxy: it loads the scripts, so a chunk held later is a whole
/// flush.
async fn first_flush(agent: &TestAgent, redis: &RedisServer) {
    agent.send_taken(b"warm:1|c").await;
    agent.tick();
    eventually(Duration::from_secs(10), "first flush", || {
        redis.counter_total(1, "warm") == 1
    })
    .await;
}

/// After the agent gave up on the held copy and its retry was applied: a later flush is
/// acknowledged too, then the old copy reaches Redis.
async fn deliver_the_held_copy_late(agent: &TestAgent, redis: &RedisServer, proxy: &FaultProxy) {
    agent.send_taken(b"after:1|c").await;
    agent.tick();
    eventually(Duration::from_secs(10), "a later flush", || {
        redis.counter_total(1, "after") == 1
    })
    .await;
    proxy.release();
    eventually(
        Duration::from_secs(10),
        "the held copy reached Redis",
        || proxy.delivered_late.load(Ordering::SeqCst) == 1,
    )
    .await;
    assert!(
        agent.metric("redis_errors_total") >= 1.0,
        "the agent gave up on it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_delivered_after_its_retry_was_acknowledged_is_not_applied_again() {
    let (redis, port) = RedisServer::start_tcp();
    let proxy = FaultProxy::start(([127, 0, 0, 1], port).into(), 1).await;
    let agent = TestAgent::start(via_proxy(&redis, &proxy));
    first_flush(&agent, &redis).await;

    proxy.set_mode(Mode::HoldNextFlush);
    agent.send(b"late:5|c\nlate.t:2|ms");
    // The agent times out on the held copy and writes the chunk again on a new connection.
    eventually(Duration::from_secs(10), "the retry was applied", || {
        redis.counter_total(1, "late") == 5
    })
    .await;
    deliver_the_held_copy_late(&agent, &redis, &proxy).await;
    agent.stop().await;
    for p in PRECISIONS {
        assert_eq!(redis.counter_total(p, "late"), 5, "precision {p}");
    }
    let count: f64 = redis::cmd("ZSCORE")
        .arg("stats:late.t:AccessTime")
        .arg("count")
        .query(&mut redis.conn())
        .unwrap();
    assert_eq!(count, 1.0);
    let slice = (unix_now() / 3600 * 3600).to_string();
    assert_eq!(
        redis.hist_total(&format!("hist:3600:late.t:AccessTime:{slice}")),
        1.0,
        "slice buckets once"
    );
}

/// The same fault on a chunk of quantile buckets alone: with `quantile_write_secs` a group's
/// buckets are summed in the agent and written after the group, in their own chunk, under the
/// same guard. Its copy delivered after the retry was acknowledged adds no bucket twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_copy_of_a_held_buckets_chunk_is_not_applied_again() {
    let (redis, port) = RedisServer::start_tcp();
    let proxy = FaultProxy::start(([127, 0, 0, 1], port).into(), 2).await;
    // The first flush closes the last window of a 5 s group: the next group is the test's.
    let agent = TestAgent::start_at(
        Config {
            quantile_write_secs: 5,
            quantile_precisions: vec![5, 3600],
            ..via_proxy(&redis, &proxy)
        },
        clock_at(4, 5),
    );
    first_flush(&agent, &redis).await;
    let group = agent.clock.unix_now();
    assert_eq!(group % 5, 0);
    // Its statistics are written with its first window, seconds before the group ends.
    agent.send_taken(b"held.t:2|ms\nheld.t:300|ms").await;
    agent.tick();
    let count = |redis: &RedisServer| -> Option<f64> {
        redis::cmd("ZSCORE")
            .arg("stats:held.t:AccessTime")
            .arg("count")
            .query(&mut redis.conn())
            .unwrap()
    };
    eventually(Duration::from_secs(3), "statistics written", || {
        count(&redis) == Some(2.0)
    })
    .await;
    let slice = format!("hist:5:held.t:AccessTime:{group}");
    assert_eq!(redis.hist_total(&slice), 0.0, "the buckets are held");

    proxy.set_mode(Mode::HoldNextFlush);
    // The group ends, and its buckets are dealt over the next group's windows.
    agent
        .clock
        .advance(Duration::from_secs(group + 10 - agent.clock.unix_now()));
    eventually(
        Duration::from_secs(15),
        "the retry wrote the buckets",
        || redis.hist_total(&slice) == 2.0,
    )
    .await;
    let held = String::from_utf8_lossy(&proxy.held.lock().unwrap()).into_owned();
    assert!(
        held.contains("held.t"),
        "the copy held is the buckets' chunk: {held}"
    );
    deliver_the_held_copy_late(&agent, &redis, &proxy).await;
    agent.stop().await;
    assert_eq!(
        redis.hist_total(&slice),
        2.0,
        "the 5 s slice's buckets once"
    );
    let hour = format!("hist:3600:held.t:AccessTime:{}", group / 3600 * 3600);
    assert_eq!(redis.hist_total(&hour), 2.0, "the hour's buckets once");
    assert_eq!(count(&redis), Some(2.0), "the statistics once");
}

/// Ends a chaos run: the proxy passes everything, the backlog is written (after at least three
/// cuts and three stalls, and no window dropped), the agent stops, and the writes the proxy
/// stalled have reached Redis.
async fn end_the_chaos(agent: TestAgent, proxy: &FaultProxy) {
    proxy.set_mode(Mode::Pass);
    eventually(Duration::from_secs(30), "backlog written", || {
        agent.metric("backlog_windows") == 0.0
    })
    .await;
    let (cuts, stalls) = (
        proxy.cuts.load(Ordering::SeqCst),
        proxy.stalls.load(Ordering::SeqCst),
    );
    assert!(
        cuts >= 3 && stalls >= 3,
        "faults: {cuts} cuts, {stalls} stalls"
    );
    assert_eq!(agent.metric("windows_dropped_total"), 0.0);
    agent.stop().await;
    // Stalled writes still in the proxy arrive, whether the agent still waits or not.
    eventually(
        Duration::from_secs(5),
        "the stalled writes passed on",
        || proxy.stalled.load(Ordering::SeqCst) == 0,
    )
    .await;
    // Passed on: in Redis's socket buffers, read and executed within moments.
    tokio::time::sleep(Duration::from_millis(200)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_stalls_and_cuts_under_load_neither_lose_nor_double() {
    let (redis, port) = RedisServer::start_tcp();
    let proxy = FaultProxy::start(([127, 0, 0, 1], port).into(), 7).await;
    let agent = TestAgent::start(via_proxy(&redis, &proxy));
    proxy.set_mode(Mode::Chaos);
    let sent = send_load(agent.udp[0], Duration::from_secs(20), 50, 10).await;
    end_the_chaos(agent, &proxy).await;
    for p in PRECISIONS {
        for (i, &n) in sent.iter().enumerate() {
            let series = format!("load.{i}");
            assert_eq!(
                redis.counter_total(p, &series),
                n,
                "{series} at precision {p}"
            );
        }
    }
}

fn query<T: redis::FromRedisValue>(redis: &RedisServer, cmd: &mut redis::Cmd) -> T {
    cmd.query(&mut redis.conn()).unwrap()
}

/// One window whose chunk holds ordinary series beside values at the edges of their types and
/// keys of another program's under our names: every ordinary series is exact, each refused
/// write is counted by reason, and an item Redis refuses leaves nothing half-written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_values_and_foreign_keys_spoil_nothing_else() {
    let redis = RedisServer::start();
    // Another program's keys: a string where a counter hash, a stats ZSET and a log list go,
    // and a daily count one step from the end of the 64-bit range.
    let day = unix_now() / 86400 * 86400;
    for key in [
        "count:60:victim",
        "stats:victim.t:AccessTime",
        "recent:foreign:info",
    ] {
        let _: () = query(&redis, redis::cmd("SET").arg(key).arg("theirs"));
    }
    let _: () = query(
        &redis,
        redis::cmd("HSET")
            .arg("count:86400:full")
            .arg(day)
            .arg(i64::MAX - 1),
    );
    let agent = TestAgent::start(Config {
        // The whole window in one chunk, hostile items among ordinary ones.
        max_series_per_chunk: 1000,
        ..test_config(&redis)
    });
    let mut datagram: String = (0..50).map(|i| format!("ok.{i}:3|c\n")).collect();
    datagram.push_str(concat!(
        "victim:2|c\n",
        "victim.t:5|ms\n",
        "full:2|c\n",
        "big:9223372036854775807|c\n",
        "tiny:1|c|@1e-300\n",
        "huge.t:1e300|ms\n",
        "heavy.t:1|ms|@1e-300\n",
        "den:1e-310|c\n",
        "den.t:4.9e-324|ms\n",
        "inf:1e308|c\n",
        "inf:-1e308|c\n",
        "g:1e19|g\n",
        "_e{4,5}:oops|hello|s:foreign\n",
        "_e{2,4}:ok|fine|s:fine\n",
        "ok.t:7|ms",
    ));
    agent.send(datagram.as_bytes());
    eventually(Duration::from_secs(10), "the window written", || {
        agent.metric(r#"flushes_total{outcome="ok"}"#) > 0.0
    })
    .await;

    let out_of_range = agent.metric(r#"bad_lines_total{reason="out_of_range"}"#);
    assert_eq!(
        out_of_range, 7.0,
        "big, tiny, huge.t, heavy.t, inf twice, g"
    );
    assert_eq!(
        agent.metric(r#"write_failures_total{reason="wrong_type"}"#),
        3.0
    );
    assert_eq!(
        agent.metric(r#"write_failures_total{reason="overflow"}"#),
        1.0
    );
    assert_eq!(agent.metric("chunks_applied_before_total"), 0.0);
    agent.stop().await;

    for p in PRECISIONS {
        for i in 0..50 {
            assert_eq!(
                redis.counter_total(p, &format!("ok.{i}")),
                3,
                "ok.{i} at {p}"
            );
        }
        // Refused only where the foreign key or the full count is.
        if p != 60 {
            assert_eq!(redis.counter_total(p, "victim"), 2, "victim at {p}");
        }
        if p != 86400 {
            assert_eq!(redis.counter_total(p, "full"), 2, "full at {p}");
        }
        // A denormal adds nothing, and nothing breaks.
        assert_eq!(redis.counter_total(p, "den"), 0);
    }
    let full: i64 = query(&redis, redis::cmd("HGET").arg("count:86400:full").arg(day));
    assert_eq!(full, i64::MAX - 1, "an overflowing HINCRBY changes nothing");
    let theirs: String = query(&redis, redis::cmd("GET").arg("count:60:victim"));
    assert_eq!(theirs, "theirs");
    // The refused stats item wrote nothing, not even its hour.
    let start: bool = query(
        &redis,
        redis::cmd("EXISTS").arg("stats:victim.t:AccessTime:start"),
    );
    assert!(!start);
    let ok_count: f64 = query(
        &redis,
        redis::cmd("ZSCORE")
            .arg("stats:ok.t:AccessTime")
            .arg("count"),
    );
    assert_eq!(ok_count, 1.0);
    let den: Vec<f64> = query(
        &redis,
        redis::cmd("ZMSCORE")
            .arg("stats:den.t:AccessTime")
            .arg("count")
            .arg("sumsq"),
    );
    assert_eq!(den, [1.0, 0.0]);
    // The refused log entry wrote no common: count either; the other log is whole.
    let foreign: bool = query(&redis, redis::cmd("EXISTS").arg("common:foreign:info"));
    assert!(!foreign);
    let fine: i64 = query(&redis, redis::cmd("LLEN").arg("recent:fine:info"));
    assert_eq!(fine, 1);
    let ttl: i64 = query(&redis, redis::cmd("TTL").arg("recent:fine:info"));
    assert!(ttl > 0, "log keys expire when idle");
}

/// Sends `n` datagrams of `crash:1|c` over about `d`; returns `n`.
fn send_counts(udp: u16, n: i64, d: Duration) -> i64 {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    for _ in 0..n {
        socket.send_to(b"crash:1|c", ("127.0.0.1", udp)).unwrap();
        std::thread::sleep(d / n as u32);
    }
    n
}

fn spool_files(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "window"))
        .count()
}

/// SIGKILL while Redis is down: the closed windows were in the spool, and the next start
/// writes each of them once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_an_outage_then_restart_writes_every_closed_window_once() {
    let mut redis = RedisServer::start();
    let spool = tempfile::tempdir().unwrap();
    let spool_dir = spool.path().to_str().unwrap();
    let args = ["--spool-dir", spool_dir, "--redis-timeout-ms", "300"];
    let (agent, udp, _) = spawn_agent(&redis.url(), &args);
    let mut agent = Killed(agent);
    redis.kill();
    let sent = send_counts(udp, 300, Duration::from_secs(3));
    // Every datagram sent is in a closed window once a boundary has passed.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(spool_files(spool.path()) >= 3, "windows wait in the spool");
    agent.kill();

    redis.restart_after(Duration::ZERO, &[]);
    let (again, _, http) = spawn_agent(&redis.url(), &args);
    let mut again = Killed(again);
    eventually(
        Duration::from_secs(15),
        "the spool written and emptied",
        || spool_files(spool.path()) == 0,
    )
    .await;
    assert!(metric_at(([127, 0, 0, 1], http).into(), "spool_windows_loaded_total") >= 3.0);
    again.kill();
    for p in PRECISIONS {
        assert_eq!(redis.counter_total(p, "crash"), sent, "precision {p}");
    }
}

/// Sends `bursts` bursts of `each` `crash:1|c` datagrams, each 0.3 s into a second of its own
/// (so each fills one window), and reads `backlog_unspooled_windows` after each; returns the
/// lines sent and the readings.
fn send_bursts(udp: u16, http: u16, bursts: usize, each: i64) -> (i64, Vec<f64>) {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut readings = Vec::new();
    for _ in 0..bursts {
        let into_second = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_millis();
        std::thread::sleep(Duration::from_millis(u64::from(1300 - into_second) % 1000));
        for _ in 0..each {
            socket.send_to(b"crash:1|c", ("127.0.0.1", udp)).unwrap();
        }
        let http = ([127, 0, 0, 1], http).into();
        readings.push(metric_at(http, "backlog_unspooled_windows"));
    }
    (bursts as i64 * each, readings)
}

/// Restarts Redis and the agent (`start`) on its spool, waits until the spool is written, and
/// stops the agent.
async fn replay_the_spool(
    redis: &mut RedisServer,
    start: &impl Fn() -> (Killed, u16, u16),
    spooled: &impl Fn() -> usize,
) {
    redis.restart_after(Duration::ZERO, &[]);
    let (mut again, _, _) = start();
    eventually(
        Duration::from_secs(15),
        "the spool written and emptied",
        || spooled() == 0,
    )
    .await;
    again.kill();
}

/// A spool on a small file system that fills while Redis is down: the windows it cannot take
/// are counted (`backlog_unspooled_windows`, `/readyz`'s body) while they are at risk, and a
/// SIGKILL then loses at most those, doubling nothing, at every precision. Once room returns
/// the closer writes them to the spool, the gauge falls to 0, and a SIGKILL loses nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_spool_disk_says_what_a_crash_would_lose_and_spools_again_when_room_returns() {
    let mut redis = RedisServer::start();
    // 16 pages; the filler leaves 6: a few windows' files (a page each) and the state file's.
    let disk = SmallDisk::new(16 * 4096);
    let filler = disk.path().join("filler");
    std::fs::write(&filler, vec![0u8; 10 * 4096]).unwrap();
    let spool_dir = disk.dir().join("spool");
    let spool_dir = spool_dir.to_str().unwrap();
    let args = ["--spool-dir", spool_dir, "--redis-timeout-ms", "300"];
    let url = redis.url();
    let start = || {
        let (agent, udp, http) = spawn_agent_in(disk.command(bin()), &url, &args);
        (Killed(agent), udp, http)
    };
    let spooled = || spool_files(&disk.path().join("spool"));
    const EACH: i64 = 50;
    let totals = |redis: &RedisServer| PRECISIONS.map(|p| redis.counter_total(p, "crash"));

    // The disk fills while Redis is down; SIGKILL with windows in memory only. (Redis keeps
    // nothing across its restarts here.)
    redis.kill();
    let (mut agent, udp, http) = start();
    let (sent, readings) = tokio::task::spawn_blocking(move || send_bursts(udp, http, 10, EACH))
        .await
        .unwrap();
    // The last burst's window closes and meets the full disk.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let addr = ([127, 0, 0, 1], http).into();
    let at_risk = metric_at(addr, "backlog_unspooled_windows");
    assert_eq!(
        readings[0], 0.0,
        "the first windows are spooled: {readings:?}"
    );
    assert!(
        at_risk >= 3.0,
        "the gauge rose as the disk filled: {readings:?}, {at_risk}"
    );
    assert!(metric_at(addr, "spool_write_errors_total{kind=\"window\"}") >= at_risk);
    let (status, body) = http_get(addr, "/readyz");
    assert_eq!(status, 503, "Redis is down");
    assert!(
        body.contains(&format!("{at_risk} windows waiting are in memory only")),
        "{body}"
    );
    agent.kill();
    let mut log = String::new();
    std::io::Read::read_to_string(&mut agent.0.stderr.take().unwrap(), &mut log).unwrap();
    // Each kind on a line of its own: neither hides the other.
    assert!(log.contains("cannot spool the window; it is kept in memory only"));
    assert!(log.contains("cannot spool the sums held back"));
    replay_the_spool(&mut redis, &start, &spooled).await;
    let written = totals(&redis);
    for (p, total) in PRECISIONS.iter().zip(written) {
        assert!(total <= sent, "precision {p}: {total} of {sent}: doubled");
        // The state file may hold the last window closed (then it is not lost).
        let lost = (sent - total) / EACH;
        assert!(
            (at_risk as i64 - 1..=at_risk as i64).contains(&lost) && (sent - total) % EACH == 0,
            "precision {p}: {total} of {sent}: lost other than the {at_risk} windows at risk"
        );
        assert_eq!(total, written[0], "precision {p} against 1 s");
    }

    // The disk fills again; then room returns, the windows are spooled, and SIGKILL loses
    // nothing.
    redis.kill();
    let (mut agent, udp, http) = start();
    let (more, _) = tokio::task::spawn_blocking(move || send_bursts(udp, http, 10, EACH))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let addr = ([127, 0, 0, 1], http).into();
    assert!(metric_at(addr, "backlog_unspooled_windows") >= 3.0);
    std::fs::remove_file(&filler).unwrap();
    eventually(Duration::from_secs(3), "the windows spooled", || {
        metric_at(addr, "backlog_unspooled_windows") == 0.0
    })
    .await;
    assert!(!http_get(addr, "/readyz").1.contains("memory only"));
    assert_eq!(spooled(), 10, "each window in a file");
    agent.kill();
    replay_the_spool(&mut redis, &start, &spooled).await;
    // (Redis keeps nothing across its restarts here: what it holds is this second run's.)
    for (p, total) in PRECISIONS.iter().zip(totals(&redis)) {
        assert_eq!(total, more, "precision {p}");
    }
}

/// SIGKILL at the worst moment: Redis applied the chunks but the agent never heard so. The
/// next start replays them from the spool, and Redis answers that they were applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_after_redis_applied_but_before_the_reply_doubles_nothing() {
    let (redis, port) = RedisServer::start_tcp();
    let proxy = FaultProxy::start(([127, 0, 0, 1], port).into(), 3).await;
    let spool = tempfile::tempdir().unwrap();
    let spool_dir = spool.path().to_str().unwrap();
    let args = ["--spool-dir", spool_dir, "--cleaner-enabled", "false"];
    let (agent, udp, _) = spawn_agent(&format!("redis://{}/0", proxy.addr), &args);
    let mut agent = Killed(agent);
    // A first flush loads the script (a NOSCRIPT reply swallowed would stop everything).
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .send_to(b"warm:1|c", ("127.0.0.1", udp))
        .unwrap();
    eventually(Duration::from_secs(10), "first flush", || {
        redis.counter_total(1, "warm") == 1
    })
    .await;
    proxy.set_mode(Mode::SwallowReplies);
    let sent = tokio::task::spawn_blocking(move || send_counts(udp, 100, Duration::from_secs(2)))
        .await
        .unwrap();
    // The writer keeps sending its first pipeline again (each copy answered, unheard, as
    // applied before); the later windows wait behind it. All are closed a boundary later.
    eventually(
        Duration::from_secs(10),
        "Redis applied the first window",
        || redis.counter_total(1, "crash") > 0,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(redis.counter_total(1, "crash") < sent);
    assert!(
        spool_files(spool.path()) >= 2,
        "unacknowledged windows stay spooled"
    );
    agent.kill();

    let (again, _, http) = spawn_agent(&redis.url(), &args);
    let mut again = Killed(again);
    eventually(Duration::from_secs(15), "the spool replayed", || {
        spool_files(spool.path()) == 0
    })
    .await;
    let http = ([127, 0, 0, 1], http).into();
    assert!(metric_at(http, "chunks_applied_before_total") >= 1.0);
    again.kill();
    for p in PRECISIONS {
        assert_eq!(redis.counter_total(p, "crash"), sent, "precision {p}");
    }
}

/// SIGKILL with `coarse_write_secs` on: the sums of the open groups are in the spool's state
/// file, so the coarse precisions lose nothing either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_with_coarse_writes_keeps_the_sums_it_held() {
    let redis = RedisServer::start();
    let spool = tempfile::tempdir().unwrap();
    let spool_dir = spool.path().to_str().unwrap();
    let args = ["--spool-dir", spool_dir, "--coarse-write-secs", "60"];
    // Sending and the check after it take about 5 s, all within one minute (a group that ended
    // in between would have written its sums already): the agent's clock starts a second into
    // one.
    let behind = behind_to(1, 60);
    let (agent, udp, _) = spawn_agent_behind(behind, &redis.url(), &args);
    let mut agent = Killed(agent);
    let sent = tokio::task::spawn_blocking(move || send_counts(udp, 200, Duration::from_secs(3)))
        .await
        .unwrap();
    eventually(Duration::from_secs(5), "the 1 s precision written", || {
        redis.counter_total(1, "crash") == sent
    })
    .await;
    assert!(
        redis.counter_total(86400, "crash") < sent,
        "the coarse precisions are still summed in the agent"
    );
    agent.kill();

    let (again, _, _) = spawn_agent_behind(behind, &redis.url(), &args);
    let mut again = Killed(again);
    // SIGTERM: the stop writes every sum it holds.
    // SAFETY: signalling a child this test started.
    unsafe { libc::kill(again.0.id() as i32, libc::SIGTERM) };
    assert!(again.0.wait().unwrap().success());
    assert_eq!(
        spool_files(spool.path()),
        0,
        "everything written at the stop"
    );
    for p in PRECISIONS {
        assert_eq!(redis.counter_total(p, "crash"), sent, "precision {p}");
    }
}

/// SIGKILL with the quantile buckets held for their minute (`quantile_write_secs`, 60 by
/// default): the buckets summed so far are in the spool's state file, so the restart writes
/// every one of them once, as the statistics were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_while_buckets_are_held_loses_none_of_them() {
    let redis = RedisServer::start();
    let spool = tempfile::tempdir().unwrap();
    let spool_dir = spool.path().to_str().unwrap();
    let args = ["--spool-dir", spool_dir, "--cleaner-enabled", "false"];
    // Early in a minute, so that the whole test runs inside it: nothing is written before the
    // kill. The agent's clock starts a second into one.
    let behind = behind_to(1, 60);
    let minute = (unix_now() - behind) / 60 * 60;
    let (agent, udp, _) = spawn_agent_behind(behind, &redis.url(), &args);
    let mut agent = Killed(agent);
    let sent = tokio::task::spawn_blocking(move || {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        for i in 0..200 {
            let line = format!("lat:{}|ms", 1 + i % 50);
            socket.send_to(line.as_bytes(), ("127.0.0.1", udp)).unwrap();
            std::thread::sleep(Duration::from_millis(15));
        }
        200.0
    })
    .await
    .unwrap();
    let stats = |redis: &RedisServer| -> f64 {
        redis::cmd("ZSCORE")
            .arg("stats:lat:AccessTime")
            .arg("count")
            .query::<Option<f64>>(&mut redis.conn())
            .unwrap()
            .unwrap_or(0.0)
    };
    eventually(
        Duration::from_secs(5),
        "the statistics go every window",
        || stats(&redis) == sent,
    )
    .await;
    let minute_key = format!("hist:60:lat:AccessTime:{minute}");
    let hour_key = format!("hist:3600:lat:AccessTime:{}", minute / 3600 * 3600);
    assert_eq!(redis.hist_total(&minute_key), 0.0, "the buckets are held");
    agent.kill();

    let (again, _, _) = spawn_agent_behind(behind, &redis.url(), &args);
    let mut again = Killed(again);
    // SAFETY: signalling a child this test started.
    unsafe { libc::kill(again.0.id() as i32, libc::SIGTERM) };
    assert!(again.0.wait().unwrap().success());
    assert_eq!(redis.hist_total(&minute_key), sent, "the minute");
    assert_eq!(redis.hist_total(&hour_key), sent, "the hour");
    assert_eq!(stats(&redis), sent, "nothing doubled");
}

/// The spool's state file cannot be replaced (here a directory stands where its temporary file
/// goes, as a full disk refuses it), while groups end and are written from memory; SIGKILL,
/// the way cleared, restart on the spool. The outdated state file must not be taken up: its
/// sums were written since. So every precision holds at most what was sent (the held sums of
/// the open groups are lost, and counted), and the 1 s precision, written every window, all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_file_that_cannot_be_replaced_is_never_taken_up() {
    let redis = RedisServer::start();
    let spool = tempfile::tempdir().unwrap();
    let spool_dir = spool.path().to_str().unwrap();
    let args = [
        "--spool-dir",
        spool_dir,
        "--coarse-write-secs",
        "5",
        "--quantile-write-secs",
        "5",
        "--quantile-precisions",
        "5,3600",
        "--cleaner-enabled",
        "false",
    ];
    // Within one hour (the statistics compared are the hour's): the agent's clock starts at
    // the hour.
    let behind = behind_to(0, 3600);
    let (agent, udp, http) = spawn_agent_behind(behind, &redis.url(), &args);
    let mut agent = Killed(agent);
    // The state file is made unwritable 3 s into a 5 s group, whose sums it then holds; the
    // group ends and is dealt out over the next 5 s, all before the kill. (The agent started
    // in the group's first second; this waits for its second.)
    while (unix_now() - behind) % 5 != 1 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let send = move |secs: u64| {
        tokio::task::spawn_blocking(move || {
            let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
            let until = std::time::Instant::now() + Duration::from_secs(secs);
            let mut n = 0;
            while std::time::Instant::now() < until {
                let lines = format!("crash:1|c\nlat:{}|ms", 1 + n % 50);
                socket
                    .send_to(lines.as_bytes(), ("127.0.0.1", udp))
                    .unwrap();
                n += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            n
        })
    };
    let mut sent = send(3).await.unwrap();
    let state = spool.path().join("coarse.state");
    assert!(state.exists(), "the held sums are spooled");
    std::fs::create_dir(spool.path().join("coarse.tmp")).unwrap();
    // Groups end meanwhile and go out from memory; the state file cannot follow.
    sent += send(7).await.unwrap();
    let http = ([127, 0, 0, 1], http).into();
    eventually(Duration::from_secs(5), "every window written", || {
        redis.counter_total(1, "crash") == sent as i64
    })
    .await;
    assert!(metric_at(http, "spool_write_errors_total") >= 1.0);
    agent.kill();
    std::fs::remove_dir(spool.path().join("coarse.tmp")).unwrap();

    let (again, _, _) = spawn_agent_behind(behind, &redis.url(), &args);
    let mut again = Killed(again);
    // SAFETY: signalling a child this test started.
    unsafe { libc::kill(again.0.id() as i32, libc::SIGTERM) };
    assert!(again.0.wait().unwrap().success());
    let sent = sent as i64;
    assert_eq!(redis.counter_total(1, "crash"), sent, "every window's 1 s");
    for p in PRECISIONS {
        let total = redis.counter_total(p, "crash");
        assert!(total <= sent, "precision {p}: {total} of {sent} sent");
    }
    let count: f64 = redis::cmd("ZSCORE")
        .arg("stats:lat:AccessTime")
        .arg("count")
        .query::<Option<f64>>(&mut redis.conn())
        .unwrap()
        .unwrap_or(0.0);
    assert!(count <= sent as f64, "statistics: {count} of {sent}");
    let hour = (unix_now() - behind) / 3600 * 3600;
    let buckets = redis.hist_total(&format!("hist:3600:lat:AccessTime:{hour}"));
    assert!(buckets <= sent as f64, "buckets: {buckets} of {sent}");
}

/// An evicted guard while a reply is lost: under an allkeys-* `maxmemory-policy` Redis may evict
/// the guard hash (the test deletes it, as eviction would). The agent sends the unanswered
/// pipeline again, marked as perhaps applied; it finds no guard, so it is not applied a second
/// time (counted in `chunks_guard_lost_total`). The policy is read again on the reconnect and
/// exported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_guard_never_doubles_a_window() {
    let (redis, port) = RedisServer::start_tcp();
    let proxy = FaultProxy::start(([127, 0, 0, 1], port).into(), 5).await;
    let agent = TestAgent::start(via_proxy(&redis, &proxy));
    first_flush(&agent, &redis).await;
    assert_eq!(
        agent.metric(r#"redis_evicts_keys{policy="noeviction"}"#),
        0.0
    );
    let config = |key: &str, value: &str| {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(key)
            .arg(value)
            .query(&mut redis.conn())
            .unwrap();
    };
    config("maxmemory", "1gb");
    config("maxmemory-policy", "allkeys-lru");
    proxy.set_mode(Mode::SwallowReplies);
    for _ in 0..50 {
        agent.send(b"evict:1|c");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eventually(Duration::from_secs(10), "Redis applied the window", || {
        redis.counter_total(1, "evict") == 50
    })
    .await;
    // The agent, unanswered, sends it again and again. The guard goes.
    let guards: Vec<String> = redis::cmd("KEYS")
        .arg("flush:*")
        .query(&mut redis.conn())
        .unwrap();
    assert!(!guards.is_empty());
    let _: () = redis::cmd("DEL")
        .arg(&guards)
        .query(&mut redis.conn())
        .unwrap();
    proxy.set_mode(Mode::Pass);
    // Generous: under a loaded CI machine the agent's reconnect after the swallowed replies
    // has taken over 15 s; the wait ends as soon as the backlog is written.
    eventually(Duration::from_secs(60), "backlog written", || {
        agent.metric("backlog_windows") == 0.0 && agent.metric("chunks_guard_lost_total") >= 1.0
    })
    .await;
    assert_eq!(
        agent.metric(r#"redis_evicts_keys{policy="allkeys-lru"}"#),
        1.0
    );
    agent.send(b"evict:1|c");
    agent.stop().await;
    for p in PRECISIONS {
        assert_eq!(redis.counter_total(p, "evict"), 51, "precision {p}");
    }
}

/// The agent stopped (SIGSTOP) for 3 s while counts arrive, then continued: the closer closes
/// the windows it passed one after another, the shares of ended 5 s groups dealt to them, and
/// every count lands once at every precision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_agent_catches_up_without_losing_or_doubling() {
    let redis = RedisServer::start();
    let args = ["--coarse-write-secs", "5", "--cleaner-enabled", "false"];
    let (agent, udp, http) = spawn_agent(&redis.url(), &args);
    let mut agent = Killed(agent);
    let pid = agent.0.id() as i32;
    let sending =
        tokio::task::spawn_blocking(move || send_counts(udp, 300, Duration::from_secs(6)));
    tokio::time::sleep(Duration::from_secs(2)).await;
    // SAFETY: signalling a child this test started.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    tokio::time::sleep(Duration::from_secs(3)).await;
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let sent = sending.await.unwrap();
    eventually(Duration::from_secs(10), "the 1 s precision written", || {
        redis.counter_total(1, "crash") == sent
    })
    .await;
    let http = ([127, 0, 0, 1], http).into();
    assert_eq!(metric_at(http, "windows_dropped_total"), 0.0);
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    assert!(agent.0.wait().unwrap().success());
    for p in PRECISIONS {
        assert_eq!(redis.counter_total(p, "crash"), sent, "precision {p}");
    }
}

/// The same chaos under `storage_schemas` whose sections keep different precisions: a window's
/// counters are written in a group of chunks per section, and its carbon points in one points
/// section per schema, so a window is several chunks, each retried and guarded on its own.
/// Every counter lands once at each of its own precisions and nowhere else; every carbon point
/// lands in its own schema's finest archive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_over_a_window_of_several_schemas_neither_loses_nor_doubles() {
    use std::io::Write;
    let (redis, port) = RedisServer::start_tcp();
    let proxy = FaultProxy::start(([127, 0, 0, 1], port).into(), 11).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("storage-schemas.conf");
    std::fs::write(
        &file,
        "[carbon_fine]\npattern = ^c\\.fine\\.\nretentions = 1s:1h,1m:1d\n\
         [even]\npattern = [02468]$\nretentions = 1s:10m,1m:1d\n\
         [rest]\npattern = .*\nretentions = 10s:1h,1h:7d\n",
    )
    .unwrap();
    let schemas = statsd_redis::storage_conf::Schemas::load(&file).unwrap();
    let carbon_addr: std::net::SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let agent = TestAgent::start(Config {
        storage_schemas: file.clone(),
        schemas: Some(statsd_redis::storage_conf::SharedSchemas::new(schemas)),
        carbon_tcp: vec![carbon_addr],
        ..via_proxy(&redis, &proxy)
    });
    proxy.set_mode(Mode::Chaos);
    // Carbon points beside the counters: each path a point every half second, each point its
    // own 10 s slice (so the last write of a slice is its only one), the newest an hour old.
    let now = unix_now() as i64;
    let start = now - now % 10 - 3000;
    let carbon_paths: Vec<String> = (0..5)
        .flat_map(|j| [format!("c.fine.{j}"), format!("c.rest.{j}.x")])
        .collect();
    let sender = std::thread::spawn({
        let carbon_paths = carbon_paths.clone();
        move || {
            let mut stream = std::net::TcpStream::connect(carbon_addr).unwrap();
            for k in 0..40i64 {
                let lines: String = carbon_paths
                    .iter()
                    .map(|path| format!("{path} {k} {}\n", start + k * 10))
                    .collect();
                stream.write_all(lines.as_bytes()).unwrap();
                std::thread::sleep(Duration::from_millis(500));
            }
        }
    });
    let sent = send_load(agent.udp[0], Duration::from_secs(20), 50, 10).await;
    sender.join().unwrap();
    eventually(Duration::from_secs(10), "the carbon points placed", || {
        agent.metric("carbon_points_total{outcome=\"placed\"}") == 400.0
    })
    .await;
    end_the_chaos(agent, &proxy).await;
    for (i, &n) in sent.iter().enumerate() {
        let series = format!("load.{i}");
        let (own, other) = if i % 2 == 0 {
            ([1, 60], [10, 3600])
        } else {
            ([10, 3600], [1, 60])
        };
        for p in own {
            assert_eq!(redis.counter_total(p, &series), n, "{series} at {p}");
        }
        for p in other {
            assert_eq!(redis.counter_total(p, &series), 0, "{series} not at {p}");
        }
    }
    // (At 1 s the points are older than the hash keeps: in their blocks.)
    for path in &carbon_paths {
        let finest = if path.starts_with("c.fine.") { 1 } else { 10 };
        let held = redis.history(&format!("gauge:{finest}:{path}"));
        let want: BTreeMap<u64, f64> = (0..40)
            .map(|k| ((start + k * 10) as u64, k as f64))
            .collect();
        assert_eq!(held, want, "{path}");
    }
}

/// A carbon point of the present leaves the slice over it pending (`ZADD NX` into
/// `pending:gauge:`), and the writer adds a member it added before no more while no rollup
/// claim took members since (`claims:gauge:`, which the check reads and watches). Here the
/// faults that would lose a slice's rollup: a claim between two windows (the check reads it:
/// the next point adds the member again), and a claim between a chunk's check and its `EXEC`
/// (the transaction held by the proxy meanwhile): the `WATCH` breaks, nothing of that send is
/// applied, and the chunk sent again adds the member, so the next run makes the minute with
/// that point. The point itself lands once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollup_claim_racing_a_points_write_leaves_its_member_pending() {
    use statsd_redis::aggregate::ClosedWindow;
    use statsd_redis::aggregate::points::{Placed, SeriesPoints};
    use statsd_redis::storage_conf::Aggregation;
    use statsd_redis::store::{Chunker, Store, Writer};
    use std::sync::Arc;

    let (redis, port) = RedisServer::start_tcp();
    let proxy = FaultProxy::start(([127, 0, 0, 1], port).into(), 1).await;
    let config = Config {
        // The held transaction is released well within it.
        redis_timeout_ms: 10_000,
        ..via_proxy(&redis, &proxy)
    };
    let store = Store::open(&config).unwrap();
    let chunker = Chunker::new(store.keys().clone(), &config);
    let telemetry = Arc::new(statsd_redis::telemetry::Telemetry::new());
    let mut writer = Writer::new(store, None, telemetry);
    // A point of the 5 s archive (the book's precisions as archives), the minute over it open.
    let minute = unix_now() / 60 * 60;
    let chunk = |slice: u64, seq: u64| {
        let window = ClosedWindow {
            start: slice,
            points: vec![SeriesPoints {
                series: "c.a".into(),
                schema: 0,
                aggregation: Aggregation::default(),
                placed: vec![Placed {
                    archive: 1,
                    slice,
                    value: seq as f64,
                }],
            }],
            ..ClosedWindow::default()
        };
        let mut chunks = chunker.whole(&window);
        assert_eq!(chunks.len(), 1);
        chunks[0].seq = seq;
        vec![Arc::new(chunks.remove(0))]
    };
    let pending = || -> Vec<String> {
        redis::cmd("ZRANGE")
            .arg("pending:gauge:")
            .arg(0)
            .arg(-1)
            .query(&mut redis.conn())
            .unwrap()
    };
    let claim = |score: u64| claim_rollups(&mut redis.conn(), score);
    async fn write(writer: &mut Writer, chunks: Vec<Arc<statsd_redis::store::FlushChunk>>) {
        let written = writer.write_chunks("flush:c.1", &chunks, &[]).await;
        assert!(written.error.is_none(), "{:?}", written.error);
        assert_eq!(written.acknowledged, 1);
    }

    write(&mut writer, chunk(minute, 1)).await;
    let member = pending();
    assert_eq!(member.len(), 1, "the minute is pending");
    assert!(
        member[0].starts_with(&format!("3|{minute}|average|")),
        "{member:?}"
    );
    // Its index member and its pending member: two ZADDs. The next point adds neither.
    assert_eq!(redis.calls("zadd"), 2);
    write(&mut writer, chunk(minute + 5, 2)).await;
    assert_eq!(
        redis.calls("zadd"),
        2,
        "the member is pending still: not added again"
    );

    // A rollup run claims it between two windows: the next check reads the claim.
    let now = unix_now();
    assert_eq!(claim(now * 1_000_000 + 1), member);
    assert!(pending().is_empty());
    write(&mut writer, chunk(minute + 10, 3)).await;
    assert_eq!(pending(), member, "pending again after the claim");

    // A claim between the next chunk's check and its EXEC.
    proxy.set_mode(Mode::HoldNextFlush);
    let chunks = chunk(minute + 15, 4);
    let held = tokio::spawn(async move {
        // The held send's connection ends after its late delivery: the writer may say so
        // once, then sends the chunk again (its guard decides whether it was applied).
        let mut acknowledged = 0;
        for _ in 0..3 {
            let written = writer.write_chunks("flush:c.1", &chunks, &[true]).await;
            acknowledged += written.acknowledged;
            if written.error.is_none() {
                break;
            }
        }
        assert_eq!(acknowledged, 1);
        writer
    });
    eventually(Duration::from_secs(10), "the transaction is held", || {
        !proxy.held.lock().unwrap().is_empty()
    })
    .await;
    let held_bytes = String::from_utf8_lossy(&proxy.held.lock().unwrap()).into_owned();
    assert!(
        !held_bytes.contains("pending:gauge:"),
        "the held send adds no pending member: {held_bytes}"
    );
    assert_eq!(claim(now * 1_000_000 + 2), member);
    proxy.release();
    let mut writer = held.await.unwrap();
    assert_eq!(pending(), member, "the chunk sent again added it");
    let values: BTreeMap<String, f64> = redis::cmd("HGETALL")
        .arg("gauge:5:c.a")
        .query(&mut redis.conn())
        .unwrap();
    let expected: BTreeMap<String, f64> = (0..4)
        .map(|k| ((minute + 5 * k).to_string(), (k + 1) as f64))
        .collect();
    assert_eq!(values, expected, "each point once");

    // Another program's key of another type under the count's name: claims go on, uncounted,
    // and the writer, which cannot read the count, adds the member with every point.
    let _: () = redis::pipe()
        .cmd("DEL")
        .arg("claims:gauge:")
        .cmd("HSET")
        .arg("claims:gauge:")
        .arg("theirs")
        .arg(1)
        .query(&mut redis.conn())
        .unwrap();
    assert_eq!(claim(now * 1_000_000 + 3), member);
    let zadds = redis.calls("zadd");
    write(&mut writer, chunk(minute + 20, 5)).await;
    write(&mut writer, chunk(minute + 25, 6)).await;
    assert_eq!(pending(), member);
    assert_eq!(redis.calls("zadd"), zadds + 2, "a ZADD NX with each point");
}
