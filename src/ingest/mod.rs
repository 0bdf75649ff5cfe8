//! Receiving StatsD: sockets in [`udp`], and [`LineHandler`], which takes one datagram through
//! the parser into a reader's [`Window`] and tallies what it saw.

pub mod udp;

use crate::aggregate::{LogEntry, Window};
use crate::protocol::{self, BadLine, Line, SeriesNamer};
use crate::telemetry::Tally;

/// Bad lines kept for the log: the longest prefix of a line worth printing.
const BAD_LINE_LOG_BYTES: usize = 200;

/// Turns datagrams into window updates; one per reader, its buffers reused across datagrams.
#[derive(Debug)]
pub struct LineHandler {
    namer: SeriesNamer,
    pub tally: Tally,
    /// The first bad line since the reader last logged one.
    pub bad_example: Option<(BadLine, String)>,
}

impl LineHandler {
    pub fn new(sanitize_names: bool) -> LineHandler {
        LineHandler {
            namer: SeriesNamer::new(sanitize_names),
            tally: Tally::default(),
            bad_example: None,
        }
    }

    /// Records every good line of `datagram` into `window`. A `truncated` datagram (cut by the
    /// kernel) loses its partial last line, counted as a bad line.
    pub fn handle_datagram(&mut self, datagram: &[u8], truncated: bool, window: &mut Window) {
        self.tally.datagrams += 1;
        self.tally.bytes += datagram.len() as u64;
        let mut body = datagram;
        if truncated {
            self.tally.truncated += 1;
            let (whole, cut) = protocol::whole_lines(datagram);
            if cut {
                self.tally.lines += 1;
                self.reject(BadLine::Truncated, &datagram[whole.len()..]);
            }
            body = whole;
        }
        for line in protocol::lines(body) {
            self.tally.lines += 1;
            self.handle_line(line, window);
        }
    }

    fn handle_line(&mut self, line: &[u8], window: &mut Window) {
        if let Some((series, sample)) = protocol::parse_plain(line) {
            window.record(series, &sample);
            self.tally.samples[sample.kind as usize] += 1;
            return;
        }
        match protocol::parse_line(line) {
            Ok(Line::Metric(m)) => {
                // Naming fails only for the name itself (tags can't make it fail), so it fails
                // on the first sample or never: a line is recorded whole or not at all.
                let mut renamed = false;
                for sample in &m.samples {
                    match self.namer.series(m.name, m.influx_tags, sample.tags) {
                        Ok((series, r)) => {
                            renamed |= r;
                            window.record(series, sample);
                            self.tally.samples[sample.kind as usize] += 1;
                        }
                        Err(reason) => return self.reject(reason, line),
                    }
                }
                self.tally.renamed += u64::from(renamed);
                self.tally.unknown_fields += u64::from(m.unknown_fields);
            }
            Ok(Line::Event(e)) => {
                self.tally.events += 1;
                window.record_log(LogEntry::from_event(&e));
            }
            Ok(Line::ServiceCheck(sc)) => {
                self.tally.service_checks += 1;
                window.record_log(LogEntry::from_service_check(&sc));
            }
            Err(reason) => self.reject(reason, line),
        }
    }

    fn reject(&mut self, reason: BadLine, line: &[u8]) {
        self.tally.bad[reason as usize] += 1;
        if self.bad_example.is_none() {
            let shown = &line[..line.len().min(BAD_LINE_LOG_BYTES)];
            self.bad_example = Some((reason, String::from_utf8_lossy(shown).into_owned()));
        }
    }
}
