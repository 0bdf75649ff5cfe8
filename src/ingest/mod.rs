//! Receiving StatsD: datagram sockets (UDP, unix) in [`udp`], streams (TCP, unix) in
//! [`stream`], and [`LineHandler`], which takes datagrams and whole lines through the parser
//! into a reader's [`Window`] and tallies what it saw.

pub mod datagram;
pub mod mapping;
pub mod relay;
pub mod rules;
pub mod stream;

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::aggregate::{LogEntry, Window};
use crate::protocol::{self, BadLine, Line, Sample, SeriesNamer, carbon, pickle};
pub use crate::telemetry::Transport;
use crate::telemetry::{LogLimit, Tally};
use mapping::Mapped;
use relay::{Relay, RelayBuffer};
use rules::{Listed, Rules, SharedRules};

/// Bad lines kept for the log: the longest prefix of a line worth printing.
const BAD_LINE_LOG_BYTES: usize = 200;

/// The rate limit of one listener's bad-line log messages, shared by its readers: one per
/// [`LogLimit::PERIOD`]; the metrics count them all.
#[derive(Debug, Default)]
pub struct BadLineLog(Mutex<LogLimit>);

impl BadLineLog {
    /// Logs the handler's first bad line since the last message, unless one was logged less
    /// than [`LogLimit::PERIOD`] ago.
    pub fn log(&self, handler: &mut LineHandler, transport: Transport) {
        if handler.bad_example.is_none() {
            return;
        }
        let mut limit = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if limit.occurred().is_none() {
            return;
        }
        if let Some((reason, line)) = handler.bad_example.take() {
            tracing::warn!(
                transport = transport.as_str(),
                reason = reason.as_str(),
                line,
                "bad line (further ones are only counted for the next 10 s)"
            );
        }
    }
}

/// A unix socket file of ours: made with the configured permissions, removed when dropped (at a
/// clean stop, once its listener has stopped) if it is still the file this process bound.
#[derive(Debug)]
pub struct SocketFile {
    path: PathBuf,
    /// Device and inode of the file bound: a file another process put there since is not ours.
    id: (u64, u64),
}

impl SocketFile {
    /// Binds a unix socket at `path` with `bind`, readable and writable as `mode` says from its
    /// first instant (the umask is set around the bind: no window with looser permissions).
    ///
    /// A socket file already there is probed with `probe` (a connect of the listener's own
    /// kind): only a refused connection means nobody listens, and then the file is a crashed
    /// run's and is replaced. A live socket, a socket of another kind (the probe fails another
    /// way), or any other kind of file is an error and is never removed.
    pub fn bind<S>(
        path: &Path,
        mode: u32,
        probe: impl Fn(&Path) -> io::Result<()>,
        bind: impl FnOnce(&Path) -> io::Result<S>,
    ) -> io::Result<(S, SocketFile)> {
        match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_socket() => match probe(path) {
                Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => {
                    tracing::info!(path = %path.display(), "replacing a stale socket file");
                    std::fs::remove_file(path)?;
                }
                Ok(()) => {
                    return Err(io::Error::new(
                        io::ErrorKind::AddrInUse,
                        "another process listens on this socket",
                    ));
                }
                Err(e) => {
                    return Err(io::Error::new(
                        io::ErrorKind::AddrInUse,
                        format!("a socket is there that may be in use ({e}): not replaced"),
                    ));
                }
            },
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    "a file that is not a socket is in the way",
                ));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        // SAFETY: umask only swaps the process's file mode mask; it cannot fail. Sockets are
        // bound while the agent starts, before it creates files anywhere else.
        let old = unsafe { libc::umask(!mode & 0o777) };
        let socket = bind(path);
        // SAFETY: as above, restoring the mask read.
        unsafe { libc::umask(old) };
        let socket = socket?;
        let meta = std::fs::symlink_metadata(path)?;
        let file = SocketFile {
            path: path.to_path_buf(),
            id: (meta.dev(), meta.ino()),
        };
        // The mask can only take bits away; this gives the rest (e.g. a mode above 0777 & ~0).
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
        Ok((socket, file))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        let ours = std::fs::symlink_metadata(&self.path)
            .is_ok_and(|meta| (meta.dev(), meta.ino()) == self.id);
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Turns datagrams into window updates; one per reader, its buffers reused across datagrams.
#[derive(Debug)]
pub struct LineHandler {
    namer: SeriesNamer,
    /// New series a window takes per type (`max_series_per_window`).
    max_series: usize,
    pub tally: Tally,
    /// The first bad line since the reader last logged one.
    pub bad_example: Option<(BadLine, String)>,
    /// The filters and mapping rules in use (none: `None`), the shared ones a SIGHUP
    /// replaces, and the version of those taken.
    rules: Option<Arc<Rules>>,
    /// The rules when they hold carbon's lists (none: `None`).
    carbon_lists: Option<Arc<Rules>>,
    shared: Option<(Arc<SharedRules>, u64)>,
    /// With `relay`: the packet of received lines being filled.
    relay: Option<RelayBuffer>,
    /// Whether the lines are carbon's (`path value timestamp`) rather than StatsD's.
    carbon: bool,
}

impl LineHandler {
    pub fn new(sanitize_names: bool, max_series: usize) -> LineHandler {
        LineHandler {
            namer: SeriesNamer::new(sanitize_names),
            max_series,
            tally: Tally::default(),
            bad_example: None,
            rules: None,
            carbon_lists: None,
            shared: None,
            relay: None,
            carbon: false,
        }
    }

    /// Takes the lines of `transport`: carbon's on the carbon receivers. [`handle_lines`] hands
    /// those over before it relays or applies the filters and mapping rules, which are StatsD's.
    ///
    /// [`handle_lines`]: LineHandler::handle_lines
    pub fn for_transport(mut self, transport: Transport) -> LineHandler {
        self.carbon = transport.is_carbon();
        self
    }

    /// Relays every line received through `relay`.
    pub fn with_relay(mut self, relay: Option<Arc<Relay>>) -> LineHandler {
        self.relay = relay.map(RelayBuffer::new);
        self
    }

    /// Sends the relay's partial packet: at the end of each read of a stream.
    pub fn flush_relay(&mut self) {
        if let Some(relay) = &mut self.relay {
            relay.flush();
        }
    }

    /// Sends the relay's partial packet once it has waited long enough: after each batch of
    /// datagrams, and at each read timeout.
    pub fn flush_relay_due(&mut self) {
        if let Some(relay) = &mut self.relay {
            relay.flush_due();
        }
    }

    /// Applies `rules`, and the rules that replace them.
    pub fn with_rules(mut self, rules: Arc<SharedRules>) -> LineHandler {
        self.shared = Some((rules, u64::MAX));
        self.take_rules();
        self
    }

    /// Takes the shared rules if they changed.
    #[inline]
    fn take_rules(&mut self) {
        let Some((shared, version)) = &mut self.shared else {
            return;
        };
        if let Some(rules) = shared.changed_since(version) {
            self.namer.drop_tags = rules.drop_tags.clone();
            self.carbon_lists = rules.has_carbon_lists().then(|| rules.clone());
            self.rules = (!rules.is_empty()).then_some(rules);
        }
    }

    /// Names a sample of metric `name` (its tags `influx` or `dog`) and records it, through
    /// the filters and the mapping rules when there are any; what they remove is counted.
    /// `Ok(renamed)`, or why the name is bad.
    #[inline]
    fn record(
        &mut self,
        name: &str,
        (influx, dog): (Option<&str>, Option<&str>),
        sample: &Sample<'_>,
        window: &mut Window,
        plain: bool,
    ) -> Result<bool, BadLine> {
        let mapped = match &self.rules {
            None => Mapped::Unmatched,
            Some(rules) if !rules.keeps(name, sample.kind) => Mapped::Drop,
            Some(rules) => rules.mapper.map(name, sample.kind),
        };
        let (series, renamed) = match &mapped {
            // A plain line's name is its series already (`parse_plain` checked it).
            Mapped::Unmatched if plain => (name, false),
            Mapped::Unmatched => self.namer.series(name, influx, dog)?,
            Mapped::Drop => {
                self.tally.samples[sample.kind as usize] += 1;
                self.tally.filtered[sample.kind as usize] += 1;
                return Ok(false);
            }
            Mapped::To {
                name,
                labels,
                honor_labels,
                rule,
            } => {
                let named = self
                    .namer
                    .series_labelled(name, influx, dog, labels, *honor_labels)?;
                // The rule's own page options go with its series to the Prometheus page.
                if window.observe
                    && let Some(options) = self
                        .rules
                        .as_ref()
                        .and_then(|r| r.mapper.page_options(*rule))
                {
                    window.note_page_options(named.0, options, self.max_series);
                }
                named
            }
        };
        if renamed && window.observe {
            // The Prometheus page escapes the name as sent, as statsd_exporter does, where
            // Redis has it sanitized (`with😱emoji`: `with_emoji` there, `withemoji` here).
            let sent = match &mapped {
                Mapped::To { name, .. } => name.as_str(),
                _ => name,
            };
            if series.split(';').next() != Some(sent) {
                window.note_page_name(series, sent, self.max_series);
            }
        }
        window.record(series, sample, self.max_series);
        self.tally.samples[sample.kind as usize] += 1;
        Ok(renamed)
    }

    /// Records every good line of `datagram` into `window`. A `truncated` datagram (cut by the
    /// kernel) loses its partial last line, counted as a bad line.
    pub fn handle_datagram(&mut self, datagram: &[u8], truncated: bool, window: &mut Window) {
        self.tally.packets += 1;
        self.tally.bytes += datagram.len() as u64;
        let mut body = datagram;
        if truncated {
            self.tally.truncated_datagrams += 1;
            let (whole, cut) = protocol::whole_lines(datagram);
            if cut {
                self.tally.lines += 1;
                self.reject(BadLine::Truncated, &datagram[whole.len()..]);
            }
            body = whole;
        }
        self.handle_lines(body, window);
    }

    /// Records every good line of `body` (whole lines; the last needs no newline).
    pub fn handle_lines(&mut self, mut body: &[u8], window: &mut Window) {
        if self.carbon {
            return self.handle_carbon(body, window);
        }
        // The common line is split and parsed in one pass; anything else is split off and
        // goes through the full parser.
        self.take_rules();
        if let Some(relay) = &mut self.relay {
            relay.add(body);
        }
        while !body.is_empty() {
            if let Some((series, sample, used)) = protocol::parse_plain(body) {
                self.tally.lines += 1;
                if self.rules.is_none() {
                    self.tally.samples[sample.kind as usize] += 1;
                    window.record(series, &sample, self.max_series);
                } else if let Err(reason) = self.record(series, (None, None), &sample, window, true)
                {
                    self.reject(reason, &body[..used]);
                }
                body = &body[used..];
                continue;
            }
            let (line, rest) = protocol::first_line(body);
            body = rest;
            if !line.is_empty() {
                self.tally.lines += 1;
                self.handle_line(line, window);
            }
        }
    }

    fn handle_line(&mut self, line: &[u8], window: &mut Window) {
        match protocol::parse_line(line) {
            Ok(Line::Metric(m)) => {
                // Naming fails only for the name itself (tags can't make it fail), so it fails
                // on the first sample or never: a line is recorded whole or not at all.
                let mut renamed = false;
                for sample in &m.samples {
                    match self.record(&m.name, (m.influx_tags, sample.tags), sample, window, false)
                    {
                        Ok(r) => renamed |= r,
                        Err(reason) => return self.reject(reason, line),
                    }
                }
                self.tally.names_sanitized += u64::from(renamed);
                self.tally.unknown_fields += u64::from(m.unknown_fields);
                if let Some(reason) = m.rejected {
                    self.reject(reason, line);
                }
            }
            Ok(Line::Event(e)) => {
                self.tally.events += 1;
                self.tally.unknown_fields += u64::from(e.unknown_fields);
                window.record_log(LogEntry::from_event(&e), self.max_series);
            }
            Ok(Line::ServiceCheck(sc)) => {
                self.tally.service_checks += 1;
                self.tally.unknown_fields += u64::from(sc.unknown_fields);
                window.record_log(LogEntry::from_service_check(&sc), self.max_series);
            }
            Err(reason) => self.reject(reason, line),
        }
    }

    /// Records every good carbon line of `body` (empty lines skipped).
    fn handle_carbon(&mut self, body: &[u8], window: &mut Window) {
        let mut now = None;
        for line in protocol::lines(body) {
            self.tally.lines += 1;
            let parsed = carbon::parse_line(line);
            self.record_point(parsed, &mut now, line, window);
        }
    }

    /// Records the items of one pickle message (`carbon_pickle`): each item a line, a message
    /// that does not decode one bad line.
    pub fn handle_pickle(&mut self, message: &[u8], window: &mut Window) {
        let decoded = match pickle::decode(message) {
            Ok(decoded) => decoded,
            Err(_) => {
                self.tally.lines += 1;
                return self.reject(BadLine::InvalidPickle, message);
            }
        };
        let mut now = None;
        for item in decoded.items() {
            self.tally.lines += 1;
            let parsed = match item {
                pickle::Item::Point { path, at, value } => std::str::from_utf8(path)
                    .map_err(|_| BadLine::InvalidUtf8)
                    .and_then(|path| carbon::point(path, value, at)),
                pickle::Item::Shape => Err(BadLine::FieldCount),
                pickle::Item::Number => Err(BadLine::InvalidValue),
            };
            self.record_point(parsed, &mut now, b"(a pickle item)", window);
        }
    }

    /// A carbon point into `window`, or its line counted bad. Carbon's `-1` is the time it
    /// came (`now`, read once a batch), as carbon takes `time.time()`.
    fn record_point(
        &mut self,
        parsed: Result<carbon::Parsed<'_>, BadLine>,
        now: &mut Option<f64>,
        line: &[u8],
        window: &mut Window,
    ) {
        // Carbon's lists come first, as in its metricReceived: before the NaN check.
        if let (Ok(p), Some(lists)) = (&parsed, &self.carbon_lists) {
            match lists.refuses(p.sent()) {
                Some(Listed::Blacklisted) => return window.points_blacklisted += 1,
                Some(Listed::NotWhitelisted) => return window.points_not_whitelisted += 1,
                None => {}
            }
        }
        match parsed {
            Ok(carbon::Parsed::Point(p)) => {
                let at = p.at.unwrap_or_else(|| {
                    *now.get_or_insert_with(|| crate::store::clock::since_epoch().as_secs_f64())
                });
                window.record_point(&p.path, at, p.value, self.max_series);
            }
            Ok(carbon::Parsed::NotANumber(_)) => window.points_nan += 1,
            Err(reason) => self.reject(reason, line),
        }
    }

    pub fn reject(&mut self, reason: BadLine, line: &[u8]) {
        self.tally.bad[reason as usize] += 1;
        if self.bad_example.is_none() {
            let shown = &line[..line.len().min(BAD_LINE_LOG_BYTES)];
            self.bad_example = Some((reason, String::from_utf8_lossy(shown).into_owned()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every line through the full parser alone, one at a time: what the one-pass split and
    /// parse of whole datagrams must agree with.
    fn line_by_line(datagram: &[u8]) -> (Window, Tally) {
        let mut handler = LineHandler::new(true, usize::MAX);
        let mut window = Window::default();
        for line in protocol::lines(datagram) {
            handler.tally.lines += 1;
            handler.handle_line(line, &mut window);
        }
        (window, handler.tally)
    }

    fn assert_same(datagram: &[u8]) {
        let mut handler = LineHandler::new(true, usize::MAX);
        let mut window = Window::default();
        handler.handle_datagram(datagram, false, &mut window);
        let (want, tally) = line_by_line(datagram);
        let text = String::from_utf8_lossy(datagram);
        assert_eq!(window.counters, want.counters, "{text:?}");
        assert_eq!(window.stats, want.stats, "{text:?}");
        assert_eq!(window.gauges, want.gauges, "{text:?}");
        assert_eq!(window.sets, want.sets, "{text:?}");
        assert_eq!(window.logs.len(), want.logs.len(), "{text:?}");
        assert_eq!(handler.tally.lines, tally.lines, "{text:?}");
        assert_eq!(handler.tally.bad, tally.bad, "{text:?}");
        assert_eq!(handler.tally.samples, tally.samples, "{text:?}");
    }

    #[test]
    fn datagrams_of_mixed_lines() {
        for d in [
            &b"a:1|c\nb:2|ms|@0.5\nq:+3|g\nq:-1|g\n\nc:1|c\r\nd:1|c|#t:1\ne:1|h\nf:2|d"[..],
            b"a:1|c\n",
            b"\n\n\r\n",
            b"a:1|c\r",
            b"a:1|c|@0.5\nb:1|c|@0.5:2|c\nb:1|c:2|c\nu:x|s\nbad\n:1|c\na:1|x\na:1|c",
        ] {
            assert_same(d);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn one_pass_agrees_with_line_by_line(
            lines in proptest::collection::vec(
                "[a-z._ ,=]{0,4}:[-+0-9.e:]{0,4}\\|(c|ms|g|s|h|d|x|)(\\|@[0-9.:e]{0,4}|\\|#[a-z:]{0,3}|:[0-9]\\|c|)\r?",
                0..6,
            )
        ) {
            assert_same(lines.join("\n").as_bytes());
        }

        #[test]
        fn one_pass_agrees_on_arbitrary_bytes(data in proptest::collection::vec(any::<u8>(), 0..120)) {
            assert_same(&data);
        }
    }
}
