#!/usr/bin/python3
"""The monitoring files (docker/monitoring/) against the real tools and a running fencegate.

1. Every alert in alerts.yaml has a unit test in alerts_test.yaml (promtool runs them: ctest
   monitoring_rules).
2. Every metric name alerts.yaml and dashboard.json use is one that GET /metrics of a running
   fencegate exports (a # TYPE line, so counters without samples yet count too; recording rules'
   own names are resolved to theirs).
3. A real Prometheus (/usr/bin/prometheus, loopback, ephemeral port, temp storage) scrapes that
   fencegate every second with a test copy of the rules (for: 0s, evaluated every second); a stale
   write makes FencegateStaleWritesRefused pending or firing, seen through Prometheus's own API.

Usage: monitoring_test.py FENCEGATE_BINARY MONITORING_DIR
Prints "SKIPPED: ..." and exits 0 when Prometheus is not installed.
"""
import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import yaml

PROMETHEUS = "/usr/bin/prometheus"
PROMQL_WORDS = {
    "sum", "by", "without", "rate", "increase", "irate", "histogram_quantile", "max", "min", "avg", "count",
    "changes", "or", "and", "unless", "on", "ignoring", "group_left", "group_right", "bool", "label_values",
    "le", "offset", "topk", "bottomk", "abs", "delta", "deriv", "time", "vector", "scalar", "clamp_min",
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Upstream(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            self.rfile.read(n)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def write(port, path, token):
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path), data=b"x",
                                 headers={"Fencing-Token": str(token)}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def wait_for(pred, timeout, what):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            v = pred()
            if v:
                return v
        except Exception as e:  # not up yet
            last = e
        time.sleep(0.25)
    raise AssertionError("timed out waiting for %s (last error: %s)" % (what, last))


def metric_names(expr):
    """The metric names an expression uses (identifiers that are not PromQL words, labels or
    label values), without the recording rules' names (level:metric:operation)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # drop string literals (label values)
    expr = re.sub(r"\{[^}]*\}", "", expr)  # drop label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # drop ranges
    expr = re.sub(r"\b\d+(ms|[smhdwy])\b", "", expr)  # drop durations (offset 5m)
    expr = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", expr)  # drop label lists
    names = set()
    for tok in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr):
        if tok in PROMQL_WORDS or tok.startswith("$") or ":" in tok:
            continue
        if re.fullmatch(r"\d+[smhdwy]?", tok):
            continue
        names.add(tok)
    return names


def exported(metrics_text):
    """Sample names fencegate exports: each # TYPE line's name, and a histogram's series."""
    out = set()
    for line in metrics_text.splitlines():
        m = re.match(r"# TYPE (\S+) (\S+)", line)
        if m:
            out.add(m.group(1))
            if m.group(2) == "histogram":
                out.update(m.group(1) + s for s in ("_bucket", "_sum", "_count"))
        elif line and not line.startswith("#"):
            out.add(re.split(r"[{ ]", line, 1)[0])
    return out


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    binary, mondir = sys.argv[1], sys.argv[2]
    rules = yaml.safe_load(open(os.path.join(mondir, "alerts.yaml")))
    tests = yaml.safe_load(open(os.path.join(mondir, "alerts_test.yaml")))
    dashboard = json.load(open(os.path.join(mondir, "dashboard.json")))

    # 1. Every alert has a unit test (that expects it to fire).
    alerts = [r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r]
    firing_tested = {t["alertname"] for tc in tests["tests"] for t in tc.get("alert_rule_test", []) if t["exp_alerts"]}
    quiet_tested = {t["alertname"] for tc in tests["tests"] for t in tc.get("alert_rule_test", []) if not t["exp_alerts"]}
    missing = [a for a in alerts if a not in firing_tested or a not in quiet_tested]
    assert not missing, "alerts without a firing and a quiet unit test in alerts_test.yaml: %s" % missing
    for g in rules["groups"]:
        for r in g["rules"]:
            if "alert" in r:
                assert r.get("annotations", {}).get("summary"), r["alert"] + " has no summary"
                anchor = r["annotations"].get("runbook", "").split("#")[-1]
                assert anchor == r["alert"].lower(), r["alert"] + ": runbook anchor " + anchor

    # The metric names the files use.
    used = {}
    for g in rules["groups"]:
        for r in g["rules"]:
            for n in metric_names(r["expr"]):
                used.setdefault(n, "alerts.yaml " + r.get("alert", r.get("record")))
    for p in dashboard["panels"]:
        for t in p["targets"]:
            for n in metric_names(t["expr"]):
                used.setdefault(n, "dashboard.json panel " + repr(p["title"]))
    for v in dashboard.get("templating", {}).get("list", []):
        if isinstance(v.get("query"), str) and "(" in v["query"]:
            m = re.match(r"label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)", v["query"])  # (metric, label)
            for n in metric_names(m.group(1) if m else v["query"]):
                used.setdefault(n, "dashboard.json variable " + v["name"])
    assert len(used) >= 10, used

    tmp = tempfile.mkdtemp(prefix="fencegate-monitoring-")
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    port, admin = free_port(), free_port()
    cfg = {
        "listen": "127.0.0.1:%d" % port, "db": os.path.join(tmp, "fence.db"), "threads": 1,
        "admin": {"listen": "127.0.0.1:%d" % admin},
        "routes": [{"prefix": "/", "upstream": "http://127.0.0.1:%d" % upstream.server_address[1],
                    "resource": "ledger", "mode": "enforce"}],
    }
    with open(os.path.join(tmp, "fencegate.json"), "w") as f:
        json.dump(cfg, f)
    fglog = open(os.path.join(tmp, "fencegate.log"), "w")
    fg = subprocess.Popen([binary, "serve", "--config", os.path.join(tmp, "fencegate.json")], stdout=fglog, stderr=fglog)
    prom = None
    try:
        wait_for(lambda: get("http://127.0.0.1:%d/healthz" % admin), 15, "fencegate")
        assert write(port, "/w", 5) == 200

        # 2. Every name used is exported.
        have = exported(get("http://127.0.0.1:%d/metrics" % admin))
        unknown = {n: where for n, where in used.items() if n not in have}
        assert not unknown, "metric names used but not exported by /metrics: %s" % unknown
        print("ok: %d metric names used by alerts.yaml and dashboard.json are all exported" % len(used))

        # 3. A real Prometheus sees the stale-write alert.
        if not os.path.exists(PROMETHEUS):
            print("SKIPPED: %s is not installed (apt-get install prometheus); the live alert is not tested" % PROMETHEUS)
            return 0
        for g in rules["groups"]:
            g["interval"] = "1s"
            for r in g["rules"]:
                if "alert" in r:
                    r["for"] = "0s"
        with open(os.path.join(tmp, "alerts.yaml"), "w") as f:
            yaml.safe_dump(rules, f)
        pport = free_port()
        pcfg = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [os.path.join(tmp, "alerts.yaml")],
            "scrape_configs": [{"job_name": "fencegate", "static_configs": [{"targets": ["127.0.0.1:%d" % admin]}]}],
        }
        with open(os.path.join(tmp, "prometheus.yml"), "w") as f:
            yaml.safe_dump(pcfg, f)
        plog = open(os.path.join(tmp, "prometheus.log"), "w")
        prom = subprocess.Popen([PROMETHEUS, "--config.file=" + os.path.join(tmp, "prometheus.yml"),
                                 "--storage.tsdb.path=" + os.path.join(tmp, "prom-data"),
                                 "--web.listen-address=127.0.0.1:%d" % pport, "--log.level=warn"],
                                stdout=plog, stderr=plog)
        api = "http://127.0.0.1:%d/api/v1/" % pport

        def scraped():
            j = json.loads(get(api + "query?query=" + urllib.request.quote('fencegate_requests_total{decision="forwarded"}')))
            return j["data"]["result"]

        wait_for(scraped, 60, "Prometheus to scrape fencegate")

        def alert_state():
            j = json.loads(get(api + "alerts"))
            for a in j["data"]["alerts"]:
                if a["labels"].get("alertname") == "FencegateStaleWritesRefused":
                    return a
            return None

        assert alert_state() is None, "the stale-write alert is active before any stale write"
        assert write(port, "/w", 4) == 409
        a = wait_for(lambda: (lambda s: s if s and s["state"] in ("pending", "firing") else None)(alert_state()),
                     60, "FencegateStaleWritesRefused to go pending or firing")
        assert a["labels"]["resource"] == "ledger", a
        print("ok: Prometheus shows FencegateStaleWritesRefused %s for resource ledger" % a["state"])
        return 0
    except Exception:
        for name in ("fencegate.log", "prometheus.log"):
            p = os.path.join(tmp, name)
            if os.path.exists(p):
                sys.stderr.write("--- %s\n%s\n" % (name, open(p).read()[-6000:]))
        raise
    finally:
        for p in (prom, fg):
            if p is not None:
                p.terminate()
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
        upstream.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
