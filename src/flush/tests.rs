use super::groups::deal;
use super::*;
use crate::aggregate::Ledger;
use crate::protocol::MetricType;
use crate::protocol::{Sample, Value};
use crate::store::{CounterWrite, Keys};
use std::time::Duration;

/// A closer over one reader's window, coarse writes every `coarse_write_secs` windows.
fn closer(coarse_write_secs: u64) -> (Closer, Arc<Mutex<Window>>) {
    closer_with(Config {
        coarse_write_secs: Some(coarse_write_secs),
        max_series_per_chunk: 100,
        ..Config::default()
    })
}

fn closer_with(config: Config) -> (Closer, Arc<Mutex<Window>>) {
    let window = Arc::new(Mutex::new(Window::default()));
    let chunker = Chunker::new(Keys::new(""), &config);
    let closer = Closer {
        windows: vec![window.clone()],
        ledger: Ledger::default(),
        numbering: chunker.numbering(),
        chunker,
        sequence: "flush:a".into(),
        last_window: 0,
        coarse: Coarse::new(&config),
        quantiles: QuantileGroups::new(&config),
        aggregations: Default::default(),
        drop_log: Default::default(),
        stamp_log: Default::default(),
        window_spool_log: Default::default(),
        state_spool_log: Default::default(),
        spool: None,
        reloads: None,
        app_series: None,
        config,
        clock: Clock::system(),
        opened: Duration::ZERO,
        telemetry: Arc::new(Telemetry::new()),
    };
    (closer, window)
}

fn record(window: &Mutex<Window>, series: usize) {
    let sample = Sample {
        kind: MetricType::Counter,
        value: Value::Number(1.0),
        rate: 1.0,
        tags: None,
        timestamp: None,
    };
    let mut w = window.lock().unwrap();
    for i in 0..series {
        w.record(&format!("s{i}"), &sample, usize::MAX);
    }
}

/// Chunks queued per window for windows 100..100+n with `series` counters each.
fn chunks_per_window(coarse_write_secs: u64, series: usize, n: u64) -> Vec<usize> {
    chunks_per_window_at(coarse_write_secs, series, 100..100 + n)
}

fn chunks_per_window_at(
    coarse_write_secs: u64,
    series: usize,
    starts: impl IntoIterator<Item = u64>,
) -> Vec<usize> {
    let (mut closer, window) = closer(coarse_write_secs);
    let backlog = Backlog::default();
    for start in starts {
        record(&window, series);
        closer.close(start, false, &backlog);
    }
    backlog.lock().iter().map(|w| w.chunks.len()).collect()
}

#[test]
fn after_a_boundary_the_next_is_waited_for_unless_the_clock_jumped() {
    let at = |secs: f64| Duration::from_secs_f64(secs);
    let room = 1000;
    // On time, or held up: the next boundary, even if passed already (it is closed at once).
    assert_eq!(next_boundary(101, at(101.0), 1, room), 102);
    assert_eq!(next_boundary(101, at(101.002), 1, room), 102);
    assert_eq!(next_boundary(101, at(104.5), 1, room), 102);
    assert_eq!(next_boundary(110, at(110.3), 10, room), 120);
    // A wake a little early (or the clock set back less than a window): the window just closed
    // is not closed again.
    assert_eq!(next_boundary(1001, at(1000.9), 1, room), 1002);
    // Set back further: the window holding now, not a wait as long as the step.
    assert_eq!(next_boundary(5000, at(1200.5), 1, room), 1201);
    // On by more than CATCH_UP_WINDOWS: from the window holding now.
    assert_eq!(next_boundary(101, at(101.5 + 60.0), 1, room), 102);
    assert_eq!(next_boundary(101, at(101.5 + 61.0), 1, room), 163);
    assert_eq!(next_boundary(101, at(100_000.5), 1, room), 100_001);
    // Or by more than the backlog can take: catching up must not push out what it holds.
    assert_eq!(next_boundary(101, at(104.5), 1, 3), 102);
    assert_eq!(next_boundary(101, at(105.5), 1, 3), 106);
    assert_eq!(next_boundary(101, at(102.5), 1, 0), 103);
}

/// Driven by a manual clock, the closer closes at its boundaries and only then: each window
/// carries what came in before its boundary; a jump far ahead goes on from there, and the stop
/// closes the window that was open.
#[tokio::test]
async fn the_closer_closes_the_windows_its_clock_passes() {
    let clock = Clock::manual(Duration::from_millis(1_000_300));
    let (mut closer, window) = closer(0);
    closer.opened = clock.now();
    closer.clock = clock.clone();
    let backlog = Backlog::default();
    let stop = CancellationToken::new();
    let starts = || -> Vec<u64> { backlog.lock().iter().map(|w| w.start).collect() };
    let queued = |expected: &'static [u64]| async move {
        for _ in 0..2000 {
            if starts() == expected {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(starts(), expected);
    };
    let drive = async {
        record(&window, 1);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(starts(), [0u64; 0], "nothing closes before the clock moves");
        clock.advance(Duration::from_millis(500));
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(starts(), [0u64; 0], "1000.8 is not yet a boundary");
        clock.advance(Duration::from_millis(500));
        queued(&[1000]).await;
        record(&window, 1);
        clock.advance(Duration::from_secs(3));
        queued(&[1000, 1001]).await;
        // 1002 and 1003 were closed empty; 1004 is open.
        record(&window, 1);
        clock.advance(Duration::from_secs(1));
        queued(&[1000, 1001, 1004]).await;
        record(&window, 1);
        clock.advance(Duration::from_secs(10_000));
        queued(&[1000, 1001, 1004, 1005]).await;
        record(&window, 1);
        clock.advance(Duration::from_secs(1));
        queued(&[1000, 1001, 1004, 1005, 11_005]).await;
        record(&window, 1);
        stop.cancel();
    };
    tokio::join!(closer.run(&backlog, &stop), drive);
    assert_eq!(starts(), [1000, 1001, 1004, 1005, 11_005, 11_006]);
}

#[test]
fn the_backlog_is_bounded_in_bytes_and_its_spool_follows_it() {
    let (mut closer, window) = closer(0);
    let dir = tempfile::tempdir().unwrap();
    closer.spool = Some(Arc::new(Spool::open(dir.path(), false).unwrap()));
    let backlog = Backlog::default();
    record(&window, 250);
    closer.close(100, false, &backlog);
    let one = backlog.lock()[0].bytes();
    closer.config.max_backlog_bytes = 2 * one + one / 2;
    for start in 101..105 {
        record(&window, 250);
        closer.close(start, false, &backlog);
    }
    let queued: Vec<u64> = backlog.lock().iter().map(|w| w.start).collect();
    assert_eq!(queued, [103, 104]);
    let files = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "window"))
        .count();
    assert_eq!(files, 2);
    // One window larger than the bound is still kept.
    closer.config.max_backlog_bytes = one / 2;
    record(&window, 250);
    closer.close(105, false, &backlog);
    assert_eq!(backlog.lock().len(), 1);
}

#[test]
fn a_restart_takes_up_the_coarse_sums_and_the_window_only_the_state_held() {
    let dir = tempfile::tempdir().unwrap();
    let spool_files = || {
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".window"))
            .collect();
        names.sort();
        names
    };
    let (mut first, window) = closer(5);
    first.spool = Some(Arc::new(Spool::open(dir.path(), false).unwrap()));
    let backlog = Backlog::default();
    for start in 100..103 {
        record(&window, 250);
        first.close(start, false, &backlog);
    }
    // The crash came between the state file and window 102's own file.
    let last = spool_files().pop().unwrap();
    std::fs::remove_file(dir.path().join(&last)).unwrap();
    // Each counter's sum at the first level.
    let sums = |c: &Closer| -> Vec<i64> {
        let coarse = c.coarse.as_ref().unwrap();
        coarse.sums.held().map(|(_, s, _, _)| s[0]).collect()
    };
    let held = sums(&first);
    drop(first);

    let (mut again, _) = closer(5);
    let spool = Arc::new(Spool::open(dir.path(), false).unwrap());
    again.spool = Some(spool.clone());
    let replayed = Backlog::default();
    again.replay(&spool, &replayed);
    let starts: Vec<u64> = replayed.lock().iter().map(|w| w.start).collect();
    assert_eq!(starts, [100, 101, 102]);
    assert_eq!(spool_files().len(), 3, "window 102 has a file again");
    let restored = sums(&again);
    assert_eq!(
        (restored.len(), restored.iter().sum::<i64>()),
        (250, 3 * 250)
    );
    assert_eq!(restored.iter().sum::<i64>(), held.iter().sum::<i64>());
    assert_eq!(again.coarse.unwrap().levels[0].held.group, Some(100));
}

#[test]
fn a_group_is_dealt_so_that_each_window_gets_a_share_of_every_kind() {
    // Nine counter chunks, then three costlier stats chunks, over three windows of four.
    let group = (0..12).map(|j| if j < 9 { 'c' } else { 's' }).collect();
    let dealt: Vec<char> = deal(group, 3).collect();
    for take in dealt.chunks(4) {
        assert_eq!(take.iter().filter(|&&k| k == 's').count(), 1, "{dealt:?}");
    }
    assert_eq!(deal(vec![1, 2], 5).collect::<Vec<_>>(), [1, 2]);
}

#[test]
fn a_late_close_does_not_mix_slices_in_a_group() {
    // Window 104 was never closed (a late close skipped its boundary): the 100..103 group
    // must end when 105 comes, not take 105..109 into the 5 s slice of 100.
    assert_eq!(
        chunks_per_window_at(5, 250, [100, 101, 102, 103, 105, 106, 107, 108, 109]),
        [3, 3, 3, 3, 4, 4, 4, 3, 4]
    );
}

#[test]
fn without_a_coarse_precision_nothing_is_deferred() {
    let config = Config {
        precisions: vec![1],
        coarse_write_secs: Some(5),
        ..Config::default()
    };
    assert!(Coarse::new(&config).is_none());
}

#[test]
fn without_coarse_writes_every_window_is_written_whole() {
    assert_eq!(chunks_per_window(0, 250, 3), [3, 3, 3]);
}

#[test]
fn a_group_is_written_once_and_spread_over_the_next_windows() {
    // Precision 1 every window (3 chunks of 250 series); 5 s to 1 day once per 5 s group
    // (windows 100..104, then 105..109), its 3 chunks spread one per following window.
    assert_eq!(
        chunks_per_window(5, 250, 12),
        [3, 3, 3, 3, 4, 4, 4, 3, 3, 4, 4, 4]
    );
}

#[test]
fn each_precision_is_written_once_per_its_slice_or_per_coarse_write_secs() {
    use CounterWrite::*;
    let config = Config {
        coarse_write_secs: Some(60),
        ..Config::default()
    };
    let coarse = Coarse::new(&config).unwrap();
    let precisions = |modes: [CounterWrite; 7]| {
        let mut v = Vec::from(crate::config::DEFAULT_PRECISIONS);
        v.iter_mut()
            .zip(modes)
            .map(|(p, m)| (*p, m))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        coarse.window_precisions,
        precisions([WriteUnindexed, Skip, Skip, Skip, Skip, Skip, Skip])
    );
    let levels: Vec<_> = coarse
        .levels
        .iter()
        .map(|l| (l.period_secs, l.precisions.clone()))
        .collect();
    assert_eq!(
        levels,
        [
            (
                5,
                precisions([IndexOnly, Write, Skip, Skip, Skip, Skip, Skip])
            ),
            (
                60,
                precisions([Skip, Skip, Write, Write, Write, Write, Write])
            ),
        ]
    );
    // Series of two 5 s groups in a row write without index members; the longest level
    // always adds them.
    assert_eq!(
        coarse.levels[0].continuing,
        Some(precisions([
            Skip,
            WriteUnindexed,
            Skip,
            Skip,
            Skip,
            Skip,
            Skip
        ]))
    );
    assert_eq!(coarse.levels[1].continuing, None);
    // Unless the cleaner may empty a hash between two groups: 4 slices of 1 s < 3 × 5 s.
    let few_slices = Coarse::new(&Config {
        sample_count: 4,
        ..config
    })
    .unwrap();
    assert_eq!(few_slices.levels[0].continuing, None);
}

#[test]
fn chunks_are_numbered_in_sending_order_across_fine_and_coarse_chunks() {
    let (mut closer, window) = closer(5);
    let backlog = Backlog::default();
    for start in 100..112 {
        record(&window, 250);
        closer.close(start, start == 111, &backlog);
    }
    let queue = backlog.lock();
    let numbers: Vec<u64> = queue
        .iter()
        .flat_map(|w| w.chunks.iter().map(|c| c.seq))
        .collect();
    assert_eq!(numbers, (1..=numbers.len() as u64).collect::<Vec<_>>());
    // The last window takes every coarse chunk still held: the third of the 105..109 group's
    // and the partial group of windows 110 and 111.
    assert_eq!(queue.back().map(|w| w.chunks.len()), Some(3 + 1 + 3));
}

/// `quantile_write_secs`: the buckets leave the windows' own chunks and come once per group,
/// with the window that ends it (or the last one); a restart from the spool takes up the
/// buckets an open group held.
#[test]
fn buckets_are_written_once_per_group_and_survive_a_restart() {
    let config = Config {
        quantile_precisions: vec![5, 3600],
        quantile_write_secs: 5,
        ..Config::default()
    };
    let timers = |window: &Mutex<Window>| {
        let mut w = window.lock().unwrap();
        for i in 0..3 {
            let sample = Sample {
                kind: MetricType::Timer,
                value: Value::Number(10.0 * (i + 1) as f64),
                rate: 1.0,
                tags: None,
                timestamp: None,
            };
            w.record(&format!("t{i}"), &sample, usize::MAX);
        }
    };
    let (mut closer, window) = closer_with(config.clone());
    let backlog = Backlog::default();
    for start in 100..112 {
        timers(&window);
        closer.close(start, start == 111, &backlog);
    }
    let per_window: Vec<usize> = backlog.lock().iter().map(|w| w.chunks.len()).collect();
    assert_eq!(per_window, [1, 1, 1, 1, 2, 1, 1, 1, 1, 2, 1, 2]);

    let dir = tempfile::tempdir().unwrap();
    let spool = Arc::new(Spool::open(dir.path(), false).unwrap());
    let (mut first, window) = closer_with(config.clone());
    first.spool = Some(spool.clone());
    for start in 100..103 {
        timers(&window);
        first.close(start, false, &backlog);
    }
    let held = |c: &Closer| -> f64 {
        let q = c.quantiles.as_ref().unwrap();
        q.sums
            .iter()
            .flat_map(|m| m.values())
            .map(|b| b.total())
            .sum()
    };
    assert_eq!(held(&first), 9.0);
    drop(first);
    drop(spool);
    let spool = Arc::new(Spool::open(dir.path(), false).unwrap());
    let (mut again, _) = closer_with(config);
    again.replay(&spool, &Backlog::default());
    assert_eq!(held(&again), 9.0, "the buckets held came back");
    assert_eq!(again.quantiles.as_ref().unwrap().held.group, Some(100));
}

/// The spool cannot take windows (here its directory is gone, as a full disk refuses a file):
/// they are queued in memory only and counted; once it can, the next close writes them, oldest
/// first and under their own numbers, and a replay then finds them in order with their chunks
/// as closed, those the writer had sent since included.
#[test]
fn windows_the_spool_could_not_take_are_spooled_when_it_can() {
    let (mut closer, window) = closer(0);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spool");
    closer.spool = Some(Arc::new(Spool::open(&path, false).unwrap()));
    let backlog = Backlog::default();
    let metric =
        |c: &Closer, name| crate::http::api::metric_sum(&c.telemetry.render(), name).unwrap_or(0.0);
    let unspooled = |c: &Closer| metric(c, "backlog_unspooled_windows");
    record(&window, 10);
    closer.close(100, false, &backlog);
    std::fs::remove_dir_all(&path).unwrap();
    for start in 101..104 {
        record(&window, 10);
        closer.close(start, false, &backlog);
    }
    assert_eq!(unspooled(&closer), 3.0);
    assert_eq!(
        metric(&closer, "spool_write_errors_total{kind=\"window\"}"),
        3.0
    );
    // The writer had Redis acknowledge window 100 and the first chunk of window 101.
    let first_of_101 = {
        let mut queue = backlog.lock();
        queue.pop_front();
        queue[0].chunks.remove(0)
    };

    std::fs::create_dir(&path).unwrap();
    closer.close(104, false, &backlog);
    assert_eq!(unspooled(&closer), 0.0);
    assert!(
        backlog
            .lock()
            .iter()
            .all(|w| matches!(w.spooled, Spooled::File(_)))
    );
    drop(closer);
    let spooled = Spool::open(&path, false).unwrap().load().unwrap();
    let order: Vec<(u64, u64)> = spooled.iter().map(|w| (w.start, w.number)).collect();
    assert_eq!(order, [(101, 2), (102, 3), (103, 4)]);
    assert_eq!(spooled[0].chunks[0].seq, first_of_101.seq);
}
