//! statsd_exporter's own exposition tests (its `bridge_test.go`, `pkg/line/line_test.go`,
//! `pkg/exporter/exporter_test.go` and the observer options of `pkg/mapper/mapper_test.go`,
//! turned into `tests/prometheus/exporter_vectors.json` by `scripts/exporter-vectors.py`) run
//! through the binary with `prometheus_app_metrics = true`: each vector's mapping file given to
//! an agent of its own, its datagrams sent over UDP, and the application part of `/metrics`
//! compared, family by family and series by series, with what statsd_exporter's test expects.
//! Where the agent differs on purpose, the vector quotes the row of docs/prometheus.md's table
//! that says so and carries what the agent shows instead (the page, the series it refused and
//! the lines it counted bad), which is checked just as strictly. `promtool check metrics` parses
//! every page compared.

mod common;

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::process::{Child, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use serde::Deserialize;

#[derive(Deserialize)]
struct Vector {
    test: String,
    mapping: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    send: Vec<Datagram>,
    statsd_exporter: Page,
    /// The rows of docs/prometheus.md's table of differences that make the agent's page
    /// another, quoted; the agent's page is then `agent`.
    #[serde(default)]
    differs: Vec<String>,
    agent: Option<AgentPage>,
    /// Later states of the page, each once the time given has passed since the last datagram
    /// (ttl), as statsd_exporter's test moves its clock on from its events.
    #[serde(default)]
    then: Vec<Then>,
}

#[derive(Deserialize)]
struct Datagram {
    datagram: Option<String>,
    /// A datagram that is not UTF-8 (statsd_exporter's invalid-UTF-8 cases).
    bytes: Option<Vec<u8>>,
}

impl Datagram {
    fn bytes(&self) -> Vec<u8> {
        match (&self.datagram, &self.bytes) {
            (Some(text), _) => text.as_bytes().to_vec(),
            (None, Some(bytes)) => bytes.clone(),
            (None, None) => panic!("a datagram without content"),
        }
    }
}

#[derive(Deserialize)]
struct AgentPage {
    page: Page,
    /// `statsd_redis_app_series_refused_total` by reason.
    #[serde(default)]
    refused: BTreeMap<String, f64>,
    /// `statsd_redis_bad_lines_total` by reason: the lines the agent refuses, and no others.
    #[serde(default)]
    bad_lines: BTreeMap<String, f64>,
}

#[derive(Deserialize)]
struct Then {
    after: String,
    statsd_exporter: Page,
}

/// The applications' families: by name, the type and the series.
type Page = BTreeMap<String, Family>;

#[derive(Deserialize, Debug, Default)]
struct Family {
    #[serde(rename = "type")]
    kind: String,
    help: Option<String>,
    series: Vec<Series>,
}

#[derive(Deserialize, Debug, Default)]
struct Series {
    labels: BTreeMap<String, String>,
    value: Option<f64>,
    count: Option<f64>,
    sum: Option<f64>,
    quantiles: Option<BTreeMap<String, f64>>,
    buckets: Option<BTreeMap<String, f64>>,
}

/// A counter sent after each step's datagrams: once the page shows it, the window holding the
/// step has closed.
const SENTINEL: &str = "zz_vectors_sentinel";

fn vectors() -> Vec<Vector> {
    serde_json::from_str(include_str!("prometheus/exporter_vectors.json")).unwrap()
}

/// A Go duration (`1s`, `1m2s`) as a [`Duration`].
fn go_duration(text: &str) -> Duration {
    let mut secs = 0.0;
    let mut number = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() || c == '.' {
            number.push(c);
            continue;
        }
        let n: f64 = std::mem::take(&mut number).parse().unwrap();
        secs += n * match c {
            'h' => 3600.0,
            'm' if chars.peek() == Some(&'s') => {
                chars.next();
                0.001
            }
            'm' => 60.0,
            's' => 1.0,
            _ => panic!("duration {text}"),
        };
    }
    Duration::from_secs_f64(secs)
}

// ---------------------------------------------------------------------------------------------
// The page as families.

/// `name{k="v",...} value` as the name, the labels and the value.
fn sample(line: &str) -> Option<(String, BTreeMap<String, String>, f64)> {
    let (series, value) = line.rsplit_once(' ')?;
    let value = match value {
        "NaN" => f64::NAN,
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    let Some((name, rest)) = series.split_once('{') else {
        return Some((series.to_string(), BTreeMap::new(), value));
    };
    let mut labels = BTreeMap::new();
    let mut chars = rest.chars();
    loop {
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if key.is_empty() || key == "}" {
            break;
        }
        assert_eq!(chars.next(), Some('"'), "{line}");
        let mut text = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some('n') => text.push('\n'),
                    Some(other) => text.push(other),
                    None => break,
                },
                '"' => break,
                c => text.push(c),
            }
        }
        labels.insert(key.trim_start_matches(',').to_string(), text);
        if chars.clone().next() == Some('}') {
            break;
        }
    }
    Some((name.to_string(), labels, value))
}

/// The application families of a page (the agent's own `statsd_redis_*` and `process_*` and
/// the sentinel left out), as the vectors write them.
fn families(page: &str) -> Page {
    let mut out = Page::new();
    let mut help = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in page.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            help.insert(name.to_string(), text.to_string());
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            let ours = name.starts_with("statsd_redis_") || name.starts_with("process_");
            current = (!ours && name != SENTINEL).then(|| name.to_string());
            if let Some(name) = &current {
                out.insert(
                    name.clone(),
                    Family {
                        kind: kind.to_string(),
                        help: help.get(name).cloned(),
                        series: Vec::new(),
                    },
                );
            }
            continue;
        }
        let (Some(family), Some((name, mut labels, value))) = (&current, sample(line)) else {
            continue;
        };
        let f = out.get_mut(family).unwrap();
        let quantile = labels.remove("quantile");
        let le = if f.kind == "histogram" {
            labels.remove("le")
        } else {
            None
        };
        let at = match f.series.iter().position(|s| s.labels == labels) {
            Some(at) => at,
            None => {
                f.series.push(Series {
                    labels,
                    ..Series::default()
                });
                f.series.len() - 1
            }
        };
        let s = &mut f.series[at];
        match name.strip_prefix(family.as_str()).unwrap_or(&name) {
            "_sum" => s.sum = Some(value),
            "_count" => s.count = Some(value),
            "_bucket" => {
                s.buckets
                    .get_or_insert_with(BTreeMap::new)
                    .insert(le.unwrap_or_default(), value);
            }
            _ => match quantile {
                Some(q) => {
                    s.quantiles
                        .get_or_insert_with(BTreeMap::new)
                        .insert(q, value);
                }
                None => s.value = Some(value),
            },
        }
    }
    out
}

fn close(got: f64, want: f64) -> bool {
    // Sums of repeated observations add up in another order (statsd_exporter adds each
    // repeat, the agent weighs one value): the same to the last bits.
    (got.is_nan() && want.is_nan())
        || got == want
        || (got - want).abs() <= 1e-9 * got.abs().max(want.abs())
}

/// Where `got` differs from `want`, said; `None` when it is the page wanted. Values a vector
/// leaves out (a summary's quantiles over different values) are not compared.
fn differences(got: &Page, want: &Page) -> Option<String> {
    let mut said = Vec::new();
    let names = |p: &Page| p.keys().cloned().collect::<Vec<_>>();
    if names(got) != names(want) {
        said.push(format!(
            "families {:?}, statsd_exporter's test wants {:?}",
            names(got),
            names(want)
        ));
    }
    for (name, w) in want {
        let Some(g) = got.get(name) else { continue };
        if g.kind != w.kind {
            said.push(format!("{name}: type {}, wanted {}", g.kind, w.kind));
        }
        if let Some(help) = &w.help
            && g.help.as_ref() != Some(help)
        {
            said.push(format!("{name}: HELP {:?}, wanted {help:?}", g.help));
        }
        let sets = |f: &Family| {
            f.series
                .iter()
                .map(|s| s.labels.clone())
                .collect::<Vec<_>>()
        };
        let (mut gs, mut ws) = (sets(g), sets(w));
        gs.sort();
        ws.sort();
        if gs != ws {
            said.push(format!("{name}: series {gs:?}, wanted {ws:?}"));
            continue;
        }
        for ws in &w.series {
            let gs = g.series.iter().find(|s| s.labels == ws.labels).unwrap();
            let at = format!("{name}{:?}", ws.labels);
            let mut values = vec![
                ("value".to_string(), gs.value, ws.value),
                ("count".to_string(), gs.count, ws.count),
                ("sum".to_string(), gs.sum, ws.sum),
            ];
            for (what, got, want) in [
                ("quantile", &gs.quantiles, &ws.quantiles),
                ("le", &gs.buckets, &ws.buckets),
            ] {
                let Some(want) = want else { continue };
                let got = got.clone().unwrap_or_default();
                if got.keys().ne(want.keys()) {
                    said.push(format!(
                        "{at}: {what} {:?}, wanted {:?}",
                        got.keys().collect::<Vec<_>>(),
                        want.keys().collect::<Vec<_>>()
                    ));
                    continue;
                }
                for (k, v) in want {
                    values.push((format!("{what}={k}"), got.get(k).copied(), Some(*v)));
                }
            }
            for (what, got, want) in values {
                if let Some(want) = want
                    && !got.is_some_and(|got| close(got, want))
                {
                    said.push(format!("{at} {what}: {got:?}, wanted {want}"));
                }
            }
        }
    }
    (!said.is_empty()).then(|| said.join("; "))
}

// ---------------------------------------------------------------------------------------------
// One vector through an agent of its own.

/// The ports handed out to this test's agents: [`free_port`] finds a port free, and another
/// thread must not be given it again before its agent binds it.
static TAKEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());

fn port() -> u16 {
    loop {
        let p = free_port();
        let mut taken = TAKEN.lock().unwrap_or_else(|p| p.into_inner());
        if !taken.contains(&p) {
            taken.push(p);
            return p;
        }
    }
}

struct Running {
    child: Child,
    udp: u16,
    http: SocketAddr,
    dir: tempfile::TempDir,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The binary with the vector's mapping file and flags, once its HTTP port answers; or why it
/// did not start (a mapping file it refuses: what it logged).
fn start(redis: &RedisServer, mapping: Option<&str>, args: &[String]) -> Result<Running, String> {
    let dir = tempfile::tempdir().unwrap();
    let (udp, http) = (port(), port());
    let mut command = bin();
    command
        .args(["--prometheus-app-metrics", "true"])
        .args(["--udp", &format!("127.0.0.1:{udp}")])
        .args(["--http", &format!("127.0.0.1:{http}")])
        .args(["--redis", &redis.url()])
        .args(args)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("agent.log")).unwrap());
    if let Some(mapping) = mapping {
        let file = dir.path().join("mapping.yml");
        std::fs::write(&file, mapping).unwrap();
        command.arg("--mapping-file").arg(file);
    }
    let mut agent = Running {
        child: command.spawn().unwrap(),
        udp,
        http: ([127, 0, 0, 1], http).into(),
        dir,
    };
    // The HTTP port is bound after the UDP ones: once it answers, datagrams are received.
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(agent.http).is_err() {
        if let Ok(Some(status)) = agent.child.try_wait() {
            return Err(format!(
                "the agent did not start ({status}): {}",
                agent.log()
            ));
        }
        if Instant::now() > deadline {
            return Err("the agent did not answer on HTTP within 10 s".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(agent)
}

impl Running {
    fn send(&self, datagram: &[u8]) {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        socket.send_to(datagram, ("127.0.0.1", self.udp)).unwrap();
    }

    /// The page. A request that fails while the agent lives is made again, at most five times (CI
    /// saw a live agent, its log quiet, answer one with a connection reset, once in a few
    /// hundred runs of the 145 vectors; why, we have not found); a failure names the agent's
    /// process state (`Z`: it exited) and its log.
    fn page(&self) -> String {
        let mut tries = 0;
        loop {
            let failure = match std::panic::catch_unwind(|| http_get(self.http, "/metrics").1) {
                Ok(page) => return page,
                Err(e) => e.downcast_ref::<String>().cloned().unwrap_or_default(),
            };
            let state = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()));
            let alive = state.as_ref().is_ok_and(|s| !s.contains(") Z "));
            tries += 1;
            if !alive || tries > 5 {
                panic!(
                    "no page after {tries} tries: {failure}; the agent's /proc stat: {state:?}; \
                     its log:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The kernel's lines for the sockets bound to the agent's UDP port (CI once saw a live
    /// agent receive nothing there for 30 s): who holds it, what waits in its queue, what the
    /// kernel dropped.
    fn udp_sockets(&self) -> String {
        let port = format!(":{:04X} ", self.udp);
        let table = std::fs::read_to_string("/proc/net/udp").unwrap_or_default();
        let mut lines = table.lines();
        let header = lines.next().unwrap_or_default().to_string();
        let held: Vec<&str> = lines.filter(|l| l.contains(&port)).collect();
        format!("{header}\n{}", held.join("\n"))
    }

    /// The agent's process as the kernel has it (its state; `Z`: it exited), the sockets it
    /// holds, and the sockets listening on its HTTP port (CI once saw a page say nothing was
    /// received while no socket was bound to the agent's UDP port): whose page answered.
    fn process(&self) -> String {
        let pid = self.child.id();
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = state
            .rsplit(") ")
            .next()
            .unwrap_or_default()
            .split(' ')
            .next();
        let held: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|fds| {
                fds.filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
                    .map(|l| l.to_string_lossy().into_owned())
                    .filter(|l| l.starts_with("socket:"))
                    .collect()
            })
            .unwrap_or_default();
        let port = format!(":{:04X} ", self.http.port());
        let listening: Vec<String> = std::fs::read_to_string("/proc/net/tcp")
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(&port) && l.split_whitespace().nth(3) == Some("0A"))
            .filter_map(|l| l.split_whitespace().nth(9).map(|i| format!("socket:[{i}]")))
            .collect();
        format!(
            "the agent (pid {pid}) state {state:?}, holding {held:?}; listening on its HTTP port: {listening:?}"
        )
    }

    /// What the agent logged.
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("agent.log")).unwrap_or_default()
    }

    /// Sends the sentinel and waits for the page to count it `n` times: every datagram sent
    /// before it has been taken into a closed window.
    fn settle(&self, n: usize) -> Result<(), String> {
        self.send(format!("{SENTINEL}:1|c").as_bytes());
        let want = format!("{SENTINEL} {n}");
        // A mapping may give it labels (a rule matching every name).
        let shown = |l: &str| {
            l.starts_with(SENTINEL)
                && sample(l).is_some_and(|(name, _, v)| name == SENTINEL && v == n as f64)
        };
        // A window closes each second; among 32 agents on two cores, a loaded CI machine has
        // taken more than 10 s once. Polls 100 ms apart: each is a new connection.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let page = self.page();
            if page.lines().any(shown) {
                return Ok(());
            }
            if Instant::now() > deadline {
                let of = |series| metric_in(&page, series);
                return Err(format!(
                    "the page never showed `{want}` (the agent's counts: {} datagrams and {} \
                     lines received, {} windows written, {} failed); the sockets on its UDP \
                     port (/proc/net/udp: queues, drops):\n{}\n{}\nits log:\n{}",
                    of("packets_received_total"),
                    of("lines_received_total"),
                    of("flushes_total{outcome=\"ok\"}"),
                    of("flushes_total{outcome=\"error\"}"),
                    self.udp_sockets(),
                    self.process(),
                    self.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The page once it is `want` (up to `within`), checked by promtool; or what differs.
    fn expect(&self, want: &Page, within: Duration) -> Result<String, String> {
        let deadline = Instant::now() + within;
        loop {
            let page = self.page();
            match differences(&families(&page), want) {
                None => return promtool_checks(&page).map(|()| page),
                Some(d) if Instant::now() > deadline => {
                    return Err(format!("{d}\n--- page:\n{}", app_part(&page)));
                }
                Some(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }
}

/// `promtool check metrics` parses the page, and finds nothing but names as statsd_exporter's
/// tests send them: counters without `_total`, names holding their type (`foo_counter`,
/// `foo_histogram`), a counter or gauge named `…_count`, `…_sum` or `…_bucket`, which
/// statsd_exporter's page shows just the same.
fn promtool_checks(page: &str) -> Result<(), String> {
    let lints = std::panic::catch_unwind(|| promtool_lints(page))
        .map_err(|e| e.downcast_ref::<String>().cloned().unwrap_or_default())?;
    let names = [
        "counter metrics should have \"_total\" suffix",
        "metric name should not include type",
        "non-histogram and non-summary metrics should not have",
        "non-histogram metrics should not have \"_bucket\" suffix",
    ];
    match lints.iter().find(|l| !names.iter().any(|n| l.contains(n))) {
        Some(lint) => Err(format!("promtool: {lint}\n{}", app_part(page))),
        None => Ok(()),
    }
}

/// The page without the agent's own families, for a failure's message.
fn app_part(page: &str) -> String {
    page.lines()
        .filter(|l| {
            let name = l
                .trim_start_matches("# HELP ")
                .trim_start_matches("# TYPE ");
            !l.is_empty() && !name.starts_with("statsd_redis_") && !name.starts_with("process_")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// [`run`], once more with a new agent when the first received not one datagram: CI saw that,
/// twice in many runs, with no socket left on the agent's UDP port while its page answered
/// (the cause not found yet); what the kernel showed is printed, and the vector must then pass.
fn run_received(redis: &RedisServer, v: &Vector) -> Result<(), String> {
    match run(redis, v) {
        Err(why) if why.contains("(the agent's counts: 0 datagrams and 0 lines received") => {
            eprintln!(
                "{}: the agent received nothing; a new agent takes the vector:\n{why}",
                v.test
            );
            run(redis, v)
        }
        other => other,
    }
}

fn run(redis: &RedisServer, v: &Vector) -> Result<(), String> {
    let (want, agent_page) = match (&v.agent, v.differs.is_empty()) {
        (None, true) => (&v.statsd_exporter, None),
        (Some(agent), false) => (&agent.page, Some(agent)),
        _ => return Err("a vector that differs says what the agent shows (`agent`)".into()),
    };
    for row in &v.differs {
        if !include_str!("../docs/prometheus.md").contains(row.as_str()) {
            return Err(format!("docs/prometheus.md no longer has the row {row}"));
        }
    }
    let agent = start(redis, v.mapping.as_deref(), &v.args)?;
    let mut sent = Instant::now();
    for (n, datagram) in v.send.iter().enumerate() {
        sent = Instant::now();
        agent.send(&datagram.bytes());
        agent.settle(n + 1)?;
    }
    agent.expect(want, Duration::from_secs(2))?;
    if let Some(a) = agent_page {
        let counts = [
            ("app_series_refused_total", &a.refused),
            ("bad_lines_total", &a.bad_lines),
        ];
        for (metric, by_reason) in counts {
            for (reason, count) in by_reason {
                let series = format!("{metric}{{reason=\"{reason}\"}}");
                let got = metric_in(&agent.page(), &series);
                if got != *count {
                    return Err(format!("{series} {got}, wanted {count}"));
                }
            }
        }
        let bad = metric_in(&agent.page(), "bad_lines_total");
        if bad != a.bad_lines.values().sum::<f64>() {
            return Err(format!(
                "bad_lines_total {bad} in all, wanted {:?}",
                a.bad_lines
            ));
        }
    }
    for then in &v.then {
        // A series leaves the page at a window's close after its ttl (docs/prometheus.md): the
        // page is the later state within five seconds of its time, and never before it.
        let after = go_duration(&then.after);
        let page = agent.expect(&then.statsd_exporter, after + Duration::from_secs(5))?;
        let took = sent.elapsed();
        if took < after {
            return Err(format!(
                "the page became {:?} {took:?} after the last datagram, before {after:?}:\n{}",
                then.statsd_exporter.keys(),
                app_part(&page)
            ));
        }
    }
    Ok(())
}

#[test]
fn statsd_exporters_tests_through_the_binary() {
    let all = vectors();
    assert!(all.len() >= 100, "the vectors load");
    let redis = RedisServer::start();
    // A page that passes through a state of one window (TestTtlExpiration: the gauge gone, the
    // summary not yet, between two closes 2 to 4 s after the line) is checked with no other
    // agent running: among 30 on two cores, the sentinel's window and promtool's check of the
    // first page took up to 4 s, and that state was gone before it was looked for.
    let (alone, together): (Vec<usize>, Vec<usize>) =
        (0..all.len()).partition(|&i| all[i].then.len() > 1);
    // The vectors that wait out a ttl first, so that the others run meanwhile.
    let mut order = together;
    order.sort_by_key(|&i| all[i].then.is_empty());
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<(usize, Result<(), String>)>> = Mutex::new(Vec::new());
    // Agents mostly wait for their windows: many at once on two cores.
    std::thread::scope(|s| {
        for _ in 0..32 {
            s.spawn(|| {
                while let Some(&i) = order.get(next.fetch_add(1, Ordering::SeqCst)) {
                    let result = run_received(&redis, &all[i]);
                    results.lock().unwrap().push((i, result));
                }
            });
        }
    });
    let mut results = results.into_inner().unwrap();
    for i in alone {
        results.push((i, run_received(&redis, &all[i])));
    }
    results.sort_by_key(|(i, _)| *i);
    let failed: Vec<String> = results
        .iter()
        .filter_map(|(i, r)| {
            r.as_ref()
                .err()
                .map(|why| format!("{}: {why}", all[*i].test))
        })
        .collect();
    let mut report = format!(
        "{} of {} vectors as expected",
        results.len() - failed.len(),
        results.len()
    );
    if !failed.is_empty() {
        report.push_str(&format!("\n\n{}", failed.join("\n\n")));
    }
    eprintln!("{report}");
    assert!(failed.is_empty(), "{report}");
}

// ---------------------------------------------------------------------------------------------
// The StatsD clients the tests drive (tests/transports.rs, tests/end_to_end.rs), to the page.

/// Python's `statsd` and `datadog`, Node's `hot-shots` and Rust's `cadence` each send a
/// counter, a gauge and a timer (tags and `h`/`d` observations where the client has them) to
/// an agent with `prometheus_app_metrics = true`: the page shows each as statsd_exporter shows
/// such lines (names escaped, a run of dashes one `_`; tags as labels, their keys escaped;
/// timers in seconds as summaries, `h` and `d` as sent), and nothing else.
#[test]
fn every_client_the_tests_drive_shows_on_the_page() {
    let redis = RedisServer::start();
    let agent = start(&redis, None, &[]).unwrap();
    let port = agent.udp;
    python(&format!(
        r#"
import statsd
c = statsd.StatsClient("127.0.0.1", {port})
c.incr("py.statsd.cache--hits", 3)
c.gauge("py.statsd.depth", 7)
c.timing("py.statsd.latency", 250)
"#
    ));
    python(&format!(
        r#"
from datadog.dogstatsd import DogStatsd
d = DogStatsd(host="127.0.0.1", port={port}, disable_telemetry=True)
tags = ["env:test", "service.name:shop"]
d.increment("dd.cache-hits", 3, tags=tags)
d.gauge("dd.depth", 7, tags=tags)
d.timing("dd.latency", 250, tags=tags)
d.histogram("dd.size", 512, tags=tags)
d.distribution("dd.spread", 0.5, tags=tags)
d.flush()
"#
    ));
    node(&format!(
        r#"
const StatsD = require('hot-shots');
const c = new StatsD({{ host: '127.0.0.1', port: {port}, errorHandler: e => {{ console.error(e); process.exit(1); }} }});
const tags = ['env:test', 'service.name:shop'];
c.increment('hs.cache-hits', 3, tags);
c.gauge('hs.depth', 7, tags);
c.timing('hs.latency', 250, tags);
c.histogram('hs.size', 512, tags);
c.distribution('hs.spread', 0.5, tags);
c.close(() => process.exit(0));
"#
    ));
    {
        use cadence::prelude::*;
        use cadence::{StatsdClient, UdpMetricSink};
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let sink = UdpMetricSink::from(("127.0.0.1", port), socket).unwrap();
        let client = StatsdClient::from_sink("cadence", sink);
        client
            .count_with_tags("cache-hits", 3)
            .with_tag("env", "test")
            .with_tag("service.name", "shop")
            .send();
        client
            .gauge_with_tags("depth", 7)
            .with_tag("env", "test")
            .send();
        client
            .time_with_tags("latency", 250)
            .with_tag("env", "test")
            .send();
        client
            .histogram_with_tags("size", 512)
            .with_tag("env", "test")
            .send();
        client
            .distribution_with_tags("spread", 0.5)
            .with_tag("env", "test")
            .send();
    }
    agent.settle(1).unwrap();
    let tagged = serde_json::json!({"env": "test", "service_name": "shop"});
    let env = serde_json::json!({"env": "test"});
    let counter = |labels: &serde_json::Value| serde_json::json!({"type": "counter", "series": [{"labels": labels, "value": 3.0}]});
    let gauge = |labels: &serde_json::Value| serde_json::json!({"type": "gauge", "series": [{"labels": labels, "value": 7.0}]});
    // One observation: every quantile is the value.
    let summary = |labels: &serde_json::Value, v: f64| {
        serde_json::json!({"type": "summary", "series": [{
            "labels": labels, "count": 1.0, "sum": v,
            "quantiles": {"0.5": v, "0.9": v, "0.99": v},
        }]})
    };
    let none = serde_json::json!({});
    let want: Page = serde_json::from_value(serde_json::json!({
        "py_statsd_cache_hits": counter(&none),
        "py_statsd_depth": gauge(&none),
        "py_statsd_latency": summary(&none, 0.25),
        "dd_cache_hits": counter(&tagged),
        "dd_depth": gauge(&tagged),
        "dd_latency": summary(&tagged, 0.25),
        "dd_size": summary(&tagged, 512.0),
        "dd_spread": summary(&tagged, 0.5),
        "hs_cache_hits": counter(&tagged),
        "hs_depth": gauge(&tagged),
        "hs_latency": summary(&tagged, 0.25),
        "hs_size": summary(&tagged, 512.0),
        "hs_spread": summary(&tagged, 0.5),
        "cadence_cache_hits": counter(&tagged),
        "cadence_depth": gauge(&env),
        "cadence_latency": summary(&env, 0.25),
        "cadence_size": summary(&env, 512.0),
        "cadence_spread": summary(&env, 0.5),
    }))
    .unwrap();
    if let Err(why) = agent.expect(&want, Duration::from_secs(3)) {
        panic!("{why}");
    }
}
