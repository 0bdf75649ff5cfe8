//! The dashboard in a real headless Chromium against a live agent and a private Redis: the
//! chart must show the counts sent and the timer table the stats, read from the rendered DOM;
//! at 420 px the layout, asked of Chromium through its DevTools protocol, must fit the window.
//! Screenshots are saved as target/dashboard.png and dashboard-narrow.png for people to look at.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::*;
use serde_json::{Value, json};

const CHROMIUM: &str = "/usr/bin/chromium";

/// Headless, and quiet: nothing fetched but the page.
const HEADLESS: [&str; 8] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
];

/// Runs headless Chromium on `url` with extra arguments; returns its stdout.
fn chromium(url: &str, extra: &[&str]) -> String {
    let profile = tempfile::tempdir().unwrap();
    let out = Command::new(CHROMIUM)
        .args(HEADLESS)
        .args([
            "--window-size=1280,900",
            // Let the page's fetches and first timers run before the DOM is taken.
            "--virtual-time-budget=4000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(extra)
        .arg(url)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run {CHROMIUM} ({e}): the browser test needs Debian's chromium package (apt-get install -y chromium)")
        });
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Evaluates `expression` in `url` as Chromium lays it out in a window `width` px wide, once
/// `ready` (an expression) is true, through the DevTools protocol over a pipe
/// (`--remote-debugging-pipe`: commands on fd 3, replies on fd 4, each a JSON text ended by a
/// NUL); the value it returns.
fn evaluate_in_page(url: &str, width: u32, ready: &str, expression: &str) -> Value {
    use std::io::{BufRead, BufReader, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;

    let (commands, mut to_chromium) = std::io::pipe().unwrap();
    let (from_chromium, replies) = std::io::pipe().unwrap();
    let (commands_fd, replies_fd) = (commands.as_raw_fd(), replies.as_raw_fd());
    let profile = tempfile::tempdir().unwrap();
    let mut command = Command::new(CHROMIUM);
    command
        .args(HEADLESS)
        .arg("--remote-debugging-pipe")
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // SAFETY: only fcntl and dup2 run between fork and exec; both are async-signal-safe.
    unsafe {
        command.pre_exec(move || {
            // Each end first to a number above 3 and 4 (a pipe made while other tests run may
            // be fd 3 or 4 itself: dup2 onto itself would leave it close-on-exec, and the second
            // dup2 could overwrite the first), then onto 3 and 4, which keeps them open in exec.
            let (commands, replies) = (
                libc::fcntl(commands_fd, libc::F_DUPFD, 10),
                libc::fcntl(replies_fd, libc::F_DUPFD, 10),
            );
            if commands < 0
                || replies < 0
                || libc::dup2(commands, 3) < 0
                || libc::dup2(replies, 4) < 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {CHROMIUM} ({e}): apt-get install -y chromium"));
    drop((commands, replies));
    let mut from_chromium = BufReader::new(from_chromium);
    let mut id = 0;
    let mut call = |session: Option<&str>, method: &str, params: Value| -> Value {
        id += 1;
        let mut message = json!({ "id": id, "method": method, "params": params });
        if let Some(session) = session {
            message["sessionId"] = json!(session);
        }
        to_chromium
            .write_all(message.to_string().as_bytes())
            .unwrap();
        to_chromium.write_all(b"\0").unwrap();
        loop {
            let mut text = Vec::new();
            from_chromium.read_until(0, &mut text).unwrap();
            assert!(
                text.pop() == Some(0),
                "chromium closed its pipe during {method}"
            );
            let reply: Value = serde_json::from_slice(&text).unwrap();
            if reply["id"] == id {
                assert!(reply.get("error").is_none(), "{method}: {reply}");
                return reply["result"].clone();
            }
        }
    };
    let target = call(None, "Target.createTarget", json!({ "url": url }))["targetId"].clone();
    let attach = json!({ "targetId": target, "flatten": true });
    let session = call(None, "Target.attachToTarget", attach)["sessionId"]
        .as_str()
        .unwrap()
        .to_string();
    // A browser window is at least 500 px wide; the viewport can be narrower.
    let metrics = json!({ "width": width, "height": 900, "deviceScaleFactor": 1, "mobile": false });
    call(
        Some(&session),
        "Emulation.setDeviceMetricsOverride",
        metrics,
    );
    let mut evaluate = |expression: &str| {
        let params = json!({ "expression": expression, "returnByValue": true });
        call(Some(&session), "Runtime.evaluate", params)["result"]["value"].clone()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while evaluate(ready) != json!(true) {
        assert!(std::time::Instant::now() < deadline, "{url}: never {ready}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let value = evaluate(expression);
    let _ = child.kill();
    let _ = child.wait();
    value
}

/// The elements of the page that reach past the right edge of the window (those inside a
/// `.scroll` box scroll there, as wide tables do), and the window's width.
const OVERFLOW: &str = "({ width: innerWidth, over: [...document.querySelectorAll('body *')]
    .filter((e) => !e.closest('.scroll') && e.getBoundingClientRect().right > innerWidth + 0.5)
    .map((e) => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '')) })";

/// The values of `attr="..."` on every rendered element (the page's script text left out).
fn attribute_values(dom: &str, attr: &str) -> Vec<String> {
    let rendered = dom.split("<script>").next().unwrap_or(dom);
    rendered
        .split(&format!("{attr}=\""))
        .skip(1)
        .filter_map(|s| s.split('"').next())
        .map(String::from)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_shows_counts_stats_and_logs() {
    let redis = RedisServer::start();
    let agent = TestAgent::start(test_config(&redis));
    for _ in 0..5 {
        agent.send(b"hits:1|c");
    }
    agent.send(b"checkout:120|ms\ncheckout:80|ms\nlogin:30|ms\n_sc|db|2|m:replica down");
    agent.send(b"queue:7|g\nusers:alice|s\nusers:bob|s");
    agent.send(b"sizes:10|h\nsizes:20|h\nsizes:4000|h\nspread:3|d|@0.5");
    let page: String = (1..=100).map(|v| format!("page.time:{v}|ms\n")).collect();
    agent.send(page.as_bytes());
    for n in 0..30 {
        agent.send(format!("filler.{n:02}:1|c").as_bytes());
    }
    eventually(Duration::from_secs(3), "flushed", || {
        redis.counter_total(1, "hits") == 5
    })
    .await;
    eventually(Duration::from_secs(3), "logs flushed", || {
        redis.known("known:").len() == 31 * PRECISIONS.len()
    })
    .await;

    let url = format!("http://{}/?counter=hits&precision=1", agent.http);
    let dom = {
        let url = url.clone();
        tokio::task::spawn_blocking(move || chromium(&url, &["--dump-dom"]))
            .await
            .unwrap()
    };
    let counts = attribute_values(&dom, "data-count");
    assert_eq!(
        counts,
        ["5"],
        "the chart shows one sample of 5 for hits\n{dom}"
    );
    let slices = attribute_values(&dom, "data-slice");
    assert_eq!(
        redis
            .get_counter("count:1:hits")
            .keys()
            .map(|s| s.to_string())
            .collect::<Vec<_>>(),
        slices
    );

    // Timer table: slowest first, with the hour's stats.
    let timers: Vec<String> = attribute_values(&dom, "data-timer");
    assert_eq!(timers, ["checkout", "page.time", "login"]);
    let checkout_row = dom
        .split("data-timer=\"checkout\"")
        .nth(1)
        .unwrap()
        .split("</tr>")
        .next()
        .unwrap();
    for cell in [
        "<td class=\"num\">100</td>",
        "<td class=\"num\">80</td>",
        "<td class=\"num\">120</td>",
        "<td class=\"num\">2</td>",
    ] {
        assert!(
            checkout_row.contains(cell),
            "checkout row lacks {cell}: {checkout_row}"
        );
    }
    // The paginated series list (25 a page) and the logs.
    assert!(dom.contains("31 series · page 1/2"), "{dom}");
    assert!(dom.contains("replica down"), "logs shown");

    // Every other type: a gauge's value, a set's distinct members, a timer's p99 (within the
    // 1 % of its buckets) and its quantiles over time.
    let dom_of = |query: &str| {
        let url = format!("http://{}/?{query}", agent.http);
        tokio::task::spawn_blocking(move || chromium(&url, &["--dump-dom"]))
    };
    let gauge = dom_of("type=gauge&series=queue&precision=1").await.unwrap();
    assert_eq!(
        attribute_values(&gauge, "data-gauge-value"),
        ["7"],
        "{gauge}"
    );
    let set = dom_of("type=set&series=users&precision=60").await.unwrap();
    assert_eq!(attribute_values(&set, "data-count"), ["2"], "{set}");
    let timer = dom_of("type=timer&series=page.time").await.unwrap();
    let p99: f64 = attribute_values(&timer, "data-p99")[0].parse().unwrap();
    assert!((p99 - 99.0).abs() <= 0.99, "p99 {p99}\n{timer}");
    let lines: std::collections::BTreeSet<String> =
        attribute_values(&timer, "data-line").into_iter().collect();
    assert_eq!(
        lines.into_iter().collect::<Vec<_>>(),
        ["page.time p50", "page.time p90", "page.time p99"],
        "quantiles over time"
    );
    assert!(timer.contains("page.time"), "timers are listed");
    let histogram = dom_of("type=histogram&series=sizes").await.unwrap();
    let p50: f64 = attribute_values(&histogram, "data-p50")[0].parse().unwrap();
    assert!((p50 - 20.0).abs() <= 0.2, "p50 {p50}\n{histogram}");
    let distribution = dom_of("type=distribution&series=spread").await.unwrap();
    let p50: f64 = attribute_values(&distribution, "data-p50")[0]
        .parse()
        .unwrap();
    assert!((p50 - 3.0).abs() <= 0.03, "p50 {p50}\n{distribution}");
    assert_eq!(
        attribute_values(&distribution, "data-series"),
        ["spread"],
        "distributions listed"
    );

    // Several series on one chart, and the timers searched by name.
    let two = dom_of("type=counter&series=hits,filler.07&precision=1")
        .await
        .unwrap();
    let lines: std::collections::BTreeSet<String> =
        attribute_values(&two, "data-line").into_iter().collect();
    assert_eq!(lines.into_iter().collect::<Vec<_>>(), ["filler.07", "hits"]);
    // The chart runs to the second still being written, shaded, though neither series has a
    // point there.
    let band: u64 = attribute_values(&two, "data-from")[0].parse().unwrap();
    assert!(band + 10 >= unix_now() && band <= unix_now(), "{two}");
    let found = dom_of("type=timer&match=page").await.unwrap();
    assert_eq!(attribute_values(&found, "data-series"), ["page.time"]);

    let shot = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join("dashboard.png");
    let arg = format!("--screenshot={}", shot.display());
    tokio::task::spawn_blocking(move || chromium(&url, &[&arg]))
        .await
        .unwrap();
    assert!(
        std::fs::metadata(&shot)
            .map(|m| m.len() > 10_000)
            .unwrap_or(false),
        "screenshot written"
    );
    // At a phone's width nothing reaches past the window's edge: the columns stack, the chart
    // shrinks, wide tables scroll in their own box. Every type's view, with a chart drawn.
    for query in [
        "type=timer&series=page.time",
        "type=counter&series=hits,filler.07&precision=1",
        "type=gauge&series=queue&precision=1",
    ] {
        let url = format!("http://{}/?{query}", agent.http);
        let layout = tokio::task::spawn_blocking(move || {
            let ready = "document.querySelectorAll('#chart circle').length > 0";
            evaluate_in_page(&url, 420, ready, OVERFLOW)
        })
        .await
        .unwrap();
        assert_eq!(layout["width"], 420, "{layout}");
        assert_eq!(layout["over"], json!([]), "{query} at 420 px: {layout}");
    }
    // And a picture of it, for people to look at (target/dashboard-narrow.png).
    let narrow = shot.with_file_name("dashboard-narrow.png");
    let arg = format!("--screenshot={}", narrow.display());
    let url = format!("http://{}/?type=timer&series=page.time", agent.http);
    tokio::task::spawn_blocking(move || chromium(&url, &[&arg, "--window-size=420,900"]))
        .await
        .unwrap();
    assert!(narrow.exists());
    agent.stop().await;
}

/// Each `<circle class="sample…" … data-slice="…">` of a chart: its slice and whether it is
/// drawn as still arriving.
fn samples(dom: &str) -> Vec<(u64, bool)> {
    dom.split("<circle")
        .skip(1)
        .filter_map(|c| {
            let element = c.split('>').next()?;
            let slice = attribute_values(element, "data-slice")
                .pop()?
                .parse()
                .ok()?;
            Some((
                slice,
                attribute_values(element, "class")
                    .pop()?
                    .contains("filling"),
            ))
        })
        .collect()
}

/// At the default `quantile_write_secs` (60) a minute's buckets are written during the next
/// minute: right after the values arrive the timer view says that nothing is written yet
/// instead of showing an empty chart. With 5 s groups (and 5 s slices) a slice once written
/// and complete is drawn solid, and the slices after it lie in the band still arriving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_shades_the_quantile_slices_still_arriving() {
    let redis = RedisServer::start();
    // The minute does not end (and is not written) before the page is taken: the agent's
    // clock stands 10 s into it until moved.
    let clock = clock_at(10, 60);
    let held = TestAgent::start_at(
        statsd_redis::config::Config {
            quantile_write_secs: 60,
            ..test_config(&redis)
        },
        clock.clone(),
    );
    held.send_taken(b"wait.t:5|ms\nwait.t:7|ms").await;
    clock.advance(Duration::from_secs(1));
    eventually(Duration::from_secs(3), "statistics written", || {
        redis::cmd("EXISTS")
            .arg("stats:wait.t:AccessTime")
            .query::<i64>(&mut redis.conn())
            .unwrap()
            == 1
    })
    .await;
    let url = format!("http://{}/?type=timer&series=wait.t", held.http);
    let dom = tokio::task::spawn_blocking(move || chromium(&url, &["--dump-dom"]))
        .await
        .unwrap();
    assert!(
        dom.contains("no buckets written in the last half hour yet")
            && dom.contains("during the next minute"),
        "{dom}"
    );
    assert!(samples(&dom).is_empty(), "no quantile drawn yet");
    held.stop().await;

    let redis = RedisServer::start();
    // A second into a 5 s slice, so that the values land in the one named here.
    let clock = clock_at(1, 5);
    let slice = clock.unix_now() / 5 * 5;
    let agent = TestAgent::start_at(
        statsd_redis::config::Config {
            quantile_write_secs: 5,
            quantile_precisions: vec![5, 3600],
            // 400 slices of 5 s cover the chart's half hour.
            sample_count: 400,
            ..test_config(&redis)
        },
        clock.clone(),
    );
    agent.send_taken(b"wait.t:5|ms\nwait.t:7|ms").await;
    // Complete once its group's write window (5 s) and a flush (1 s) have passed: the closer
    // closes each of those windows in turn.
    clock.advance(Duration::from_secs(slice + 5 + 6 - clock.unix_now()));
    eventually(
        Duration::from_secs(15),
        "the group's buckets written",
        || redis.hist_total(&format!("hist:5:wait.t:AccessTime:{slice}")) == 2.0,
    )
    .await;
    let url = format!("http://{}/?type=timer&series=wait.t", agent.http);
    let dom = tokio::task::spawn_blocking(move || chromium(&url, &["--dump-dom"]))
        .await
        .unwrap();
    let drawn = samples(&dom);
    assert_eq!(
        drawn,
        vec![(slice, false); 3],
        "p50, p90, p99 of the slice, solid\n{dom}"
    );
    let band: u64 = attribute_values(&dom, "data-from")[0].parse().unwrap();
    assert!(
        band > slice && band <= clock.unix_now(),
        "the band starts after the slice: {band} vs {slice}"
    );
    agent.stop().await;
}

/// The landing page opens on the busiest counter, not on "no series selected"; another type's
/// view on its first series; and what is shown is in the URL, which opens the same view again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_opens_on_the_busiest_counter_and_keeps_its_view_in_the_url() {
    let redis = RedisServer::start();
    let agent = TestAgent::start(test_config(&redis));
    let (status, body) = http_get(agent.http, "/api/v1/busiest");
    assert_eq!(status, 404, "no counter yet: {body}");
    agent.send(b"a.quiet:1|c\nz.busy:40|c\nm.middle:3|c\nq.first:7|g\nq.second:9|g");
    eventually(Duration::from_secs(3), "flushed", || {
        redis.counter_total(1, "z.busy") == 40
    })
    .await;
    let view = |query: &str| {
        let url = format!("http://{}/{query}", agent.http);
        tokio::task::spawn_blocking(move || {
            let ready = "document.querySelectorAll('#chart circle.sample').length > 0";
            let what = "({ search: location.search, title: document.getElementById('chart-title').textContent })";
            evaluate_in_page(&url, 1280, ready, what)
        })
    };
    let landing = view("").await.unwrap();
    assert!(
        landing["title"].as_str().unwrap().starts_with("z.busy ·"),
        "the busiest counter, though last by name: {landing}"
    );
    let search = landing["search"].as_str().unwrap().to_string();
    assert!(
        search.contains("series=z.busy") && search.contains("precision=60"),
        "{landing}"
    );
    let gauges = view("?type=gauge").await.unwrap();
    assert!(
        gauges["title"].as_str().unwrap().starts_with("q.first ·"),
        "{gauges}"
    );
    assert!(
        gauges["search"]
            .as_str()
            .unwrap()
            .contains("series=q.first"),
        "{gauges}"
    );
    // The URL the landing page wrote opens the same view.
    let again = view(&search).await.unwrap();
    assert_eq!(again, landing);
    agent.stop().await;
}

/// With Redis gone the page says so, instead of showing empty panels.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_says_when_redis_is_unreachable() {
    let redis = RedisServer::start();
    let agent = TestAgent::start(statsd_redis::config::Config {
        redis: "redis://127.0.0.1:1/0".into(),
        redis_timeout_ms: 300,
        ..test_config(&redis)
    });
    let url = format!("http://{}/", agent.http);
    let dom = tokio::task::spawn_blocking(move || chromium(&url, &["--dump-dom"]))
        .await
        .unwrap();
    let banner = dom
        .split("id=\"banner\"")
        .nth(1)
        .and_then(|b| b.split("</div>").next())
        .unwrap_or_default();
    assert!(
        banner.contains("Redis is unreachable") && !banner.contains("hidden"),
        "{banner}"
    );
    agent.stop().await;
}

/// A set's chart offers the configured precisions (with `retentions`, 10 s and minutes), the
/// minute first, and shows the minute's distinct members.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sets_precisions_are_the_configured_ones() {
    let redis = RedisServer::start();
    let mut config = test_config(&redis);
    config.retentions = "10s:1h,1m:1d".into();
    let agent = TestAgent::start(config);
    agent.send(b"users:alice|s\nusers:bob|s\nusers:alice|s");
    eventually(Duration::from_secs(15), "the set written", || {
        redis_keys(&redis, "set:60:users:*") > 0
    })
    .await;
    let url = format!("http://{}/?type=set&series=users", agent.http);
    let dom = tokio::task::spawn_blocking(move || chromium(&url, &["--dump-dom"]))
        .await
        .unwrap();
    let options: Vec<String> = attribute_values(&dom, "value")
        .into_iter()
        .filter(|v| ["1", "5", "10", "60", "300", "3600"].contains(&v.as_str()))
        .collect();
    assert_eq!(options, ["60", "10"], "{dom}");
    assert_eq!(attribute_values(&dom, "data-count"), ["2"], "{dom}");
}

fn redis_keys(redis: &RedisServer, pattern: &str) -> usize {
    redis::cmd("KEYS")
        .arg(pattern)
        .query::<Vec<String>>(&mut redis.conn())
        .unwrap()
        .len()
}
