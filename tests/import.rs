//! `statsd-redis import whisper`: whisper files as Etsy's statsd leaves them through carbon
//! (written here by Debian's `python3-whisper`, the library carbon writes with: 10 s points for
//! an hour, then minutes for a week, counts summed and gauges' last values kept), imported
//! through the binary; the agent's Graphite API then answers for the imported names what
//! graphite-web answers over the same files. A second import changes no key; a damaged file is
//! named and skipped; nothing after the cut-off is touched.

mod common;

use std::path::Path;

use common::*;

/// Writes, under `root`, whisper files of two counters and a gauge with a point every 10 s for
/// the three hours before `now` (and a damaged file), as carbon writes them.
fn write_whisper(root: &Path, now: u64) {
    let script = r#"
import os, sys, whisper
root, now = sys.argv[1], int(sys.argv[2])
def write(rel, method, value):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    whisper.create(path, [(10, 360), (60, 10080)], xFilesFactor=0, aggregationMethod=method)
    points = [(t, value(t)) for t in range(now - 3 * 3600, now, 10)]
    # As carbon writes them: ten minutes at a time as they come (whisper writes a point older
    # than its first archive straight into a coarser one, unsummed).
    for i in range(0, len(points), 60):
        batch = points[i:i + 60]
        whisper.update_many(path, batch, now=batch[-1][0] + 10)
write("stats_counts/app/hits.wsp", "sum", lambda t: (t // 10) % 7)
write("stats/counters/app/api/calls/count.wsp", "sum", lambda t: 2)
write("stats/gauges/app/queue.wsp", "last", lambda t: (t // 10) % 100 - 20)
write("stats/app/hits.wsp", "average", lambda t: 0.5)
write("collectd/web1/load.wsp", "average", lambda t: (t // 10) % 13 / 4)
with open(os.path.join(root, "stats_counts/app/broken.wsp"), "wb") as f:
    f.write(b"\x00\x00\x00\x02" + b"\x00" * 20)
"#;
    with_python_whisper(script, &[root.to_str().unwrap(), &now.to_string()]);
}

fn import(redis: &RedisServer, root: &Path, until: Option<u64>) -> (String, String) {
    let mut command = bin();
    command.args([
        "import",
        "whisper",
        root.to_str().unwrap(),
        "--redis",
        &redis.url(),
    ]);
    if let Some(until) = until {
        command.args(["--until", &until.to_string()]);
    }
    let out = run_ok(&mut command, "statsd-redis import whisper");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn whisper_history_is_imported_once_and_nothing_after_the_cut_off() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let now = unix_now() / 600 * 600;
    write_whisper(dir.path(), now);
    let (out, err) = import(&redis, dir.path(), None);
    assert!(out.starts_with("imported 4 files ("), "{out}");
    assert!(err.contains("points read"), "the progress line: {err}");
    assert!(
        err.contains("skipped ") && err.contains("broken.wsp"),
        "{err}"
    );
    let first = redis.everything();
    // The minutes of the last three hours and the 10 s points' counts, summed per precision:
    // the 60 s slices of the hour the 10 s archive holds are its six points' sum.
    let minute = redis.get_counter("count:60:app.hits");
    let slice = now - 1800;
    let want: i64 = (0..6).map(|i| ((slice + 10 * i) / 10 % 7) as i64).sum();
    assert_eq!(minute.get(&slice), Some(&want));
    // The last whole hour: from the 10 s points or the summed minutes, 2 every 10 s.
    let hour = now / 3600 * 3600 - 3600;
    assert_eq!(
        redis.get_counter("count:3600:app.api.calls").get(&hour),
        Some(&720)
    );
    assert!(
        redis.get_counter("count:1:app.hits").is_empty(),
        "no archive of 1 s"
    );
    let known = redis.known("known:");
    assert!(known.contains(&"60:app.hits".to_string()), "{known:?}");
    assert!(
        redis
            .known("known:gauge:")
            .contains(&"300:app.queue".to_string())
    );
    // A carbon path: its minutes' archive at 60 s, as whisper made it, as far back as the
    // book's 120 slices keep (no 10 s precision here; its values: the test below).
    let load = redis.history("gauge:60:collectd.web1.load");
    assert!((100..=120).contains(&load.len()), "{}", load.len());
    assert!(redis.history("gauge:300:collectd.web1.load").is_empty());

    // Again: nothing changes.
    import(&redis, dir.path(), None);
    assert_eq!(redis.everything(), first, "a second import changes nothing");

    // A fresh Redis and a cut-off half an hour back: no slice ends after it.
    let later = RedisServer::start();
    let until = now - 1800;
    import(&later, dir.path(), Some(until));
    for p in [5, 60, 300, 3600] {
        let slices = later.get_counter(&format!("count:{p}:app.hits"));
        assert!(slices.keys().all(|s| s + p <= until), "precision {p}");
    }
}

/// graphite-web 1.1.10 over the whisper files and the agent over what was imported answer
/// alike, summarized over ten minutes (for the hour of 10 s points, read by the agent at 60 s)
/// and an hour (for three hours, minutes in whisper, 5 min slices in the agent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_answers_for_imported_names_as_graphite_web_over_the_files() {
    assert!(
        Path::new("/usr/bin/graphite-manage").exists(),
        "this test runs graphite-web: apt-get install -y --no-install-recommends graphite-web"
    );
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let now = unix_now() / 600 * 600;
    write_whisper(dir.path(), now);
    import(&redis, dir.path(), None);
    let oracle = GraphiteWeb::over(dir.path());
    let agent = TestAgent::start(test_config(&redis));
    let ask = |base: &str, target: &str, from: u64| -> serde_json::Value {
        let target = query_encode(target);
        curl_json(&format!(
            "{base}/render?target={target}&from={from}&until={now}&format=json"
        ))
    };
    let agent_url = format!("http://{}/graphite", agent.http);
    // Each reads its finest store that holds the range: 10 s points and 60 s slices for the
    // last 50 minutes, 60 s points and 5 min slices for three hours. The first bucket is left
    // out: the agent's first slice is the one after `from`'s, whisper's first point the one
    // after `from`, so it covers less of that bucket.
    for (etsy, ours, how, bucket, back) in [
        ("stats_counts.app.hits", "app.hits", "sum", "10min", 3000),
        (
            "stats.counters.app.api.calls.count",
            "app.api.calls",
            "sum",
            "1h",
            3 * 3600,
        ),
        ("stats.gauges.app.queue", "app.queue", "last", "10min", 3000),
        (
            "stats.gauges.app.queue",
            "app.queue",
            "last",
            "1h",
            3 * 3600,
        ),
    ] {
        let from = now - back;
        let points = |v: serde_json::Value| -> Vec<serde_json::Value> {
            let all = v[0]["datapoints"].as_array().cloned().unwrap_or_default();
            all.into_iter().skip(1).collect()
        };
        let theirs = points(ask(
            &oracle.url,
            &format!("summarize({etsy},'{bucket}','{how}')"),
            from,
        ));
        let mine = points(ask(
            &agent_url,
            &format!("summarize({ours},'{bucket}','{how}')"),
            from,
        ));
        assert!(
            theirs.iter().filter(|p| p[0].is_number()).count() >= 2,
            "{etsy}: graphite-web has data: {theirs:?}"
        );
        assert_eq!(mine, theirs, "{ours} against {etsy}, {bucket} {how}");
    }
    agent.stop().await;
}

/// With the files' own schema as `retentions`, every archive is imported whole (the hour of 10 s
/// points, the three hours of minutes), and the Graphite API reads the archive graphite-web
/// 1.1.10 reads from the files: the same points, timestamps and steps, raw, from ranges that
/// each archive answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_files_schema_every_archive_is_kept_and_read_as_graphite_web_reads_it() {
    assert!(
        Path::new("/usr/bin/graphite-manage").exists(),
        "this test runs graphite-web: apt-get install -y --no-install-recommends graphite-web"
    );
    let schema = "10s:1h,1m:7d";
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    // On a minute: the files' last minute is whole (the importer leaves a partial slice out).
    let now = unix_now() / 60 * 60;
    write_whisper(dir.path(), now);
    // The slices of the 10 s archive (its points `now - 3600 .. now - 10`) an import at `at`
    // keeps: within the hour before `at`, and ended by `at`.
    let whole_hour = |at: u64| {
        (now - 3600..now)
            .step_by(10)
            .filter(|&t| t > at - 3600 && t + 10 <= at)
            .count()
    };
    let before = unix_now();
    run_ok(
        bin().args([
            "import",
            "whisper",
            dir.path().to_str().unwrap(),
            "--redis",
            &redis.url(),
            "--retentions",
            schema,
        ]),
        "statsd-redis import whisper",
    );
    // The whole 10 s archive (the hour's points the clock has not yet moved past) and every
    // whole minute of the three hours; the book's 120 slices keep two hours of minutes and no
    // 10 s slice.
    let after = unix_now();
    // (The slices older than the newest 120 of each are in the archive's blocks.)
    let tens = redis.history("count:10:app.hits").len();
    assert!(
        [whole_hour(before), whole_hour(after)].contains(&tens),
        "{tens} slices of 10 s"
    );
    assert!(tens >= 350, "{tens}");
    assert!(redis.history("count:60:app.hits").len() >= 179);
    assert!(redis.get_counter("count:60:app.hits").len() <= 120);
    let oracle = GraphiteWeb::over(dir.path());
    let agent = TestAgent::start(statsd_redis::config::Config {
        retentions: schema.into(),
        ..test_config(&redis)
    });
    let agent_url = format!("http://{}/graphite", agent.http);
    let render = |base: &str, target: &str, from: u64| -> serde_json::Value {
        curl_json(&format!(
            "{base}/render?target={}&from={from}&until={now}&format=json",
            query_encode(target)
        ))
    };
    // 50 minutes: the 10 s archive; two and three hours: the minutes.
    for (etsy, ours, back, step) in [
        ("stats_counts.app.hits", "app.hits", 3000, 10),
        ("stats_counts.app.hits", "app.hits", 2 * 3600, 60),
        ("stats.gauges.app.queue", "app.queue", 3000, 10),
        ("stats.gauges.app.queue", "app.queue", 3 * 3600, 60),
        // A carbon path: each archive at its own step, averages as whisper made them.
        ("collectd.web1.load", "collectd.web1.load", 3000, 10),
        ("collectd.web1.load", "collectd.web1.load", 3 * 3600, 60),
    ] {
        let theirs = render(&oracle.url, etsy, now - back);
        let mine = render(&agent_url, ours, now - back);
        let points = |v: &serde_json::Value| v[0]["datapoints"].as_array().cloned().unwrap();
        let (theirs, mine) = (points(&theirs), points(&mine));
        assert_eq!(
            theirs[1][1].as_u64().unwrap() - theirs[0][1].as_u64().unwrap(),
            step,
            "{etsy} from -{back}s: graphite-web's archive"
        );
        assert!(
            theirs.iter().filter(|p| p[0].is_number()).count() > 10,
            "{etsy}: graphite-web has data"
        );
        assert_eq!(mine, theirs, "{ours} against {etsy} from -{back}s");
    }
    agent.stop().await;
}

/// What an import leaves, as readers see it: each hash's slices with its blocks' (a slice may
/// move from the hash into its block between two imports, as the clock passes a slice and the
/// hash keeps the newest 120), and every other key's `DUMP`.
type Imported = (
    std::collections::BTreeMap<String, std::collections::BTreeMap<u64, f64>>,
    std::collections::BTreeMap<String, Vec<u8>>,
);

fn imported(redis: &RedisServer) -> Imported {
    let (mut slices, mut others) = Imported::default();
    for (key, dump) in redis.snapshot() {
        if key.starts_with("count:") || key.starts_with("gauge:") {
            slices.insert(key.clone(), redis.history(&key));
        } else if !key.starts_with("history:") {
            others.insert(key, dump);
        }
    }
    (slices, others)
}

/// With a long archive's blocks in place, an import again finds each block and sets its slots
/// one by one (the script's other way) and changes nothing a reader sees; a slice the agent's
/// cleaner would have moved, found in the hash, is taken out of it as the import sets its slot.
#[test]
fn a_second_import_into_blocks_changes_nothing() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let now = unix_now() / 60 * 60;
    write_whisper(dir.path(), now);
    let schema = ["--retentions", "10s:1h,1m:7d"];
    let run = || {
        run_ok(
            bin()
                .args(["import", "whisper", dir.path().to_str().unwrap()])
                .args(["--redis", &redis.url(), "--until", &now.to_string()])
                .args(schema),
            "statsd-redis import whisper",
        )
    };
    run();
    let first = imported(&redis);
    assert!(
        redis
            .snapshot()
            .keys()
            .any(|k| k.starts_with("history:count:60:app.hits:248:"))
    );
    run();
    assert_eq!(imported(&redis), first);
    // An old slice in the hash (as an earlier release left it, or the agent wrote late) is
    // set in its slot and leaves the hash, so that it is never counted twice.
    let whole = redis.history("count:60:app.hits");
    let old = *whole.keys().next().unwrap();
    let _: () = redis::cmd("HSET")
        .arg("count:60:app.hits")
        .arg(old)
        .arg(999)
        .query(&mut redis.conn())
        .unwrap();
    run();
    assert!(!redis.get_counter("count:60:app.hits").contains_key(&old));
    assert_eq!(imported(&redis), first);
}
