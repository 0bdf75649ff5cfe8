//! The StatsD / DogStatsD line protocol (docs/protocol.md), as pure functions over bytes.
//!
//! [`lines`] splits a datagram, [`parse_line`] turns one line into a [`Line`] that borrows from
//! the datagram, and [`SeriesNamer`] folds a metric's name and tags into its series name;
//! [`parse_plain`] reads the common untagged line straight off the datagram instead. No
//! clock, socket or metric lives here: bad input is a [`BadLine`] value, never a panic.

pub mod carbon;
mod event;
pub mod pickle;
mod series;
mod value;

pub use value::{MAX_INCREMENT, MAX_VALUE};

pub use event::{AlertType, Event, ServiceCheck};
pub use series::SeriesNamer;

use std::borrow::Cow;

use nom::IResult;
use nom::Parser;
use nom::bytes::complete::{tag, take_till};
use smallvec::SmallVec;

/// The six metric types of the protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MetricType {
    Counter,
    Timer,
    Histogram,
    Distribution,
    Gauge,
    Set,
}

impl MetricType {
    pub const ALL: [MetricType; 6] = [
        MetricType::Counter,
        MetricType::Timer,
        MetricType::Histogram,
        MetricType::Distribution,
        MetricType::Gauge,
        MetricType::Set,
    ];

    /// The type as it is written on the wire (`c`, `ms`, ...), also its metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            MetricType::Counter => "c",
            MetricType::Timer => "ms",
            MetricType::Histogram => "h",
            MetricType::Distribution => "d",
            MetricType::Gauge => "g",
            MetricType::Set => "s",
        }
    }

    pub fn from_wire(b: &[u8]) -> Option<MetricType> {
        Some(match b {
            b"c" => MetricType::Counter,
            b"ms" => MetricType::Timer,
            b"h" => MetricType::Histogram,
            b"d" => MetricType::Distribution,
            b"g" => MetricType::Gauge,
            b"s" => MetricType::Set,
            _ => return None,
        })
    }
}

/// Why a line was rejected. Each reason is a label of the bad-lines metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BadLine {
    /// No `:` after the name (`a`).
    MissingValue,
    /// No `|type` after the value (`a:1`).
    MissingType,
    /// Nothing before the `:`, or nothing left after sanitizing.
    EmptyName,
    /// No value, or only empty values (`a:|c`).
    EmptyValue,
    UnknownType,
    InvalidValue,
    InvalidSampleRate,
    /// A finite value the agent cannot add exactly and safely (see [`value::in_range`]).
    OutOfRange,
    InvalidTimestamp,
    /// InfluxDB tags in the name and DogStatsD `#tags` on the same line.
    MixedTagStyles,
    InvalidUtf8,
    InvalidEvent,
    InvalidServiceCheck,
    /// The partial last line of a datagram the kernel truncated, or of a stream cut by a stop.
    Truncated,
    /// A stream line longer than `max_datagram_bytes` (dropped up to its newline).
    LineTooLong,
    /// A carbon line that is not `path value timestamp`.
    FieldCount,
    /// A carbon path's tags that carbon refuses (`name;k`, an empty key or value).
    InvalidTags,
    /// A carbon pickle message that does not decode, or holds anything but data.
    InvalidPickle,
    /// A carbon pickle message longer than `carbon_pickle_max_bytes` (skipped).
    PickleTooLarge,
}

impl BadLine {
    pub const ALL: [BadLine; 19] = [
        BadLine::MissingValue,
        BadLine::MissingType,
        BadLine::EmptyName,
        BadLine::EmptyValue,
        BadLine::UnknownType,
        BadLine::InvalidValue,
        BadLine::InvalidSampleRate,
        BadLine::OutOfRange,
        BadLine::InvalidTimestamp,
        BadLine::MixedTagStyles,
        BadLine::InvalidUtf8,
        BadLine::InvalidEvent,
        BadLine::InvalidServiceCheck,
        BadLine::Truncated,
        BadLine::LineTooLong,
        BadLine::FieldCount,
        BadLine::InvalidTags,
        BadLine::InvalidPickle,
        BadLine::PickleTooLarge,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            BadLine::MissingValue => "missing_value",
            BadLine::MissingType => "missing_type",
            BadLine::EmptyName => "empty_name",
            BadLine::EmptyValue => "empty_value",
            BadLine::UnknownType => "unknown_type",
            BadLine::InvalidValue => "invalid_value",
            BadLine::InvalidSampleRate => "invalid_sample_rate",
            BadLine::OutOfRange => "out_of_range",
            BadLine::InvalidTimestamp => "invalid_timestamp",
            BadLine::MixedTagStyles => "mixed_tag_styles",
            BadLine::InvalidUtf8 => "invalid_utf8",
            BadLine::InvalidEvent => "invalid_event",
            BadLine::InvalidServiceCheck => "invalid_service_check",
            BadLine::Truncated => "truncated",
            BadLine::LineTooLong => "line_too_long",
            BadLine::FieldCount => "field_count",
            BadLine::InvalidTags => "invalid_tags",
            BadLine::InvalidPickle => "invalid_pickle",
            BadLine::PickleTooLarge => "pickle_too_large",
        }
    }
}

/// One value of a metric line.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value<'a> {
    /// A counter increment, a timer/histogram/distribution sample, or a gauge's new value.
    Number(f64),
    /// A gauge value written with a leading sign: added to the current value.
    GaugeDelta(f64),
    /// A set member: the raw value text.
    Member(&'a [u8]),
}

/// One sample of a metric line. A line yields several with the multi-value forms.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample<'a> {
    pub kind: MetricType,
    pub value: Value<'a>,
    /// The sample rate, `0 < rate <= 1`; 1 when absent.
    pub rate: f64,
    /// DogStatsD `#tags` text of the segment, without the `#`.
    pub tags: Option<&'a str>,
    /// DogStatsD's `|T<unix seconds>`: the moment the value belongs to, when not now.
    pub timestamp: Option<u64>,
}

/// A parsed metric line: the name as sent, InfluxDB-style tags from the name, its samples.
#[derive(Clone, Debug, PartialEq)]
pub struct MetricLine<'a> {
    /// The name without its tags (owned only when SignalFx tags stood in its middle).
    pub name: Cow<'a, str>,
    /// The `k=v,k2=v2` tags written in the name: InfluxDB `name,k=v`, Librato `name#k=v` or
    /// SignalFx `name[k=v]`.
    pub influx_tags: Option<&'a str>,
    /// Most lines carry one sample; four inline keep the multi-value forms allocation-free.
    pub samples: SmallVec<[Sample<'a>; 4]>,
    /// Optional fields the parser did not know and ignored.
    pub unknown_fields: u32,
    /// Why a segment after the first did not parse (`a:1|c:x|c`): the samples before it are
    /// kept, as Etsy statsd keeps them, and the line is counted as bad for that reason too.
    pub rejected: Option<BadLine>,
}

/// What one line of a datagram is. A metric line is the large one, and the usual one: it stays
/// inline, a temporary on the reader's stack, rather than an allocation per line.
#[derive(Clone, Debug, PartialEq)]
#[allow(clippy::large_enum_variant)]
pub enum Line<'a> {
    Metric(MetricLine<'a>),
    Event(Event<'a>),
    ServiceCheck(ServiceCheck<'a>),
}

/// Splits a datagram into its lines: `\n` separated, a trailing `\r` removed, empty lines skipped.
pub fn lines(datagram: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = datagram;
    std::iter::from_fn(move || {
        while !rest.is_empty() {
            let (line, next) = first_line(rest);
            rest = next;
            if !line.is_empty() {
                return Some(line);
            }
        }
        None
    })
}

/// The first line of `input` (a trailing `\r` removed, possibly empty) and what follows its `\n`.
pub fn first_line(input: &[u8]) -> (&[u8], &[u8]) {
    let (line, rest) = match memchr::memchr(b'\n', input) {
        Some(end) => (&input[..end], &input[end + 1..]),
        None => (input, &input[input.len()..]),
    };
    (line.strip_suffix(b"\r").unwrap_or(line), rest)
}

/// The part of a truncated datagram that holds whole lines, and whether a partial line was cut.
pub fn whole_lines(datagram: &[u8]) -> (&[u8], bool) {
    match datagram.iter().rposition(|b| *b == b'\n') {
        Some(end) => (&datagram[..end], end + 1 < datagram.len()),
        None => (&[], !datagram.is_empty()),
    }
}

/// Parses one line (without its newline).
pub fn parse_line(line: &[u8]) -> Result<Line<'_>, BadLine> {
    if line.starts_with(b"_e{") {
        return event::parse_event(line).map(Line::Event);
    }
    if line.starts_with(b"_sc|") {
        return event::parse_service_check(line).map(Line::ServiceCheck);
    }
    parse_metric(line).map(Line::Metric)
}

/// [`series::name_byte_allowed`] as a table: the bytes of a name that needs no sanitizing.
const PLAIN_NAME: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        t[b] = series::name_byte_allowed(b as u8);
        b += 1;
    }
    t
};

/// How many bytes at the front of `input` pass [`PLAIN_NAME`].
fn plain_name_len(input: &[u8]) -> usize {
    let mut at = 0;
    #[cfg(target_arch = "x86_64")]
    while let Some(block) = input[at..].first_chunk::<16>() {
        let not_plain = simd::not_plain(block);
        if not_plain != 0 {
            return at + not_plain.trailing_zeros() as usize;
        }
        at += 16;
    }
    at + input[at..]
        .iter()
        .position(|&b| !PLAIN_NAME[usize::from(b)])
        .unwrap_or(input.len() - at)
}

/// [`PLAIN_NAME`] sixteen bytes at a time with SSE2, which every x86-64 processor has: the rule
/// of `series::name_byte_allowed` again, held to the table by a proptest.
#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    /// A bit for each byte of `block` that [`super::PLAIN_NAME`] rejects, the first byte lowest.
    #[inline]
    pub(super) fn not_plain(block: &[u8; 16]) -> u32 {
        // SAFETY: SSE2 is part of the x86-64 baseline, and the load reads exactly `block`.
        unsafe {
            let v = _mm_loadu_si128(block.as_ptr().cast());
            let splat = |b: u8| _mm_set1_epi8(b as i8);
            // Signed compares: bytes from 0x80 up are negative and fall outside every range.
            let within = |v, lo: u8, hi: u8| {
                _mm_and_si128(
                    _mm_cmpgt_epi8(v, splat(lo - 1)),
                    _mm_cmplt_epi8(v, splat(hi + 1)),
                )
            };
            let letters = within(_mm_or_si128(v, splat(0x20)), b'a', b'z');
            let digits = within(v, b'0', b'9');
            let dash_dot = within(v, b'-', b'.');
            let others = _mm_or_si128(
                _mm_cmpeq_epi8(v, splat(b'_')),
                _mm_or_si128(
                    _mm_cmpeq_epi8(v, splat(b';')),
                    _mm_cmpeq_epi8(v, splat(b'=')),
                ),
            );
            let plain = _mm_or_si128(
                _mm_or_si128(letters, digits),
                _mm_or_si128(dash_dot, others),
            );
            !(_mm_movemask_epi8(plain) as u32) & 0xffff
        }
    }
}

/// The common line `name:value|type` or `name:value|type|@rate`, with a plain name (nothing to
/// sanitize, no tags), read from the front of `input` in one pass and without building a
/// [`MetricLine`]: its name, which is also its series name, its one sample, and how many bytes
/// the line took with its `\n`. `None` for anything else, including every bad line and a line
/// ending in `\r\n`: [`parse_line`] then gives the full answer.
///
/// A reader runs this over a whole datagram, line after line, so the common line is split from
/// the next one by the same scan that parses it.
#[inline(always)]
pub fn parse_plain(input: &[u8]) -> Option<(&str, Sample<'_>, usize)> {
    let colon = plain_name_len(input);
    if colon == 0 || input.get(colon) != Some(&b':') {
        return None;
    }
    let text_start = colon + 1;
    let mut bar = text_start;
    while bar < input.len() && !matches!(input[bar], b'|' | b':' | b'\n') {
        bar += 1;
    }
    if input.get(bar) != Some(&b'|') {
        return None;
    }
    let text = &input[text_start..bar];
    // `MetricType::from_wire` as a byte match: finding the type's end first and looking it up
    // cost 4 ns a line. The proptest against the full parser holds the two together.
    let (kind, rest) = match &input[bar + 1..] {
        [b'c', rest @ ..] => (MetricType::Counter, rest),
        [b'm', b's', rest @ ..] => (MetricType::Timer, rest),
        [b'g', rest @ ..] => (MetricType::Gauge, rest),
        [b'h', rest @ ..] => (MetricType::Histogram, rest),
        [b'd', rest @ ..] => (MetricType::Distribution, rest),
        // Sets, unknown types, a missing type.
        _ => return None,
    };
    let (rate, end) = match rest {
        [] | [b'\n', ..] => (1.0, rest),
        [b'|', b'@', r @ ..] => {
            let (r, end) = r.split_at(memchr::memchr(b'\n', r).unwrap_or(r.len()));
            if r.contains(&b':') {
                return None;
            }
            (value::parse_sample_rate(r).ok()?, end)
        }
        _ => return None,
    };
    let number = value::parse_number(text).ok()?;
    // Most lines have no rate and a small value: in range whatever their type.
    if (rate != 1.0 || number.abs() > MAX_INCREMENT) && !value::in_range(kind, number, rate) {
        return None;
    }
    let value = match (kind, text.first()?) {
        (MetricType::Gauge, b'+' | b'-') => Value::GaugeDelta(number),
        _ => Value::Number(number),
    };
    let used = input.len() - end.len() + usize::from(!end.is_empty());
    // SAFETY: every byte before `colon` passed the PLAIN_NAME table, which admits ASCII only.
    let name = unsafe { std::str::from_utf8_unchecked(&input[..colon]) };
    Some((
        name,
        Sample {
            kind,
            value,
            rate,
            tags: None,
            timestamp: None,
        },
        used,
    ))
}

fn utf8(b: &[u8]) -> Result<&str, BadLine> {
    std::str::from_utf8(b).map_err(|_| BadLine::InvalidUtf8)
}

/// `take_till` for a byte, as the small nom parser the grammar is built from.
fn till(byte: u8) -> impl Fn(&[u8]) -> IResult<&[u8], &[u8]> {
    move |i| take_till(|b| b == byte)(i)
}

fn parse_metric(line: &[u8]) -> Result<MetricLine<'_>, BadLine> {
    // name ':' rest — the name ends at the first ':'.
    let (head, rest) = till(b':')(line)
        .ok()
        .filter(|(rest, _)| !rest.is_empty())
        .map(|(rest, head)| (head, &rest[1..]))
        .ok_or(BadLine::MissingValue)?;
    let (name, influx_tags) = name_and_tags(utf8(head)?);
    if name.is_empty() {
        return Err(BadLine::EmptyName);
    }

    let mut out = MetricLine {
        name,
        influx_tags,
        samples: SmallVec::new(),
        unknown_fields: 0,
        rejected: None,
    };
    let mut input = rest;
    loop {
        let before = out.samples.len();
        match parse_segment(input, &mut out) {
            Ok(rest) => input = rest,
            Err(reason) => {
                // A segment is taken whole or not at all; where the next one would start is
                // not known after a bad one.
                out.samples.truncate(before);
                if before == 0 {
                    return Err(reason);
                }
                out.rejected = Some(reason);
                break;
            }
        }
        if input.is_empty() {
            break;
        }
        // A ':' after a segment starts the next Etsy segment (`a:1|c:5|ms`).
        input = &input[1..];
    }
    if influx_tags.is_some() && out.samples.iter().any(|s| s.tags.is_some()) {
        return Err(BadLine::MixedTagStyles);
    }
    Ok(out)
}

/// Splits the tags written in a metric name from it, in the forms statsd_exporter takes: SignalFx
/// `name[k=v,k2=v2]` (the brackets anywhere; the name is what stands around them), else at the
/// first `,` (InfluxDB `name,k=v`) or `#` (Librato `name#k=v`).
fn name_and_tags(head: &str) -> (Cow<'_, str>, Option<&str>) {
    if let (Some(open), Some(close)) = (head.find('['), head.find(']'))
        && open < close
    {
        let (before, after) = (&head[..open], &head[close + 1..]);
        let name = if after.is_empty() {
            Cow::Borrowed(before)
        } else {
            Cow::Owned([before, after].concat())
        };
        return (name, Some(&head[open + 1..close]));
    }
    match head.find([',', '#']) {
        // A `#` starts tags only when `k=v` pairs follow it (`web.hits#env=prod`); otherwise it
        // is a byte of the name, as Etsy statsd and vector read it (`a#.b` sanitizes to `a.b`).
        Some(at) if head.as_bytes()[at] == b'#' && !tag_pairs(&head[at + 1..]) => {
            (Cow::Borrowed(head), None)
        }
        Some(at) => (Cow::Borrowed(&head[..at]), Some(&head[at + 1..])),
        None => (Cow::Borrowed(head), None),
    }
}

/// Whether `text` is a list of `k=v` tags: every non-empty part has a key before an `=`.
fn tag_pairs(text: &str) -> bool {
    let mut parts = text.split(',').filter(|t| !t.is_empty()).peekable();
    parts.peek().is_some() && parts.all(|t| t.find('=').is_some_and(|at| at > 0))
}

/// One `values|type[|field]...` segment; returns the input after it (empty, or starting at the
/// `:` of the next segment).
fn parse_segment<'a>(input: &'a [u8], out: &mut MetricLine<'a>) -> Result<&'a [u8], BadLine> {
    let (input, values) = till(b'|')(input).map_err(|_| BadLine::MissingType)?;
    let (input, _) =
        tag::<_, _, nom::error::Error<&[u8]>>("|")(input).map_err(|_| BadLine::MissingType)?;
    let (mut input, wire_type) = take_till(|b| b == b'|' || b == b':')
        .parse(input)
        .map_err(|_: nom::Err<nom::error::Error<&[u8]>>| BadLine::MissingType)?;
    if wire_type.is_empty() {
        return Err(BadLine::MissingType);
    }
    let kind = MetricType::from_wire(wire_type).ok_or(BadLine::UnknownType)?;

    let mut rate = 1.0;
    let mut tags = None;
    let mut timestamp = None;
    while let Some(rest) = input.strip_prefix(b"|") {
        // Only a rate or timestamp field can be followed by the ':' of an Etsy segment
        // (`a:1|c|@0.5:5|ms`); tags, container ids and unknown fields may hold ':'.
        // So can an empty field (`a:0|ms|:1|ms`, Telegraf's test): the `|` before a `:`. A
        // field that is only `:` (`a:1|g|:|#t`, gostatsd's tests) starts no segment: it is an
        // unknown field.
        let only_colon = rest.first() == Some(&b':') && matches!(rest.get(1), None | Some(b'|'));
        let field_end = if only_colon {
            Some(1)
        } else if matches!(rest.first(), Some(b'@' | b'T' | b':')) {
            rest.iter().position(|b| *b == b'|' || *b == b':')
        } else {
            rest.iter().position(|b| *b == b'|')
        }
        .unwrap_or(rest.len());
        let (field, after) = rest.split_at(field_end);
        input = after;
        match field.first() {
            Some(b'@') => rate = value::parse_sample_rate(&field[1..])?,
            Some(b'#') => tags = Some(utf8(&field[1..])?).filter(|t| !t.is_empty()),
            Some(b'T') if !field[1..].is_empty() => {
                timestamp = Some(value::parse_timestamp(&field[1..])?);
            }
            Some(b'c') if field.starts_with(b"c:") => {}
            None => {}
            _ => out.unknown_fields += 1,
        }
    }

    let before = out.samples.len();
    if kind == MetricType::Set {
        if !values.is_empty() {
            out.samples.push(Sample {
                kind,
                value: Value::Member(values),
                rate,
                tags,
                timestamp,
            });
        }
    } else {
        for text in values.split(|b| *b == b':').filter(|v| !v.is_empty()) {
            let number = value::parse_number(text)?;
            if !value::in_range(kind, number, rate) {
                return Err(BadLine::OutOfRange);
            }
            let value = if kind == MetricType::Gauge && matches!(text[0], b'+' | b'-') {
                Value::GaugeDelta(number)
            } else {
                Value::Number(number)
            };
            out.samples.push(Sample {
                kind,
                value,
                rate,
                tags,
                timestamp,
            });
        }
    }
    if out.samples.len() == before {
        return Err(BadLine::EmptyValue);
    }
    Ok(input)
}

#[cfg(test)]
mod tests;
