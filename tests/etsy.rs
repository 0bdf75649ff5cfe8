//! Etsy statsd's Graphite names (`graphite_etsy_names`) against the real stack: Etsy's `statsd`
//! from the npm registry flushing to Debian's `carbon-cache`, whisper files, graphite-web 1.1.10
//! over them (`tests/etsy/stack.sh`). The same datagrams go to Etsy's daemon and to the agent;
//! Grafana-shaped requests with Etsy's names go to graphite-web and to the agent, and answer
//! alike.
//!
//! The two flush schedules: Etsy flushes every second here (`flushInterval` 1000, whisper's
//! finest archive 1 s) and stamps a flush's points with its second, the one after the values
//! came; the agent puts them in the second they came in. The bursts are sent between the 5th
//! and the 45th second of a minute, so both schedules put them in that minute, and the range
//! starts with it and stays within the 100 s both read at one-second points (the agent's 1 s
//! precision holds 120 s): per minute (`summarize(…, '1min', …)`), counts, rates (per second at
//! a one-second step, so their sum is the count), gauges and sets' sizes then agree exactly.
//! Before a name's first flush Etsy has no points and the agent zeros; a minute's sum is the
//! same. A timer's statistics are the agent's of a minute's buckets and Etsy's of one flush
//! (the bursts are one datagram each, so one flush takes all of one): compared in one bucket,
//! counts exactly, the rest within the buckets' accuracy (docs/reading.md, "Etsy's names").

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

/// Etsy's statsd 0.9.0 (the newest on the npm registry; its `stats.js`, `lib/` and Graphite
/// backend are those of 0.10.2), installed once into this test target's directory.
fn etsy_statsd() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("etsy");
        let package = dir.join("node_modules/statsd");
        if !package.join("stats.js").exists() {
            std::fs::create_dir_all(&dir).unwrap();
            run_ok(
                Command::new("npm").current_dir(&dir).args([
                    "install",
                    "--silent",
                    "--no-audit",
                    "--no-fund",
                    "--no-save",
                    "statsd@0.9.0",
                ]),
                "npm install statsd (apt-get install -y npm)",
            );
        }
        package
    })
}

/// Etsy statsd, carbon-cache and graphite-web, stopped when dropped.
struct Stack {
    run: tempfile::TempDir,
    env: BTreeMap<String, String>,
}

impl Stack {
    /// The stack with whisper's `retentions` (the script's default when `None`).
    fn start(retentions: Option<&str>) -> Stack {
        assert!(
            Path::new("/usr/bin/carbon-cache").exists(),
            "this test runs carbon: apt-get install -y --no-install-recommends graphite-carbon"
        );
        let run = tempfile::tempdir().unwrap();
        let out = run_ok(
            Command::new(stack_script())
                .arg("start")
                .env("REALSTACK_RUN", run.path().join("run"))
                .env("STATSD_PKG", etsy_statsd())
                .envs(retentions.map(|r| ("RETENTIONS", r))),
            "the stack did not start",
        );
        let env = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Stack { run, env }
    }

    fn statsd_port(&self) -> u16 {
        self.env["STATSD_PORT"].parse().unwrap()
    }

    fn graphite(&self) -> String {
        self.env["GRAPHITE_URL"].clone()
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        let _ = Command::new(stack_script())
            .arg("stop")
            .env("REALSTACK_RUN", self.run.path().join("run"))
            .output();
    }
}

fn stack_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/etsy/stack.sh")
}

fn render(base: &str, target: &str, from: u64, until: u64) -> Value {
    curl_json(&format!(
        "{base}/render?target={}&from={from}&until={until}&format=json",
        query_encode(target)
    ))
}

/// A render's series as name → points (time, value).
fn series(answer: &Value) -> BTreeMap<String, Vec<(i64, Option<f64>)>> {
    answer
        .as_array()
        .unwrap_or_else(|| panic!("not a list of series: {answer}"))
        .iter()
        .map(|s| {
            let points = s["datapoints"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| (p[1].as_i64().unwrap(), p[0].as_f64()))
                .collect();
            (s["target"].as_str().unwrap().to_string(), points)
        })
        .collect()
}

/// `/metrics/find`'s nodes: (path, leaf), Etsy's own series (`statsd`) and carbon's tag store
/// (`_tagged`) left out.
fn found(base: &str, query: &str) -> BTreeSet<(String, bool)> {
    curl_json(&format!(
        "{base}/metrics/find?query={}&format=completer",
        query_encode(query)
    ))["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["path"]
                    .as_str()
                    .unwrap()
                    .trim_end_matches('.')
                    .to_string(),
                m["is_leaf"] == "1",
            )
        })
        .filter(|(p, _)| !p.split('.').any(|n| n == "statsd" || n == "_tagged"))
        .collect()
}

const FIRST: &[&str] = &[
    "etsy.hits:1|c",
    "etsy.hits:2|c|@0.5",
    "etsy.hits:3|c|@0.25",
    "etsy.api.calls:5|c",
    "etsy.api.errors:1|c|@0.1",
    "etsy.queue:10|g",
    "etsy.queue:+5|g",
    "etsy.queue:-3|g",
    "etsy.depth:-4|g",
    "etsy.users:a|s",
    "etsy.users:b|s",
    "etsy.users:a|s",
    "etsy.tagged:7|c|#env:prod",
    "etsy.api.latency:30|ms",
    "etsy.api.latency:10|ms",
    "etsy.api.latency:100|ms",
    "etsy.api.latency:20|ms",
    "etsy.api.latency:90|ms",
    "etsy.api.latency:40|ms",
    "etsy.api.latency:80|ms",
    "etsy.api.latency:50|ms",
    "etsy.api.latency:70|ms",
    "etsy.api.latency:60|ms",
];

/// The second burst, some flushes later: a delta on a gauge that was idle meanwhile.
const SECOND: &[&str] = &["etsy.hits:4|c", "etsy.queue:+1|g", "etsy.users:c|s"];

#[test]
fn etsy_named_requests_answer_as_the_real_stack_does() {
    etsy_named_requests(None);
}

/// The same at a long schema, whisper's and the agent's (six hours of seconds, a week of
/// minutes: more slices than the book's hash keeps at every precision): the same answers for
/// every family, the precision chosen as whisper chooses it, and Etsy's long files imported;
/// then, read by an agent whose clock is 15 minutes on, the set's slices moved into blocks and
/// the timer's minute packed answer the same.
#[test]
fn etsy_named_requests_answer_as_the_real_stack_does_at_a_long_schema() {
    etsy_named_requests(Some("1s:6h,1m:7d"));
}

fn etsy_named_requests(retentions: Option<&str>) {
    let redis = RedisServer::start();
    let stack = Stack::start(retentions);
    // Under `retentions` the hourly statistics (a timer's names) are written once a
    // `coarse_write_secs`, 60 s by default: every window here, as Etsy's are.
    let schema: Vec<&str> = retentions.map_or(vec![], |r| vec!["--retentions", r]);
    let coarse: &[&str] = if retentions.is_some() {
        &["--coarse-write-secs", "0"]
    } else {
        &[]
    };
    // The quantile buckets written with every window, not once a minute; no cleaner (the
    // aged agent below is the one).
    let args = [
        &[
            "--graphite-etsy-names",
            "true",
            "--quantile-write-secs",
            "0",
        ][..],
        &schema,
        coarse,
    ]
    .concat();
    let (agent, udp, http) = spawn_agent(
        &redis.url(),
        &[&args[..], &["--cleaner-enabled", "false"]].concat(),
    );
    let _agent = Killed(agent);
    let ours = format!("http://127.0.0.1:{http}/graphite");
    let theirs = stack.graphite();
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    // A burst is one datagram, so that one flush of Etsy's takes it whole.
    let send = |lines: &[&str]| {
        let datagram = lines.join("\n");
        socket
            .send_to(datagram.as_bytes(), ("127.0.0.1", udp))
            .unwrap();
        socket
            .send_to(datagram.as_bytes(), ("127.0.0.1", stack.statsd_port()))
            .unwrap();
    };
    // Both bursts, and Etsy's stamps a second after each, within one minute: per minute, the
    // two schedules then agree.
    while !(5..45).contains(&(unix_now() % 60)) {
        std::thread::sleep(Duration::from_millis(200));
    }
    let from = unix_now() / 60 * 60;
    // The agent's timer statistics are of minutes: the range for them starts in the minute
    // before the burst's, so that its minute is the range's first slice.
    let timers_from = from - 1;
    send(FIRST);
    std::thread::sleep(Duration::from_millis(2500));
    send(SECOND);
    // Etsy's next flush, carbon's write (within a second of it) and the agent's window.
    let total = |base: &str| {
        let answer = render(
            base,
            "summarize(stats_counts.etsy.hits,'1h','sum',true)",
            from,
            unix_now(),
        );
        series(&answer)
            .values()
            .flat_map(|p| p.iter().filter_map(|(_, v)| *v))
            .sum::<f64>()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while total(&theirs) < 21.0 || total(&ours) < 21.0 {
        assert!(
            Instant::now() < deadline,
            "the counts did not arrive: the agent {}, graphite-web {}",
            total(&ours),
            total(&theirs)
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    std::thread::sleep(Duration::from_millis(1500));
    let until = unix_now();
    assert!(until - from < 100, "the range must stay within 100 s");

    // The request, and what both must answer for it in the bursts' minute (the next minute's
    // bucket, when the range reaches it, must agree too: counts 0, gauges carried on).
    let expected: &[(&str, &[(&str, f64)])] = &[
        (
            "summarize(stats_counts.etsy.*,'1min','sum')",
            &[("summarize(stats_counts.etsy.hits, \"1min\", \"sum\")", 21.0)],
        ),
        (
            "summarize(stats.etsy.*,'1min','sum')",
            &[("summarize(stats.etsy.hits, \"1min\", \"sum\")", 21.0)],
        ),
        // A tagged name by itself (a glob leaves tagged series out, in both).
        (
            "summarize(stats_counts.etsy.tagged;env=prod,'1min','sum')",
            &[(
                "summarize(stats_counts.etsy.tagged;env=prod, \"1min\", \"sum\")",
                7.0,
            )],
        ),
        (
            "aliasByNode(summarize(stats_counts.etsy.api.*,'1min','sum'),3)",
            &[("calls", 5.0), ("errors", 10.0)],
        ),
        (
            "summarize(sumSeries(stats_counts.etsy.api.*),'1min','sum')",
            &[(
                "summarize(sumSeries(stats_counts.etsy.api.*), \"1min\", \"sum\")",
                15.0,
            )],
        ),
        (
            "aliasByNode(summarize(stats.gauges.etsy.*,'1min','last'),3)",
            &[("depth", -4.0), ("queue", 13.0)],
        ),
        (
            "summarize(stats.sets.etsy.*.count,'1min','sum')",
            &[(
                "summarize(stats.sets.etsy.users.count, \"1min\", \"sum\")",
                3.0,
            )],
        ),
    ];
    for (target, wanted) in expected {
        let (a, b) = (
            series(&render(&ours, target, from, until)),
            series(&render(&theirs, target, from, until)),
        );
        assert_eq!(
            a, b,
            "{target}: the agent, then graphite-web over Etsy's files"
        );
        let minute = from as i64;
        let values: Vec<(&str, f64)> = a
            .iter()
            .map(|(name, points)| match points.first() {
                Some(&(at, Some(v))) if at == minute => (name.as_str(), v),
                _ => panic!("{target}: {name} has no bucket at {minute}: {points:?}"),
            })
            .collect();
        assert_eq!(values, *wanted, "{target}");
    }
    let expand = |base: &str, query: &str| {
        curl_json(&format!(
            "{base}/metrics/expand?query={}&leavesOnly=1",
            query_encode(query)
        ))
    };
    for query in [
        "stats.gauges.etsy.*",
        "stats.timers.etsy.api.latency.upper*",
    ] {
        assert_eq!(
            expand(&ours, query),
            expand(&theirs, query),
            "expand {query}"
        );
    }

    timers_agree(&ours, &theirs, (timers_from, until));

    for query in [
        "stats",
        "stats.*",
        "stats_counts.*",
        "stats.etsy.*",
        "stats_counts.etsy.*",
        "stats_counts.etsy.api.*",
        "stats.gauges.*",
        "stats.gauges.etsy.*",
        "stats.sets.*",
        "stats.sets.etsy.*",
        "stats.sets.etsy.users.*",
        "stats.*.etsy.*",
        "stats.timers.*",
        "stats.timers.etsy.*",
        "stats.timers.etsy.api.*",
        "stats.timers.etsy.api.latency.*",
    ] {
        let (a, b) = (found(&ours, query), found(&theirs, query));
        assert!(!a.is_empty(), "{query}: nothing found");
        assert_eq!(a, b, "find {query}: the agent, then graphite-web");
    }
    // The history: carbon's files imported into another Redis answer for Etsy's counters and
    // gauges as graphite-web over them does; a second import changes no slice.
    let imported = RedisServer::start();
    // A copy of the files as they are now: Etsy's daemon flushes on (its counters' zeros, its
    // own statsd.* names) and would change them between the two imports.
    let copy = tempfile::tempdir().unwrap();
    let whisper = copy.path().join("whisper");
    run_ok(
        Command::new("cp")
            .arg("-a")
            .arg(&stack.env["WHISPER_DIR"])
            .arg(&whisper),
        "cp -a the whisper files",
    );
    // One cut-off for both: a slice ending between the two would be the second's alone.
    let cut_off = unix_now().to_string();
    let import = || {
        run_ok(
            bin()
                .args(["import", "whisper"])
                .arg(&whisper)
                .args(["--redis", &imported.url(), "--until", &cut_off])
                .args(&schema),
            "statsd-redis import whisper",
        );
    };
    import();
    let keys = imported.as_read();
    import();
    assert_eq!(imported.as_read(), keys, "a second import changes nothing");
    let (history, _, history_http) = spawn_agent(
        &imported.url(),
        &[&["--graphite-etsy-names", "true"][..], &schema].concat(),
    );
    let _history = Killed(history);
    let history = format!("http://127.0.0.1:{history_http}/graphite");
    for target in [
        "summarize(stats_counts.etsy.*,'1min','sum')",
        "summarize(stats.etsy.*,'1min','sum')",
        "aliasByNode(summarize(stats_counts.etsy.api.*,'1min','sum'),3)",
        "aliasByNode(summarize(stats.gauges.etsy.*,'1min','last'),3)",
    ] {
        let (a, b) = (
            series(&render(&history, target, from, until)),
            series(&render(&theirs, target, from, until)),
        );
        assert!(!a.is_empty(), "{target}: nothing imported");
        assert_eq!(a, b, "{target}: imported, then graphite-web over the files");
    }

    // Only counters and gauges were imported: no namespace of sets or timers is listed.
    let listed: Vec<String> = found(&history, "stats.*")
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    assert_eq!(listed, ["stats.etsy", "stats.gauges"], "{listed:?}");

    // The agent's own names stay beside Etsy's at the root.
    let root = found(&ours, "*");
    for node in ["stats", "stats_counts", "etsy"] {
        assert!(root.contains(&(node.to_string(), false)), "{root:?}");
    }
    if retentions.is_none() {
        return;
    }

    // Aged: an agent whose clock is 15 minutes on (the cleaner ages a slice by the agent's
    // clock) moves the set's slices into blocks and packs the timer's minute, and answers as
    // graphite-web still does.
    let (aged, _, aged_http) = spawn_agent_with_clock(
        "+900s",
        &redis.url(),
        &[&args[..], &["--cleaner-interval-secs", "1"]].concat(),
    );
    let _aged = Killed(aged);
    let aged = format!("http://127.0.0.1:{aged_http}/graphite");
    let deadline = Instant::now() + Duration::from_secs(30);
    let moved = |pattern: &str| {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(pattern)
            .query(&mut redis.conn())
            .unwrap();
        !keys.is_empty()
    };
    while !(moved("history:set:*etsy.users*") && moved("history:hist:*etsy.api.latency*")) {
        assert!(Instant::now() < deadline, "the aged agent moved nothing");
        std::thread::sleep(Duration::from_millis(200));
    }
    let sets = "summarize(stats.sets.etsy.*.count,'1min','sum')";
    let (a, b) = (
        series(&render(&aged, sets, from, until)),
        series(&render(&theirs, sets, from, until)),
    );
    assert_eq!(a, b, "{sets}: aged, then graphite-web");
    timers_agree(&aged, &theirs, (timers_from, until));
}

/// Etsy's statistics of the timer's flush (graphite-web over its files, `theirs`) and the
/// agent's (`ours`) of its minute's buckets: counts exactly, values within the buckets'
/// accuracy (1 %), the spread within three times it.
fn timers_agree(ours: &str, theirs: &str, (timers_from, until): (u64, u64)) {
    let timer = |base: &str, field: &str| -> Vec<f64> {
        let target = format!("summarize(stats.timers.etsy.api.latency.{field},'1h','max',true)");
        let answer = series(&render(base, &target, timers_from, until));
        answer.values().flatten().filter_map(|(_, v)| *v).collect()
    };
    for (field, want, tolerance) in [
        ("count", 10.0, 0.0),
        ("count_ps", 10.0, 0.0),
        ("count_90", 9.0, 0.0),
        ("upper", 100.0, 0.01),
        ("lower", 10.0, 0.01),
        ("mean", 55.0, 0.01),
        ("median", 55.0, 0.01),
        ("sum", 550.0, 0.01),
        ("sum_squares", 38_500.0, 0.02),
        ("upper_90", 90.0, 0.01),
        ("mean_90", 50.0, 0.01),
        ("sum_90", 450.0, 0.01),
        ("sum_squares_90", 28_500.0, 0.02),
        ("std", 28.722813232690143, 0.03),
    ] {
        let (a, b) = (timer(ours, field), timer(theirs, field));
        assert_eq!(b, [want], "{field}: graphite-web over Etsy's files");
        let [a] = a[..] else {
            panic!("{field}: the agent answered {a:?}");
        };
        // Per second: Etsy's of its one-second flush, the agent's of its minute.
        let want = if field == "count_ps" {
            10.0 / 60.0
        } else {
            want
        };
        assert!(
            (a - want).abs() <= tolerance * want,
            "{field}: the agent {a}, Etsy {want}"
        );
    }
}
