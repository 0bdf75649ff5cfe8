//! Writing closed windows: [`build_chunks`] turns a window into bounded [`FlushChunk`]s, each a
//! ready `EVALSHA` of `flush.lua` with its own token; [`Writer`] sends them over one
//! multiplexed connection, reconnecting after any failure.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{Client, RedisWrite, Script, ToRedisArgs};

use super::{Keys, StoreError, clock, keys};
use crate::aggregate::{ClosedWindow, SeriesName};
use crate::telemetry::Telemetry;

const FLUSH_SCRIPT: &str = include_str!("flush.lua");

/// One script call of a window: applied atomically, and at most once thanks to its token.
#[derive(Debug, Clone)]
pub struct FlushChunk {
    /// Series (and log entries) it carries.
    pub series: usize,
    token: String,
    /// The script's ARGV, fixed when the window closed so every retry sends the same values.
    argv: Argv,
}

/// A chunk's script arguments, packed: one buffer and where each argument ends. It waits in the
/// backlog (coarse groups for up to a period), so it costs 4 bytes per argument beside the bytes
/// themselves, where a `redis::Cmd` costs 16 and grows by doubling; a `Cmd` is made from it only
/// when the chunk is sent.
#[derive(Debug, Clone, Default)]
struct Argv {
    data: Vec<u8>,
    ends: Vec<u32>,
}

impl Argv {
    fn arg(&mut self, value: impl ToRedisArgs) -> &mut Argv {
        value.write_redis_args(self);
        self
    }

    fn iter(&self) -> impl Iterator<Item = &[u8]> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts
            .zip(&self.ends)
            .map(|(start, &end)| &self.data[start as usize..end as usize])
    }

    fn end_arg(&mut self) {
        // A chunk holds at most a few megabytes (bounded series, sets cost per 100 members).
        self.ends
            .push(u32::try_from(self.data.len()).unwrap_or(u32::MAX));
    }
}

impl RedisWrite for Argv {
    fn write_arg(&mut self, arg: &[u8]) {
        self.data.extend_from_slice(arg);
        self.end_arg();
    }

    fn writer_for_next_arg(&mut self) -> impl std::io::Write + '_ {
        /// Ends the argument when the caller is done writing it.
        struct Guard<'a>(&'a mut Argv);
        impl Drop for Guard<'_> {
            fn drop(&mut self) {
                self.0.end_arg();
            }
        }
        impl std::io::Write for Guard<'_> {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.data.extend_from_slice(buf);
                Ok(buf.len())
            }

            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        Guard(self)
    }
}

impl FlushChunk {
    /// Names the chunk as the `index`th one written with `window`; its token must be unique.
    pub fn set_token(&mut self, keys: &Keys, agent_id: &str, window: u64, index: usize) {
        self.token = keys.flush_token(agent_id, window, index);
    }

    pub fn token(&self) -> &str {
        &self.token
    }
}

/// What a chunk may hold: `max_series` series, a set costing one more per this many members.
const SET_MEMBERS_PER_SERIES: usize = 100;

/// The part of a closed window that one chunk carries, as index ranges into its vectors.
#[derive(Default)]
struct Slice {
    counters: (usize, usize),
    stats: (usize, usize),
    gauges: (usize, usize),
    sets: (usize, usize),
    logs: (usize, usize),
}

/// Splits `[0, len)` of each section (`counters` of the window's counters) into chunks of at
/// most `budget` cost, in section order.
fn plan(window: &ClosedWindow, counters: usize, budget: usize) -> Vec<Slice> {
    let set_cost = |i: usize| 1 + window.sets[i].1.len() / SET_MEMBERS_PER_SERIES;
    let sections: [(usize, &dyn Fn(usize) -> usize); 5] = [
        (counters, &|_| 1),
        (window.stats.len(), &|_| 1),
        (window.gauges.len(), &|_| 1),
        (window.sets.len(), &set_cost),
        (window.logs.len(), &|_| 1),
    ];
    let mut chunks = Vec::new();
    let mut current = Slice::default();
    let mut cost = 0;
    for (section, (len, item_cost)) in sections.iter().enumerate() {
        let mut start = 0;
        for item in 0..*len {
            let c = item_cost(item);
            if cost > 0 && cost + c > budget {
                *current.section(section) = (start, item);
                chunks.push(std::mem::take(&mut current));
                start = item;
                cost = 0;
            }
            cost += c;
        }
        *current.section(section) = (start, *len);
    }
    if cost > 0 {
        chunks.push(current);
    }
    chunks
}

impl Slice {
    fn section(&mut self, i: usize) -> &mut (usize, usize) {
        [
            &mut self.counters,
            &mut self.stats,
            &mut self.gauges,
            &mut self.sets,
            &mut self.logs,
        ]
        .into_iter()
        .nth(i)
        .expect("five sections")
    }
}

/// What a chunk does with its counters at one precision. Gauges and sets are written at every
/// precision the chunk lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CounterWrite {
    /// Nothing at this precision.
    Skip = 0,
    /// `HINCRBY`, and the index member with a new slice.
    Write = 1,
    /// `HINCRBY` only (`coarse_write_secs`): a later chunk of this agent adds the index member
    /// (the 1 s precision, indexed once per period, not every second), or it is there already
    /// (a series a coarse level wrote in the group before too).
    WriteUnindexed = 2,
    /// The index member only, for counters that earlier chunks wrote unindexed.
    IndexOnly = 3,
}

impl CounterWrite {
    /// Every precision written and indexed: a window written whole.
    pub fn everywhere(precisions: &[u64]) -> Vec<(u64, CounterWrite)> {
        precisions
            .iter()
            .map(|&p| (p, CounterWrite::Write))
            .collect()
    }
}

/// Splits a closed window into chunks of at most `max_series` series each, each a ready
/// `EVALSHA` of `flush.lua` (argument layout documented there), the `i`th with the token
/// `flush:<agent_id>:<window.start>:<i>` unless [`FlushChunk::set_token`] names it again.
pub fn build_chunks(
    window: &ClosedWindow,
    keys: &Keys,
    precisions: &[(u64, CounterWrite)],
    sample_count: u64,
    agent_id: &str,
    token_ttl_secs: u64,
    max_series: usize,
) -> Vec<FlushChunk> {
    let hour = clock::hour_start(window.start);
    let asctime = clock::asctime(window.start);
    // Counters that no listed precision takes (all of them coarse) are left out, not sent.
    let counted = precisions.iter().any(|(_, c)| *c != CounterWrite::Skip);
    let all_counters: &[(SeriesName, i64)] = if counted { &window.counters } else { &[] };
    plan(window, all_counters.len(), max_series)
        .into_iter()
        .enumerate()
        .map(|(index, part)| {
            let mut cmd = Argv::default();
            cmd.arg(token_ttl_secs)
                .arg(keys.prefix())
                .arg(sample_count)
                .arg(&hour)
                .arg(&asctime)
                .arg(precisions.len());
            for &(p, counters) in precisions {
                cmd.arg(p)
                    .arg(keys::slice(window.start, p))
                    .arg(counters as u8);
            }
            let counters = &all_counters[part.counters.0..part.counters.1];
            cmd.arg(counters.len());
            for (series, n) in counters {
                cmd.arg(&**series).arg(*n);
            }
            let stats = &window.stats[part.stats.0..part.stats.1];
            cmd.arg(stats.len());
            for (series, kind, s) in stats {
                cmd.arg(&**series)
                    .arg(kind.redis_name())
                    .arg(s.count)
                    .arg(s.sum)
                    .arg(s.sumsq)
                    .arg(s.min)
                    .arg(s.max);
            }
            let gauges = &window.gauges[part.gauges.0..part.gauges.1];
            cmd.arg(gauges.len());
            for (series, value) in gauges {
                cmd.arg(&**series).arg(*value);
            }
            let sets = &window.sets[part.sets.0..part.sets.1];
            cmd.arg(sets.len());
            for (series, members) in sets {
                cmd.arg(&**series).arg(members.len());
                for m in members {
                    cmd.arg(&**m);
                }
            }
            let logs = &window.logs[part.logs.0..part.logs.1];
            cmd.arg(logs.len());
            for log in logs {
                cmd.arg(&log.name)
                    .arg(log.severity.as_str())
                    .arg(&log.message);
            }
            cmd.data.shrink_to_fit();
            cmd.ends.shrink_to_fit();
            FlushChunk {
                series: counters.len() + stats.len() + gauges.len() + sets.len() + logs.len(),
                token: keys.flush_token(agent_id, window.start, index),
                argv: cmd,
            }
        })
        .collect()
}

/// Sends flush chunks to Redis.
pub struct Writer {
    client: Client,
    connection: Option<MultiplexedConnection>,
    connected_before: bool,
    timeout: Duration,
    script: Script,
    /// Tokens of chunks whose replies arrived: deleted by the next script call.
    acknowledged: Vec<String>,
    telemetry: Arc<Telemetry>,
}

/// What happened to a chunk that reached Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    Now,
    /// Its token existed: an earlier attempt had applied it and only the reply was lost.
    Before,
}

impl Writer {
    pub fn new(client: Client, timeout: Duration, telemetry: Arc<Telemetry>) -> Writer {
        Writer {
            client,
            connection: None,
            connected_before: false,
            timeout,
            script: Script::new(FLUSH_SCRIPT),
            acknowledged: Vec::new(),
            telemetry,
        }
    }

    async fn connection(&mut self) -> Result<MultiplexedConnection, StoreError> {
        if let Some(c) = &self.connection {
            return Ok(c.clone());
        }
        let connection = super::connect(&self.client, self.timeout).await?;
        if self.connected_before {
            self.telemetry.redis_reconnects.increment(1);
        }
        self.connected_before = true;
        self.connection = Some(connection.clone());
        Ok(connection)
    }

    /// Applies chunks in one pipeline (one round trip), in order. On an error none of them
    /// counts as acknowledged: sending them all again is safe, since their tokens stay until
    /// acknowledged. Any error drops the connection, so the next call starts afresh.
    pub async fn write_chunks(
        &mut self,
        chunks: &[Arc<FlushChunk>],
    ) -> Result<Vec<Applied>, StoreError> {
        let result = self.try_write(chunks).await;
        if result.is_err() {
            self.connection = None;
            self.telemetry.redis_errors.increment(1);
        }
        result
    }

    /// Deletes the tokens of the chunks acknowledged last (no later call will): for a clean stop.
    pub async fn release_tokens(&mut self) -> Result<(), StoreError> {
        if self.acknowledged.is_empty() {
            return Ok(());
        }
        let mut conn = self.connection().await?;
        redis::cmd("DEL")
            .arg(&self.acknowledged)
            .query_async::<()>(&mut conn)
            .await?;
        self.acknowledged.clear();
        Ok(())
    }

    async fn try_write(&mut self, chunks: &[Arc<FlushChunk>]) -> Result<Vec<Applied>, StoreError> {
        let mut conn = self.connection().await?;
        let mut pipe = redis::pipe();
        for (i, chunk) in chunks.iter().enumerate() {
            // The first call deletes the tokens acknowledged so far.
            let acknowledged: &[String] = if i == 0 { &self.acknowledged } else { &[] };
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(self.script.get_hash())
                .arg(1 + acknowledged.len())
                .arg(&chunk.token)
                .arg(acknowledged);
            for arg in chunk.argv.iter() {
                cmd.arg(arg);
            }
            pipe.add_command(cmd);
        }
        let replies: Vec<i64> = match pipe.query_async(&mut conn).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                self.script.prepare_invoke().load_async(&mut conn).await?;
                pipe.query_async(&mut conn).await?
            }
            other => other?,
        };
        // The calls deleted the earlier tokens; these chunks' replies arrived, so theirs are next.
        self.acknowledged.clear();
        self.acknowledged
            .extend(chunks.iter().map(|c| c.token.clone()));
        Ok(replies
            .into_iter()
            .map(|applied| {
                if applied == 1 {
                    Applied::Now
                } else {
                    Applied::Before
                }
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::{LogEntry, Severity};

    fn window(counters: usize, sets: &[usize], logs: usize) -> ClosedWindow {
        ClosedWindow {
            start: 100,
            counters: (0..counters).map(|i| (format!("c{i}").into(), 1)).collect(),
            sets: sets
                .iter()
                .enumerate()
                .map(|(i, m)| {
                    (
                        format!("s{i}").into(),
                        (0..*m).map(|j| j.to_string().into_bytes().into()).collect(),
                    )
                })
                .collect(),
            logs: (0..logs)
                .map(|_| LogEntry {
                    name: "n".into(),
                    severity: Severity::Info,
                    message: "m".into(),
                })
                .collect(),
            ..ClosedWindow::default()
        }
    }

    fn chunk_sizes(w: &ClosedWindow, budget: usize) -> Vec<usize> {
        build_chunks(
            w,
            &Keys::new(""),
            &CounterWrite::everywhere(&[1, 60]),
            120,
            "a",
            3600,
            budget,
        )
        .iter()
        .map(|c| c.series)
        .collect()
    }

    #[test]
    fn packed_arguments_are_those_a_command_would_send() {
        let member: &[u8] = b"\x00\xffm";
        let mut argv = Argv::default();
        argv.arg(3600u64)
            .arg("")
            .arg(-7i64)
            .arg(0.1f64)
            .arg(f64::MAX)
            .arg(member);
        let mut cmd = redis::Cmd::new();
        cmd.arg(3600u64)
            .arg("")
            .arg(-7i64)
            .arg(0.1f64)
            .arg(f64::MAX)
            .arg(member);
        let expected: Vec<&[u8]> = cmd
            .args_iter()
            .filter_map(|a| match a {
                redis::Arg::Simple(bytes) => Some(bytes),
                _ => None,
            })
            .collect();
        assert_eq!(expected.len(), 6);
        assert_eq!(argv.iter().collect::<Vec<_>>(), expected);
    }

    #[test]
    fn chunks_respect_the_budget_across_sections() {
        assert_eq!(chunk_sizes(&window(5, &[], 0), 2), [2, 2, 1]);
        assert_eq!(chunk_sizes(&window(3, &[1], 2), 2), [2, 2, 2]);
        assert_eq!(chunk_sizes(&window(0, &[], 0), 2), Vec::<usize>::new());
    }

    #[test]
    fn counters_no_precision_takes_are_left_out() {
        let w = window(5, &[1], 0);
        let skip = [(1, CounterWrite::Skip), (60, CounterWrite::Skip)];
        let chunks = build_chunks(&w, &Keys::new(""), &skip, 120, "a", 3600, 100);
        assert_eq!(chunks.iter().map(|c| c.series).collect::<Vec<_>>(), [1]);
    }

    #[test]
    fn big_sets_cost_more() {
        // 250 members cost 3; a chunk still takes at least one item.
        assert_eq!(chunk_sizes(&window(1, &[250, 1], 0), 3), [1, 1, 1]);
    }

    #[test]
    fn every_item_lands_in_exactly_one_chunk() {
        let w = window(7, &[1, 500, 2], 4);
        let chunks = build_chunks(
            &w,
            &Keys::new(""),
            &CounterWrite::everywhere(&[1]),
            120,
            "a",
            3600,
            4,
        );
        assert_eq!(chunks.iter().map(|c| c.series).sum::<usize>(), 7 + 3 + 4);
        let tokens: Vec<_> = chunks.iter().map(|c| c.token()).collect();
        let expected: Vec<_> = (0..chunks.len())
            .map(|i| format!("flush:a:100:{i}"))
            .collect();
        assert_eq!(tokens, expected);
    }
}
