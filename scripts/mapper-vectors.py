#!/usr/bin/env python3
"""Turns statsd_exporter's mapper tests (pkg/mapper/mapper_test.go, TestMetricMapperYAML and
TestAction) into the vectors tests/mapping.rs runs through the agent: each scenario's mapping
file, whether statsd_exporter refuses it, and each case's metric, type, and the name and labels
statsd_exporter gives it (or that no rule matches).

    scripts/mapper-vectors.py path/to/mapper_test.go > tests/mapping/vectors.json

The test file comes from the statsd_exporter repository (github.com/prometheus/statsd_exporter);
the vectors are data read from it, not its code."""
import json
import re
import sys

TOKEN = re.compile(r'\s*(?:(//[^\n]*)|(`[^`]*`)|("(?:\\.|[^"\\])*")|([A-Za-z_][\w.]*)|(-?[\d.][\w.+-]*)|(.))', re.S)


def tokens(text):
    for m in TOKEN.finditer(text):
        comment, raw, string, ident, number, punct = m.groups()
        if comment:
            continue
        if raw is not None:
            yield ("str", raw[1:-1])
        elif string is not None:
            yield ("str", json.loads(string))
        elif ident is not None:
            yield ("id", ident)
        elif number is not None:
            yield ("num", number)
        elif punct is not None and punct.strip():
            yield ("p", punct)


def parse(toks, i):
    """A Go composite literal's value at toks[i]: {...} as a list or dict, else a scalar."""
    kind, value = toks[i]
    if kind == "id" and i + 1 < len(toks) and toks[i + 1] == ("p", "{"):
        return parse(toks, i + 1)  # a type name before the braces
    if kind == "id" and value in ("map", "mappings", "[]MetricObjective", "[]float64"):
        while toks[i] != ("p", "{"):
            i += 1
        return parse(toks, i)
    if (kind, value) == ("p", "["):  # []T{...} and map[K]V{...}
        while toks[i] != ("p", "{"):
            i += 1
        return parse(toks, i)
    if (kind, value) != ("p", "{"):
        if kind == "id" and toks[i + 1] == ("p", "*"):
            return value, i + 1
        return value, i + 1
    i += 1
    items, fields = [], {}
    while toks[i] != ("p", "}"):
        if toks[i + 1] == ("p", ":"):
            key = toks[i][1]
            val, i = parse(toks, i + 2)
            fields[key] = val
        else:
            val, i = parse(toks, i)
            items.append(val)
        # a value may be an expression (time.Second * 5): skip to the comma
        while toks[i] not in (("p", ","), ("p", "}")):
            i += 1
        if toks[i] == ("p", ","):
            i += 1
    return (fields if fields else items), i + 1


def scenarios(source, test):
    body = source[source.index(f"func {test}("):]
    body = body[body.index("}{") + 1:]
    toks = list(tokens(body))
    value, _ = parse(toks, 0)
    return value


def main():
    source = open(sys.argv[1]).read()
    out = []
    for test in ("TestMetricMapperYAML", "TestAction"):
        for s in scenarios(source, test):
            cases = []
            for m in s.get("mappings", []):
                cases.append({
                    "metric": m["statsdMetric"],
                    "type": m.get("metricType", "MetricTypeCounter").removeprefix("MetricType").lower(),
                    "name": m.get("name", ""),
                    "labels": m.get("labels", {}) or {},
                    "not_present": m.get("notPresent", "false") == "true",
                })
            out.append({
                "test": f"{test}: {s['testName']}",
                "config": s.get("config", ""),
                "bad": s.get("configBad", "false") == "true",
                "action": s.get("expectedAction", "").removeprefix("ActionType").lower(),
                "cases": cases,
            })
    json.dump(out, sys.stdout, indent=1, ensure_ascii=False)
    print()


main()
