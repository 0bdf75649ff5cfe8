#!/usr/bin/env python3
"""Turns statsd_exporter's exposition tests into the vectors tests/prometheus_vectors.rs runs
through the agent with `prometheus_app_metrics = true`: each scenario's mapping file, the
datagrams sent, and the page statsd_exporter's test expects (families, types, series, values).

    git --git-dir=DIR show v0.30.0:pkg/exporter/exporter_test.go > exporter_test.go   (etc.)
    scripts/exporter-vectors.py exporter_test.go bridge_test.go mapper_test.go line_test.go \\
        > tests/prometheus/exporter_vectors.json

or, from a clone or `fetch` of github.com/prometheus/statsd_exporter (needs PyYAML):

    scripts/exporter-vectors.py --git-dir DIR --rev v0.30.0 > tests/prometheus/exporter_vectors.json

Read from the four test files (data, never their code):

* `bridge_test.go` `TestHandlePacket`: each scenario's packet, and the events the parser must
  make of it, as the page those events make (statsd_exporter's exporter, no mapping file).
* `pkg/line/line_test.go` `TestLineToEvents`: the same for the lines bridge_test.go does not
  send (extended aggregation, container ids), when the case lists its events; and the lines
  with several values of a counter or gauge, whose cases list none: statsd_exporter's
  `pkg/line/line.go` refuses them (`invalid_extended_aggregate_type`), its page is empty. The
  `TestDisableParsing*` tests turn statsd_exporter's tag-style flags off, which the agent does
  not have: they are not taken.
* `pkg/exporter/exporter_test.go`: `TestConflictingMetrics`' table (each scenario's events and the
  values its test reads back), and the single-case tests (their mapping file and events; what
  each test asserts is in `ASSERTS` below, each with the text of the Go assertion it stands
  for, which this script checks is still in the file).
* `pkg/mapper/mapper_test.go` `TestMetricMapperYAML`: the scenarios whose expected mapping
  carries observer options (quantiles, buckets, scale, ttl): the metric sent as a line, and
  the page those options make.

An event becomes a line: a counter `name:v|c`, a gauge `name:v|g` (`+v`/`-v` when relative),
an observation `name:v|h` (an event's value is already in seconds: `h` keeps it as sent), its
labels as DogStatsD tags `|#k:v` in key order; one `event.Events` batch is one datagram.

Where the agent shows the same lines otherwise by a difference docs/prometheus.md lists ("What
differs from statsd_exporter"), the vector says so in `differs` (the table's row, quoted) and
carries what the agent shows instead in `agent` (its page, the series it refused, the lines it
counted bad): `statsd_exporter` is always what its test expects. The agent's side is worked out
from the documented rules, not from running it: the agent's reading of each datagram (`read`,
with the parser's documented differences: bad and zero sample rates, empty and extra
components, container ids, an unmatched SignalFx bracket, several values of a counter or
gauge), then a window's types taken counters, gauges, observers, conflicts counted
per series per window, names refused either way round. With every parser difference undone the
reading is statsd_exporter's: the script checks it makes the events each bridge_test.go and
line_test.go case lists."""
import json
import math
import re
import subprocess
import sys

import yaml

DOCS = "docs/prometheus.md"

# ---------------------------------------------------------------------------------------------
# Go: tokens and composite literals.

TOKEN = re.compile(
    r'\s*(?:(//[^\n]*)|(`[^`]*`)|("(?:\\.|[^"\\])*")|([A-Za-z_][\w.]*)|(-?(?:\d|\.\d)[\d.]*(?:[eE][+-]?\d+)?)|(.))',
    re.S,
)


def go_string(quoted):
    """A Go interpreted string literal as text, invalid UTF-8 bytes kept (surrogateescape)."""
    out = bytearray()
    body = quoted[1:-1]
    i = 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out += c.encode()
            i += 1
            continue
        e = body[i + 1]
        if e == "x":
            out.append(int(body[i + 2:i + 4], 16))
            i += 4
        elif e in "ntr\\\"'":
            out += {"n": b"\n", "t": b"\t", "r": b"\r", "\\": b"\\", '"': b'"', "'": b"'"}[e]
            i += 2
        elif e == "u":
            out += chr(int(body[i + 2:i + 6], 16)).encode()
            i += 6
        else:
            raise ValueError(f"escape \\{e} in {quoted}")
    return out.decode("utf-8", "surrogateescape")


def tokens(text):
    for m in TOKEN.finditer(text):
        comment, raw, string, ident, number, punct = m.groups()
        if comment:
            continue
        if raw is not None:
            yield ("str", raw[1:-1])
        elif string is not None:
            yield ("str", go_string(string))
        elif ident is not None:
            yield ("id", ident)
        elif number is not None:
            yield ("num", number)
        elif punct is not None and punct.strip():
            yield ("p", punct)


class Composite(dict):
    """A `T{...}` literal: its fields by name, its items in `items`, its type in `type`."""

    def __init__(self, type_, fields, items):
        super().__init__(fields)
        self.type = type_
        self.items = items


def parse(toks, i, env):
    """The value at toks[i] and the index after it. Identifiers found in `env` are replaced by
    their value (the test's local variables)."""
    kind, value = toks[i]
    if (kind, value) == ("p", "&"):
        return parse(toks, i + 1, env)
    type_ = None
    if kind == "id" or (kind, value) == ("p", "["):
        # A type before braces: event.CounterEvent{, map[string]string{, []float64{
        j, depth = i, 0
        while j < len(toks):
            t = toks[j]
            if t == ("p", "[") or t == ("p", "("):
                depth += 1
            elif t == ("p", "]") or t == ("p", ")"):
                depth -= 1
            elif t == ("p", "{") and depth == 0:
                break
            elif depth == 0 and t[0] != "id" and t != ("p", "*"):
                j = None
                break
            j += 1
        if j is not None and j < len(toks) and toks[j] == ("p", "{") and j > i:
            type_ = " ".join(v for _, v in toks[i:j])
            i = j
            kind, value = toks[i]
    if (kind, value) != ("p", "{"):
        if kind == "num":
            return float(value), i + 1
        if kind == "id" and value in env:
            return env[value], i + 1
        if kind == "id" and value in ("true", "false"):
            return value == "true", i + 1
        return value, i + 1
    i += 1
    items, fields = [], {}
    while toks[i] != ("p", "}"):
        if toks[i][0] in ("id", "str") and toks[i + 1] == ("p", ":") and toks[i][0] == "id":
            key = toks[i][1]
            val, i = parse(toks, i + 2, env)
            fields[key] = val
        elif toks[i + 1] == ("p", ":"):  # map literal: "key": value
            key, i = parse(toks, i, env)
            val, i = parse(toks, i + 1, env)
            fields[key] = val
        else:
            val, i = parse(toks, i, env)
            items.append(val)
        while toks[i] not in (("p", ","), ("p", "}")):
            i += 1
        if toks[i] == ("p", ","):
            i += 1
    return Composite(type_, fields, items), i + 1


def function(source, name):
    start = source.index(f"func {name}(")
    end = source.find("\nfunc ", start + 1)
    return source[start:end if end > 0 else len(source)]


def table(body):
    """The scenarios of a `scenarios := []struct {...}{ ... }` table in a function's body."""
    at = body.index("scenarios := []struct")
    at = body.index("}{", at) + 1
    value, _ = parse(list(tokens(body[at:])), 0, {})
    return value.items


def locals_of(body):
    """The function's simple local variables: strings, map literals, `make(map...)` filled by
    `m["k"] = "v"` (maps by reference, as Go has them)."""
    env = {}
    for m in re.finditer(r'(\w+) := ("(?:\\.|[^"\\])*")', body):
        env[m.group(1)] = go_string(m.group(2))
    for m in re.finditer(r'(\w+) := (map\[string\]string\{)', body):
        value, _ = parse(list(tokens(body[m.start(2):])), 0, env)
        env[m.group(1)] = value
    for m in re.finditer(r'(\w+) := make\(map\[string\]string\)', body):
        env[m.group(1)] = Composite("map[string]string", {}, [])
    for m in re.finditer(r'(\w+)\["(\w+)"\] = ("(?:\\.|[^"\\])*")', body):
        if m.group(1) in env:
            env[m.group(1)][m.group(2)] = go_string(m.group(3))
    return env


def config_of(body):
    m = re.search(r"config := `([^`]*)`", body)
    return m.group(1) if m else None


def batches(body, env):
    """Every non-empty `event.Events{...}` literal of the body, in order."""
    out = []
    for m in re.finditer(r"event\.Events\{", body):
        value, _ = parse(list(tokens(body[m.start():])), 0, env)
        if value.items:
            out.append([event(e) for e in value.items])
    return out


# ---------------------------------------------------------------------------------------------
# Events and lines.


def event(c):
    kind = {"event.CounterEvent": "counter", "event.GaugeEvent": "gauge", "event.ObserverEvent": "observer"}[c.type]
    prefix = {"counter": "C", "gauge": "G", "observer": "O"}[kind]
    labels = c.get(prefix + "Labels")
    labels = labels if isinstance(labels, dict) else {}  # make(map[string]string): empty
    return {
        "kind": kind,
        "name": c[prefix + "MetricName"],
        "value": float(c.get(prefix + "Value", 0.0)),
        "relative": bool(c.get("GRelative", False)),
        "labels": dict(labels),
    }


def number(v):
    """A float as the text format (and a StatsD line) writes it."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    r = repr(float(v))
    return r[:-2] if r.endswith(".0") else r


def line(e):
    v = e["value"]
    if e["kind"] == "counter":
        text = f"{e['name']}:{number(v)}|c"
    elif e["kind"] == "gauge":
        assert e["relative"] or v >= 0, e
        text = f"{e['name']}:{'+' if e['relative'] and v >= 0 else ''}{number(v)}|g"
    else:
        text = f"{e['name']}:{number(v)}|h"
    if e["labels"]:
        text += "|#" + ",".join(f"{k}:{e['labels'][k]}" for k in sorted(e["labels"]))
    return text


# ---------------------------------------------------------------------------------------------
# The agent's reading of a datagram (src/protocol/mod.rs, docs/protocol.md), for the lines the
# vectors send. Each parse feature is a row of docs/prometheus.md's table; without it, that part
# of a line is read as statsd_exporter's pkg/line/line.go reads it, so that with none the events
# are statsd_exporter's (checked against every event bridge_test.go and line_test.go list).

PARSE_FEATURES = (
    "bad_rate",  # `@bar` makes a bad line, not rate 1
    "zero_rate",  # `@0` makes a bad line, not rate 1
    "empty_component",  # an empty `|` field is skipped, not the line dropped
    "components",  # more than five `|` components are read, not the line dropped
    "container",  # `|c:<id>` is ignored, not a `container_id` label
    "bad_container",  # `|c`, `|c:` are ignored, not the line dropped
    "brackets",  # one unmatched `[` or `]`: InfluxDB tags still read, not the name kept whole
    "values",  # several values of a counter or gauge are each taken, not the line refused
)

DECIMAL = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


class BadLine(Exception):
    """A line the agent refuses, and its reason (`statsd_redis_bad_lines_total{reason}`)."""


def decimal(text, signed=True):
    """A finite decimal (value::parse_decimal), else None."""
    if not DECIMAL.fullmatch(text) or (not signed and text[0] in "+-"):
        return None
    return float(text)


def read(datagram, features):
    """The events the agent makes of a datagram, and its bad lines by reason."""
    events, bad = [], {}
    for text in datagram.split("\n"):
        text = text[:-1] if text.endswith("\r") else text
        if not text:
            continue
        try:
            events += read_line(text, features)
        except BadLine as e:
            bad[e.args[0]] = bad.get(e.args[0], 0) + 1
    return events, bad


def read_line(text, features):
    head, colon, rest = text.partition(":")
    if not colon:
        raise BadLine("missing_value")
    if any("\udc80" <= c <= "\udcff" for c in text):
        raise BadLine("invalid_utf8")
    name, name_tags = name_and_tags(head, features)
    if not name:
        raise BadLine("empty_name")
    segments = []
    while True:
        try:
            seg, rest = segment(rest, features)
        except BadLine:
            # A later segment that does not parse keeps the ones before it (and counts the
            # line as bad too: not among the vectors' lines).
            assert not segments, text
            raise
        segments.append(seg)
        if not rest:
            break
        rest = rest[1:]  # the `:` of the next segment (`a:1|c:5|ms`)
    if name_tags is not None and any(s["tags"] is not None for s in segments):
        raise BadLine("mixed_tag_styles")
    if len(segments[0]["values"]) > 1 and segments[0]["kind"] in ("c", "g") and "values" not in features:
        # statsd_exporter's extended aggregation is for timers, histograms and distributions:
        # invalid_extended_aggregate_type.
        return []
    events = []
    for s in segments:
        if s["dropped"]:
            continue
        labels = tag_labels(name_tags, "=") if name_tags is not None else tag_labels(s["tags"], ":")
        if s["container"] is not None:
            labels["container_id"] = s["container"]
        for text_, v in s["values"]:
            events += sample_events(name, s["kind"], text_, v, s["rate"], labels, features)
    return events


def name_and_tags(head, features):
    """The name and the `k=v,...` tags written in it: SignalFx `[...]` anywhere, else from the
    first `,` (InfluxDB) or `#` (Librato, when `k=v` tags follow)."""
    o, c = head.find("["), head.find("]")
    if o >= 0 and c >= 0 and o < c:
        return head[:o] + head[c + 1:], head[o + 1:c]
    if (o >= 0) != (c >= 0) and "brackets" not in features:
        return head, None
    at = min((i for i in (head.find(","), head.find("#")) if i >= 0), default=-1)
    if at < 0:
        return head, None
    pairs = [t for t in head[at + 1:].split(",") if t]
    if head[at] == "#" and not (pairs and all(t.find("=") > 0 for t in pairs)):
        return head, None
    return head[:at], head[at + 1:]


def segment(text, features):
    """One `values|type[|field]...` segment: what it holds, and the text after it (empty, or
    from the `:` of the next segment)."""
    values, bar, text = text.partition("|")
    if not bar:
        raise BadLine("missing_type")
    kind = re.match(r"[^|:]*", text).group()
    text = text[len(kind):]
    if not kind:
        raise BadLine("missing_type")
    if kind not in ("c", "ms", "h", "d", "g"):
        # Sets (which statsd_exporter refuses) are sent by no vector.
        raise BadLine("unknown_type")
    s = {"kind": kind, "rate": 1.0, "tags": None, "container": None, "dropped": False}
    components = 2
    while text.startswith("|"):
        rest = text[1:]
        if rest[:1] == ":" and rest[1:2] in ("", "|"):
            end = 1
        elif rest[:1] in ("@", "T", ":"):
            end = min((i for i in (rest.find("|"), rest.find(":")) if i >= 0), default=len(rest))
        else:
            end = rest.find("|") if "|" in rest else len(rest)
        field, text = rest[:end], rest[end:]
        components += 1
        if field.startswith("@"):
            s["rate"] = sample_rate(field[1:], features)
        elif field.startswith("#"):
            s["tags"] = field[1:] or None
        elif field.startswith("c:") and len(field) > 2:
            if "container" not in features:
                s["container"] = field[2:]
        elif field.startswith("c") and "bad_container" not in features:
            s["dropped"] = True  # malformed_container_id
        elif field == "" and "empty_component" not in features:
            s["dropped"] = True  # malformed_component
        # Otherwise the agent ignores the field (`|c`, `|c:`, an empty or unknown one).
    if components > 5 and "components" not in features:
        s["dropped"] = True  # malformed_component
    s["values"] = []
    for v in (v for v in values.split(":") if v):
        number_ = decimal(v)
        if number_ is None:
            raise BadLine("invalid_value")
        s["values"].append((v, number_))
    if not s["values"]:
        raise BadLine("empty_value")
    return s, text


def sample_rate(text, features):
    r = decimal(text, signed=False)
    if r is None and "bad_rate" in features or r == 0 and "zero_rate" in features:
        raise BadLine("invalid_sample_rate")
    if not r:
        return 1.0  # statsd_exporter: an invalid or zero factor is 1
    if r > 1:
        raise BadLine("invalid_sample_rate")
    return r


def tag_labels(text, separator):
    """Tags as the page's labels: `k<sep>v` split at the first separator (a DogStatsD tag's
    leading `#` dropped), a tag without a key or a value left out, keys escaped, the last of a
    key in (key, value) order winning."""
    pairs = []
    for tag in (text or "").split(","):
        tag = tag[1:] if separator == ":" and tag.startswith("#") else tag
        k, _, v = tag.partition(separator)
        if k and v:
            pairs.append((k, v))
    return {escape(k): v for k, v in sorted(pairs)}


def sample_events(name, kind, text, v, rate, labels, features):
    if kind == "c":
        return [{"kind": "counter", "name": name, "value": v / rate, "relative": False, "labels": dict(labels)}]
    if kind == "g":
        # A gauge's rate is ignored; a sign makes it a delta.
        return [{"kind": "gauge", "name": name, "value": v, "relative": text[0] in "+-", "labels": dict(labels)}]
    e = {"kind": "observer", "name": name, "value": v / 1000 if kind == "ms" else v, "relative": False, "labels": dict(labels)}
    # The agent's page repeats a sampled observation as statsd_exporter does: int(1/rate).
    return [dict(e) for _ in range(int(1 / rate))]


# ---------------------------------------------------------------------------------------------
# What statsd_exporter shows for events, and what the agent shows by its documented rules.

DEF_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10]
DEF_QUANTILES = [0.5, 0.9, 0.99]


def escape(name):
    out = "_" if name[:1].isdigit() else ""
    prev = None
    for c in name:
        if (c.isascii() and c.isalnum()) or c == "_":
            out += c
        elif not (c == "-" and prev == "-"):
            out += "_"
        prev = c
    return out


class Rules:
    def __init__(self, text):
        doc = yaml.safe_load(text or "") or {}
        self.defaults = doc.get("defaults") or {}
        rules = doc.get("mappings") or []
        self.rules = [r for r in rules if r.get("match_type") != "regex"] + [r for r in rules if r.get("match_type") == "regex"]

    def find(self, name, kind):
        for r in self.rules:
            t = r.get("match_metric_type")
            if t and t != kind:
                continue
            if r.get("match_type") == "regex":
                m = re.search(r["match"], name)
            else:
                pattern = "".join("([^.]*)" if c == "*" else re.escape(c) for c in r["match"])
                m = re.fullmatch(pattern, name)
            if m:
                return r, m
        return None, None

    def observer(self, rule):
        kind = (rule or {}).get("observer_type") or (rule or {}).get("timer_type") or self.defaults.get("observer_type") or "summary"
        return kind


def expand(template, m):
    def sub(g):
        n = int(g.group(1) or g.group(2))
        # Go's Expand: a group the pattern lacks is empty.
        return (m.group(n) if n <= (m.re.groups) else "") or ""

    return re.sub(r"\$\{(\d+)\}|\$(\d+)", sub, str(template))


class Page:
    """The application part of a page: families by name, each its type and series by labels."""

    def __init__(self):
        self.families = {}
        self.conflicts = []  # statsd_exporter's (type, metric_name) per event
        self.refused = {}  # the agent's reason -> series refused, per window
        self.bad_lines = {}  # the agent's reason -> lines

    def family(self, name):
        return self.families.get(name)

    def as_json(self):
        out = {}
        for name in sorted(self.families):
            f = self.families[name]
            series = []
            for key in sorted(f["series"]):
                s = f["series"][key]
                entry = {"labels": dict(key)}
                if f["type"] in ("counter", "gauge"):
                    entry["value"] = s
                else:
                    entry["count"], entry["sum"] = s["count"], s["sum"]
                    values = {v for v, _ in s["values"]}
                    if f["type"] == "summary" and len(values) == 1:
                        # One value observed (however often): every quantile is that value,
                        # whatever the estimator.
                        (value,) = values
                        entry["quantiles"] = {number(q): value for q in f["quantiles"]}
                    if f["type"] == "histogram":
                        entry["buckets"] = {
                            number(b): float(sum(w for v, w in s["values"] if v <= b)) for b in f["buckets"]
                        }
                        entry["buckets"]["+Inf"] = s["count"]
                series.append(entry)
            out[name] = {"type": f["type"], "series": series}
        return out


def exporter(batches_, mapping):
    """statsd_exporter's page after the batches (pkg/exporter handleEvent, pkg/registry)."""
    rules = Rules(mapping)
    page = Page()
    for batch in batches_:
        for e in batch:
            handle(page, rules, e, agent=False)
    return page


def handle(page, rules, e, agent, window=None, features=()):
    """One event onto the page: statsd_exporter's way, or (`agent`) the agent's, with the
    documented `features` of the agent that differ from statsd_exporter: "collide" (names
    refused either way round)."""
    rule, m = rules.find(e["name"], e["kind"])
    labels = dict(e["labels"])
    if rule is not None:
        if rule.get("action") == "drop":
            return
        mapped = expand(rule.get("name", ""), m)
        if mapped == "":
            return
        name = escape(mapped)
        for k, v in (rule.get("labels") or {}).items():
            if rule.get("honor_labels") and k in labels:
                continue
            labels[k] = expand(v, m)
    else:
        name = escape(e["name"])
    value = e["value"] * float(rule.get("scale", 1.0) if rule else 1.0)
    if e["kind"] == "counter" and value < 0:
        return
    kind = e["kind"]
    if kind == "observer":
        kind = "histogram" if rules.observer(rule) == "histogram" else "summary"
    if agent and "collide" in features:
        conflict = collides_agent(page, name, kind)
    else:
        conflict = collides_exporter(page, name, kind)
    if conflict:
        if agent:
            window.add((conflict, e["kind"], e["name"], tuple(sorted(e["labels"].items()))))
        else:
            page.conflicts.append({"counter": "counter", "gauge": "gauge"}.get(kind, "observer"))
        return
    f = page.families.setdefault(name, {"type": kind, "series": {}})
    if kind == "histogram":
        f["buckets"] = DEF_BUCKETS
    if kind == "summary":
        f["quantiles"] = DEF_QUANTILES
    key = tuple(sorted(labels.items()))
    if kind == "counter":
        f["series"][key] = f["series"].get(key, 0.0) + value
    elif kind == "gauge":
        f["series"][key] = (f["series"].get(key, 0.0) + value) if e["relative"] else value
    else:
        s = f["series"].setdefault(key, {"count": 0.0, "sum": 0.0, "values": []})
        s["count"] += 1
        s["sum"] += value
        s["values"].append((value, 1.0))


def collides_exporter(page, name, kind):
    """pkg/registry: the first type of a name wins; a counter or gauge `y_sum` (`_count`,
    `_bucket`) beside a `y` that is not a counter, a histogram `x` beside an `x_sum`, `x_count` or
    `x_bucket` of another type, a summary `x` beside an `x_sum` or `x_count` of another type."""
    f = page.family(name)
    if f is not None:
        return f["type"] != kind and "type_conflict"
    if kind in ("counter", "gauge"):
        for suffix in ("_bucket", "_count", "_sum"):
            base = page.family(name[: -len(suffix)]) if name.endswith(suffix) else None
            if base is not None and base["type"] != "counter":
                return "type_conflict"
        return None
    suffixes = ("_sum", "_count", "_bucket") if kind == "histogram" else ("_sum", "_count")
    for suffix in suffixes:
        other = page.family(name + suffix)
        if other is not None and other["type"] != kind:
            return "type_conflict"
    return None


def collides_agent(page, name, kind):
    """docs/prometheus.md "Conflicts": the first type wins (timers, histograms and distributions
    one observer type); a summary or histogram `x` beside any `x_sum`, `x_count`, `x_bucket` is
    refused whichever came first."""
    observer = kind in ("summary", "histogram")
    f = page.family(name)
    if f is not None:
        theirs = f["type"] in ("summary", "histogram")
        if theirs != observer or (not observer and f["type"] != kind):
            return "type_conflict"
        return None
    if observer and any(page.family(name + s) for s in ("_sum", "_count", "_bucket")):
        return "name_collision"
    for s in ("_sum", "_count", "_bucket"):
        base = page.family(name[: -len(s)]) if name.endswith(s) else None
        if base is not None and base["type"] in ("summary", "histogram"):
            return "name_collision"
    return None


FEATURES = ("order", "collide") + PARSE_FEATURES


def agent(datagrams, mapping, features=FEATURES):
    """The agent's page after the datagrams, one window each, each read as the agent reads it
    (`read`): a window's counters first, then its gauges, then its observations
    (docs/prometheus.md, "First type in one window"); a counter's increments in a window summed,
    and left off when the sum is negative; refusals counted once per series per window."""
    rules = Rules(mapping)
    page = Page()
    order = {"counter": 0, "gauge": 1, "observer": 2}
    for datagram in datagrams:
        batch, bad = read(datagram, features)
        for reason, n in bad.items():
            page.bad_lines[reason] = page.bad_lines.get(reason, 0) + n
        window = set()
        ordered = sorted(batch, key=lambda e: order[e["kind"]]) if "order" in features else batch
        sums = {}
        for e in ordered:
            if e["kind"] == "counter":
                key = (e["name"], tuple(sorted(e["labels"].items())))
                sums[key] = sums.get(key, 0.0) + e["value"]
        done = set()
        for e in ordered:
            if e["kind"] == "counter":
                key = (e["name"], tuple(sorted(e["labels"].items())))
                if key in done:
                    continue
                done.add(key)
                e = dict(e, value=sums[key])
                if e["value"] < 0:
                    continue
            handle(page, rules, e, agent=True, window=window, features=features)
        for reason, *_ in window:
            page.refused[reason] = page.refused.get(reason, 0) + 1
    for reason in ("type_conflict", "name_collision"):
        page.refused.setdefault(reason, 0)
    return page


# ---------------------------------------------------------------------------------------------
# The documented differences, quoted from docs/prometheus.md's table.


def row(label):
    for l in open(DOCS, encoding="utf-8"):
        if l.startswith(f"| {label} |"):
            return l.strip()
    raise SystemExit(f"{DOCS}: no row {label!r} in the table of differences")


FIRST_TYPE = "First type in one window"
CONFLICTS = "Conflicts counted"
COLLISION = "`x` beside `x_count`"
NEGATIVE = "Negative counter"


FEATURE_ROWS = {
    "order": FIRST_TYPE,
    "collide": COLLISION,
    "bad_rate": "A bad sample rate (`foo:1\\|c\\|@bar`)",
    "zero_rate": "A sample rate of 0 (`@0`)",
    "empty_component": "An empty component (`foo:1\\|c\\|`)",
    "components": "More than five `\\|` components",
    "container": "DogStatsD container ids (`\\|c:<id>`)",
    "bad_container": "A malformed container id (`\\|c`, `\\|c:`)",
    "brackets": "One unmatched `[` or `]` in a name (SignalFX tags)",
    "values": "Several values on a counter or gauge line (`foo:1:2\\|c`)",
}


def same(a, b):
    """Two pages alike, their values to the last bits (a weighted sum against repeated adds),
    as tests/prometheus_vectors.rs compares them."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return a == b or abs(a - b) <= 1e-9 * max(abs(a), abs(b))
    return a == b


def rows_that_differ(datagrams, mapping, theirs, mine):
    """The rows of the table that make the agent's page differ from statsd_exporter's: each
    documented rule of the agent without which its page would be another."""
    if same(mine.as_json(), theirs.as_json()):
        return []
    rows = []
    for feature in FEATURES:
        without = agent(datagrams, mapping, tuple(f for f in FEATURES if f != feature))
        if not same(without.as_json(), mine.as_json()):
            rows.append(row(FEATURE_ROWS[feature]))
    assert rows, "the agent's page differs by no documented rule"
    return rows


def vector(id_, mapping, datagrams, theirs, expected=None, extra=None):
    """A vector from datagrams: statsd_exporter's page (its test's `expected`, else `theirs`, the
    page its events make), and the agent's where its documented rules make it differ."""
    mine = agent(datagrams, mapping)
    v = {
        "test": id_,
        "mapping": mapping,
        "send": [datagram(d) for d in datagrams],
        "statsd_exporter": expected if expected is not None else theirs.as_json(),
    }
    differs = rows_that_differ(datagrams, mapping, theirs, mine)
    if theirs.conflicts or any(mine.refused.values()):
        differs.append(row(CONFLICTS))
        v["statsd_exporter_conflicts"] = theirs.conflicts
    if differs:
        v["differs"] = differs
        v["agent"] = {"page": mine.as_json(), "refused": mine.refused}
        if mine.bad_lines:
            v["agent"]["bad_lines"] = mine.bad_lines
    if extra:
        v.update(extra)
    return v


def events_vector(id_, mapping, batches_, expected=None, extra=None):
    """A vector from event batches, each sent as one datagram of lines (`line`)."""
    datagrams = ["\n".join(line(e) for e in b) for b in batches_]
    for d, b in zip(datagrams, batches_):
        # The agent reads the lines back into the events.
        assert same(read(d, ())[0], b) and same(read(d, FEATURES)[0], b), d
    return vector(id_, mapping, datagrams, exporter(batches_, mapping), expected, extra)


# ---------------------------------------------------------------------------------------------
# bridge_test.go TestHandlePacket: a packet and the events the parser makes of it.


def bridge(source):
    return [
        packet_vector(f"bridge_test.go TestHandlePacket: {s.get('name')}", s["in"], events_of(s))
        for s in table(function(source, "TestHandlePacket"))
        if s.get("in", "")
    ]


def line_cases(source, seen):
    """pkg/line/line_test.go TestLineToEvents: a line and its events, as bridge_test.go's, for
    the lines bridge_test.go does not send already. Its check compares only the events a case
    lists: a case without `out` asserts nothing and is left out, but for the lines with several
    values of a counter or gauge (`foo_counter:0.5:120|c`), which statsd_exporter refuses
    (line.go: invalid_extended_aggregate_type) and the agent takes; one with an empty `out` says
    the line makes none."""
    body = function(source, "TestLineToEvents")
    at = body.index("testCases := map[string]testCase{") + len("testCases := ")
    cases, _ = parse(list(tokens(body[at:])), 0, {})
    out = []
    for name, case in dict.items(cases):
        text = case.get("in", "")
        if not text or text in seen:
            continue
        id_ = f"line_test.go TestLineToEvents: {name}"
        if "out" in case:
            out.append(packet_vector(id_, text, events_of(case)))
        elif several_values(text):
            note = "line_test.go lists no events: statsd_exporter's pkg/line refuses the line (invalid_extended_aggregate_type)"
            out.append(packet_vector(id_, text, [], note))
    return out


def several_values(text):
    """Whether the line is one that only several values of a counter or gauge keep from the
    agent's page: taken with every documented difference, refused without that one."""
    without = tuple(f for f in FEATURES if f != "values")
    return bool(read(text, FEATURES)[0]) and not read(text, without)[0]


def events_of(case):
    """The events a case lists (`out`); none when it lists none."""
    out_ = case.get("out")
    return [event(e) for e in out_.items] if isinstance(out_, Composite) else []


def packet_vector(id_, packet, events, note=None):
    """A packet and the events statsd_exporter's parser makes of it, as the page; the agent
    reads the packet itself."""
    # The model of the agent's reading, every documented difference undone, makes the events
    # statsd_exporter's test lists.
    assert same(read(packet, ())[0], events), (id_, read(packet, ())[0], events)
    extra = {"note": note} if note else None
    v = vector(id_, None, [packet], exporter([events], None), extra=extra)
    names = [e["name"] for e in events + read(packet, FEATURES)[0]]
    if any(re.search(r"[^A-Za-z0-9._-]", n) for n in names):
        # A name sanitizing would change (docs/prometheus.md): as sent, for statsd_exporter's
        # escaping.
        v["args"] = ["--sanitize-names", "false"]
    return v


def datagram(text):
    raw = text.encode("utf-8", "surrogateescape")
    try:
        raw.decode("utf-8")
        return {"datagram": text}
    except UnicodeDecodeError:
        return {"bytes": list(raw)}


# ---------------------------------------------------------------------------------------------
# pkg/exporter/exporter_test.go.

# What each single-case test asserts (the Go text it stands for is checked to be in the file),
# as the page: `statsd_exporter` families (None: the events' page), or a check of its own.
ASSERTS = {
    "TestNegativeCounter": {
        "go": 'errorEventStats.WithLabelValues("illegal_negative_counter")',
        "differs": [NEGATIVE],
        "note": "statsd_exporter counts the event in events_error_total{reason=illegal_negative_counter} "
        "and shows no series; the agent shows none either, and counts nothing",
    },
    "TestInconsistentLabelSets": {
        "go": 'metricNames := [4]string{"counter_test", "gauge_test", "histogram_test", "summary_test"}',
    },
    "TestLabelParsing": {"go": 'if getFloat64(metrics, "counter_test", labels) == nil'},
    "TestHonorLabels": {"go": 'getFloat64(metrics, metricName, map[string]string{"some_label": "bar"}) == nil'},
    "TestEmptyStringMetric": {
        "go": 'errorEventStats.WithLabelValues("empty_metric_name")',
        "note": "statsd_exporter counts events_error_total{reason=empty_metric_name} and shows nothing",
    },
    "TestSummaryWithQuantilesEmptyMapping": {"go": "quantiles := metricFamily.Metric[0].Summary.Quantile"},
    "TestHistogramUnits": {
        "go": "ex.Mapper.Defaults.ObserverType = mapper.ObserverTypeHistogram",
        # Set in the test's code, not by a file: the same default as a file says it.
        "mapping": "defaults:\n  observer_type: histogram\n",
    },
    "TestCounterIncrement": {"go": "if *value != 2 {"},
    "TestGaugeIncrementDecrement": {"go": "if *value != 327 {"},
    "TestScaledMapping": {"go": "if *value != 300*1024 {"},
}


def exporter_tests(source):
    out = []
    for test, what in ASSERTS.items():
        body = function(source, test)
        assert what["go"] in body, f"{test}: {what['go']!r} is no longer in the test"
        env = locals_of(body)
        mapping = what.get("mapping", config_of(body))
        extra = {"note": what["note"]} if "note" in what else None
        v = events_vector(f"exporter_test.go {test}", mapping, batches(body, env), extra=extra)
        for d in what.get("differs", []):
            v.setdefault("differs", []).append(row(d))
            v.setdefault("agent", {"page": v["statsd_exporter"]})
        out.append(v)
    out += ttl(source)
    out += conflicting(source)
    return out


def ttl(source):
    """TestTtlExpiration: the gauge of the default ttl (1s) leaves the page first, the mapped
    summary (2s) after it."""
    body = function(source, "TestTtlExpiration")
    assert 't.Fatalf("Gauge `foobar` should be expired")' in body
    assert 't.Fatalf("Summary `bazqux` should be expired")' in body
    env = locals_of(body)
    mapping = config_of(body)
    events = batches(body, env)
    v = events_vector("exporter_test.go TestTtlExpiration", mapping, events)
    # A second after the events (the test's clock) the gauge is gone and the summary still
    # there; two seconds after them neither. The agent takes each off the page later, at a
    # window's close (docs/prometheus.md): each state is seen no sooner than its time.
    first = {k: f for k, f in v["statsd_exporter"].items() if f["type"] != "gauge"}
    v["then"] = [
        {"after": "1s", "statsd_exporter": first},
        {"after": "2s", "statsd_exporter": {}},
    ]
    return [v]


def conflicting(source):
    body = function(source, "TestConflictingMetrics")
    mapping = config_of(body)
    out = []
    for s in table(body):
        events = [event(e) for e in s["in"].items]
        # The test reads back, for each expected value, the event at its place by the event's
        # own name and labels; everything else on the page is what the events make.
        expected = exporter([events], mapping).as_json()
        for i, want in enumerate(s["expected"].items):
            e = events[i]
            name = escape(e["name"])
            f = expected[name]
            series = next(x for x in f["series"] if x["labels"] == e["labels"])
            got = series.get("value", series.get("sum"))
            assert got == want, (s["name"], name, got, want)
        out.append(events_vector(f"exporter_test.go TestConflictingMetrics: {s['name']}", mapping, [events], expected))
        # The same events a window apart, as statsd_exporter takes them one after the other.
        apart = events_vector(
            f"exporter_test.go TestConflictingMetrics: {s['name']} (a window apart)",
            mapping,
            [[e] for e in events],
            expected,
        )
        out.append(apart)
    return out


# ---------------------------------------------------------------------------------------------
# pkg/mapper/mapper_test.go: observer options, as the page shows them.


def mapper_options(source):
    out = []
    body = function(source, "TestMetricMapperYAML")
    for s in table(body):
        if s.get("configBad") is True:
            continue
        config = s.get("config", "")
        mappings = s.get("mappings")
        for m in mappings.items if isinstance(mappings, Composite) else []:
            keys = set(m) & {"quantiles", "buckets", "scale", "ttl", "maxAge", "ageBuckets", "bufCap"}
            if not keys or not m.get("name"):
                continue
            out.append(mapper_vector(s["testName"], config, m, keys))
    return out


def mapper_vector(test, config, m, keys):
    doc = yaml.safe_load(config) or {}
    defaults = doc.get("defaults") or {}
    metric = m["statsdMetric"]
    labels = dict(m.get("labels") or {})
    rule = next(r for r in doc.get("mappings", []) if str(r.get("name", "")) == m["name"])
    v = {"test": f"mapper_test.go TestMetricMapperYAML: {test}: {metric}", "mapping": config}
    # A name like test.*.* is sent as it is: the agent's sanitizing (which drops `*`) off.
    v["args"] = ["--sanitize-names", "false"]
    name = escape(m["name"])
    if "ttl" in keys:
        # The test's ttl (the rule's, else the defaults'): a counter of the rule shows, then
        # leaves the page once unseen that long. The line (one count) is ours.
        ttl = rule.get("ttl") or defaults.get("ttl")
        secs = duration(ttl)
        v["send"] = [{"datagram": f"{metric}:1|c"}]
        v["statsd_exporter"] = {name: {"type": "counter", "series": [{"labels": labels, "value": 1.0}]}}
        if secs <= 10:
            v["then"] = [{"after": ttl, "statsd_exporter": {}}]
        else:
            v["note"] = f"ttl {ttl} is longer than the test waits: the series is only seen to stay"
        return v
    if "scale" in keys:
        scale = float(m["scale"]["Val"])
        # One timer of 1000 ms (the line's value is ours; the scale is the test's): observed in
        # seconds, then scaled.
        value = 1000.0 / 1000 * scale
        v["send"] = [{"datagram": f"{metric}:1000|ms"}]
        v["statsd_exporter"] = {
            name: {
                "type": "summary",
                "series": [{"labels": labels, "count": 1.0, "sum": value, "quantiles": {number(q): value for q in DEF_QUANTILES}}],
            }
        }
        return v
    observer = rule.get("observer_type") or rule.get("timer_type") or defaults.get("observer_type") or "summary"
    # One timer of 100 ms (ours): 0.1 s observed.
    v["send"] = [{"datagram": f"{metric}:100|ms"}]
    if observer == "histogram":
        bounds = [float(b) for b in m["buckets"].items] if isinstance(m.get("buckets"), Composite) else DEF_BUCKETS
        v["statsd_exporter"] = {
            name: {
                "type": "histogram",
                "series": [
                    {
                        "labels": labels,
                        "count": 1.0,
                        "sum": 0.1,
                        "buckets": {**{number(b): float(0.1 <= b) for b in bounds}, "+Inf": 1.0},
                    }
                ],
            }
        }
        return v
    quantiles = m.get("quantiles")
    qs = [float(q["Quantile"]) for q in quantiles.items] if isinstance(quantiles, Composite) else DEF_QUANTILES
    v["statsd_exporter"] = {
        name: {
            "type": "summary",
            "series": [{"labels": labels, "count": 1.0, "sum": 0.1, "quantiles": {number(q): 0.1 for q in qs}}],
        }
    }
    return v


def duration(text):
    """A Go duration (1m2s, 10s) in seconds."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    return sum(float(n) * units[u] for n, u in re.findall(r"([\d.]+)(ms|h|m|s)", str(text)))


def main():
    if sys.argv[1] == "--git-dir":
        git_dir, rev = sys.argv[2], sys.argv[4]

        def read(path):
            return subprocess.run(["git", f"--git-dir={git_dir}", "show", f"{rev}:{path}"], check=True, capture_output=True, text=True).stdout

        exporter_src = read("pkg/exporter/exporter_test.go")
        bridge_src = read("bridge_test.go")
        mapper_src = read("pkg/mapper/mapper_test.go")
        line_src = read("pkg/line/line_test.go")
    else:
        exporter_src, bridge_src, mapper_src, line_src = (open(p, encoding="utf-8").read() for p in sys.argv[1:5])
    bridged = bridge(bridge_src)
    seen = {s.get("in") for s in table(function(bridge_src, "TestHandlePacket"))}
    vectors = bridged + line_cases(line_src, seen) + exporter_tests(exporter_src) + mapper_options(mapper_src)
    json.dump(vectors, sys.stdout, indent=1, ensure_ascii=False)
    print()


if __name__ == "__main__":
    main()
