#!/usr/bin/python3
"""Writes tests/carbon/protocol_vectors.json: the cases of carbon's own receiver tests
(carbon's lib/carbon/tests/test_protocols.py: TestMetricReceiver, TestMetricLineReceiver,
TestMetricDatagramReceiver, TestMetricPickleReceiver), as data the agent's carbon receivers are
run on (tests/carbon_vectors.rs): what is sent (a line over TCP, a datagram, a pickle message),
and the points carbon's metricReceived is called with ("now" where carbon puts time.time()).
The pickles are made here by Python's own pickle module, at its default protocol as the tests
do, and at protocols 0 and 2. Carbon's allow/block lists and MIN_TIMESTAMP_RESOLUTION (off by
default) have no counterpart in the agent and are left out.

    /usr/bin/python3 scripts/carbon-vectors.py > tests/carbon/protocol_vectors.json
"""
import json
import pickle
import sys

NOW = "now"
cases = []


def case(name, transport, data, points):
    cases.append({"name": name, "transport": transport, "hex": data.hex(), "points": points})


# TestMetricReceiver, through a line.
case("valid_metricReceived", "line", b"carbon.foo 2 1", [["carbon.foo", 1, 2]])
case("nan_metricReceived", "line", b"carbon.foo nan 1", [])
case("notime_metricReceived", "line", b"carbon.foo 2 -1", [["carbon.foo", NOW, 2]])
# TestMetricLineReceiver.
case("invalid_line_received", "line", b"\xd0\xb6" * 401, [])
case("valid_line_received", "line", b"\xd0\xb6\xd0\xbe\xd0\xbf\xd0\xb0 42 -1", [["жопа", NOW, 42]])
# TestMetricDatagramReceiver.
case("valid_datagramReceived", "datagram", b"carbon.foo 1 2", [["carbon.foo", 2, 1]])
case("invalid_datagramReceived_no_timestamp", "datagram", b"carbon.foo 1", [])
case("invalid_datagramReceived_long", "datagram", b"c" * 401, [])
case("utf8_datagramReceived", "datagram", b"\xd0\xb6\xd0\xbe\xd0\xbf\xd0\xb0 42 -1", [["жопа", NOW, 42]])
case("multiple_datagramReceived", "datagram", b"lines 1 2\nare 3 4\nnot\nvalid 5 6\n",
     [["lines", 2, 1], ["are", 4, 3], ["valid", 6, 5]])
# TestMetricPickleReceiver, at the default protocol and at those carbon's senders use.
for protocol in (pickle.DEFAULT_PROTOCOL, 0, 2):
    suffix = "" if protocol == pickle.DEFAULT_PROTOCOL else "_protocol_%d" % protocol
    case("string_received" + suffix, "pickle",
         pickle.dumps([("foo.bar", (1, 1.5)), ("bar.foo", (2, 2.5))], protocol=protocol),
         [["foo.bar", 1, 1.5], ["bar.foo", 2, 2.5]])
    case("decode_pickle" + suffix, "pickle", pickle.dumps([("foo.bar", 1)], protocol=protocol), [])
    case("invalid_types" + suffix, "pickle", pickle.dumps([("foo.bar", ("a", "b"))], protocol=protocol), [])
    case("py2_unicode_to_string_conversion" + suffix, "pickle",
         pickle.dumps([("foo.bar.中文", (1, 2))], protocol=protocol), [["foo.bar.中文", 1, 2]])
for i, data in enumerate([b"1", b"i", b"iii"]):
    case("invalid_pickle_%d" % i, "pickle", data, [])

json.dump({"source": "carbon lib/carbon/tests/test_protocols.py, made by scripts/carbon-vectors.py",
           "python": sys.version.split()[0], "cases": cases}, sys.stdout, ensure_ascii=False, indent=1)
sys.stdout.write("\n")
