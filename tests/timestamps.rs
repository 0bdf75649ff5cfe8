//! DogStatsD's `|T<unix seconds>` on counters and gauges: each value lands in the slices of its
//! own second, at every precision whose retention still holds it, on one server and in a
//! cluster; values too old or too far ahead are counted and dropped, timestamps on other types
//! counted and taken as of now; a SIGKILL with a spool writes them exactly once.

mod common;

use std::collections::BTreeMap;
use std::net::UdpSocket;
use std::time::Duration;

use common::topology::Cluster;
use common::*;
use statsd_redis::config::{Config, RedisMode};
use statsd_redis::store::clock::Clock;

/// `sample_count` at the defaults: a slice of precision p is kept while it is within 120 p.
const SAMPLES: u64 = 120;

/// The hash `key` as slice start → value.
type Read<'a> = &'a dyn Fn(&str) -> Vec<(String, String)>;

fn slices<T: std::str::FromStr>(read: Read<'_>, key: &str) -> BTreeMap<u64, T>
where
    T::Err: std::fmt::Debug,
{
    read(key)
        .into_iter()
        .map(|(slice, v)| (slice.parse().unwrap(), v.parse().unwrap()))
        .collect()
}

/// Whether precision `p` still holds second `at` when the window ending at `end` is written.
fn retained(at: u64, p: u64, end: u64) -> bool {
    at / p * p + SAMPLES * p > end
}

/// Sends, in the window starting at `t` of an agent whose clock stands at `t`, counters and
/// gauges stamped 10 s, 10 min and 2 h back, 5 s and 1 h ahead and 200 days back, a timer
/// stamped, and unstamped values; then, in the next window, a gauge value older than the
/// gauge's latest. Checks every precision's slices, `gauges:`, and the counts by outcome.
async fn land_where_they_belong(agent: &TestAgent, read: Read<'_>, t: u64) {
    let counters = [(t - 10, 1), (t - 600, 2), (t - 7200, 4)];
    let gauges = [(t - 7200, 1.0), (t - 600, 2.0), (t - 10, 3.0)];
    let mut lines: Vec<String> = counters
        .iter()
        .map(|(at, n)| format!("st.c:{n}|c|T{at}"))
        .collect();
    lines.extend(gauges.iter().map(|(at, v)| format!("st.g:{v}|g|#|T{at}")));
    lines.extend([
        format!("st.c:8|c|T{}", t + 5),
        format!("st.c:16|c|T{}", t + 3600),
        format!("st.c:32|c|@0.5|T{}", t - 200 * 86_400),
        "st.c:64|c".to_string(),
        "st.g:4|g".to_string(),
        format!("st.t:5|ms|T{}", t - 10),
    ]);
    agent.send_taken(lines.join("\n").as_bytes()).await;
    agent.tick();
    let end = t + 1;
    eventually(Duration::from_secs(10), "the window written", || {
        slices::<i64>(read, "count:1:st.c").get(&t) == Some(&72)
    })
    .await;
    for p in PRECISIONS {
        let mut want: BTreeMap<u64, i64> = BTreeMap::new();
        for (at, n) in counters.iter().filter(|(at, _)| retained(*at, p, end)) {
            *want.entry(at / p * p).or_default() += n;
        }
        // 5 s ahead counts in the window it came in, with the unstamped 64.
        *want.entry(t / p * p).or_default() += 8 + 64;
        let key = format!("count:{p}:st.c");
        assert_eq!(slices::<i64>(read, &key), want, "{key}");

        let mut want: BTreeMap<u64, f64> = BTreeMap::new();
        for (at, v) in gauges.iter().filter(|(at, _)| retained(*at, p, end)) {
            want.insert(at / p * p, *v);
        }
        want.insert(t / p * p, 4.0);
        let key = format!("gauge:{p}:st.g");
        assert_eq!(slices::<f64>(read, &key), want, "{key}");
    }
    let current = |read: Read<'_>| -> Option<f64> {
        read("gauges:")
            .into_iter()
            .find(|(name, _)| name == "st.g")
            .map(|(_, v)| v.parse().unwrap())
    };
    assert_eq!(current(read), Some(4.0));
    for (outcome, n) in [
        ("earlier", 6.0),
        ("current", 1.0),
        ("too_old", 1.0),
        ("too_far_ahead", 1.0),
        ("ignored", 1.0),
    ] {
        let metric = format!("timestamped_samples_total{{outcome=\"{outcome}\"}}");
        assert_eq!(agent.metric(&metric), n, "{metric}");
    }
    assert_eq!(agent.metric("bad_lines_total"), 0.0);

    // An older value than the gauge's latest (4, at t): written where no later value is; the
    // slices holding 4 keep it, and so does `gauges:`.
    let before: Vec<BTreeMap<u64, f64>> = PRECISIONS
        .iter()
        .map(|p| slices(read, &format!("gauge:{p}:st.g")))
        .collect();
    let at = t - 300;
    agent.send_taken(format!("st.g:9|g|T{at}").as_bytes()).await;
    agent.tick();
    eventually(Duration::from_secs(10), "the next window written", || {
        slices::<f64>(read, "gauge:1:st.g").contains_key(&(t + 1))
    })
    .await;
    for (p, mut want) in PRECISIONS.into_iter().zip(before) {
        if retained(at, p, end + 1) && at / p * p != t / p * p {
            want.insert(at / p * p, 9.0);
        }
        // The current value again, in the window the older one came in.
        want.insert((t + 1) / p * p, 4.0);
        let key = format!("gauge:{p}:st.g");
        assert_eq!(slices::<f64>(read, &key), want, "{key}");
    }
    assert_eq!(current(read), Some(4.0));
}

/// A moment half a minute into one, a little while ago.
fn moment() -> u64 {
    unix_now() / 60 * 60 - 60 + 30
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timestamped_values_land_in_their_own_second() {
    let redis = RedisServer::start();
    let t = moment();
    let config = Config {
        cleaner_enabled: false,
        ..test_config(&redis)
    };
    let agent = TestAgent::start_at(config, Clock::manual(Duration::from_secs(t)));
    let read = |key: &str| -> Vec<(String, String)> {
        redis::cmd("HGETALL")
            .arg(key)
            .query(&mut redis.conn())
            .unwrap()
    };
    land_where_they_belong(&agent, &read, t).await;
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timestamped_values_land_in_their_own_second_in_a_cluster() {
    let cluster = Cluster::start();
    let t = moment();
    let config = Config {
        udp: vec!["127.0.0.1:0".parse().unwrap()],
        http: "127.0.0.1:0".parse().unwrap(),
        redis_mode: RedisMode::Cluster,
        redis_cluster_nodes: cluster.seeds(),
        cleaner_enabled: false,
        ..Config::default()
    };
    let agent = TestAgent::start_at(config, Clock::manual(Duration::from_secs(t)));
    let read = |key: &str| cluster.hgetall(key);
    land_where_they_belong(&agent, &read, t).await;
    agent.stop().await;
}

/// Timestamped counters sent while Redis is down, spooled, SIGKILL, restart: each lands once,
/// at each precision that holds its second. (Ages away from the retention edges, so that the
/// second the windows close in does not matter: 10 s, 400 s, 5000 s.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timestamped_values_survive_a_sigkill_with_a_spool_exactly_once() {
    let mut redis = RedisServer::start();
    let spool = tempfile::tempdir().unwrap();
    let spool_dir = spool.path().to_str().unwrap();
    let args = ["--spool-dir", spool_dir, "--redis-timeout-ms", "300"];
    let (agent, udp, _) = spawn_agent(&redis.url(), &args);
    let mut agent = Killed(agent);
    redis.kill();
    let ages = [(10, 1), (400, 10), (5000, 100)];
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    for _ in 0..3 {
        let now = unix_now();
        let lines: Vec<String> = ages
            .iter()
            .map(|(age, n)| format!("old:{n}|c|T{}", now - age))
            .collect();
        socket
            .send_to(lines.join("\n").as_bytes(), ("127.0.0.1", udp))
            .unwrap();
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    // Every datagram sent is in a closed, spooled window once a boundary has passed.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    agent.kill();

    redis.restart_after(Duration::ZERO, &[]);
    let (again, _, _) = spawn_agent(&redis.url(), &args);
    let mut again = Killed(again);
    let windows = || {
        std::fs::read_dir(spool.path())
            .unwrap()
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "window"))
            .count()
    };
    eventually(Duration::from_secs(15), "the spool written", || {
        windows() == 0
    })
    .await;
    again.kill();
    for p in PRECISIONS {
        let want: i64 = ages
            .iter()
            .filter(|(age, _)| *age < SAMPLES * p)
            .map(|(_, n)| 3 * n)
            .sum();
        assert_eq!(redis.counter_total(p, "old"), want, "precision {p}");
    }
}
