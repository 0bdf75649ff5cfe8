//! Redis Cluster mode against a private cluster of 3 masters and 3 replicas: every type end to
//! end, read back with the book's reader semantics; a reshard and a killed master under load,
//! with exact totals (nothing lost, nothing doubled); the cleaner across slots.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::topology::Cluster;
use common::*;
use statsd_redis::config::{Config, RedisMode};
use statsd_redis::store::{Cleaner, Store};
use statsd_redis::telemetry::Telemetry;

fn cluster_config(cluster: &Cluster) -> Config {
    Config {
        udp: vec!["127.0.0.1:0".parse().unwrap()],
        http: "127.0.0.1:0".parse().unwrap(),
        redis_mode: RedisMode::Cluster,
        redis_cluster_nodes: cluster.seeds(),
        ..Config::default()
    }
}

/// The book's `get_counter` on a cluster: the hash from the master that owns it, summed.
fn counter_total(cluster: &Cluster, precision: u64, series: &str) -> i64 {
    cluster
        .hgetall(&format!("count:{precision}:{series}"))
        .iter()
        .map(|(_, count)| count.parse::<i64>().unwrap())
        .sum()
}

fn query<T: redis::FromRedisValue>(cluster: &Cluster, key: &str, cmd: &mut redis::Cmd) -> T {
    cmd.query(&mut cluster.conn(cluster.node_of_key(key)))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_type_is_written_and_read_back_in_a_cluster() {
    let cluster = Cluster::start();
    let config = cluster_config(&cluster);
    let agent = TestAgent::start(config.clone());
    let now = unix_now();
    agent.send(
        b"hits:3|c\nhits:2|c\nweb.api:1|c|#route:cart\n\
          checkout:120|ms\ncheckout:80|ms\nsize:4|h\n\
          queue:7|g\nusers:alice|s\nusers:bob|s\n\
          _e{5,4}:title|text|t:error|#service:shop\n_sc|db.up|2|m:down\n_sc|}x|0",
    );
    // A window after it: a name that would make an empty hash tag holds nothing up.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    agent.send(b"after:1|c");
    assert_eq!(http_get(agent.http, "/readyz").0, 200);
    agent.stop().await;

    assert_eq!(
        cluster.zrange_withscores("common:{_}}x:info"),
        vec![("ok".to_string(), 1.0)]
    );
    for p in PRECISIONS {
        assert_eq!(counter_total(&cluster, p, "after"), 1, "precision {p}");
        assert_eq!(counter_total(&cluster, p, "hits"), 5, "precision {p}");
        assert_eq!(counter_total(&cluster, p, "web.api;route=cart"), 1);
        let gauge = cluster.hgetall(&format!("gauge:{p}:queue"));
        assert_eq!(gauge.len(), 1, "gauge at {p}");
        assert_eq!(gauge[0].1.parse::<f64>().unwrap(), 7.0);
        // The window is the second of the send, or the next one if it began meanwhile.
        let key = [now, now + 1]
            .map(|t| format!("set:{p}:users:{}", t / p * p))
            .into_iter()
            .find(|key| query::<bool>(&cluster, key, redis::cmd("EXISTS").arg(key)))
            .unwrap_or_else(|| panic!("no set at precision {p}"));
        let members: u64 = query(&cluster, &key, redis::cmd("PFCOUNT").arg(&key));
        assert_eq!(members, 2, "{key}");
    }
    let known: Vec<String> = query(
        &cluster,
        "known:",
        redis::cmd("ZRANGE").arg("known:").arg(0).arg(-1),
    );
    for p in PRECISIONS {
        assert!(known.contains(&format!("{p}:hits")), "{known:?}");
    }
    let known_gauges: Vec<String> = query(
        &cluster,
        "known:gauge:",
        redis::cmd("ZRANGE").arg("known:gauge:").arg(0).arg(-1),
    );
    assert_eq!(known_gauges.len(), PRECISIONS.len());
    let value: f64 = query(
        &cluster,
        "gauges:",
        redis::cmd("HGET").arg("gauges:").arg("queue"),
    );
    assert_eq!(value, 7.0);

    // The stats family takes the series in a hash tag; the book's get_stats reads it unchanged.
    let stats = cluster.zrange_withscores("stats:{checkout}:AccessTime");
    let score = |m: &str| stats.iter().find(|(k, _)| k == m).unwrap().1;
    assert_eq!((score("count"), score("sum")), (2.0, 200.0));
    assert_eq!((score("min"), score("max")), (80.0, 120.0));
    assert!(
        cluster
            .get_string("stats:{checkout}:AccessTime:start")
            .is_some()
    );
    let slowest = cluster.zrange_withscores("slowest:AccessTime");
    assert_eq!(slowest, vec![("checkout".to_string(), 100.0)]);
    // Quantile buckets: a hash per slice, each in its own slot, read back through the cluster
    // connection.
    let buckets = |key: &str| -> f64 {
        cluster
            .hgetall(key)
            .iter()
            .filter(|(f, _)| f != "a")
            .map(|(_, c)| c.parse::<f64>().unwrap())
            .sum()
    };
    let minute = [now, now + 1]
        .map(|t| format!("hist:60:checkout:AccessTime:{}", t / 60 * 60))
        .into_iter()
        .collect::<std::collections::BTreeSet<_>>()
        .iter()
        .map(|key| buckets(key))
        .sum::<f64>();
    assert_eq!(minute, 2.0);
    let mut reader = Store::open(&config).unwrap().reader().await.unwrap();
    let p100 = reader
        .quantiles(
            ("checkout", statsd_redis::aggregate::StatKind::Timer),
            &[1.0],
            statsd_redis::store::QuantileRange::hour(now),
            (false, None),
        )
        .await
        .unwrap()
        .unwrap()
        .quantiles[0]
        .1;
    assert!((p100 - 120.0).abs() <= 1.2, "{p100}");
    assert_eq!(cluster.zrange_withscores("stats:{size}:Histogram").len(), 5);

    let recent: Vec<String> = query(
        &cluster,
        "recent:shop:error",
        redis::cmd("LRANGE").arg("recent:shop:error").arg(0).arg(-1),
    );
    assert_eq!(recent.len(), 1);
    assert!(recent[0].ends_with(" title: text"), "{recent:?}");
    assert_eq!(
        cluster.zrange_withscores("common:{shop}:error"),
        vec![("title: text".to_string(), 1.0)]
    );
    assert_eq!(
        cluster.zrange_withscores("common:{db.up}:critical"),
        vec![("down".to_string(), 1.0)]
    );

    // The agent's own reader (CLI and API) through the cluster.
    let store = Store::open(&config).unwrap();
    let mut reader = store.reader().await.unwrap();
    let samples = reader.counter("hits", 60).await.unwrap();
    assert_eq!(samples.iter().map(|s| s.1).sum::<i64>(), 5);
    let stats = reader
        .stats("checkout", statsd_redis::aggregate::StatKind::Timer)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stats.average, 100.0);
    let names = reader.log_names(100).await.unwrap();
    assert!(
        names.contains(&("shop".to_string(), "error".to_string())),
        "{names:?}"
    );
    assert!(
        names.contains(&("db.up".to_string(), "critical".to_string())),
        "{names:?}"
    );
    let log = reader.log("shop", "error", 10).await.unwrap();
    assert_eq!(log.common, vec![("title: text".to_string(), 1.0)]);
    let now = unix_now();
    let sets = reader.set("users", 60, (now - 240, now)).await.unwrap();
    assert_eq!(sets.iter().map(|s| s.1).max(), Some(2));

    // The CLI, given the mode as flags.
    let out = bin()
        .args([
            "get",
            "stats",
            "checkout",
            "--json",
            "--redis-mode",
            "cluster",
        ])
        .args(["--redis-cluster-nodes", &cluster.seeds().join(",")])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(stats["average"], 100.0, "{stats}");
}

/// Exact totals of the `send_load` series at every precision, read from the cluster.
fn assert_exact(cluster: &Cluster, sent: &[i64]) {
    for p in PRECISIONS {
        for (i, &n) in sent.iter().enumerate() {
            let series = format!("load.{i}");
            assert_eq!(
                counter_total(cluster, p, &series),
                n,
                "{series} at precision {p}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reshard_under_load_neither_loses_nor_doubles() {
    let cluster = Arc::new(Cluster::start());
    let agent = TestAgent::start(cluster_config(&cluster));
    let masters = cluster.masters();
    let (a, b) = (masters[0], masters[1]);
    let resharding = {
        let cluster = cluster.clone();
        tokio::task::spawn_blocking(move || {
            cluster.reshard(a, b, 1024);
            cluster.reshard(b, a, 1024);
        })
    };
    // 200 series at 7 precisions: some of their keys are in the slots that move.
    let sent = send_load(agent.udp[0], Duration::from_secs(8), 50, 200).await;
    resharding.await.unwrap();
    eventually(Duration::from_secs(30), "backlog written", || {
        agent.metric("backlog_windows") == 0.0
    })
    .await;
    assert_eq!(agent.metric("windows_dropped_total"), 0.0);
    agent.stop().await;
    cluster.check();
    assert_eq!(cluster.keys_on_two_masters(), Vec::<String>::new());
    assert_exact(&cluster, &sent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_killed_under_load_loses_and_doubles_nothing() {
    let mut cluster = Cluster::start();
    // The cluster replicates asynchronously: without WAIT, chunks acknowledged an instant
    // before the kill could be lost with the master.
    let agent = TestAgent::start(Config {
        wait_replicas: 1,
        wait_timeout_ms: 200,
        redis_timeout_ms: 500,
        ..cluster_config(&cluster)
    });
    let load = tokio::spawn(send_load(agent.udp[0], Duration::from_secs(10), 50, 50));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let victim = cluster.masters()[0];
    cluster.kill(victim);
    cluster.wait_failover(victim, Duration::from_secs(30));
    // The promoted replica has no replica of its own: windows wait (WAIT 1 falls short) until
    // the old master is back as its replica.
    cluster.restart(victim);
    let sent = load.await.unwrap();
    eventually(Duration::from_secs(30), "backlog written", || {
        agent.metric("backlog_windows") == 0.0
    })
    .await;
    assert_eq!(agent.metric("windows_dropped_total"), 0.0);
    agent.stop().await;
    assert_exact(&cluster, &sent);
}

/// A cleaner (sample count 120) holding the lease.
async fn leased_cleaner(store: Store) -> Cleaner {
    leased_cleaner_of(store, &statsd_redis::config::Config::default().retention()).await
}

/// A cleaner of `retention` holding the lease, every precision due in its first pass.
async fn leased_cleaner_of(
    store: Store,
    retention: &statsd_redis::retention::Retention,
) -> Cleaner {
    let mut cleaner = Cleaner::new(
        store,
        "test".into(),
        Duration::from_secs(1),
        retention,
        Arc::new(Telemetry::new()),
    );
    assert!(cleaner.hold_lease().await.unwrap());
    cleaner
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cleaner_trims_hashes_in_every_slot_and_their_index_members() {
    let cluster = Cluster::start();
    let config = cluster_config(&cluster);
    let store = Store::open(&config).unwrap();
    // 40 series spread over the slots, each with 10 one-second slices far in the past and one
    // recent slice for the even ones.
    let now = unix_now();
    for i in 0..40 {
        let key = format!("count:1:old.{i}");
        let mut conn = cluster.conn(cluster.node_of_key(&key));
        for slice in 1000..1010 {
            let _: () = redis::cmd("HSET")
                .arg(&key)
                .arg(slice)
                .arg(1)
                .query(&mut conn)
                .unwrap();
        }
        if i % 2 == 0 {
            let _: () = redis::cmd("HSET")
                .arg(&key)
                .arg(now)
                .arg(1)
                .query(&mut conn)
                .unwrap();
        }
        let _: () = query(
            &cluster,
            "known:",
            redis::cmd("ZADD")
                .arg("known:")
                .arg(0)
                .arg(format!("1:old.{i}")),
        );
    }
    let mut cleaner = leased_cleaner(store).await;
    let report = cleaner.pass(now).await.unwrap();
    assert_eq!(report.slices_removed, 400);
    assert_eq!(report.hashes_removed, 20);
    let known: Vec<String> = query(
        &cluster,
        "known:",
        redis::cmd("ZRANGE").arg("known:").arg(0).arg(-1),
    );
    assert_eq!(known.len(), 20);
    assert!(
        known
            .iter()
            .all(|m| m.trim_start_matches("1:old.").parse::<u32>().unwrap() % 2 == 0)
    );
    for i in (0..40).step_by(2) {
        assert_eq!(cluster.hgetall(&format!("count:1:old.{i}")).len(), 1);
    }
}

/// With `retentions`, every slot's hashes are trimmed at their own precision's count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cleaner_trims_each_precision_at_its_count_in_every_slot() {
    let cluster = Cluster::start();
    let store = Store::open(&cluster_config(&cluster)).unwrap();
    let now = unix_now() / 3600 * 3600;
    for i in 0..20 {
        for (p, member) in [(10, format!("10:s.{i}")), (60, format!("60:s.{i}"))] {
            let key = format!("count:{member}");
            let mut conn = cluster.conn(cluster.node_of_key(&key));
            for k in 0..100 {
                let _: () = redis::cmd("HSET")
                    .arg(&key)
                    .arg(now - k * p)
                    .arg(1)
                    .query(&mut conn)
                    .unwrap();
            }
            let _: () = query(
                &cluster,
                "known:",
                redis::cmd("ZADD").arg("known:").arg(0).arg(&member),
            );
        }
    }
    let retention = statsd_redis::retention::Retention::parse("10s:5m,1m:1h").unwrap();
    let mut cleaner = leased_cleaner_of(store, &retention).await;
    let report = cleaner.pass(now).await.unwrap();
    // 30 of 100 slices of 10 s kept, 60 of 100 of a minute: 70 + 40 removed per series.
    assert_eq!(report.slices_removed, 20 * (70 + 40));
    for i in 0..20 {
        assert_eq!(cluster.hgetall(&format!("count:10:s.{i}")).len(), 30);
        assert_eq!(cluster.hgetall(&format!("count:60:s.{i}")).len(), 60);
    }
}

/// Across slots, the cleaner removes the `gauges:` fields of idle gauges (their history lives
/// in other slots than `gauges:`), the hourly statistics whose next hour is over (found with
/// `SCAN` on every master) and the `slowest:AccessTime` members whose statistics are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cleaner_forgets_idle_gauges_and_slowest_members_across_slots() {
    let cluster = Cluster::start();
    let store = Store::open(&cluster_config(&cluster)).unwrap();
    let now = unix_now();
    for i in 0..40 {
        let key = format!("gauge:1:g.{i}");
        // The even ones written now, the odd ones two days ago.
        let slice = if i % 2 == 0 { now } else { now - 2 * 86_400 };
        let mut conn = cluster.conn(cluster.node_of_key(&key));
        let _: () = redis::cmd("HSET")
            .arg(&key)
            .arg(slice)
            .arg(i)
            .query(&mut conn)
            .unwrap();
        let _: () = query(
            &cluster,
            "gauges:",
            redis::cmd("HSET")
                .arg("gauges:")
                .arg(format!("g.{i}"))
                .arg(i),
        );
    }
    for (series, stats) in [("kept", true), ("gone", false)] {
        let _: () = query(
            &cluster,
            "slowest:AccessTime",
            redis::cmd("ZADD")
                .arg("slowest:AccessTime")
                .arg(1)
                .arg(series),
        );
        if stats {
            let key = format!("stats:{{{series}}}:AccessTime");
            let _: () = query(
                &cluster,
                &key,
                redis::cmd("ZADD").arg(&key).arg(1).arg("count"),
            );
        }
    }
    // The statistics of a name that stopped long ago, their slowest: member with them.
    for (key, value) in [
        ("stats:{old}:AccessTime:start", "2000-01-01T00:00:00"),
        ("stats:{old}:AccessTime:pstart", "1999-12-31T23:00:00"),
    ] {
        let _: () = query(&cluster, key, redis::cmd("SET").arg(key).arg(value));
    }
    let key = "stats:{old}:AccessTime";
    let _: () = query(
        &cluster,
        key,
        redis::cmd("ZADD").arg(key).arg(1).arg("count"),
    );
    let _: () = query(
        &cluster,
        "slowest:AccessTime",
        redis::cmd("ZADD")
            .arg("slowest:AccessTime")
            .arg(5)
            .arg("old"),
    );
    let mut cleaner = leased_cleaner(store).await;
    let report = cleaner.pass(now).await.unwrap();
    assert_eq!((report.gauges_removed, report.slowest_removed), (20, 2));
    // The hour's ZSET and :start, and :pstart (its :last is not there).
    assert_eq!(report.stats_removed, 3);
    for key in ["stats:{old}:AccessTime", "stats:{old}:AccessTime:start"] {
        assert!(
            !query::<bool>(&cluster, key, redis::cmd("EXISTS").arg(key)),
            "{key}"
        );
    }
    let mut fields: Vec<String> = query(&cluster, "gauges:", redis::cmd("HKEYS").arg("gauges:"));
    fields.sort_by_key(|f| f[2..].parse::<u32>().unwrap());
    assert_eq!(
        fields,
        (0..40)
            .step_by(2)
            .map(|i| format!("g.{i}"))
            .collect::<Vec<_>>()
    );
    let slowest = cluster.zrange_withscores("slowest:AccessTime");
    assert_eq!(slowest, vec![("kept".to_string(), 1.0)]);
}

/// The cleaner's re-check against a writer racing it. In a cluster the cleaner trims a hash in
/// its slot, then removes the member of a hash that was emptied from `known:` (another slot):
/// a writer that makes the hash anew in between, and adds its member before that removal,
/// would leave a hash the cleaner can no longer see, unless the cleaner checks each hash again
/// after the removal. A thread writes an old (trimmable) slice into 16 hashes and, as the flush
/// script does, adds a hash's member when the slice is new, as fast as it can, while the
/// cleaner runs pass after pass: every hash that exists at the end has its member. (Without
/// the re-check this test fails.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_racing_the_cleaner_never_leaves_a_hash_unindexed() {
    let cluster = Arc::new(Cluster::start());
    let store = Store::open(&cluster_config(&cluster)).unwrap();
    let now = unix_now();
    let hashes: Vec<String> = (0..16).map(|i| format!("race.{i}")).collect();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (cluster, stop, hashes) = (cluster.clone(), stop.clone(), hashes.clone());
        std::thread::spawn(move || {
            let mut conns: Vec<_> = hashes
                .iter()
                .map(|h| cluster.conn(cluster.node_of_key(&format!("count:1:{h}"))))
                .collect();
            let mut known = cluster.conn(cluster.node_of_key("known:"));
            let mut writes = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for (h, conn) in hashes.iter().zip(&mut conns) {
                    // A slice older than sample_count (120) seconds: the next trim empties it.
                    // As the flush script does, the member is added with a new slice only.
                    let count: i64 = redis::cmd("HINCRBY")
                        .arg(format!("count:1:{h}"))
                        .arg(now - 1000)
                        .arg(1)
                        .query(conn)
                        .unwrap();
                    if count == 1 {
                        let _: () = redis::cmd("ZADD")
                            .arg("known:")
                            .arg(0)
                            .arg(format!("1:{h}"))
                            .query(&mut known)
                            .unwrap();
                    }
                    writes += 1;
                }
            }
            writes
        })
    };
    let mut cleaner = leased_cleaner(store).await;
    let mut removed = 0;
    for _ in 0..300 {
        removed += cleaner.pass(now).await.unwrap().hashes_removed;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let writes = writer.join().unwrap();
    let known: Vec<String> = query(
        &cluster,
        "known:",
        redis::cmd("ZRANGE").arg("known:").arg(0).arg(-1),
    );
    let unindexed: Vec<&String> = hashes
        .iter()
        .filter(|h| {
            let key = format!("count:1:{h}");
            query::<bool>(&cluster, &key, redis::cmd("EXISTS").arg(&key))
                && !known.contains(&format!("1:{h}"))
        })
        .collect();
    assert!(unindexed.is_empty(), "hashes left unindexed: {unindexed:?}");
    assert!(
        removed > 100 && writes > 1000,
        "the race ran: {removed} hashes removed, {writes} writes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coarse_writes_are_exact_in_a_cluster_too() {
    let cluster = Cluster::start();
    let agent = TestAgent::start(Config {
        coarse_write_secs: Some(5),
        ..cluster_config(&cluster)
    });
    let sent = send_load(agent.udp[0], Duration::from_secs(4), 50, 50).await;
    agent.send(b"coarse.t:10|ms\ncoarse.t:30|ms");
    // The stop writes every sum the agent still holds.
    agent.stop().await;
    assert_exact(&cluster, &sent);
    let stats = cluster.zrange_withscores("stats:{coarse.t}:AccessTime");
    let score = |m: &str| stats.iter().find(|(k, _)| k == m).unwrap().1;
    assert_eq!((score("count"), score("sum")), (2.0, 40.0));
    let known: Vec<String> = query(
        &cluster,
        "known:",
        redis::cmd("ZRANGE").arg("known:").arg(0).arg(-1),
    );
    for p in PRECISIONS {
        assert!(known.contains(&format!("{p}:load.0")), "{p}: {known:?}");
    }
}

/// The slot chunks of `window` as the agent makes them for `cluster`, each numbered `seq`.
fn slot_chunks(
    cluster: &Cluster,
    keys: &statsd_redis::store::Keys,
    window: &statsd_redis::aggregate::ClosedWindow,
    seq: u64,
) -> Vec<Arc<statsd_redis::store::FlushChunk>> {
    use statsd_redis::store::{Chunker, CounterWrite, build_slot_chunks};
    let settings = Chunker::new(keys.clone(), &cluster_config(cluster)).settings;
    build_slot_chunks(window, &CounterWrite::everywhere(&PRECISIONS), &settings)
        .into_iter()
        .map(|mut c| {
            c.seq = seq;
            Arc::new(c)
        })
        .collect()
}

/// A slot chunk sent again after its reply was lost is not applied again, and the index members
/// of all its hashes are added again and its timers' averages read back, so the follow-ups miss
/// none of what it added.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunk_sent_again_is_applied_once_and_its_follow_ups_made_again() {
    use statsd_redis::aggregate::{ClosedWindow, StatKind, Stats};
    use statsd_redis::store::{FollowUps, Writer};

    let cluster = Cluster::start();
    let store = Store::open(&cluster_config(&cluster)).unwrap();
    let timer = |sum: f64| Stats {
        count: 2.0,
        sum,
        sumsq: 500.0,
        min: 10.0,
        max: 20.0,
        buckets: Default::default(),
        values: Vec::new(),
    };
    let window = ClosedWindow {
        start: unix_now(),
        counters: (0..30).map(|i| (format!("again.{i}").into(), 2)).collect(),
        stats: vec![
            // A name that starts with `}` is tagged `{_}}t`: its series comes back whole.
            ("}t".into(), StatKind::Timer, timer(50.0)),
            (
                "again.t".into(),
                StatKind::Timer,
                Stats {
                    buckets: {
                        let m = statsd_redis::aggregate::Mapping::default();
                        let mut b = statsd_redis::aggregate::Buckets::default();
                        b.add(m.bucket(10.0), 1.0);
                        b.add(m.bucket(20.0), 1.0);
                        b
                    },
                    ..timer(30.0)
                },
            ),
        ],
        ..ClosedWindow::default()
    };
    let chunks = slot_chunks(&cluster, store.keys(), &window, 1);
    let mut writer = Writer::new(store, None, Arc::new(Telemetry::new()));
    let (mut first, mut again) = (FollowUps::default(), FollowUps::default());
    let written = writer
        .write_slots("flush:t.1:", &chunks, &[], &mut first)
        .await;
    assert!(written.error.is_none(), "{:?}", written.error);
    assert_eq!(written.replayed, 0);
    let written = writer
        .write_slots("flush:t.1:", &chunks, &[], &mut again)
        .await;
    assert!(written.acknowledged.iter().all(|a| *a));
    assert_eq!(written.replayed, chunks.len());
    let sorted = |f: &FollowUps| {
        let mut known = f.known.clone();
        known.sort();
        known
    };
    assert_eq!(first.known.len(), 30 * PRECISIONS.len());
    let mut slowest = first.slowest.clone();
    slowest.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        slowest,
        vec![(b"again.t".to_vec(), 15.0), (b"}t".to_vec(), 25.0)]
    );
    assert_eq!(sorted(&first), sorted(&again));
    // The replay's averages are read back from the stats keys when its follow-ups are written.
    let _: () = query(
        &cluster,
        "slowest:AccessTime",
        redis::cmd("DEL").arg("slowest:AccessTime"),
    );
    writer.write_follow_ups(&again).await.unwrap();
    let ranked: Vec<(String, f64)> = query(
        &cluster,
        "slowest:AccessTime",
        redis::cmd("ZRANGE")
            .arg("slowest:AccessTime")
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES"),
    );
    assert_eq!(ranked, vec![("again.t".into(), 15.0), ("}t".into(), 25.0)]);

    // Sent again once a later chunk of each slot was applied: not applied either.
    let later: Vec<Arc<_>> = chunks
        .iter()
        .map(|c| {
            let mut c = (**c).clone();
            c.seq = 2;
            Arc::new(c)
        })
        .collect();
    let mut ignored = FollowUps::default();
    assert!(
        writer
            .write_slots("flush:t.1:", &later, &[], &mut ignored)
            .await
            .error
            .is_none()
    );
    let mut replayed = FollowUps::default();
    let written = writer
        .write_slots("flush:t.1:", &chunks, &[], &mut replayed)
        .await;
    assert_eq!(written.replayed, chunks.len());
    assert_eq!(sorted(&replayed), sorted(&first));
    // Applied once each: the first chunks and the later ones (a copy of theirs, numbered 2).
    for p in PRECISIONS {
        assert_eq!(counter_total(&cluster, p, "again.7"), 4, "precision {p}");
    }
}

/// The slot guards keep no TTL: a run's first chunk in a slot drops the fields of runs idle for
/// a week, and only those. A live run's field survives, so a late copy of its chunk is still
/// refused after another run started writing into the slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_run_drops_only_the_guard_fields_of_runs_idle_for_a_week() {
    use statsd_redis::aggregate::ClosedWindow;
    use statsd_redis::store::keys::slot_tags;
    use statsd_redis::store::{FollowUps, Writer};

    let cluster = Cluster::start();
    let store = Store::open(&cluster_config(&cluster)).unwrap();
    let keys = store.keys().clone();
    let window = ClosedWindow {
        start: unix_now(),
        counters: vec![("prune.c".into(), 3)],
        ..ClosedWindow::default()
    };
    let numbered = |seq| slot_chunks(&cluster, &keys, &window, seq);
    let chunks = numbered(1);
    let tags = slot_tags();
    let guards: Vec<String> = chunks
        .iter()
        .map(|c| keys.slot_guard(&tags[c.slot() as usize], "flush:x:").0)
        .collect();
    let day = 86_400;
    for guard in &guards {
        let _: () = query(
            &cluster,
            guard,
            redis::cmd("HSET")
                .arg(guard)
                .arg("idle.run")
                .arg(format!("5 {}", unix_now() - 8 * day))
                .arg("live.run")
                .arg(format!("5 {}", unix_now() - day)),
        );
    }

    let mut writer = Writer::new(store, None, Arc::new(Telemetry::new()));
    let written = writer
        .write_slots("flush:new.run:", &chunks, &[], &mut FollowUps::default())
        .await;
    assert!(written.error.is_none(), "{:?}", written.error);
    assert_eq!(written.replayed, 0);
    for guard in &guards {
        let mut fields: Vec<String> = query(&cluster, guard, redis::cmd("HKEYS").arg(guard));
        fields.sort();
        assert_eq!(fields, ["live.run", "new.run"], "{guard}");
    }

    // A late copy of the live run's fifth chunks: applied before, not again.
    let written = writer
        .write_slots(
            "flush:live.run:",
            &numbered(5),
            &[],
            &mut FollowUps::default(),
        )
        .await;
    assert_eq!(written.replayed, chunks.len());
    for p in PRECISIONS {
        assert_eq!(counter_total(&cluster, p, "prune.c"), 3, "precision {p}");
    }
}

/// Another program's keys of the wrong type where the hot keys go: the follow-ups that Redis
/// refuses are counted and skipped, and later windows are written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_key_at_an_index_holds_up_nothing() {
    let cluster = Cluster::start();
    for key in ["known:", "slowest:AccessTime"] {
        let _: () = query(&cluster, key, redis::cmd("SET").arg(key).arg("not ours"));
    }
    let agent = TestAgent::start(cluster_config(&cluster));
    agent.send(b"first:1|c\nfirst.t:5|ms");
    eventually(Duration::from_secs(10), "refusals counted", || {
        agent.metric("write_failures_total{reason=\"wrong_type\"}") >= 2.0
    })
    .await;
    agent.send(b"second:1|c");
    eventually(Duration::from_secs(10), "the next window written", || {
        counter_total(&cluster, 1, "second") == 1
    })
    .await;
    eventually(
        Duration::from_secs(10),
        "nothing left in the backlog",
        || agent.metric("backlog_windows") == 0.0,
    )
    .await;
    agent.stop().await;
    for p in PRECISIONS {
        assert_eq!(counter_total(&cluster, p, "first"), 1, "precision {p}");
        assert_eq!(counter_total(&cluster, p, "second"), 1, "precision {p}");
    }
}

/// With `wait_replicas`, a window's slot chunks count as written only once `WAIT` saw them
/// replicated. A master that refuses writes (out of memory) ends the pass in an error after the
/// other masters' chunks were answered: none of them counts (they would be lost with a master dying before its
/// replica had them), they go again, answered *applied before*, and are waited for then. A
/// lagging replica makes the next `WAIT` short: again none counts. The follow-ups gathered on
/// the way are all kept, so once written, every hash has its index member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunks_count_only_once_waited_for_and_their_index_members_are_kept() {
    use statsd_redis::aggregate::ClosedWindow;
    use statsd_redis::store::{FollowUps, Writer};

    let mut cluster = Cluster::start();
    // The WAIT's 300 ms well inside the reply timeout: on a loaded machine a WAIT sent to every
    // master and answered after a little more than 300 ms must be a short WAIT, not a timeout.
    let config = Config {
        redis_timeout_ms: 3_000,
        ..cluster_config(&cluster)
    };
    let store = Store::open(&config).unwrap();
    let window = ClosedWindow {
        start: unix_now(),
        counters: (0..300)
            .map(|i| (format!("waited.{i}").into(), 2))
            .collect(),
        ..ClosedWindow::default()
    };
    let chunks = slot_chunks(&cluster, store.keys(), &window, 1);
    let telemetry = Arc::new(Telemetry::new());
    let mut writer = Writer::new(store, Some((1, 300)), telemetry.clone());
    let mut follow_ups = FollowUps::default();
    let masters = cluster.masters();
    let (refusing, lagging) = (masters[0], cluster.replica_of(masters[1]).unwrap());
    let maxmemory = |port: u16, bytes: &str| {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory")
            .arg(bytes)
            .query(&mut cluster.conn(port))
            .unwrap();
    };

    // One master out of memory refuses its chunks; the others answer theirs first.
    maxmemory(refusing, "1");
    let written = writer
        .write_slots("flush:w.1:", &chunks, &[], &mut follow_ups)
        .await;
    assert!(written.error.is_some());
    assert!(
        !written.acknowledged.iter().any(|a| *a),
        "chunks answered in a pass that failed count as written without a WAIT"
    );
    maxmemory(refusing, "0");
    cluster.pause(lagging, true);
    let sent = vec![true; chunks.len()];
    let written = writer
        .write_slots("flush:w.1:", &chunks, &sent, &mut follow_ups)
        .await;
    let error = written.error.map(|e| e.to_string()).unwrap_or_default();
    assert!(
        error.contains("fewer replicas"),
        "a lagging replica: a short WAIT, not {error:?}"
    );
    assert!(!written.acknowledged.iter().any(|a| *a));
    cluster.pause(lagging, false);
    // The replica catches up within a few tries.
    let mut written = None;
    for _ in 0..20 {
        let w = writer
            .write_slots("flush:w.1:", &chunks, &sent, &mut follow_ups)
            .await;
        if w.error.is_none() {
            written = Some(w);
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let written = written.expect("written once the replica is back");
    assert!(written.acknowledged.iter().all(|a| *a));
    writer.write_follow_ups(&follow_ups).await.unwrap();
    let known: std::collections::HashSet<String> = cluster
        .zrange_withscores("known:")
        .into_iter()
        .map(|(m, _)| m)
        .collect();
    for i in 0..300 {
        for p in PRECISIONS {
            assert_eq!(counter_total(&cluster, p, &format!("waited.{i}")), 2);
            assert!(known.contains(&format!("{p}:waited.{i}")), "{p}:waited.{i}");
        }
    }
    let short: f64 = telemetry
        .render()
        .lines()
        .find_map(|l| l.strip_prefix("statsd_redis_replica_waits_short_total "))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    assert!(short >= 1.0, "a short WAIT counted");
}

/// A long archive in a cluster: the cleaner moves each series' older minutes into blocks in
/// its hash's slot (the blocks' names carry the slot's hash tag), counters and gauges of
/// series spread over every master, and the Graphite API reads every minute back as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_archives_move_into_blocks_in_their_hashs_slot() {
    let cluster = Cluster::start();
    let t = unix_now() / 60 * 60 - 60;
    let config = Config {
        retentions: "1s:1h,1m:90d".into(),
        cleaner_enabled: false,
        coarse_write_secs: Some(0),
        quantile_write_secs: 0,
        ..cluster_config(&cluster)
    };
    let agent = TestAgent::start_at(
        config.clone(),
        statsd_redis::store::clock::Clock::manual(Duration::from_secs(t)),
    );
    let mut lines = Vec::new();
    for i in 0..12 {
        for k in 1..=30u64 {
            let at = t - k * 7_200;
            lines.push(format!("hc.{i}:{k}|c|T{at}"));
            lines.push(format!("hg.{i}:{k}|g|T{at}"));
        }
        // A timer's value now: the hour's statistics name it.
        lines.push(format!("ht.{i}:1|ms"));
    }
    for batch in lines.chunks(40) {
        agent.send_taken(batch.join("\n").as_bytes()).await;
    }
    agent.send_taken(b"tick:1|c").await;
    agent.tick();
    eventually(Duration::from_secs(10), "the window written", || {
        counter_total(&cluster, 1, "tick") == 1
    })
    .await;
    let from = t - 31 * 7_200;
    let render = |target: &str| {
        curl_json(&format!(
            "http://{}/graphite/render?target={target}&from={from}&until={t}&format=json",
            agent.http
        ))
    };
    let total = |v: &serde_json::Value| -> f64 {
        v.as_array()
            .unwrap_or_else(|| panic!("{v}"))
            .iter()
            .flat_map(|s| s["datapoints"].as_array().unwrap().iter())
            .filter_map(|p| p[0].as_f64())
            .sum()
    };
    // Every minute written, and indexed (a cluster's index members come with the chunks'
    // follow-ups), before the first render: the Graphite API keeps the names it found a while.
    eventually(
        Duration::from_secs(30),
        "every minute written and indexed",
        || {
            (0..12).all(|i| {
                let indexed = |index: &str, member: String| {
                    query::<Option<f64>>(
                        &cluster,
                        index,
                        redis::cmd("ZSCORE").arg(index).arg(member),
                    )
                    .is_some()
                };
                cluster.hgetall(&format!("count:60:hc.{i}")).len() == 30
                    && cluster.hgetall(&format!("gauge:60:hg.{i}")).len() == 30
                    && indexed("known:", format!("60:hc.{i}"))
                    && indexed("known:gauge:", format!("60:hg.{i}"))
            })
        },
    )
    .await;
    // Sets' minutes as the agent writes them (a HyperLogLog a slice, in any slot): k members.
    for i in 0..12 {
        for k in 1..=30u64 {
            let key = format!("set:60:hs.{i}:{}", (t - k * 7_200) / 60 * 60);
            let members: Vec<String> = (0..k).map(|m| format!("m{m}")).collect();
            let _: u64 = query(&cluster, &key, redis::cmd("PFADD").arg(&key).arg(&members));
        }
    }
    // Timers' minutes as the agent writes their quantile buckets (a hash a slice, in any
    // slot): k values of bucket 345.
    let hist = |i: u64, k: u64| format!("hist:60:ht.{i}:AccessTime:{}", (t - k * 7_200) / 60 * 60);
    for i in 0..12 {
        for k in 1..=30u64 {
            let key = hist(i, k);
            let _: () = query(
                &cluster,
                &key,
                redis::cmd("HSET")
                    .arg(&key)
                    .arg("a")
                    .arg("0.01")
                    .arg("345")
                    .arg(k),
            );
        }
    }
    assert_eq!(total(&render("hc.*")), 12.0 * 465.0);
    assert_eq!(total(&render("hg.*")), 12.0 * 465.0);
    let (counts, gauges) = (render("hc.*"), render("hg.*"));
    let store = Store::open(&config).unwrap();
    let mut cleaner = leased_cleaner_of(store, &config.retention())
        .await
        .packing(&config.quantile_precisions, &config.retention());
    let report = cleaner.pass(t + 1).await.unwrap();
    // Each hash keeps its newest minute (and with it its index member); every set minute and
    // every timer's minute but the open one moves.
    assert_eq!(report.slices_moved, 2 * 12 * 29 + 2 * 12 * 30, "{report:?}");
    for i in 0..12 {
        assert_eq!(cluster.hgetall(&format!("count:60:hc.{i}")).len(), 1);
    }
    assert_eq!(render("hc.*"), counts);
    assert_eq!(render("hg.*"), gauges);
    // A counter's samples from the JSON API: its hash and its blocks read in one transaction,
    // in the hash's slot.
    for i in [0, 7] {
        let answer = curl_json(&format!(
            "http://{}/api/v1/counter/hc.{i}?precision=60",
            agent.http
        ));
        let samples = answer["samples"].as_array();
        let sum: f64 = (samples.unwrap_or_else(|| panic!("{answer}")).iter())
            .filter_map(|s| s[1].as_f64())
            .sum();
        assert_eq!(sum, 465.0, "{answer}");
    }
    // The sets' minutes, read from their blocks (a reader asks the HyperLogLogs only of the
    // minutes the cleaner may not have moved yet), and their names found from the blocks
    // alone, on every master.
    assert_eq!(total(&render("hs.*")), 12.0 * 465.0);
    for i in 0..12 {
        for k in 1..=30u64 {
            let key = format!("set:60:hs.{i}:{}", (t - k * 7_200) / 60 * 60);
            let left: u64 = query(&cluster, &key, redis::cmd("EXISTS").arg(&key));
            assert_eq!(left, 0, "{key}");
        }
    }
    // The timers' minutes, packed into blocks named in the slot of their series' name.
    assert_eq!(total(&render("ht.*.count")), 12.0 * (465.0 + 1.0));
    for i in 0..12 {
        for k in 1..=30u64 {
            let key = hist(i, k);
            let left: u64 = query(&cluster, &key, redis::cmd("EXISTS").arg(&key));
            assert_eq!(left, 0, "{key}");
        }
    }
    let found = curl_json(&format!(
        "http://{}/api/v1/series?type=set&precision=60&match=hs.*",
        agent.http
    ));
    assert_eq!(
        found["series"].as_array().map(Vec::len),
        Some(12),
        "{found}"
    );
    agent.stop().await;
}
