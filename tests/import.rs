//! `statsd-redis import whisper`: whisper files as Etsy's statsd leaves them through carbon
//! (written here by Debian's `python3-whisper`, the library carbon writes with: 10 s points for
//! an hour, then minutes for a week, counts summed and gauges' last values kept), imported
//! through the binary; the agent's Graphite API then answers for the imported names what
//! graphite-web answers over the same files. A second import changes no key; a damaged file is
//! named and skipped; nothing after the cut-off is touched.

mod common;

use std::collections::BTreeMap;
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
    // book's 120 slices keep (no 10 s precision here; its values: the test below); its five
    // minutes, which the file has no archive of, made of its finest archive that holds them
    // as whisper rolls up (average, xFilesFactor 0.5): before the hour of 10 s points, of its
    // minutes.
    let load = redis.history("gauge:60:collectd.web1.load");
    assert!((100..=120).contains(&load.len()), "{}", load.len());
    let fives = redis.history("gauge:300:collectd.web1.load");
    assert!(fives.len() >= 30, "{}", fives.len());
    let minutes = redis.history("gauge:60:collectd.web1.load");
    let mut checked = 0;
    for (slice, v) in fives.range(..now - 3600) {
        let of: Vec<f64> = minutes.range(slice..&(slice + 300)).map(|m| *m.1).collect();
        if of.len() == 5 {
            assert_eq!(*v, of.iter().sum::<f64>() / 5.0, "{slice}");
            checked += 1;
        }
    }
    assert!(
        checked >= 10,
        "{checked} five minutes beside the minutes the hash keeps"
    );

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

/// A carbon path's file made under another schema than the one its path matches now (carbon
/// never applies an edited schema to the files it made) is imported into its path's schema:
/// each precision from the file's archive of that step, else from its finest archive that holds
/// the slice, rolled up with the path's own aggregation and xFilesFactor; an archive that makes
/// no slice of the schema is named. The expected slices are made from the file as whisper
/// reads it (its header's float xFilesFactor, its slots' timestamps) by `whisper.aggregate`.
#[test]
fn a_file_of_another_schema_is_rolled_into_its_paths_schema() {
    let script = r#"
import json, os, struct, sys, whisper
root, now = sys.argv[1], int(sys.argv[2])
os.makedirs(os.path.join(root, "old"), exist_ok=True)
def write(name, archives, xff, method, step, back, value, kept):
    path = os.path.join(root, "old", name)
    whisper.create(path, archives, xFilesFactor=xff, aggregationMethod=method)
    points = [(t, value(t)) for t in range(now - back, now, step) if kept(t)]
    # As carbon writes them, a batch at a time as they come.
    for i in range(0, len(points), 60):
        batch = points[i:i + 60]
        whisper.update_many(path, batch, now=batch[-1][0] + step)
    return path
# Minutes for 20 days under 1m:1d,5m:20d, averaged at xFilesFactor 0.5. Hours that keep
# five minutes of ten (ten minutes made of those minutes: just enough), four (not enough; of
# five minutes: enough) and two (not enough of either).
kept = {0: range(5), 1: range(4), 2: (0, 9)}
avg = write("avg.wsp", [(60, 1440), (300, 5760)], 0.5, "average", 60, 20 * 86400,
            lambda t: (t // 60) % 17 * 0.37 + 1,
            lambda t: (t // 60) % 10 in kept.get((t // 3600) % 5, range(10)))
# Ten seconds for three hours under 10s:1h,1h:20d, the maximum at xFilesFactor 0.3: bands
# of ten minutes with one slot of six a minute (below it) and with two (reaching it).
mx = write("b.max.wsp", [(10, 360), (3600, 480)], 0.3, "max", 10, 3 * 3600,
           lambda t: ((t // 10) % 11 - 5) * 1.5,
           lambda t: {0: (t // 10) % 6 == 0, 1: (t // 10) % 6 < 2}.get((t // 600) % 4, True))
schema = [(10, 720), (60, 2880), (600, 4320)]
def expected(path):
    info = whisper.info(path)
    xff, method = info["xFilesFactor"], info["aggregationMethod"]
    archives = []
    with open(path, "rb") as f:
        for a in info["archives"]:
            f.seek(a["offset"])
            raw = [p for p in struct.iter_unpack("!Ld", f.read(a["size"])) if p[0]]
            step, newest = a["secondsPerPoint"], max(t for t, _ in raw)
            start = newest + step - step * a["points"]
            archives.append((step, start, newest + step,
                             {t: v for t, v in raw if t >= start and t % step == 0}))
    out = {}
    for p, count in schema:
        order = sorted((a for a in archives if p % a[0] == 0), key=lambda a: (a[0] != p, a[0]))
        decided, slices = set(), {}
        for step, start, end, points in order:
            t = -(-start // p) * p
            while t + p <= min(now, end):
                if t not in decided:
                    decided.add(t)
                    neighbors = [points.get(t + k * step) for k in range(p // step)]
                    known = [v for v in neighbors if v is not None]
                    if known and float(len(known)) / float(len(neighbors)) >= xff:
                        # As text: Rust parses it exactly (serde_json's own floats may not).
                        slices[t] = repr(whisper.aggregate(method, known, neighbors))
                t += p
        out[p] = slices
    return out
json.dump({"old.avg": expected(avg), "old.b.max": expected(mx)}, sys.stdout)
"#;
    let dir = tempfile::tempdir().unwrap();
    let now = unix_now() / 600 * 600;
    let out = with_python_whisper(script, &[dir.path().to_str().unwrap(), &now.to_string()]);
    let text: BTreeMap<String, BTreeMap<u64, BTreeMap<u64, String>>> =
        serde_json::from_slice(&out.stdout).unwrap();
    let want: BTreeMap<&str, BTreeMap<u64, BTreeMap<u64, f64>>> = (text.iter())
        .map(|(path, precisions)| {
            let parsed = |slices: &BTreeMap<u64, String>| {
                (slices.iter())
                    .map(|(t, v)| (*t, v.parse().unwrap()))
                    .collect()
            };
            let precisions = precisions.iter().map(|(p, s)| (*p, parsed(s)));
            (path.as_str(), precisions.collect())
        })
        .collect();
    let conf = dir.path().join("storage-schemas.conf");
    std::fs::write(
        &conf,
        "[old]\npattern = ^old\\.\nretentions = 10s:2h,1m:2d,10m:30d\n",
    )
    .unwrap();
    let aggregation = dir.path().join("storage-aggregation.conf");
    std::fs::write(
        &aggregation,
        "[max]\npattern = \\.max$\nxFilesFactor = 0.3\naggregationMethod = max\n",
    )
    .unwrap();
    let redis = RedisServer::start();
    let out = run_ok(
        bin()
            .args(["import", "whisper", dir.path().to_str().unwrap()])
            .args(["--redis", &redis.url(), "--until", &now.to_string()])
            .args(["--storage-schemas", conf.to_str().unwrap()])
            .args(["--storage-aggregation", aggregation.to_str().unwrap()]),
        "statsd-redis import whisper",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("left out of") && stderr.contains("b.max.wsp: its 3600 s archive"),
        "{stderr}"
    );
    assert_eq!(stderr.matches("left out of").count(), 1, "{stderr}");
    for (path, precisions) in &want {
        for (p, slices) in precisions {
            let got = redis.history(&format!("gauge:{p}:{path}"));
            // Every precision made something: the 10 s one only of the file with 10 s points.
            assert_eq!(
                slices.is_empty(),
                *p == 10 && *path == "old.avg",
                "{path} at {p}"
            );
            let differ: Vec<_> = (got.keys().chain(slices.keys()))
                .filter(|t| got.get(t) != slices.get(t))
                .map(|t| (t, got.get(t), slices.get(t)))
                .take(5)
                .collect();
            assert!(
                differ.is_empty(),
                "{path} at {p} s (slice, imported, whisper's): {differ:?}"
            );
        }
    }
    // The ten minutes of the last day come from the minutes, the older ones from the five
    // minutes: both made some, and each left some out below xFilesFactor. Of the last day's
    // 144, three hours in five and the hours of five minutes in ten (at xFilesFactor, not
    // above it) make 86.
    let tens = &want["old.avg"][&600];
    let day = now - 86400;
    let (recent, older) = (tens.range(day..).count(), tens.range(..day).count());
    assert!(recent > 80 && older > 2000, "{recent} {older}");
    for (from, to) in [(day, now), (now - 20 * 86400 + 600, day)] {
        let held = (from..to)
            .step_by(600)
            .filter(|t| tens.contains_key(t))
            .count();
        assert!(
            held < ((to - from) / 600) as usize,
            "some left out in {from}..{to}"
        );
    }
}
