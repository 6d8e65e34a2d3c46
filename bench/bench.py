#!/usr/bin/env python3
"""fencegate benchmark: fencegate vs nginx vs HAProxy, side by side in one run, on loopback.

Run it through bench/run.sh (which installs nginx, haproxy and wrk and builds fencegate if
needed); see bench/README.md for what is measured and how. Standard library only.
"""
import argparse
import datetime
import http.client as http_client  # issue 30: one keyed request with its own header
import json
import math
import os
import platform
import re
import resource
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TOKEN = "7"  # the generation every load request presents (valid and equal in enforce mode)


def env_int(name, default):
    v = os.environ.get(name, "")
    return int(v) if v.strip() else default


def env_float(name, default):
    v = os.environ.get(name, "")
    return float(v) if v.strip() else default


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Procs:
    """Every process the benchmark starts, so that all of them are stopped at the end."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.procs = []  # (name, Popen)

    def start(self, name, argv, cpu=None, stdin=subprocess.DEVNULL, stdout=None, env=None):
        logpath = os.path.join(self.tmp, f"{name}.log")
        out = open(logpath, "ab") if stdout is None else stdout
        pre = (lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None
        p = subprocess.Popen(argv, stdin=stdin, stdout=out, stderr=open(logpath, "ab"), preexec_fn=pre,
                             env=env, cwd=self.tmp)
        self.procs.append((name, p))
        return p

    def stop(self, p, timeout=15):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = [(n, q) for (n, q) in self.procs if q is not p]

    def stop_all(self):
        for _, p in reversed(list(self.procs)):
            self.stop(p, timeout=10)


def wait_port(port, proc, name, timeout=15):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{name} did not listen on {port} within {timeout}s")


def wait_port_fast(port, proc, name, timeout=60):
    """wait_port polled every 2 ms: the scale part times start-up with it."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.002)
    raise RuntimeError(f"{name} did not listen on {port} within {timeout}s")


def admin_metrics(admin_port):
    """fencegate's admin /metrics page, as text."""
    with socket.create_connection(("127.0.0.1", admin_port), timeout=10) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data.decode("latin-1")


def idempotency_count(admin_port, outcome):
    """fencegate_idempotency_total{resource="bench",outcome=...} (0 before the first)."""
    m = re.search(r'^fencegate_idempotency_total\{resource="bench",outcome="%s"\} (\S+)$' % outcome,
                  admin_metrics(admin_port), re.M)
    return float(m.group(1)) if m else 0.0


def store_commits(admin_port):
    """fencegate's own store commit histogram (admin /metrics): (batches committed, seconds summed)."""
    text = admin_metrics(admin_port)
    n = re.search(r"^fencegate_store_commit_seconds_count (\S+)$", text, re.M)
    t = re.search(r"^fencegate_store_commit_seconds_sum (\S+)$", text, re.M)
    if not n or not t:
        raise RuntimeError("fencegate /metrics has no fencegate_store_commit_seconds histogram")
    return float(n.group(1)), float(t.group(1))


def commit_mean_ms(before, after):
    n = after[0] - before[0]
    return (after[1] - before[1]) / n * 1000 if n > 0 else 0.0


def http(port, method, path, token=None, body=b"0123456789abcdef", timeout=10):
    """One request on a fresh connection; returns (status, headers dict lower-cased)."""
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
    if token is not None:
        head += f"Fencing-Token: {token}\r\n"
    head += f"Content-Type: application/octet-stream\r\nContent-Length: {len(body)}\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(head.encode() + body)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        raw_head, _, rest = data.partition(b"\r\n\r\n")
        lines = raw_head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        # Read the body by its length: not every server closes after "Connection: close".
        want = int(headers.get("content-length", "0"))
        while len(rest) < want:
            chunk = s.recv(65536)
            if not chunk:
                break
            rest += chunk
    return status, headers


def pss_kb(pids):
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
    return total


def status_kb(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def children(pid):
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
        except OSError:
            pass
    return out


def established(port):
    """Established TCP connections whose local port is `port` (the server's side), from /proc/net/tcp{,6}."""
    n = 0
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    if fields[3] == "01" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        n += 1
        except OSError:
            pass
    return n


def nofile_limit(pid):
    """The soft open-file limit process `pid` runs with (/proc/PID/limits); 0 if unreadable."""
    try:
        with open(f"/proc/{pid}/limits") as f:
            for line in f:
                if line.startswith("Max open files"):
                    return int(line.split()[3])
    except (OSError, ValueError):
        pass
    return 0


def cpu_ticks_split(pids):
    """(user, system) clock ticks of `pids` from /proc/PID/stat. Without IRQ time accounting (this
    kernel: CONFIG_IRQ_TIME_ACCOUNTING unset) the softirq work a process's sends run on its own
    core, such as loopback TCP delivering to the peer, counts as its system time."""
    user = system = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            user += int(fields[11])
            system += int(fields[12])
        except OSError:
            pass
    return user, system


def cpu_ticks(pids):
    return sum(cpu_ticks_split(pids))


def core_jiffies(cpu):
    """(busy, total) jiffies of one CPU from /proc/stat; iowait counts as idle."""
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith(f"cpu{cpu} "):
                v = [int(x) for x in line.split()[1:]]
                idle = v[3] + v[4]
                return sum(v[:8]) - idle, sum(v[:8])
    return 0, 0


def parse_kv(line):
    return {k: (float(v) if re.fullmatch(r"-?[0-9.]+", v) else v) for k, v in re.findall(r"(\w+)=(\S+)", line)}


def human_bytes(n):
    if n >= 2**30 and n % 2**30 == 0:
        return f"{n // 2**30} GiB"
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n} bytes"


def machine_info(tmp):
    cpu = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = ""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem = f"{int(line.split()[1]) // 1024 // 1024} GiB"
    fstype = subprocess.run(["findmnt", "-n", "-o", "FSTYPE", "-T", tmp], capture_output=True, text=True).stdout.strip()
    if not fstype:
        fstype = subprocess.run(["stat", "-f", "-c", "%T", tmp], capture_output=True, text=True).stdout.strip()
    return {"nproc": os.cpu_count(), "cpu": cpu, "kernel": platform.release(), "mem": mem, "tmp_fs": fstype}


def tool_versions(fencegate):
    def first_line(argv):
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=10)
            return (r.stdout + r.stderr).strip().splitlines()[0]
        except Exception as e:  # noqa: BLE001 - informational only
            return f"? ({e})"

    git = lambda *a: subprocess.run(["git", "-C", ROOT, *a], capture_output=True, text=True).stdout.strip()
    commit = git("rev-parse", "--short", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no")
    build_type = "?"
    cache = os.path.join(os.path.dirname(os.path.abspath(fencegate)), "CMakeCache.txt")
    if os.path.exists(cache):
        m = re.search(r"^CMAKE_BUILD_TYPE:STRING=(.*)$", open(cache).read(), re.M)
        build_type = m.group(1) if m else "?"
    mtime = datetime.datetime.fromtimestamp(os.path.getmtime(fencegate), datetime.timezone.utc)
    return {
        "fencegate": f"{os.path.relpath(os.path.abspath(fencegate), ROOT)} built {mtime:%Y-%m-%d %H:%M} UTC "
                     f"({build_type}); repo HEAD {commit}{' with uncommitted changes' if dirty else ''}",
        "nginx": first_line(["nginx", "-v"]),
        "haproxy": first_line(["haproxy", "-v"]),
        "wrk": first_line(["wrk", "-v"]).split("Copyright")[0].strip(),
    }


WRK_LUA = r"""
-- Same request for every target: POST, %(body)d-byte body, Fencing-Token (non-fencing proxies
-- just forward it). wrk builds it once; done() prints one machine-readable line.
wrk.method = "POST"
wrk.body = string.rep("x", %(body)d)
wrk.headers["Content-Type"] = "application/octet-stream"
wrk.headers["Fencing-Token"] = "%(token)s"
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("BENCH requests=%%d duration_us=%%d p50_us=%%d p99_us=%%d p999_us=%%d max_us=%%d status_err=%%d sock_err=%%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    latency:percentile(99.9), latency.max, e.status, e.connect + e.read + e.write + e.timeout))
end
"""

# Issue 30: keyed POSTs. WRK_KEYED_LUA: a new Idempotency-Key per request (each needs a durable
# write), "k-<prefix>-<n>". The prefix comes from the bench, new for every run: wrk's Lua
# math.random is unseeded, so a prefix drawn there repeats from run to run, and every run after
# the first would replay the first's keys instead of recording new ones. WRK_REPLAY_LUA: one key
# for every request (after the first, each is a replay), set once like the unkeyed script's
# headers so that wrk pays no per-request Lua for it either.
WRK_KEYED_LUA = WRK_LUA + r"""
local n = 0
local prefix = "%(prefix)s"
function request()
  n = n + 1
  wrk.headers["Idempotency-Key"] = '"k-' .. prefix .. '-' .. n .. '"'
  return wrk.format()
end
"""
WRK_REPLAY_LUA = WRK_LUA + r"""
wrk.headers["Idempotency-Key"] = '"replayed-key"'
"""


class Bench:
    def __init__(self, args):
        self.args = args
        # Issue 29: 6 s x 4 (was 8 s x 5) so the full run with the scaling, TLS and scale parts
        # stays about 12 minutes.
        self.duration = env_int("BENCH_DURATION", 6)
        self.reps = env_int("BENCH_REPS", 4)
        self.fresh = env_int("BENCH_FRESH", 1) != 0
        self.conns = env_int("BENCH_CONNECTIONS", 32)
        self.body = env_int("BENCH_BODY_BYTES", 1024)
        self.warmup = env_int("BENCH_WARMUP", 2)
        self.adv_ms = env_int("BENCH_ADVANCE_MS", 25)
        self.adv_seconds = env_int("BENCH_ADVANCE_SECONDS", max(5, 2 * self.duration))
        self.adv_idle_seconds = env_int("BENCH_ADVANCE_IDLE_SECONDS", 5)
        self.idle_conns = env_int("BENCH_IDLE_CONNS", 10000)
        self.upload_bytes = env_int("BENCH_UPLOAD_BYTES", 1 << 30)
        self.parts = set(args.parts.split(","))
        # Issue 29: the scaling, TLS and scale parts.
        self.scaling_conns = [int(x) for x in os.environ.get("BENCH_SCALING_CONNS", "1,32,256,1024").split(",")]
        self.scaling_threads_conns = env_int("BENCH_SCALING_THREADS_CONNS", 256)
        self.scaling_seconds = env_int("BENCH_SCALING_DURATION", 4)
        self.scaling_reps = env_int("BENCH_SCALING_REPS", 1)
        self.tls_seconds = env_int("BENCH_TLS_DURATION", 5)
        self.tls_reps = env_int("BENCH_TLS_REPS", 2)
        self.tls_clients = env_int("BENCH_TLS_CLIENTS", 4)
        self.scale_n_resources = env_int("BENCH_SCALE_RESOURCES", 100000)
        self.scale_audit_rows = env_int("BENCH_SCALE_AUDIT_ROWS", 10_000_000)
        allowed = sorted(os.sched_getaffinity(0))
        self.pin = env_int("BENCH_PIN", 1) != 0 and len(allowed) >= 2
        self.load_cpu = allowed[0] if self.pin else None
        self.target_cpu = allowed[1] if self.pin else None
        self.res = {"throughput": {}, "advance": None, "memory": {}, "upload": None, "checks": [], "idempotency": {},
                    "scaling": {}, "tls": {}, "scale": {},
                    "scaling_nofile": {}}
        self.tmp = tempfile.mkdtemp(prefix="fencegate-bench.", dir=os.environ.get("BENCH_TMPDIR") or None)
        self.procs = Procs(self.tmp)

    # ------------------------------------------------------------------ setup

    def setup(self):
        # Every process the run starts inherits this niceness: on a shared machine, concurrent
        # compiles would otherwise take most of each core and the numbers would measure them.
        self.nice = env_int("BENCH_NICE", -20)
        try:
            os.setpriority(os.PRIO_PROCESS, 0, self.nice)
        except OSError as e:
            log(f"cannot set niceness {self.nice} ({e}); running at {os.getpriority(os.PRIO_PROCESS, 0)}")
        self.nice = os.getpriority(os.PRIO_PROCESS, 0)
        self.loadavg_start = open("/proc/loadavg").read().split()[:3]
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = hard if hard != resource.RLIM_INFINITY else 1 << 20
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        self.nofile = want
        if self.idle_conns + 200 > self.nofile:
            log(f"open-file limit {self.nofile}: idle connections reduced from {self.idle_conns}")
            self.idle_conns = self.nofile - 200
        # Bench a copy: build/fencegate is rebuilt often. Versions are recorded now, at copy time.
        self.versions = tool_versions(self.args.fencegate)
        self.fg = os.path.join(self.tmp, "fencegate")
        shutil.copy2(self.args.fencegate, self.fg)
        # --baseline: an older build benched beside this one in the same run (before/after a change),
        # as the throughput target `baseline-enforce`.
        self.fg_baseline = None
        if self.args.baseline:
            self.fg_baseline = os.path.join(self.tmp, "fencegate-baseline")
            shutil.copy2(self.args.baseline, self.fg_baseline)
        self.tool = os.path.join(self.tmp, "benchtool")
        # Issue 29: with OpenSSL's headers the tool also has its TLS clients (tlsnew, tlsidle);
        # without them it is built as before and the TLS part is skipped.
        self.tool_tls = subprocess.run(["cc", "-O2", "-DBENCH_TLS", "-o", self.tool, os.path.join(HERE, "benchtool.c"),
                                        "-lssl", "-lcrypto"], capture_output=True).returncode == 0
        if not self.tool_tls:
            subprocess.run(["cc", "-O2", "-o", self.tool, os.path.join(HERE, "benchtool.c")], check=True)
        # Issue 29: one ECDSA P-256 certificate for every TLS listener of the run (openssl CLI).
        self.tls_cert = os.path.join(self.tmp, "tls-cert.pem")
        self.tls_key = os.path.join(self.tmp, "tls-key.pem")
        self.tls_pem = os.path.join(self.tmp, "tls-haproxy.pem")
        r = subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                            "-nodes", "-keyout", self.tls_key, "-out", self.tls_cert, "-days", "2", "-subj",
                            "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"], capture_output=True, text=True)
        self.tls_ok = r.returncode == 0 and self.tool_tls
        if self.tls_ok:
            with open(self.tls_pem, "w") as f:
                f.write(open(self.tls_cert).read() + open(self.tls_key).read())
            os.chmod(self.tls_key, 0o600)
        else:
            log(f"no TLS part: openssl req exit {r.returncode} {r.stderr.strip()[:200]}; benchtool with OpenSSL: {self.tool_tls}")
        self.lua = os.path.join(self.tmp, "post.lua")
        with open(self.lua, "w") as f:
            f.write(WRK_LUA % {"body": self.body, "token": TOKEN})
        # perf counts each target's system calls per request (a tracepoint: works on VMs whose
        # hardware counters are "not supported"). Optional: without it those columns say "-".
        self.perf_ok = False
        if shutil.which("perf"):
            t = subprocess.run(["perf", "stat", "-x", ",", "-e", "raw_syscalls:sys_enter", "--", "true"],
                               capture_output=True, text=True)
            self.perf_ok = t.returncode == 0 and "raw_syscalls:sys_enter" in t.stderr and "not supported" not in t.stderr
        if not self.perf_ok:
            log("perf cannot count raw_syscalls:sys_enter here: no system calls per request in the report")
        self.up_port = free_port()
        up = self.procs.start("upstream", [self.tool, "upstream", str(self.up_port)], cpu=self.load_cpu)
        wait_port(self.up_port, up, "upstream")

    def start_nginx(self, name, worker_connections=4096, workers=1, tls=False, cpu="target"):
        d = os.path.join(self.tmp, name)
        os.makedirs(d)
        port = free_port()
        conf = os.path.join(d, "nginx.conf")
        # Issue 29 (TLS rows): TLS 1.3 only, the run's ECDSA P-256 certificate, no session cache
        # or tickets (every new connection is a full handshake).
        ssl = (f" ssl;\n    ssl_certificate {self.tls_cert};\n    ssl_certificate_key {self.tls_key};\n"
               f"    ssl_protocols TLSv1.3;\n    ssl_session_cache off;\n    ssl_session_tickets off") if tls else ""
        with open(conf, "w") as f:
            f.write(f"""worker_processes {workers};
daemon off;
master_process on;
user root;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
worker_rlimit_nofile {self.nofile};
events {{ worker_connections {worker_connections}; }}
http {{
  access_log off;
  client_body_temp_path {d}/body;
  proxy_temp_path {d}/proxy;
  fastcgi_temp_path {d}/fastcgi;
  uwsgi_temp_path {d}/uwsgi;
  scgi_temp_path {d}/scgi;
  keepalive_timeout 300s;
  keepalive_requests 1000000;
  upstream up {{ server 127.0.0.1:{self.up_port}; keepalive 64; keepalive_requests 1000000; }}
  server {{
    listen 127.0.0.1:{port} backlog=4096{ssl};
    location / {{
      proxy_pass http://up;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }}
  }}
}}
""")
        p = self.procs.start(name, ["nginx", "-p", d + "/", "-e", f"{d}/error.log", "-c", conf],
                             cpu=self.target_cpu if cpu == "target" else cpu)
        wait_port(port, p, name)
        return port, p

    def start_haproxy(self, name, threads=1, tls=False, cpu="target"):
        d = os.path.join(self.tmp, name)
        os.makedirs(d)
        port = free_port()
        conf = os.path.join(d, "haproxy.cfg")
        maxconn = min(4000, (self.nofile - 100) // 2)
        # Issue 29 (TLS rows): HAProxy wants the key beside the certificate in one PEM.
        bind_ssl = f" ssl crt {self.tls_pem} ssl-min-ver TLSv1.3 no-tls-tickets" if tls else ""
        with open(conf, "w") as f:
            f.write(f"""global
  nbthread {threads}
  maxconn {maxconn}
  tune.ssl.cachesize 0
defaults
  mode http
  timeout connect 5s
  timeout client 300s
  timeout server 300s
  timeout http-keep-alive 300s
  http-reuse always
frontend fe
  bind 127.0.0.1:{port}{bind_ssl}
  default_backend be
backend be
  server up 127.0.0.1:{self.up_port}
""")
        p = self.procs.start(name, ["haproxy", "-db", "-f", conf], cpu=self.target_cpu if cpu == "target" else cpu)
        wait_port(port, p, name)
        return port, p

    def start_fencegate(self, name, mode="enforce", extra=(), routes=None, admin_port=0, binary=None, cpu="target",
                        threads=1, tls=False, cfg_extra=None, db=None, wait=wait_port):
        d = os.path.join(self.tmp, name)
        os.makedirs(d)
        port = free_port()
        db = db or os.path.join(d, "fence.db")  # issue 29: the scale part brings its own store
        if routes is None:
            argv = [binary or self.fg, "serve", "--listen", f"127.0.0.1:{port}", "--upstream",
                    f"http://127.0.0.1:{self.up_port}", "--mode", mode, "--db", db,
                    "--threads", str(threads), "--admin-listen", "127.0.0.1:0", "--log-level", "warn", *extra]
            if tls:  # issue 29: TLS rows; no resumption, as nginx (ssl_session_tickets off) and HAProxy (no-tls-tickets)
                argv += ["--tls-cert", self.tls_cert, "--tls-key", self.tls_key, "--tls-min-version", "1.3",
                         "--tls-session-resumption", "false"]
        else:
            cfg = {"listen": f"127.0.0.1:{port}", "db": db, "threads": 1,
                   "log_level": "warn", "admin": {"listen": f"127.0.0.1:{admin_port}"},
                   "routes": [dict(r, upstream=f"http://127.0.0.1:{self.up_port}") for r in routes]}
            cfg.update(cfg_extra or {})
            with open(os.path.join(d, "fencegate.json"), "w") as f:
                json.dump(cfg, f, indent=1)
            argv = [self.fg, "serve", "--config", os.path.join(d, "fencegate.json"), *extra]
        p = self.procs.start(name, argv, cpu=self.target_cpu if cpu == "target" else cpu)
        wait(port, p, name)
        return port, p, d

    # ------------------------------------------------------------------ wrk

    def wrk(self, port, seconds, path="/bench", name="wrk", pids_fn=None, count_pids=None, conns=None, scheme="http",
            timeout_s=None):
        """One wrk run; with pids_fn also the CPU those processes used, in % of one core. With
        count_pids (and perf usable), also the system calls and context switches of those
        processes during the run, counted by perf (kv "syscalls", "ctx_switches")."""
        t0 = cpu_ticks_split(pids_fn()) if pids_fn else (0, 0)
        c0 = core_jiffies(self.load_cpu) if self.pin else (0, 0)
        w0 = time.time()
        argv = ["wrk", "-t1", f"-c{conns or self.conns}", f"-d{seconds}s", "--latency", "-s", self.lua,
                *(["--timeout", f"{timeout_s}s"] if timeout_s else []),
                f"{scheme}://127.0.0.1:{port}{path}"]
        pre = (lambda: os.sched_setaffinity(0, {self.load_cpu})) if self.pin else None
        def perf_stat(events, target):
            # Counting mode (no sampling), run on the load core: it costs the counted processes a
            # few ns per event, and only runs during the unrecorded warm-up.
            return subprocess.Popen(["perf", "stat", "-x", ",", "-e", events, *target, "--", "sleep", str(seconds)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=pre)
        counters = {}
        if count_pids and self.perf_ok:
            counters[""] = perf_stat("raw_syscalls:sys_enter,context-switches",
                                     ["-p", ",".join(str(x) for x in count_pids)])
            if self.pin:
                # Context switches on the load core (wrk + upstream): each is mostly a wake-up of
                # a process the proxy's last send found asleep, which both cores pay for.
                counters["load_"] = perf_stat("context-switches", ["-C", str(self.load_cpu)])
        r = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60, preexec_fn=pre)
        with open(os.path.join(self.tmp, f"{name}.log"), "a") as f:
            f.write(r.stdout + r.stderr)
        m = re.search(r"^BENCH .*$", r.stdout, re.M)
        if r.returncode != 0 or not m:
            raise RuntimeError(f"wrk failed ({r.returncode}): {r.stdout[-500:]} {r.stderr[-500:]}")
        kv = parse_kv(m.group(0))
        if self.pin:
            # How busy the load side's core (wrk + the upstream) was: with idle time left there,
            # the target, not the load side, set the rate.
            c1 = core_jiffies(self.load_cpu)
            kv["load_core_pct"] = 100.0 * (c1[0] - c0[0]) / max(1, c1[1] - c0[1])
        kv["rps"] = kv["requests"] / (kv["duration_us"] / 1e6)
        names = {"raw_syscalls:sys_enter": "syscalls", "context-switches": "ctx_switches"}
        for prefix, proc in counters.items():
            for line in proc.communicate(timeout=seconds + 30)[1].splitlines():
                f = line.split(",")  # value,unit,event,...
                if len(f) > 2 and f[0].strip().isdigit() and f[2] in names:
                    kv[prefix + names[f[2]]] = int(f[0])
        if pids_fn:
            t1 = cpu_ticks_split(pids_fn())
            per_pct = 100.0 / os.sysconf("SC_CLK_TCK") / (time.time() - w0)
            kv["user_pct"], kv["sys_pct"] = (t1[0] - t0[0]) * per_pct, (t1[1] - t0[1]) * per_pct
            kv["cpu_pct"] = kv["user_pct"] + kv["sys_pct"]
        return kv

    # ------------------------------------------------------------------ parts

    def check(self, what, ok):
        self.res["checks"].append((what, ok))
        if not ok:
            log(f"CHECK FAILED: {what}")

    def launch(self, name, inst):
        """Starts a fresh instance of throughput target `name`: (port, process or None, pids_fn)."""
        if name == "direct":
            up = [p for n, p in self.procs.procs if n == "upstream"][0]
            return self.up_port, None, lambda: [up.pid]
        if name == "nginx":
            port, p = self.start_nginx(f"nginx.{inst}")
            return port, p, lambda: [p.pid] + children(p.pid)
        if name == "haproxy":
            port, p = self.start_haproxy(f"haproxy.{inst}")
            return port, p, lambda: [p.pid]
        binary = self.fg_baseline if name.startswith("baseline") else None
        mode = name.split("-")[1]
        # Issue 29: `fencegate-enforce-uring-off` is enforce with --io-uring off (one sendmsg per
        # send: what a container's default seccomp profile leaves).
        extra = ["--io-uring", "off"] if name.endswith("-uring-off") else []
        port, p, _ = self.start_fencegate(f"{name}.{inst}", mode=mode, binary=binary, extra=extra)
        return port, p, lambda: [p.pid]

    def throughput(self):
        names = ["direct", "nginx", "haproxy", "fencegate-enforce", "fencegate-enforce-uring-off", "fencegate-observe",
                 "fencegate-off"]
        if self.fg_baseline:
            names.append("baseline-enforce")
        live = {name: self.launch(name, 1) for name in names}
        ports = {name: v[0] for name, v in live.items()}
        # Sanity: every target answers, and the fenced ones really fence (speed must never come
        # from skipping the fence).
        for name in names:
            st, h = http(ports[name], "POST", "/bench", token=TOKEN)
            self.check(f"{name}: POST with token {TOKEN} -> 200 (got {st})", st == 200)
        st, h = http(ports["fencegate-enforce"], "POST", "/bench", token=str(int(TOKEN) - 1))
        self.check(f"fencegate-enforce: stale token -> 409 (got {st})", st == 409)
        st, h = http(ports["fencegate-enforce"], "POST", "/bench", token=None)
        self.check(f"fencegate-enforce: no token -> 428 (got {st})", st == 428)
        st, h = http(ports["fencegate-observe"], "POST", "/bench", token=str(int(TOKEN) - 1))
        self.check(f"fencegate-observe: stale token -> 200 + Fencing-Observe (got {st}, "
                   f"{h.get('fencing-observe')})", st == 200 and "fencing-observe" in h)
        targets = [(name, ports[name]) for name in names]
        runs = {name: [] for name in names}
        for rep in range(self.reps):
            # Rotate the order each repetition so a slow phase of the machine hits every target.
            order = names[rep % len(names):] + names[:rep % len(names)]
            for name in order:
                # A fresh process per repetition (BENCH_FRESH=1): on this VM one process of the
                # same binary can run 20% slower than the next for its whole life (placement), so
                # repetitions on one instance would measure that instance, not the proxy.
                if name not in live:
                    live[name] = self.launch(name, rep + 1)
                port, proc, pids_fn = live[name]
                log(f"warm-up {name} ({self.warmup}s)")
                w = self.wrk(port, self.warmup, name=f"warmup-{name}", count_pids=pids_fn())
                kv = self.wrk(port, self.duration, name=f"wrk-{name}", pids_fn=pids_fn)
                if "syscalls" in w and w["requests"] > 0:
                    # Counted over the warm-up (its requests), not the measured run: deterministic
                    # per request, where CPU time is not, and it says where a CPU difference comes from.
                    kv["syscalls_per_req"] = w["syscalls"] / w["requests"]
                    kv["ctx_per_req"] = w.get("ctx_switches", 0) / w["requests"]
                    if "load_ctx_switches" in w:
                        kv["load_ctx_per_req"] = w["load_ctx_switches"] / w["requests"]
                runs[name].append(kv)
                log(f"rep {rep + 1}/{self.reps} {name:18} {kv['rps']:9.0f} req/s  cpu {kv['cpu_pct']:4.0f}%"
                    f"  load core {kv.get('load_core_pct', 0):4.0f}%"
                    f"  p50 {kv['p50_us'] / 1000:6.2f} ms"
                    f"  p99 {kv['p99_us'] / 1000:6.2f} ms  p99.9 {kv['p999_us'] / 1000:6.2f} ms"
                    + (f"  ERRORS status={kv['status_err']:.0f} socket={kv['sock_err']:.0f}"
                       if kv["status_err"] or kv["sock_err"] else ""))
                if self.fresh and proc is not None:
                    self.procs.stop(proc)
                    del live[name]
        for name, _ in targets:
            rs = runs[name]
            self.res["throughput"][name] = {
                "rps": statistics.median(r["rps"] for r in rs),
                "p50_ms": statistics.median(r["p50_us"] for r in rs) / 1000,
                "p99_ms": statistics.median(r["p99_us"] for r in rs) / 1000,
                "p999_ms": statistics.median(r["p999_us"] for r in rs) / 1000,
                "errors": sum(r["status_err"] + r["sock_err"] for r in rs),
                "cpu_pct": statistics.median(r["cpu_pct"] for r in rs),
                "cpu_us_per_req": statistics.median(r["cpu_pct"] / 100 / r["rps"] * 1e6 for r in rs),
                # Issue 29: the same split into user space and the kernel (system time, which here
                # includes the TCP work of the proxy's own sends: see cpu_ticks_split).
                "user_us_per_req": statistics.median(r["user_pct"] / 100 / r["rps"] * 1e6 for r in rs),
                "sys_us_per_req": statistics.median(r["sys_pct"] / 100 / r["rps"] * 1e6 for r in rs),
                "load_core_pct": statistics.median(r.get("load_core_pct", 0) for r in rs),
                # What the load core (wrk + upstream + their kernel work) spent per request of
                # this target: with that core saturated, 1e6 / this is the most the load side let
                # any proxy reach.
                "load_us_per_req": statistics.median(r.get("load_core_pct", 0) / 100 / r["rps"] * 1e6 for r in rs),
                "runs": [round(r["rps"]) for r in rs],
                "syscalls_per_req": statistics.median(r["syscalls_per_req"] for r in rs)
                                    if all("syscalls_per_req" in r for r in rs) else None,
                "ctx_per_req": statistics.median(r["ctx_per_req"] for r in rs)
                               if all("ctx_per_req" in r for r in rs) else None,
                "load_ctx_per_req": statistics.median(r["load_ctx_per_req"] for r in rs)
                                    if all("load_ctx_per_req" in r for r in rs) else None,
            }
        t = self.res["throughput"]
        # Paired ratios: within one repetition the targets run minutes apart at most, so a slow
        # phase of the shared host hits both sides of a ratio; the median of those per-repetition
        # ratios is reported next to the ratio of the medians (which the targets use).
        if {"nginx", "haproxy"} <= runs.keys():
            for name in [n for n in names if n.startswith(("fencegate", "baseline"))]:
                t[name]["paired"] = {
                    other: statistics.median(a["rps"] / b["rps"] for a, b in zip(runs[name], runs[other]))
                    for other in ("nginx", "haproxy")
                }
        proxies = [n for n in t if n != "direct"]
        # Each proxy gets one core of its own. It set the rate only if that core was saturated:
        # a proxy with idle time left was waiting on the load side, and comparing such rates
        # would compare the load generator with itself.
        low = [f"{n} {t[n]['cpu_pct']:.0f}%" for n in proxies if t[n]["cpu_pct"] < 90]
        self.check("each proxy saturated its own core (>= 90% busy), so its rate is its own"
                   + (f": not {', '.join(low)}" if low else ""), not low)
        if self.pin:
            # The load side (wrk + upstream on one core) may saturate too. Then both sides limit
            # the rate and the throughput ratios are compressed toward 1 (a faster proxy cannot pull
            # further ahead than the load side lets it). The report says so next to the ratios.
            self.res["load_side_saturated"] = max(t[n]["load_core_pct"] for n in proxies) >= 95
        for name, _ in targets:
            if name.startswith(("fencegate", "baseline")):
                self.check(f"{name}: no non-2xx or socket errors under load", self.res["throughput"][name]["errors"] == 0)
        for p in [p for n, p in list(self.procs.procs) if n != "upstream"]:
            self.procs.stop(p)

    # ------------------------------------------------------------------ issue 29: scaling

    def scaling(self):
        """Throughput and CPU per request at 1, 32, 256 and 1,024 connections (one worker each,
        pinned as in the throughput part), then 2 I/O threads / 2 HAProxy threads / 2 nginx workers
        unpinned at BENCH_SCALING_THREADS_CONNS connections. One fresh process per cell, interleaved."""
        secs = self.scaling_seconds
        cells = [(c, 1) for c in self.scaling_conns] + [(self.scaling_threads_conns, 2)]
        names = ["nginx", "haproxy", "fencegate-enforce"]
        out = self.res["scaling"]
        for conns, threads in cells:
            # wrk, and each proxy, needs an fd per connection (the proxies two): checked, not assumed.
            if conns * 2 + 200 > self.nofile:
                log(f"scaling: {conns} connections need more than the open-file limit {self.nofile}: skipped")
                continue
            for rep in range(self.scaling_reps):
                for name in names[rep % 3:] + names[:rep % 3]:
                    # Two threads: the proxy may use both cores (there is no third core), the load
                    # side stays pinned to its own, as in the throughput part.
                    cpu = "target" if threads == 1 else None
                    inst = f"scaling.{name}.c{conns}.t{threads}.{rep}"
                    if name == "nginx":
                        port, p = self.start_nginx(inst, workers=threads, cpu=cpu)
                        pids = lambda p=p: [p.pid] + children(p.pid)
                    elif name == "haproxy":
                        port, p = self.start_haproxy(inst, threads=threads, cpu=cpu)
                        pids = lambda p=p: [p.pid]
                    else:
                        port, p, _ = self.start_fencegate(inst, threads=threads, cpu=cpu)
                        pids = lambda p=p: [p.pid]
                    # wrk's default 2 s timeout counts a slow answer as an error: at 1,024 connections on
                    # one load core the tail passes 1 s; 10 s still catches a proxy that stalls.
                    # The fd limit each proxy really runs with (nginx: its worker's), for the report.
                    self.res["scaling_nofile"][name] = min(nofile_limit(x) for x in pids())
                    self.wrk(port, 1, name=f"warmup-{inst}", conns=conns, timeout_s=10)
                    kv = self.wrk(port, secs, name=f"wrk-{inst}", pids_fn=pids, conns=conns, timeout_s=10)
                    self.procs.stop(p)
                    kv["cpu_us_per_req"] = kv["cpu_pct"] / 100 / max(1.0, kv["rps"]) * 1e6
                    out.setdefault((conns, threads), {}).setdefault(name, []).append(kv)
                    log(f"scaling c={conns} threads={threads} {name:18} {kv['rps']:9.0f} req/s  cpu {kv['cpu_pct']:4.0f}%"
                        f"  {kv['cpu_us_per_req']:5.1f} us/req  p99 {kv['p99_us'] / 1000:6.2f} ms"
                        + (f"  ERRORS status={kv['status_err']:.0f} socket={kv['sock_err']:.0f}"
                           if kv["status_err"] or kv["sock_err"] else ""))
        most = max(c for c, _ in out) if out else 0
        low = {n: v for n, v in self.res["scaling_nofile"].items() if v < 2 * most + 100}
        self.check(f"scaling: every proxy's open-file limit covers {most} client + {most} upstream connections"
                   + (f": not {low}" if low else ""), not low)
        errs = [f"{n} c={c} t={t}" for (c, t), row in out.items() for n, rs in row.items()
                if any(r["status_err"] or r["sock_err"] for r in rs)]
        self.check("scaling: no non-2xx or socket errors at any connection count" + (f": not {', '.join(errs)}" if errs else ""),
                   not errs)

    def report_cpu_floor(self, L):
        """Issue 29: each proxy's CPU per request split into user space and the kernel, and what that
        says of the CPU target: a proxy's kernel work per request (two receives, two sends, their
        loopback TCP delivery) is the same kind for every proxy here, so fencegate's kernel time
        alone, over HAProxy's whole CPU per request, is the lowest CPU ratio any user-space change
        could reach."""
        t = self.res["throughput"]
        ha = t.get("haproxy")
        rows = [n for n in ("nginx", "haproxy", "fencegate-enforce", "fencegate-enforce-uring-off") if n in t]
        if not ha or not all("sys_us_per_req" in t[n] for n in rows):
            return
        L.append("Where each proxy's CPU per request goes (medians of the repetitions; user and system time "
                 "from /proc/PID/stat, clock ticks of 4 ms: this kernel has no IRQ time accounting, so the "
                 "softirq work of a proxy's own sends, loopback TCP delivering to its peer, is in its system time):\n")
        L.append("| target | user µs/req | kernel µs/req | kernel share | kernel alone / HAProxy's whole CPU |")
        L.append("|---|---:|---:|---:|---:|")
        for n in rows:
            v = t[n]
            tot = v["user_us_per_req"] + v["sys_us_per_req"]
            L.append(f"| {n} | {v['user_us_per_req']:.2f} | {v['sys_us_per_req']:.2f} | "
                     f"{100 * v['sys_us_per_req'] / max(tot, 1e-9):.0f}% | "
                     f"{v['sys_us_per_req'] / (ha['user_us_per_req'] + ha['sys_us_per_req']):.2f}x |")
        ha_tot = ha["user_us_per_req"] + ha["sys_us_per_req"]
        for n in ("fencegate-enforce", "fencegate-enforce-uring-off"):
            if n in t:
                v = t[n]
                room = 0.8 * ha_tot - v["sys_us_per_req"]
                L.append(f"\n{n}: CPU per request <= 0.8x HAProxy's means at most {0.8 * ha_tot:.2f} µs; its kernel "
                         f"time alone was {v['sys_us_per_req']:.2f} µs, which leaves {room:.2f} µs for all of its "
                         f"user-space work (it used {v['user_us_per_req']:.2f}; HAProxy's user space "
                         f"{ha['user_us_per_req']:.2f}).")
        L.append("")

    def report_scaling(self, L):
        sc = self.res["scaling"]
        if not sc:
            return
        med = lambda rs, k: statistics.median(r[k] for r in rs)
        L.append(f"### Scaling (issue 29): `wrk -t1 -cN -d{self.scaling_seconds}s`, {self.body}-byte fenced POST, "
                 f"median of {self.scaling_reps}\n")
        L.append("One worker each pinned to its own core, as in the throughput part; the last row: fencegate "
                 "`--threads 2`, HAProxy `nbthread 2`, nginx `worker_processes 2`, not pinned (they may use both "
                 "cores, the load side stays pinned to its own). CPU per request: the proxy's user+system time "
                 f"(/proc) over the run / requests. Open-file limits (soft, from /proc/PID/limits): wrk {self.nofile} "
                 "(inherited from the run), "
                 + ", ".join(f"{n} {v}" for n, v in self.res["scaling_nofile"].items()) + ".\n")
        L.append("| connections | threads | nginx req/s | HAProxy req/s | fencegate req/s | nginx µs/req | HAProxy µs/req "
                 "| fencegate µs/req | fencegate / HAProxy req/s | HAProxy / fencegate CPU | nginx p99 ms | HAProxy p99 ms "
                 "| fencegate p99 ms |")
        L.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for (conns, threads), row in sc.items():
            g = lambda n, k: med(row[n], k) if n in row else float("nan")
            fg, ha, ng = "fencegate-enforce", "haproxy", "nginx"
            L.append(f"| {conns} | {threads} | {g(ng, 'rps'):.0f} | {g(ha, 'rps'):.0f} | {g(fg, 'rps'):.0f} "
                     f"| {g(ng, 'cpu_us_per_req'):.1f} | {g(ha, 'cpu_us_per_req'):.1f} | {g(fg, 'cpu_us_per_req'):.1f} "
                     f"| {g(fg, 'rps') / g(ha, 'rps'):.2f}x | {g(ha, 'cpu_us_per_req') / g(fg, 'cpu_us_per_req'):.2f}x "
                     f"| {g(ng, 'p99_us') / 1000:.2f} | {g(ha, 'p99_us') / 1000:.2f} | {g(fg, 'p99_us') / 1000:.2f} |")
        L.append("")

    # ------------------------------------------------------------------ issue 29: TLS

    def tls_launch(self, name, inst):
        if name == "nginx":
            port, p = self.start_nginx(inst, tls=True, worker_connections=min(self.nofile - 100, self.idle_conns + 1000))
            return port, p, lambda: [p.pid] + children(p.pid)
        if name == "haproxy":
            port, p = self.start_haproxy(inst, tls=True)
            return port, p, lambda: [p.pid]
        binary = self.fg_baseline if name.startswith("baseline") else None
        port, p, _ = self.start_fencegate(inst, tls=True, binary=binary,
                                          extra=["--max-connections", str(self.idle_conns + 100)])
        return port, p, lambda: [p.pid]

    def tls(self):
        """TLS 1.3 client -> proxy, plaintext to the upstream, the run's ECDSA P-256 certificate:
        keep-alive throughput (wrk over https), new connections per second (benchtool tlsnew: a
        full handshake and one POST per connection, never resumed), and idle TLS connections' PSS
        (fencegate and nginx, as in the memory part)."""
        if not self.tls_ok:
            self.check("tls: the run could make a certificate and build benchtool with OpenSSL", False)
            return
        names = ["nginx", "haproxy", "fencegate-enforce"] + (["baseline-enforce"] if self.fg_baseline else [])
        out = self.res["tls"]
        pre = (lambda: os.sched_setaffinity(0, {self.load_cpu})) if self.pin else None
        for rep in range(self.tls_reps):
            for name in names[rep % len(names):] + names[:rep % len(names)]:
                port, p, pids = self.tls_launch(name, f"tls.{name}.{rep}")
                # System calls per request counted by perf over the warm-up, as in the throughput part.
                w = self.wrk(port, 2, name=f"warmup-tls-{name}", scheme="https", count_pids=pids())
                kv = self.wrk(port, self.tls_seconds, name=f"wrk-tls-{name}", pids_fn=pids, scheme="https")
                kv["cpu_us_per_req"] = kv["cpu_pct"] / 100 / max(1.0, kv["rps"]) * 1e6
                kv["syscalls_per_req"] = w["syscalls"] / w["requests"] if w.get("syscalls") and w["requests"] else None
                out.setdefault("keepalive", {}).setdefault(name, []).append(kv)
                # BENCH_TLS_CLIENTS sequential clients at once, so the proxy always has a handshake to do.
                t0, w0 = cpu_ticks(pids()), time.time()
                cl = [subprocess.Popen([self.tool, "tlsnew", str(port), str(self.tls_seconds), TOKEN], text=True,
                                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, preexec_fn=pre)
                      for _ in range(self.tls_clients)]
                outs = [(c.communicate(timeout=self.tls_seconds + 60)[0], c.returncode) for c in cl]
                cpu_s = (cpu_ticks(pids()) - t0) / os.sysconf("SC_CLK_TCK")
                kvs = [parse_kv(o) for o, _ in outs]
                nk = {"ok": sum(k.get("ok", 0) for k in kvs), "bad": sum(k.get("bad", 0) for k in kvs),
                      "per_s": sum(k.get("per_s", 0) for k in kvs),
                      "p50_us": statistics.median(k.get("p50_us", 0) for k in kvs),
                      "p99_us": max(k.get("p99_us", 0) for k in kvs)}
                nk["cpu_pct"] = 100.0 * cpu_s / (time.time() - w0)
                nk["cpu_us_per_conn"] = cpu_s / max(1.0, nk["ok"]) * 1e6
                nk["rc"] = max(rc for _, rc in outs)
                r = argparse.Namespace(stdout=f"ok={nk['ok']:.0f} bad={nk['bad']:.0f} proxy cpu {nk['cpu_pct']:.0f}%")
                out.setdefault("new", {}).setdefault(name, []).append(nk)
                self.procs.stop(p)
                log(f"tls rep {rep + 1}/{self.tls_reps} {name:18} keep-alive {kv['rps']:8.0f} req/s p99 "
                    f"{kv['p99_us'] / 1000:6.2f} ms {kv['cpu_us_per_req']:5.1f} us/req (load core "
                    f"{kv.get('load_core_pct', 0):.0f}%); new connections "
                    f"{nk.get('per_s', 0):7.0f}/s {nk['cpu_us_per_conn']:6.0f} us/conn ({r.stdout.strip()})")
        errs = [n for n, rs in out.get("keepalive", {}).items() if any(r["status_err"] or r["sock_err"] for r in rs)]
        errs += [f"{n} (new connections)" for n, rs in out.get("new", {}).items()
                 if any(r["rc"] != 0 or not r.get("ok") for r in rs)]
        self.check("tls: every keep-alive and new-connection request answered 200" + (f": not {', '.join(errs)}" if errs else ""),
                   not errs)
        # Idle TLS connections: PSS with N connections, each after its handshake and one POST.
        # One descriptor per connection on each proxy (fencegate's session reads and writes its TLS
        # records itself): N is what the open-file limit allows, for both proxies.
        self.tls_idle = min(self.idle_conns, self.nofile - 200)
        if self.tls_idle < self.idle_conns:
            log(f"tls memory: open-file limit {self.nofile}: {self.tls_idle} idle TLS connections, not {self.idle_conns}")
        for name in ("fencegate-enforce", "nginx"):
            port, p, pids = self.tls_launch(name, f"tls-idle.{name}")
            log(f"tls memory: {self.tls_idle} idle TLS connections to {name}")
            out.setdefault("idle", {})[name] = self.idle_memory(f"tls-{name}", port, pids, cmd="tlsidle",
                                                                clients=self.tls_clients, count=self.tls_idle)
            self.procs.stop(p)

    def report_tls(self, L):
        t = self.res["tls"]
        if not t:
            return
        med = lambda rs, k: statistics.median(r.get(k, 0) for r in rs)
        L.append(f"### TLS (issue 29): TLS 1.3 client -> proxy, plaintext to the upstream, median of {self.tls_reps}\n")
        L.append("The same ECDSA P-256 certificate (made by `openssl req` in the run) on every proxy; no session "
                 "cache, no tickets. Keep-alive: `wrk -t1 -c{0} -d{1}s` over https, fenced POST. New connections: "
                 "`benchtool tlsnew` (OpenSSL client, TLS 1.3 only, session cache off, no tickets: each "
                 "connection a full handshake), {2} clients at once, each one connection after another for {1}s, each: connect, handshake, one "
                 "fenced POST with `Connection: close`, response, close; latency is connect to response. "
                 "p99 is the highest of the clients' p99s. Proxy CPU: user+system from /proc over the run.\n".format(
                     self.conns, self.tls_seconds, self.tls_clients))
        L.append("| proxy | keep-alive req/s | p99 ms | CPU µs per request | user / kernel µs per request "
                 "| syscalls per request | new connections/s "
                 "| connect-to-response p50 ms | p99 ms | proxy CPU µs per new connection |")
        L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for name in ("nginx", "haproxy", "fencegate-enforce", "baseline-enforce"):
            k, n = t.get("keepalive", {}).get(name), t.get("new", {}).get(name)
            if not k or not n:
                continue
            sc = [x["syscalls_per_req"] for x in k if x.get("syscalls_per_req")]
            split = lambda key: statistics.median(x[key] / 100 / x["rps"] * 1e6 for x in k)
            L.append(f"| {name} | {med(k, 'rps'):.0f} | {med(k, 'p99_us') / 1000:.2f} | {med(k, 'cpu_us_per_req'):.1f} "
                     f"| {split('user_pct'):.1f} / {split('sys_pct'):.1f} "
                     f"| {statistics.median(sc) if sc else float('nan'):.2f} | {med(n, 'per_s'):.0f} | {med(n, 'p50_us') / 1000:.2f} | {med(n, 'p99_us') / 1000:.2f} "
                     f"| {med(n, 'cpu_us_per_conn'):.0f} |")
        L.append("")
        ka = t.get("keepalive", {})
        if self.pin and {"fencegate-enforce", "nginx"} <= ka.keys():
            # As in the throughput part: the load core (wrk, whose TLS costs as much as a
            # proxy's, and the upstream) bounds what a faster proxy can show against nginx.
            fe = ka["fencegate-enforce"]
            busy = statistics.median(x.get("load_core_pct", 0) for x in fe)
            load_us = statistics.median(x.get("load_core_pct", 0) / 100 / x["rps"] * 1e6 for x in fe)
            ng_us = med(ka["nginx"], "cpu_us_per_req")
            if load_us > 0:
                L.append(f"Keep-alive, what the load side allowed: under fencegate-enforce the load core (wrk's TLS "
                         f"client and the upstream) was {busy:.0f}% busy and spent {load_us:.1f} µs per request, so "
                         f"no proxy there could pass about {1e6 / load_us / 1000:.1f}k req/s; nginx spent "
                         f"{ng_us:.1f} µs per request on its own core. Against nginx the highest keep-alive TLS req/s "
                         f"ratio this run's load side let a fencegate of any speed reach was about "
                         f"{ng_us / load_us:.2f}x.\n")
        if t.get("idle"):
            L.append(f"Idle TLS connections: {self.tls_idle}, each after its handshake and one fenced POST, then idle "
                     f"(the open-file limit was {self.nofile}).\n")
            L.append("| | PSS before | PSS with connections | RSS with connections | per connection |")
            L.append("|---|---:|---:|---:|---:|")
            for name, v in t["idle"].items():
                who = "nginx (master + worker)" if name == "nginx" else name
                L.append(f"| {who} | {v['base_pss_mib']:.1f} MiB | {v['pss_mib']:.1f} MiB | {v['rss_mib']:.1f} MiB | "
                         f"{v['per_conn_kib']:.1f} KiB |")
            L.append("")

    # ------------------------------------------------------------------ issue 29: scale

    def timed_start(self, name, **kw):
        """Starts a fencegate and times exec -> its data port accepting (polled every 2 ms):
        (port, process, dir, seconds). fencegate loads every stored generation before it listens."""
        t0 = time.monotonic()
        port, p, d = self.start_fencegate(name, wait=wait_port_fast, **kw)
        return port, p, d, time.monotonic() - t0

    def scale(self):
        self.scale_resources()
        self.scale_audit()

    def scale_resources(self):
        """N resources in one sidecar: memory per resource, start-up time with a store holding
        them, and the fenced POST path's throughput with N against 10 (wrk spreads its requests
        over all of them at random, each with the stored generation)."""
        import sqlite3
        n_big = self.scale_n_resources
        routes = [{"prefix": "/r/{id}/", "resource": "r-{id}", "mode": "enforce"}]
        cfg = {"max_resources": n_big + 1000}
        dbs = {}
        for n in (10, n_big):
            port, p, d = self.start_fencegate(f"scale-init-{n}", routes=routes, cfg_extra=cfg)
            self.procs.stop(p)
            db = os.path.join(d, "fence.db")
            c = sqlite3.connect(db)
            now = int(time.time() * 1000)
            c.execute(f"WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < {n} - 1) "
                      f"INSERT INTO resources(resource, generation, advanced_at_ms, advanced_by) "
                      f"SELECT 'r-' || i, {TOKEN}, {now}, 'bench' FROM n")
            c.commit()
            c.close()
            dbs[n] = db
        luas = {}
        for n in dbs:
            luas[n] = os.path.join(self.tmp, f"scale-{n}.lua")
            with open(luas[n], "w") as f:
                f.write(WRK_LUA % {"body": self.body, "token": TOKEN} +
                        f'function request() return wrk.format(nil, "/r/" .. math.random(0, {n - 1}) .. "/w") end\n')
        out = self.res["scale"].setdefault("resources", {})
        default_lua = self.lua
        try:
            for rep in range(max(2, self.scaling_reps)):
                for n in (dbs if rep % 2 == 0 else list(dbs)[::-1]):
                    port, p, d, secs = self.timed_start(f"scale-{n}.{rep}", routes=routes, cfg_extra=cfg, db=dbs[n])
                    time.sleep(0.5)
                    rss, pss = status_kb(p.pid, "VmRSS"), pss_kb([p.pid])
                    st, _ = http(port, "POST", f"/r/{n - 1}/w", token=str(int(TOKEN) - 1))
                    self.check(f"scale: resource r-{n - 1} of {n} loaded at generation {TOKEN}: stale token -> 409 (got {st})",
                               st == 409)
                    self.lua = luas[n]
                    self.wrk(port, 1, name=f"warmup-scale-{n}")
                    kv = self.wrk(port, self.scaling_seconds, name=f"wrk-scale-{n}", pids_fn=lambda p=p: [p.pid])
                    kv.update(start_s=secs, rss_kb=rss, pss_kb=pss,
                              cpu_us_per_req=kv["cpu_pct"] / 100 / max(1.0, kv["rps"]) * 1e6)
                    self.procs.stop(p)
                    out.setdefault(n, []).append(kv)
                    log(f"scale: {n:6} resources: start-up {secs * 1000:6.0f} ms  RSS {rss / 1024:6.1f} MiB  "
                        f"{kv['rps']:8.0f} req/s  {kv['cpu_us_per_req']:5.1f} us/req  p99 {kv['p99_us'] / 1000:.2f} ms")
        finally:
            self.lua = default_lua
        self.check("scale: no non-2xx or socket errors with many resources",
                   all(not (r["status_err"] or r["sock_err"]) for rs in out.values() for r in rs))

    def admin_get(self, port, path):
        """(status, JSON body, milliseconds) of one admin GET on a fresh connection."""
        t0 = time.monotonic()
        c = http_client.HTTPConnection("127.0.0.1", port, timeout=60)
        c.request("GET", path)
        r = c.getresponse()
        body = r.read()
        ms = (time.monotonic() - t0) * 1000
        c.close()
        return r.status, (json.loads(body) if body[:1] == b"{" else {}), ms

    def scale_audit(self):
        """An audit log of BENCH_SCALE_AUDIT_ROWS rows over 60 days (1,000 resources, 4% unfenced
        callers), written with sqlite directly: the newest 100 rows of one resource and the
        unfenced-callers report for the last hour, timed through the admin API; then wrk's p99 on
        the same database with retention pruning running (audit.max_age 30d: half the rows are
        older) against not (retention off)."""
        import sqlite3
        rows = self.scale_audit_rows
        routes = [{"prefix": "/", "resource": "bench", "mode": "enforce"}]
        keep_all = {"audit": {"max_age": "0", "max_rows": 0}}
        port, p, d = self.start_fencegate("scale-audit-init", routes=routes, cfg_extra=keep_all)
        self.procs.stop(p)
        db = os.path.join(d, "fence.db")
        log(f"scale: writing {rows} audit rows with sqlite")
        t0 = time.monotonic()
        c = sqlite3.connect(db, isolation_level=None)
        indexes = [r[0] for r in c.execute("SELECT sql FROM sqlite_schema WHERE type = 'index' AND tbl_name = 'audit' "
                                           "AND sql IS NOT NULL")]
        for name, in list(c.execute("SELECT name FROM sqlite_schema WHERE type = 'index' AND tbl_name = 'audit' "
                                    "AND sql IS NOT NULL")):
            c.execute(f"DROP INDEX {name}")
        # Bulk load, fencegate not running: no journal, no syncs, index sorts in memory; the
        # database goes back to WAL (fencegate's mode) at the end.
        c.execute("PRAGMA journal_mode = OFF")
        c.execute("PRAGMA synchronous = OFF")
        c.execute("PRAGMA temp_store = MEMORY")
        c.execute("PRAGMA cache_size = -262144")
        now = int(time.time() * 1000)
        span = 60 * 86400 * 1000
        c.execute("BEGIN")
        c.execute(f"""WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < {rows} - 1)
            INSERT INTO audit(time_ms, resource, decision, presented_generation, current_generation, method, target,
                              client, leader, mode, user_agent)
            SELECT {now} - {span} + i * {span} / {rows}, 'res-' || (i * 7919 % 1000),
              CASE WHEN i % 50 = 0 THEN 'rejected_missing' WHEN i % 50 = 1 THEN 'would_reject_missing'
                   WHEN i % 3 = 0 THEN 'rejected_stale' ELSE 'advanced' END,
              i % 97, i % 97, 'POST', '/w/' || (i % 1000), '10.0.' || (i % 13) || '.' || (i % 7), 'leader-' || (i % 5),
              'enforce', 'client/' || (i % 11)
            FROM n""")
        for sql in indexes:
            c.execute(sql)
        c.execute("COMMIT")
        c.execute("PRAGMA journal_mode = WAL")
        c.close()
        gen_s = time.monotonic() - t0
        log(f"scale: {rows} audit rows written and indexed in {gen_s:.0f}s")
        a = self.res["scale"].setdefault("audit", {"rows": rows, "gen_s": gen_s, "queries": {}, "prune": {}})
        pre = (lambda: os.sched_setaffinity(0, {self.load_cpu})) if self.pin else None
        admin = free_port()
        port, p, d2, secs = self.timed_start("scale-audit", routes=routes, cfg_extra=keep_all, admin_port=admin, db=db)
        a["start_s"] = secs
        queries = {"newest 100 rows of one resource": "/v1/audit?resource=res-5&limit=100",
                   "unfenced callers, last hour": "/v1/audit/unfenced?since=-1h"}
        for what, path in queries.items():
            ms, ok = [], True
            for i in range(7):
                st, body, t = self.admin_get(admin, path)
                got = len(body.get("rows", body.get("callers", [])))
                ok = ok and st == 200 and got > 0 and (got == 100 if "rows" in body else True)
                ms.append(t)
            a["queries"][what] = {"path": path, "median_ms": statistics.median(ms), "max_ms": max(ms),
                                  "first_ms": ms[0], "ok": ok, "answer_rows": got}
            self.check(f"scale: {path} answered 200 with rows", ok)
            log(f"scale: {what}: median {statistics.median(ms):.1f} ms, first {ms[0]:.1f} ms, max {max(ms):.1f} ms")
        self.procs.stop(p)

        def min_id():
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as r:
                return r.execute("SELECT min(id) FROM audit").fetchone()[0] or 0
        for rep in range(2):
            for pruning in (False, True):
                extra = {"audit": {"max_age": "30d", "max_rows": 0}} if pruning else keep_all
                port, p, _ = self.start_fencegate(f"scale-prune-{int(pruning)}.{rep}", routes=routes, cfg_extra=extra,
                                                  db=db)
                time.sleep(0.5)
                self.wrk(port, 1, name="warmup-scale-prune")
                m0 = min_id()
                kv = self.wrk(port, self.scaling_seconds, name=f"wrk-scale-prune-{int(pruning)}",
                              pids_fn=lambda p=p: [p.pid])
                kv["pruned"] = min_id() - m0  # ids are in time order here: the rows retention deleted
                self.procs.stop(p)
                a["prune"].setdefault("pruning" if pruning else "off", []).append(kv)
                log(f"scale: retention pruning {'running' if pruning else 'off    '}: {kv['rps']:8.0f} req/s  p99 "
                    f"{kv['p99_us'] / 1000:.2f} ms  rows pruned during the run {kv['pruned']}")
        self.check("scale: retention pruning ran during the pruning runs",
                   all(r["pruned"] > 0 for r in a["prune"].get("pruning", [])))

    def report_scale(self, L):
        sc = self.res["scale"]
        med = lambda rs, k: statistics.median(r[k] for r in rs)
        r = sc.get("resources")
        if r and len(r) == 2:
            small, big = sorted(r)
            per = (med(r[big], "rss_kb") - med(r[small], "rss_kb")) * 1024 / (big - small)
            self.res["scale_per_resource"] = per
            L.append(f"### Flat as the work grows (issue 29): {big} resources in one sidecar\n")
            L.append(f"The store holds {big} (or {small}) resources at generation {TOKEN} (written with sqlite before "
                     f"start); route `/r/{{id}}/` -> resource `r-{{id}}`; wrk (`-c{self.conns} -d{self.scaling_seconds}s`) "
                     f"posts to a random one of them each request with the stored generation. Start-up: exec to "
                     f"the data port accepting (fencegate loads every generation before it listens). Medians of "
                     f"{len(r[big])} fresh processes each.\n")
            L.append("| resources | start-up ms | RSS after start | req/s | p99 ms | CPU µs per request |")
            L.append("|---:|---:|---:|---:|---:|---:|")
            for n in (small, big):
                L.append(f"| {n} | {med(r[n], 'start_s') * 1000:.0f} | {med(r[n], 'rss_kb') / 1024:.1f} MiB | "
                         f"{med(r[n], 'rps'):.0f} | {med(r[n], 'p99_us') / 1000:.2f} | {med(r[n], 'cpu_us_per_req'):.1f} |")
            L.append(f"\nMemory per resource: **{per:.0f} bytes** (RSS difference / resource difference). "
                     f"Throughput with {big}: {med(r[big], 'rps') / med(r[small], 'rps'):.2f}x the {small}-resource "
                     f"rate; CPU per request {med(r[big], 'cpu_us_per_req') / med(r[small], 'cpu_us_per_req'):.2f}x.\n")
        a = sc.get("audit")
        if a:
            L.append(f"### Flat as the work grows (issue 29): an audit log of {a['rows']} rows\n")
            L.append(f"Rows over the last 60 days, 1,000 resources, 4% unfenced (`rejected_missing`, "
                     f"`would_reject_missing`), written with sqlite in {a['gen_s']:.0f} s. fencegate started on it in "
                     f"{a['start_s'] * 1000:.0f} ms. Each query through the admin API on a fresh connection, 7 times "
                     f"(client-side time, HTTP included).\n")
            L.append("| query | path | first ms | median ms | max ms | rows answered |")
            L.append("|---|---|---:|---:|---:|---:|")
            for what, q in a["queries"].items():
                L.append(f"| {what} | `{q['path']}` | {q['first_ms']:.1f} | {q['median_ms']:.1f} | {q['max_ms']:.1f} "
                         f"| {q['answer_rows']} |")
            pr = a["prune"]
            if {"off", "pruning"} <= pr.keys():
                L.append(f"\nData path with retention pruning running (`audit.max_age` 30d: half the rows are older, "
                         f"deleted in chunks of 5,000 by the store thread) against retention off, same database, "
                         f"`wrk -t1 -c{self.conns} -d{self.scaling_seconds}s`, fenced POST, interleaved, median of "
                         f"{len(pr['off'])}:\n")
                L.append("| retention | req/s | p50 ms | p99 ms | p99.9 ms | audit rows pruned per run |")
                L.append("|---|---:|---:|---:|---:|---|")
                for k, label in (("off", "off"), ("pruning", "pruning running")):
                    L.append(f"| {label} | {med(pr[k], 'rps'):.0f} | {med(pr[k], 'p50_us') / 1000:.2f} | "
                             f"{med(pr[k], 'p99_us') / 1000:.2f} | {med(pr[k], 'p999_us') / 1000:.2f} | "
                             f"{', '.join(str(x['pruned']) for x in pr[k])} |")
            L.append("")

    def advance(self):
        # Resource "load" takes the wrk load with a valid, equal token; resource "adv" gets the
        # sequential advances. Fencing is per resource, so wrk's token stays current (no 409s
        # change the load), while every advance pays the full path: proxy thread under load,
        # the store thread's durable commit (fdatasync), then the upstream exchange.
        admin = free_port()
        port, p, d = self.start_fencegate("fencegate-advance", admin_port=admin, routes=[
            {"prefix": "/", "resource": "load", "mode": "enforce"},
            {"prefix": "/adv/", "resource": "adv", "mode": "enforce"}])
        st, _ = http(port, "POST", "/bench", token=TOKEN)
        self.check(f"advance instance: load POST -> 200 (got {st})", st == 200)
        # Baseline without load: the same advances and raw syncs, nothing else on fencegate.
        log(f"advancing resource 'adv' every {self.adv_ms} ms for {self.adv_idle_seconds}s without load")
        c0 = store_commits(admin)
        r0 = subprocess.run([self.tool, "advance", str(port), "/adv/x", "1", str(self.adv_ms), str(self.adv_idle_seconds), d],
                            capture_output=True, text=True, timeout=self.adv_idle_seconds + 60,
                            preexec_fn=(lambda: os.sched_setaffinity(0, {self.load_cpu})) if self.pin else None)
        if r0.returncode != 0:
            raise RuntimeError(f"advance tool failed: {r0.stdout} {r0.stderr}")
        a0 = parse_kv(r0.stdout)
        c1 = store_commits(admin)
        self.check(f"advances without load all 200 ({a0['ok']:.0f}/{a0['n']:.0f})", a0["bad"] == 0)
        self.wrk(port, self.warmup, name="warmup-advance")
        wrk_seconds = self.adv_seconds + 2
        pre = (lambda: os.sched_setaffinity(0, {self.load_cpu})) if self.pin else None
        wrk = subprocess.Popen(["wrk", "-t1", f"-c{self.conns}", f"-d{wrk_seconds}s", "-s", self.lua,
                                f"http://127.0.0.1:{port}/bench"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, preexec_fn=pre)
        self.procs.procs.append(("wrk-advance", wrk))
        time.sleep(1)
        log(f"advancing resource 'adv' every {self.adv_ms} ms for {self.adv_seconds}s under wrk load")
        c2 = store_commits(admin)
        r = subprocess.run([self.tool, "advance", str(port), "/adv/x", "1000000", str(self.adv_ms), str(self.adv_seconds), d],
                           capture_output=True, text=True, timeout=self.adv_seconds + 60, preexec_fn=pre)
        c3 = store_commits(admin)
        out, _ = wrk.communicate(timeout=wrk_seconds + 60)
        self.procs.procs = [(n, q) for (n, q) in self.procs.procs if q is not wrk]
        if r.returncode != 0:
            raise RuntimeError(f"advance tool failed: {r.stdout} {r.stderr}")
        a = parse_kv(r.stdout)
        m = re.search(r"^BENCH .*$", out, re.M)
        w = parse_kv(m.group(0)) if m else {"requests": 0, "duration_us": 1, "status_err": -1, "sock_err": -1}
        w_rps = w["requests"] / (w["duration_us"] / 1e6)
        self.check(f"advances all 200 ({a['ok']:.0f}/{a['n']:.0f})", a["bad"] == 0)
        self.check("wrk load during advances: no non-2xx or socket errors", w["status_err"] == 0 and w["sock_err"] == 0)
        self.res["advance"] = {
            "n": int(a["n"]), "ok": int(a["ok"]), "interval_ms": self.adv_ms,
            "every_n_requests": round(w_rps * self.adv_ms / 1000),
            "load_rps": w_rps, "load_errors": w["status_err"] + w["sock_err"],
            "advance_p50_ms": a["advance_p50_us"] / 1000, "advance_p99_ms": a["advance_p99_us"] / 1000,
            "advance_max_ms": a["advance_max_us"] / 1000,
            "fdatasync_p50_ms": a["fdatasync_p50_us"] / 1000, "fdatasync_p99_ms": a["fdatasync_p99_us"] / 1000,
            "fsync_p50_ms": a["fsync_p50_us"] / 1000, "fsync_p99_ms": a["fsync_p99_us"] / 1000,
            "sync_n": int(a["fdatasync_n"] + a["fsync_n"]),
            # Means, to split an advance: fencegate's store commit (SQLite transaction + its
            # fdatasync, its own histogram) against the raw sync; the rest is the proxy's hand-offs
            # between its I/O and store threads and the upstream exchange.
            "advance_mean_ms": a["advance_mean_us"] / 1000, "commit_mean_ms": commit_mean_ms(c2, c3),
            "commits": int(c3[0] - c2[0]),
            "raw_mean_ms": (a["fdatasync_mean_us"] * a["fdatasync_n"] + a["fsync_mean_us"] * a["fsync_n"]) /
                           max(1, a["fdatasync_n"] + a["fsync_n"]) / 1000,
            "idle": {"n": int(a0["n"]), "advance_p50_ms": a0["advance_p50_us"] / 1000,
                     "advance_p99_ms": a0["advance_p99_us"] / 1000,
                     "fdatasync_p50_ms": a0["fdatasync_p50_us"] / 1000, "fdatasync_p99_ms": a0["fdatasync_p99_us"] / 1000,
                     "fsync_p50_ms": a0["fsync_p50_us"] / 1000, "fsync_p99_ms": a0["fsync_p99_us"] / 1000,
                     "advance_mean_ms": a0["advance_mean_us"] / 1000, "commit_mean_ms": commit_mean_ms(c0, c1),
                     "commits": int(c1[0] - c0[0]),
                     "raw_mean_ms": (a0["fdatasync_mean_us"] * a0["fdatasync_n"] + a0["fsync_mean_us"] * a0["fsync_n"]) /
                                    max(1, a0["fdatasync_n"] + a0["fsync_n"]) / 1000},
        }
        self.procs.stop(p)

    def idle_memory(self, name, port, pids_fn, cmd="idle", clients=1, count=None):
        """PSS with `count` (default self.idle_conns) idle connections, opened by `clients` processes of `cmd` at once
        (TLS: handshakes one after another per client, so several keep the proxy busy)."""
        count = count or self.idle_conns
        base = pss_kb(pids_fn())
        share = [count // clients + (1 if i < count % clients else 0) for i in range(clients)]
        idles = [self.procs.start(f"idle-{name}", [self.tool, cmd, str(port), str(n), TOKEN], cpu=self.load_cpu,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE) for n in share]
        lines = [idle.stdout.readline().decode() for idle in idles]
        kvs = [parse_kv(line) for line in lines]
        ok = sum(int(kv.get("ok", 0)) for kv in kvs)
        time.sleep(1)
        pss = pss_kb(pids_fn())
        rss = sum(status_kb(pid, "VmRSS") for pid in pids_fn())
        held = established(port)  # what the proxy really holds open now, not what was asked for
        for idle in idles:
            idle.stdin.close()
            idle.wait(60)
        self.procs.procs = [(n, q) for (n, q) in self.procs.procs if q not in idles]
        summary = "; ".join(line.strip() for line in lines)
        self.check(f"{name}: {count} idle connections all answered 200 ({summary})",
                   all(line.startswith("READY") for line in lines) and ok == count)
        self.check(f"{name}: all {count} idle connections were open when its memory was read "
                   f"({held} established)", held == count)
        return {"base_pss_mib": base / 1024, "pss_mib": pss / 1024, "rss_mib": rss / 1024,
                "ok": ok, "held": held, "per_conn_kib": (pss - base) / max(1, held)}

    def memory(self):
        fg_port, fg, _ = self.start_fencegate("fencegate-idle", extra=["--max-connections", str(self.idle_conns + 100)])
        http(fg_port, "POST", "/bench", token=TOKEN)
        log(f"memory: {self.idle_conns} idle keep-alive connections to fencegate")
        self.res["memory"]["fencegate"] = self.idle_memory("fencegate", fg_port, lambda: [fg.pid])
        self.procs.stop(fg)
        ng_port, ng = self.start_nginx("nginx-idle", worker_connections=min(self.nofile - 100, self.idle_conns + 1000))
        http(ng_port, "POST", "/bench", token=TOKEN)
        log(f"memory: {self.idle_conns} idle keep-alive connections to nginx")
        self.res["memory"]["nginx"] = self.idle_memory("nginx", ng_port, lambda: [ng.pid] + children(ng.pid))
        self.procs.stop(ng)

    def upload(self):
        port, p, _ = self.start_fencegate("fencegate-upload")
        http(port, "POST", "/bench", token=TOKEN)
        base = status_kb(p.pid, "VmHWM")
        log(f"upload: {self.upload_bytes} bytes through fencegate")
        pre = (lambda: os.sched_setaffinity(0, {self.load_cpu})) if self.pin else None
        r = subprocess.run([self.tool, "upload", str(port), "/upload", str(self.upload_bytes), TOKEN],
                           capture_output=True, text=True, timeout=600, preexec_fn=pre)
        kv = parse_kv(r.stdout)
        hwm = status_kb(p.pid, "VmHWM")
        self.check(f"upload answered 200 with all bytes sent ({r.stdout.strip()})",
                   kv.get("status") == 200 and kv.get("bytes") == self.upload_bytes)
        self.res["upload"] = {"bytes": self.upload_bytes, "status": int(kv.get("status", 0)),
                              "seconds": kv.get("seconds", 0), "mib_per_s": kv.get("mib_per_s", 0),
                              "hwm_before_mib": base / 1024, "hwm_mib": hwm / 1024}
        self.procs.stop(p)

    def idempotency(self):
        """Issue 30: unkeyed fenced POSTs, keyed POSTs with unique keys (a durable write each,
        amortised by group commit) and replays of one key, through one fencegate with
        "idempotency": {} on its route, in the same run; medians of BENCH_REPS runs."""
        admin = free_port()
        port, p, _ = self.start_fencegate("fencegate-idempotency", routes=[{"prefix": "/", "resource": "bench",
                                                                             "idempotency": {}}], admin_port=admin)
        st, _ = http(port, "POST", "/bench", token=TOKEN)
        self.check(f"idempotency: POST with token {TOKEN} -> 200 (got {st})", st == 200)
        luas = {"unkeyed": self.lua, "keyed-unique": None, "replay": os.path.join(self.tmp, "replay.lua")}
        with open(luas["replay"], "w") as f:
            f.write(WRK_REPLAY_LUA % {"body": self.body, "token": TOKEN})

        def keyed_lua(rep):  # a script of its own per run: its keys were never seen before
            path = os.path.join(self.tmp, f"keyed-unique-{rep}.lua")
            with open(path, "w") as f:
                f.write(WRK_KEYED_LUA % {"body": self.body, "token": TOKEN,
                                         "prefix": f"{os.getpid()}-{rep}-{time.time_ns()}"})
            return path
        # The replayed key is recorded first: otherwise the first batch of concurrent requests
        # would find it in flight (409), as it should.
        c = http_client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("POST", "/bench", body=b"x" * self.body,
                  headers={"Fencing-Token": TOKEN, "Idempotency-Key": '"replayed-key"',
                           "Content-Type": "application/octet-stream"})
        st = c.getresponse().status
        c.close()
        self.check(f"idempotency: the replayed key is recorded (got {st})", st == 200)
        runs = {name: [] for name in luas}
        default_lua = self.lua
        try:
            for rep in range(self.reps):
                for name, lua in luas.items():
                    self.lua = lua or keyed_lua(rep)
                    log(f"idempotency: {name} run {rep + 1}/{self.reps}")
                    outcome = {"keyed-unique": "stored", "replay": "replayed"}.get(name)
                    n0 = idempotency_count(admin, outcome) if outcome else 0
                    c0 = store_commits(admin)
                    r = self.wrk(port, self.duration, name=f"wrk-idem-{name}")
                    c1 = store_commits(admin)
                    r["commits"] = c1[0] - c0[0]
                    r["commit_ms"] = commit_mean_ms(c0, c1)
                    if outcome:  # fencegate's own count: every request was what the row says it was
                        r["counted"] = idempotency_count(admin, outcome) - n0
                    runs[name].append(r)
        finally:
            self.lua = default_lua
        med = lambda xs: sorted(xs)[len(xs) // 2]
        for name, rs in runs.items():
            self.res["idempotency"][name] = {"rps": med([r["rps"] for r in rs]),
                                             "p99_ms": med([r["p99_us"] for r in rs]) / 1000,
                                             "errors": sum(r["status_err"] + r["sock_err"] for r in rs),
                                             "per_commit": med([r["requests"] / max(1, r["commits"]) for r in rs]),
                                             "commit_ms": med([r["commit_ms"] for r in rs])}
            if name != "unkeyed":  # wrk counts answers it got; fencegate counts each one it made
                self.check(f"idempotency: fencegate counted every {name} request as "
                           f"{'stored' if name == 'keyed-unique' else 'replayed'}",
                           all(r["counted"] >= r["requests"] for r in rs))
        self.check("idempotency: no errors in the keyed runs",
                   all(v["errors"] == 0 for v in self.res["idempotency"].values()))
        self.procs.stop(p)

    # ------------------------------------------------------------------ fleet (issue 33)

    def fleet_etcd(self):
        """One etcd member on loopback (the fleet's coordination service) in its own data dir."""
        d = os.path.join(self.tmp, "etcd")
        os.makedirs(d)
        cport, pport = free_port(), free_port()
        cu, pu = f"http://127.0.0.1:{cport}", f"http://127.0.0.1:{pport}"
        p = self.procs.start("etcd", ["etcd", "--name", "b0", "--data-dir", os.path.join(d, "data"),
                                      "--listen-client-urls", cu, "--advertise-client-urls", cu,
                                      "--listen-peer-urls", pu, "--initial-advertise-peer-urls", pu,
                                      "--initial-cluster", f"b0={pu}", "--log-level", "warn"], cpu=self.load_cpu)
        wait_port(cport, p, "etcd")
        return cport

    def fleet_replica(self, name, routes, fleet=None):
        d = os.path.join(self.tmp, name)
        os.makedirs(d)
        port, admin = free_port(), free_port()
        cfg = {"listen": f"127.0.0.1:{port}", "db": os.path.join(d, "fence.db"), "threads": 1, "log_level": "info",
               "admin": {"listen": f"127.0.0.1:{admin}"},
               "routes": [dict(r, upstream=f"http://127.0.0.1:{self.up_port}") for r in routes]}
        if fleet:
            cfg["fleet"] = fleet
        with open(os.path.join(d, "fencegate.json"), "w") as f:
            json.dump(cfg, f, indent=1)
        p = self.procs.start(name, [self.fg, "serve", "--config", os.path.join(d, "fencegate.json")],
                             cpu=self.target_cpu)
        wait_port(port, p, name)
        wait_port(admin, p, name)
        until = time.time() + 20
        while http(admin, "GET", "/readyz", body=b"")[0] != 200:
            if time.time() > until:
                raise RuntimeError(f"{name} never became ready")
            time.sleep(0.05)
        return port, p

    @staticmethod
    def etcd_txn_times(cport, n):
        """n compare-and-put transactions (compare the key's mod_revision, put it), one at a time on
        one keep-alive connection, as a replica's commit is: seconds each."""
        import base64, http.client
        b64 = lambda x: base64.b64encode(x.encode()).decode()
        c = http.client.HTTPConnection("127.0.0.1", cport, timeout=10)
        key, rev, out = b64("bench/txn"), 0, []
        for i in range(n):
            body = json.dumps({"compare": [{"key": key, "target": "MOD", "result": "EQUAL", "mod_revision": str(rev)}],
                               "success": [{"request_put": {"key": key, "value": b64(str(i))}}]})
            t0 = time.perf_counter()
            c.request("POST", "/v3/kv/txn", body, {"Content-Type": "application/json"})
            r = json.loads(c.getresponse().read())
            out.append(time.perf_counter() - t0)
            rev = int(r["header"]["revision"]) if r.get("succeeded") else rev
        c.close()
        return out

    def fleet(self):
        """Issue 33: equal-generation fenced POSTs through one replica of a fleet of three against the
        same binary without `fleet` (no etcd on that path), and advances with three live replicas
        against a single etcd transaction measured alone, in the same run."""
        # Nearest rank: with n samples the p99 is the ceil(0.99 n)-th smallest (with 100 samples the
        # 99th, not the largest).
        pct = lambda xs, q: sorted(xs)[max(0, min(len(xs), math.ceil(q * len(xs))) - 1)]
        cport = self.fleet_etcd()
        routes = [{"prefix": "/adv", "resource": "adv", "mode": "enforce"},
                  {"prefix": "/", "resource": "bench", "mode": "enforce"}]
        reps = []
        for i in range(3):
            fl = {"etcd": [f"http://127.0.0.1:{cport}"], "name": "bench", "member": f"r{i}", "ttl_ms": 5000}
            reps.append(self.fleet_replica(f"fleet-r{i}", routes, fl))
        solo_port, solo = self.fleet_replica("fleet-off", routes)
        for port in (reps[0][0], solo_port):
            st = http(port, "POST", "/bench", token=TOKEN)[0]
            self.check(f"fleet: the load generation is admitted on port {port}", st == 200)
        rounds = env_int("BENCH_FLEET_ROUNDS", 3)
        runs = {"fleet-replica": [], "no-fleet": []}
        for _ in range(rounds):  # alternated, so drift on a shared machine hits both alike
            runs["fleet-replica"].append(self.wrk(reps[0][0], self.duration, name="wrk-fleet"))
            runs["no-fleet"].append(self.wrk(solo_port, self.duration, name="wrk-nofleet"))
        med = lambda xs: sorted(xs)[len(xs) // 2]
        thr = {k: {"rps": med([r["rps"] for r in v]), "p99_ms": med([r["p99_us"] for r in v]) / 1000,
                   "errors": sum(r["status_err"] + r["sock_err"] for r in v)} for k, v in runs.items()}
        self.procs.stop(solo)
        # Advances: one at a time, rotating over the replicas, nothing else running; each replica's
        # on a keep-alive connection of its own, as the transactions below are timed (a new TCP
        # connection per advance timed the connect and accept too). 500 of each: a p99 of 100
        # samples is their second largest, one scheduling hiccup on a shared machine.
        n = env_int("BENCH_FLEET_ADVANCES", 500)
        conns = [http_client.HTTPConnection("127.0.0.1", port, timeout=30) for port, _ in reps]
        adv = []
        body = b"0123456789abcdef"
        for g in range(1, n + 1):
            c = conns[g % 3]
            t0 = time.perf_counter()
            c.request("POST", "/adv", body=body, headers={"Fencing-Token": str(g),
                                                           "Content-Type": "application/octet-stream"})
            resp = c.getresponse()
            resp.read()
            adv.append(time.perf_counter() - t0)
            if resp.status != 200:
                self.check(f"fleet: advance to {g} answered 200 (got {resp.status})", False)
        for c in conns:
            c.close()
        txn = self.etcd_txn_times(cport, n)
        split = {"intent_ms": [], "acks_ms": [], "commit_ms": []}
        step1 = {}  # how each committing replica knew fence/ and intent/ before its intent
        total = []  # intent to commit (fencegate_fleet_advance_seconds), per advance
        for i in range(3):
            with open(os.path.join(self.tmp, f"fleet-r{i}.log"), errors="replace") as f:
                for line in f:
                    if '"fleet: advance committed"' in line and '"resource":"adv"' in line:
                        j = json.loads(line)
                        for k in split:
                            split[k].append(float(j[k]))
                        total.append(sum(float(j[k]) for k in ("intent_ms", "acks_ms", "commit_ms")))
                        step1[j.get("step1", "read")] = step1.get(j.get("step1", "read"), 0) + 1
        self.res["fleet"] = {
            "throughput": thr, "rounds": rounds, "n": n,
            "advance_p50_ms": pct(adv, 0.5) * 1000, "advance_p99_ms": pct(adv, 0.99) * 1000,
            "txn_p50_ms": pct(txn, 0.5) * 1000, "txn_p99_ms": pct(txn, 0.99) * 1000,
            "split": {k: (pct(v, 0.5), pct(v, 0.99), len(v)) for k, v in split.items() if v}, "step1": step1,
            "intent_to_commit": (pct(total, 0.5), pct(total, 0.99), len(total)) if total else None,
        }
        for r in reps:
            self.procs.stop(r[1])

    def fleet_report(self, L):
        f = self.res.get("fleet")
        if not f:
            return
        t = f["throughput"]
        fr, nf = t["fleet-replica"], t["no-fleet"]
        L.append("### Fleet (issue 33)\n")
        L.append(f"Three replicas of one fleet on one etcd member (loopback), ttl_ms 5000; the same binary without "
                 f"`fleet` beside them; {f['rounds']} alternated wrk runs each (median).\n")
        L.append("| target | req/s | p99 ms | errors |\n|---|---:|---:|---:|")
        L.append(f"| one replica of a fleet of three | {fr['rps']:.0f} | {fr['p99_ms']:.2f} | {fr['errors']} |")
        L.append(f"| no fleet | {nf['rps']:.0f} | {nf['p99_ms']:.2f} | {nf['errors']} |\n")
        L.append(f"{f['n']} advances one at a time, rotating over the three replicas (POST with token k+1, send to "
                 f"response): p50 {f['advance_p50_ms']:.2f} ms, p99 {f['advance_p99_ms']:.2f} ms. A single etcd "
                 f"compare-and-put transaction alone ({f['n']}, keep-alive): p50 {f['txn_p50_ms']:.2f} ms, p99 "
                 f"{f['txn_p99_ms']:.2f} ms.\n")
        if f["split"]:
            L.append("How an advance's time divides (the replicas' `fleet: advance committed` lines):\n")
            L.append("| stage | p50 ms | p99 ms | n |\n|---|---:|---:|---:|")
            for k, (p50, p99, n) in f["split"].items():
                L.append(f"| {k[:-3]} | {p50:.2f} | {p99:.2f} | {n} |")
            if f.get("intent_to_commit"):
                p50, p99, n = f["intent_to_commit"]
                L.append(f"| intent to commit (fencegate_fleet_advance_seconds) | {p50:.2f} | {p99:.2f} | {n} |")
            L.append("")
        if f.get("step1"):
            L.append("Step 1 (fence/ and intent/ before the intent): " +
                     ", ".join(f"{k} {v}" for k, v in sorted(f["step1"].items())) +
                     " (watch: from the last commit the watch delivered; stale: that failed the intent's "
                     "compares, then a read; read: a read).\n")

    def run(self):
        try:
            self.setup()
            if "throughput" in self.parts:
                self.throughput()
            if "advance" in self.parts:
                self.advance()
            if "memory" in self.parts:
                self.memory()
            if "upload" in self.parts:
                self.upload()
            if "idempotency" in self.parts:
                self.idempotency()
            # Issue 29.
            if "scaling" in self.parts:
                self.scaling()
            if "tls" in self.parts:
                self.tls()
            if "scale" in self.parts:
                self.scale()
            if "fleet" in self.parts:  # issue 33
                self.fleet()
        finally:
            self.loadavg_end = open("/proc/loadavg").read().split()[:3]
            self.procs.stop_all()
            keep = os.environ.get("BENCH_KEEP_TMP")
            if keep:
                log(f"kept {self.tmp}")
            else:
                shutil.rmtree(self.tmp, ignore_errors=True)

    # ------------------------------------------------------------------ report

    def targets(self):
        t = self.res["throughput"]
        out = []
        if {"fencegate-enforce", "haproxy", "nginx"} <= t.keys():
            fg, ha, ng = t["fencegate-enforce"], t["haproxy"], t["nginx"]
            out.append(("Fenced POST throughput >= 1.0x HAProxy", f"{fg['rps'] / ha['rps']:.2f}x", fg["rps"] >= ha["rps"]))
            out.append(("Fenced POST throughput >= 1.2x nginx", f"{fg['rps'] / ng['rps']:.2f}x", fg["rps"] >= 1.2 * ng["rps"]))
            out.append(("fencegate p99 <= HAProxy p99", f"{fg['p99_ms']:.2f} ms vs {ha['p99_ms']:.2f} ms",
                        fg["p99_ms"] <= ha["p99_ms"]))
        a = self.res["advance"]
        if a:
            raw = min(a["fdatasync_p99_ms"], a["fsync_p99_ms"])
            out.append(("Advance p99 <= 2x raw sync p99", f"{a['advance_p99_ms']:.2f} ms vs 2 x {raw:.2f} ms",
                        a["advance_p99_ms"] <= 2 * raw))
        m = self.res["memory"]
        if {"fencegate", "nginx"} <= m.keys():
            out.append((f"{self.idle_conns} idle connections: PSS <= nginx's",
                        f"{m['fencegate']['pss_mib']:.1f} MiB vs {m['nginx']['pss_mib']:.1f} MiB",
                        m["fencegate"]["pss_mib"] <= m["nginx"]["pss_mib"]))
        i = self.res["idempotency"]
        if i:
            base = i["unkeyed"]["rps"]
            out.append(("Keyed POSTs (unique keys) >= 0.5x unkeyed", f"{i['keyed-unique']['rps'] / base:.2f}x",
                        i["keyed-unique"]["rps"] >= 0.5 * base))
            out.append(("Replays >= 1.0x unkeyed", f"{i['replay']['rps'] / base:.2f}x", i["replay"]["rps"] >= base))
            out.append(("Keyed POST p99 <= 5 ms", f"{i['keyed-unique']['p99_ms']:.2f} ms",
                        i["keyed-unique"]["p99_ms"] <= 5))
        out += self.targets_29()
        u = self.res["upload"]
        if u:
            out.append((f"{human_bytes(u['bytes'])} streamed upload: peak RSS <= 64 MiB", f"{u['hwm_mib']:.1f} MiB",
                        u["hwm_mib"] <= 64 and u["status"] == 200))
        f = self.res.get("fleet")  # issue 33
        if f:
            fr, nf = f["throughput"]["fleet-replica"], f["throughput"]["no-fleet"]
            out.append(("Fleet: equal-generation POSTs via one replica of three >= 0.9x without fleet",
                        f"{fr['rps'] / nf['rps']:.2f}x", fr["rps"] >= 0.9 * nf["rps"]))
            out.append(("Fleet: advance p99 (three live replicas) <= 4x one etcd txn p99",
                        f"{f['advance_p99_ms']:.2f} ms vs 4 x {f['txn_p99_ms']:.2f} ms",
                        f["advance_p99_ms"] <= 4 * f["txn_p99_ms"]))
        return out

    def targets_29(self):
        """Issue 29's targets, as ratios within this run."""
        out = []
        t = self.res["throughput"]
        ha = t.get("haproxy")
        for name, label, rps_min in (("fencegate-enforce", "io_uring", 1.25), ("fencegate-enforce-uring-off",
                                                                               "--io-uring off", 1.1)):
            fg = t.get(name)
            if not fg or not ha:
                continue
            cpu = fg["cpu_us_per_req"] / ha["cpu_us_per_req"]
            floor = f" (its kernel time alone {fg['sys_us_per_req'] / ha['cpu_us_per_req']:.2f}x)" \
                if "sys_us_per_req" in fg else ""
            out.append((f"CPU per fenced POST <= 0.8x HAProxy's ({label})", f"{cpu:.2f}x{floor}", cpu <= 0.8))
            # 1e6 / the load core's busy µs per request under this fencegate is the most any proxy
            # there could pass; over HAProxy's rate, the highest ratio the run could show.
            ceil = f" (load side's ceiling {1e6 / fg['load_us_per_req'] / ha['rps']:.2f}x)" \
                if self.pin and fg.get("load_us_per_req") else ""
            out.append((f"Throughput >= {rps_min}x HAProxy ({label})", f"{fg['rps'] / ha['rps']:.2f}x{ceil}",
                        fg["rps"] >= rps_min * ha["rps"]))
            out.append((f"p99 <= HAProxy's ({label})", f"{fg['p99_ms']:.2f} ms vs {ha['p99_ms']:.2f} ms",
                        fg["p99_ms"] <= ha["p99_ms"]))
        m = self.res["memory"]
        if {"fencegate", "nginx"} <= m.keys():
            out.append((f"{self.idle_conns} idle connections: PSS <= 0.6x nginx's",
                        f"{m['fencegate']['pss_mib'] / m['nginx']['pss_mib']:.2f}x",
                        m["fencegate"]["pss_mib"] <= 0.6 * m["nginx"]["pss_mib"]))
        tk, tn = self.res["tls"].get("keepalive", {}), self.res["tls"].get("new", {})
        if {"fencegate-enforce", "nginx", "haproxy"} <= tk.keys():
            med = lambda rs, k: statistics.median(x.get(k, 0) for x in rs)
            f, ha, ng = (med(tk[n], "rps") for n in ("fencegate-enforce", "haproxy", "nginx"))
            # The most the load core let any fencegate show against each (see report_tls).
            load_us = statistics.median(x.get("load_core_pct", 0) / 100 / x["rps"] * 1e6 for x in tk["fencegate-enforce"])
            ceil = lambda n: (f" (load side's ceiling {1e6 / load_us / med(tk[n], 'rps'):.2f}x)"
                              if self.pin and load_us > 0 else "")
            out.append(("TLS keep-alive req/s >= 1.0x HAProxy (issue 27)", f"{f / ha:.2f}x{ceil('haproxy')}", f >= ha))
            out.append(("TLS keep-alive req/s >= 1.2x nginx (issue 27)", f"{f / ng:.2f}x{ceil('nginx')}", f >= 1.2 * ng))
            fp, hp = med(tk["fencegate-enforce"], "p99_us") / 1000, med(tk["haproxy"], "p99_us") / 1000
            out.append(("TLS keep-alive p99 <= HAProxy's (issue 27)", f"{fp:.2f} ms vs {hp:.2f} ms", fp <= hp))
        if {"fencegate-enforce", "haproxy"} <= tn.keys():
            f, ha = (statistics.median(x.get("per_s", 0) for x in tn[n]) for n in ("fencegate-enforce", "haproxy"))
            out.append(("New TLS connections/s >= 1.0x HAProxy (issue 27)", f"{f / max(ha, 1e-9):.2f}x", f >= ha))
        ti = self.res["tls"].get("idle", {})
        if {"fencegate-enforce", "nginx"} <= ti.keys():
            f, n = ti["fencegate-enforce"]["pss_mib"], ti["nginx"]["pss_mib"]
            out.append((f"{self.tls_idle} idle TLS connections: PSS < nginx's (issue 27)", f"{f / n:.2f}x", f < n))
        r = self.res["scale"].get("resources")
        if r and len(r) == 2:
            small, big = sorted(r)
            med = lambda rs, k: statistics.median(x[k] for x in rs)
            out.append((f"{big} resources: start-up <= 1 s", f"{med(r[big], 'start_s') * 1000:.0f} ms",
                        med(r[big], "start_s") <= 1.0))
            ratio = med(r[big], "rps") / med(r[small], "rps")
            out.append((f"{big} resources: fenced POST throughput >= 0.9x {small} resources'", f"{ratio:.2f}x",
                        ratio >= 0.9))
        a = self.res["scale"].get("audit")
        if a:
            for what, q in a["queries"].items():
                out.append((f"{a['rows']} audit rows: {what} <= 50 ms (median)", f"{q['median_ms']:.1f} ms",
                            q["median_ms"] <= 50))
            pr = a["prune"]
            if {"off", "pruning"} <= pr.keys():
                on, off = (statistics.median(x["p99_us"] for x in pr[k]) / 1000 for k in ("pruning", "off"))
                out.append(("Retention pruning: data path p99 <= 1.2x without", f"{on:.2f} ms vs {off:.2f} ms",
                            on <= 1.2 * off))
        return out

    def report(self, command, started):
        L = []
        info = machine_info(self.tmp if os.path.exists(self.tmp) else "/tmp")
        ver = self.versions
        title = started.strftime("%Y-%m-%d %H:%M UTC") + (f" — {self.args.note}" if self.args.note else "")
        L.append(f"## {title}\n")
        L.append(f"- Command: `{command}`")
        L.append(f"- Machine: {info['nproc']} CPUs, {info['cpu']}, kernel {info['kernel']}, {info['mem']} RAM; "
                 f"temp dir on {info['tmp_fs']}")
        L.append(f"- fencegate: {ver['fencegate']}")
        L.append(f"- Others: {ver['nginx']}; {ver['haproxy']}; {ver['wrk']}")
        L.append(f"- Other load on the machine: load average {' '.join(self.loadavg_start)} at start, "
                 f"{' '.join(self.loadavg_end)} at end; every benchmark process ran at nice {self.nice}")
        if self.pin:
            L.append(f"- Placement: proxy under test pinned to CPU {self.target_cpu}; wrk, the upstream and the "
                     f"bench tools pinned to CPU {self.load_cpu}")
        else:
            L.append("- Placement: nothing pinned")
        L.append(f"- Settings: BENCH_DURATION={self.duration} BENCH_REPS={self.reps} BENCH_FRESH={int(self.fresh)} BENCH_CONNECTIONS={self.conns} "
                 f"BENCH_BODY_BYTES={self.body} BENCH_ADVANCE_MS={self.adv_ms} BENCH_ADVANCE_SECONDS={self.adv_seconds} "
                 f"BENCH_ADVANCE_IDLE_SECONDS={self.adv_idle_seconds} "
                 f"BENCH_IDLE_CONNS={self.idle_conns} BENCH_UPLOAD_BYTES={self.upload_bytes} BENCH_NICE={self.nice}")
        L.append("")
        t = self.res["throughput"]
        if t:
            L.append(f"### Throughput: `wrk -t1 -c{self.conns} -d{self.duration}s`, {self.body}-byte POST, "
                     f"median of {self.reps}\n")
            L.append("| target | req/s | p50 ms | p99 ms | p99.9 ms | CPU of its core | CPU µs per request | load core busy "
                     "| load core µs per request | syscalls per request | context switches per request "
                     "| load core context switches per request | errors | req/s per run |")
            L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
            fmt = lambda x, d: "-" if x is None else f"{x:.{d}f}"
            for name, v in t.items():
                L.append(f"| {name} | {v['rps']:.0f} | {v['p50_ms']:.2f} | {v['p99_ms']:.2f} | {v['p999_ms']:.2f} | "
                         f"{v['cpu_pct']:.0f}% | {v['cpu_us_per_req']:.1f} | "
                         + (f"{v['load_core_pct']:.0f}% | {v.get('load_us_per_req', 0):.1f}" if self.pin else "- | -")
                         + f" | {fmt(v.get('syscalls_per_req'), 2)} | {fmt(v.get('ctx_per_req'), 3)}"
                         + f" | {fmt(v.get('load_ctx_per_req'), 3)}"
                         + f" | {v['errors']:.0f} | {', '.join(str(x) for x in v['runs'])} |")
            L.append("\n(CPU: the target's processes' user+system time during the run (/proc/PID/stat), in % of one "
                     "core and per request; for `direct` it is the upstream's, which shares its core with wrk. Load core busy: "
                     "how busy the core of wrk and the upstream was (/proc/stat); load core µs per request: that busy "
                     "time per request of the target. System calls and context switches per request: the target's "
                     "processes' (all threads; nginx master + worker; for `direct` the upstream's), counted by perf "
                     "(raw_syscalls:sys_enter, context-switches) over each repetition's warm-up run and divided by its "
                     "requests; unlike CPU time they barely move between runs. Load core context switches per "
                     "request: all context switches on the core of wrk and the upstream over the same warm-up "
                     "(perf -C), per request: how often the target's sends found them asleep.)\n")
            L.append("")
            if {"nginx", "haproxy"} <= t.keys():
                L.append("| fencegate mode | / nginx req/s | / HAProxy req/s | p99 / HAProxy p99 "
                         "| CPU per request: nginx / fencegate | HAProxy / fencegate |")
                L.append("|---|---:|---:|---:|---:|---:|")
                labels = {"baseline": "enforce, baseline build", "enforce-uring-off": "enforce, `--io-uring off`"}
                for mode in ("enforce", "enforce-uring-off", "observe", "off", "baseline"):
                    v = t.get(f"fencegate-{mode}") or (t.get("baseline-enforce") if mode == "baseline" else None)
                    if v:
                        L.append(f"| {labels.get(mode, mode)} | {v['rps'] / t['nginx']['rps']:.2f}x | {v['rps'] / t['haproxy']['rps']:.2f}x"
                                 f" | {v['p99_ms'] / t['haproxy']['p99_ms']:.2f}x"
                                 f" | {t['nginx']['cpu_us_per_req'] / v['cpu_us_per_req']:.2f}x"
                                 f" | {t['haproxy']['cpu_us_per_req'] / v['cpu_us_per_req']:.2f}x |")
                L.append("")
                paired = [(m.replace("-uring-off", " (--io-uring off)"), t[f"fencegate-{m}"]["paired"])
                          for m in ("enforce", "enforce-uring-off", "observe", "off")
                          if "paired" in t.get(f"fencegate-{m}", {})]
                if "paired" in t.get("baseline-enforce", {}):
                    paired.append(("enforce (baseline build)", t["baseline-enforce"]["paired"]))
                if paired:
                    L.append(f"Paired, the median over the {self.reps} repetitions of the req/s ratio within each "
                             "repetition (a slow phase of the host hits both sides of each ratio): "
                             + "; ".join(f"{m} {p['nginx']:.2f}x nginx, {p['haproxy']:.2f}x HAProxy" for m, p in paired)
                             + ".\n")
                self.report_cpu_floor(L)
                if self.res.get("load_side_saturated"):
                    L.append("The load side's core (wrk + upstream) was saturated too (load core busy >= 95%), so "
                             "both sides limited the rate. That compresses the req/s ratios toward 1: a faster "
                             "proxy cannot pull further ahead than the load side lets it. CPU per request on each "
                             "proxy's own core depends less on that and is the second comparison.\n")
                    fe, ng = t.get("fencegate-enforce"), t["nginx"]
                    if fe and fe.get("load_us_per_req"):
                        # nginx on its own saturated core: rate ~ 1e6 / its CPU µs per request. A
                        # fencegate held by the load core: rate ~ 1e6 / the load core's µs per
                        # request under it. Their quotient is the most the load side allowed.
                        L.append(f"What the load side allowed: under fencegate-enforce the load core spent "
                                 f"{fe['load_us_per_req']:.1f} µs per request, so no proxy there could pass about "
                                 f"{1e6 / fe['load_us_per_req'] / 1000:.1f}k req/s; nginx, on its own saturated core, "
                                 f"spent {ng['cpu_us_per_req']:.1f} µs per request. Against nginx the highest req/s "
                                 f"ratio this run's load side let a fencegate of any speed reach was about "
                                 f"{ng['cpu_us_per_req'] / fe['load_us_per_req']:.2f}x.\n")
        a = self.res["advance"]
        if a:
            L.append(f"### Generation advance under load\n")
            L.append(f"{a['n']} sequential advances of resource `adv` ({a['ok']} answered 200), one every "
                     f"{a['interval_ms']} ms (about every {a['every_n_requests']} load requests), while wrk loaded "
                     f"resource `load` on the same fencegate at {a['load_rps']:.0f} req/s ({a['load_errors']:.0f} errors). "
                     f"Raw syncs ({a['sync_n']}, 4 KiB overwrite + sync, alternately fdatasync and fsync) were "
                     f"timed halfway between advances, same process, same disk.\n")
            i = a["idle"]
            L.append(f"| | under load p50 ms | under load p99 ms | without load p50 ms | without load p99 ms |")
            L.append("|---|---:|---:|---:|---:|")
            L.append(f"| advance (POST with token k+1, send to response) | {a['advance_p50_ms']:.2f} | "
                     f"{a['advance_p99_ms']:.2f} | {i['advance_p50_ms']:.2f} | {i['advance_p99_ms']:.2f} |")
            L.append(f"| raw fdatasync | {a['fdatasync_p50_ms']:.2f} | {a['fdatasync_p99_ms']:.2f} | "
                     f"{i['fdatasync_p50_ms']:.2f} | {i['fdatasync_p99_ms']:.2f} |")
            L.append(f"| raw fsync | {a['fsync_p50_ms']:.2f} | {a['fsync_p99_ms']:.2f} | "
                     f"{i['fsync_p50_ms']:.2f} | {i['fsync_p99_ms']:.2f} |")
            L.append(f"\nWithout load: {i['n']} advances over {self.adv_idle_seconds}s on the same instance before "
                     f"wrk starts (baseline, not a target).\n")
            if "commit_mean_ms" in a:
                L.append("Where an advance's time goes (means): fencegate's store commit is its own "
                         "`fencegate_store_commit_seconds` histogram (SQLite transaction + fdatasync, per batch); "
                         "the rest of an advance is the hand-off from the I/O thread to the store thread and back, "
                         "and the upstream exchange.\n")
                L.append("| mean ms | advance | store commit | raw sync | advance - commit |")
                L.append("|---|---:|---:|---:|---:|")
                for label, x in (("under load", a), ("without load", i)):
                    L.append(f"| {label} ({x['commits']} commits) | {x['advance_mean_ms']:.2f} | {x['commit_mean_ms']:.2f} | "
                             f"{x['raw_mean_ms']:.2f} | {x['advance_mean_ms'] - x['commit_mean_ms']:.2f} |")
                L.append("")
        m = self.res["memory"]
        if m:
            L.append(f"### Memory: {self.idle_conns} idle keep-alive connections (one fenced POST each, then idle)\n")
            L.append("| | PSS before | PSS with connections | RSS with connections | per connection |")
            L.append("|---|---:|---:|---:|---:|")
            for name, v in m.items():
                who = "nginx (master + worker)" if name == "nginx" else name
                L.append(f"| {who} | {v['base_pss_mib']:.1f} MiB | {v['pss_mib']:.1f} MiB | {v['rss_mib']:.1f} MiB | "
                         f"{v['per_conn_kib']:.1f} KiB |")
            L.append("")
        i = self.res["idempotency"]
        if i:
            L.append(f"### Idempotency (issue 30): one fencegate, route with \"idempotency\": {{}}, "
                     f"`wrk -t1 -c{self.conns} -d{self.duration}s`, median of {self.reps}\n")
            L.append("| requests | req/s | p99 ms | errors | requests per store commit | mean commit ms |")
            L.append("|---|---|---|---|---|---|")
            for name, v in i.items():
                L.append(f"| {name} | {v['rps']:.0f} | {v['p99_ms']:.2f} | {v['errors']} | "
                         f"{v['per_commit']:.1f} | {v['commit_ms']:.3f} |")
            L.append("\nA keyed POST waits for the commit that records its key in flight (one fdatasync, shared "
                     "by every key queued meanwhile), and its answer's record rides a later commit without "
                     "being waited for: with a fixed number of connections, its rate is the connections "
                     "over that wait plus the exchange.\n")
        u = self.res["upload"]
        if u:
            L.append("### Streamed upload through fencegate (enforce, valid token; upstream discards)\n")
            L.append(f"{human_bytes(u['bytes'])} ({u['bytes']} bytes), Content-Length, status {u['status']}, {u['seconds']:.2f} s "
                     f"({u['mib_per_s']:.0f} MiB/s); peak RSS (VmHWM) {u['hwm_before_mib']:.1f} MiB before, "
                     f"**{u['hwm_mib']:.1f} MiB** after.\n")
        self.report_scaling(L)  # issue 29
        self.report_tls(L)
        self.report_scale(L)
        tg = self.targets()
        self.fleet_report(L)  # issue 33
        if tg:
            L.append("### Targets (issues 6 and 29)\n")
            L.append("| target | measured | |")
            L.append("|---|---|---|")
            for what, measured, ok in tg:
                L.append(f"| {what} | {measured} | {'met' if ok else '**missed**'} |")
            L.append("")
        failed = [w for w, ok in self.res["checks"] if not ok]
        L.append(f"Sanity checks: {len(self.res['checks']) - len(failed)}/{len(self.res['checks'])} passed"
                 + ("".join(f"\n- FAILED: {w}" for w in failed) if failed else "") + "\n")
        return "\n".join(L)


RESULTS_HEADER = """# fencegate benchmark results

Produced by `bench/run.sh --write-results` (see [README.md](README.md) for what each number means and
how it is measured). This file holds the targets and the newest run; every earlier run, oldest
first, is in [HISTORY.md](HISTORY.md). The machine is small and shared, so absolute numbers move
between runs; compare ratios within one run.

## Targets (issue 6)

Each run ends with a table of these, met or missed in that run:

- Fenced POST throughput (fencegate-enforce) >= 1.0x HAProxy's and >= 1.2x nginx's.
- fencegate p99 <= HAProxy p99.
- A generation advance under full load: p99 <= 2x a raw sync's p99 on the same disk.
- 10,000 idle keep-alive connections: PSS <= nginx's.
- A 1 GiB streamed upload: peak RSS <= 64 MiB.

Issue 29 adds (same table): CPU per fenced POST <= 0.8x HAProxy's, throughput >= 1.25x HAProxy and
p99 <= HAProxy's with io_uring (>= 1.1x with `--io-uring off`, same CPU and p99 targets); 10,000
idle connections, plain and TLS, in <= 0.6x nginx's PSS; 100,000 resources: start-up <= 1 s and
throughput >= 0.9x that with 10; 10 million audit rows: the newest 100 rows of a resource and the
unfenced report of the last hour each <= 50 ms; data-path p99 with retention pruning running <=
1.2x without.

The newest run follows; its own table of targets is at its end.

"""

# Everything below this line in RESULTS.md is the newest run (with any notes written under it).
# --write-results moves it to the end of HISTORY.md and writes the new run in its place.
NEWEST_MARK = ("<!-- newest run: `bench/run.sh --write-results` moves what follows to the end of HISTORY.md "
               "and writes the new run here -->")

HISTORY_HEADER = """# fencegate benchmark history

Every run of `bench/run.sh --write-results` before the newest, oldest first, with the notes written
at the time. The newest run and the targets are in [RESULTS.md](RESULTS.md); what each number means
is in [README.md](README.md).

"""


def write_results(results, history, text):
    """Makes `text` the newest run in `results` and moves the run it replaces to the end of `history`."""
    if not os.path.exists(results):
        with open(results, "w") as f:
            f.write(RESULTS_HEADER + NEWEST_MARK + "\n\n" + text + "\n")
        return
    with open(results) as f:
        current = f.read()
    at = current.find(NEWEST_MARK)
    if at < 0:  # a results file without the mark: append, as before the split
        with open(results, "a") as f:
            f.write(text + "\n")
        return
    top = current[:at + len(NEWEST_MARK)]
    previous = current[at + len(NEWEST_MARK):].strip("\n")
    if previous:  # history first: a failure in between duplicates the old run rather than losing it
        new = not os.path.exists(history)
        with open(history, "a") as f:
            f.write((HISTORY_HEADER if new else "\n") + previous + "\n")
    tmp = results + ".tmp"
    with open(tmp, "w") as f:
        f.write(top + "\n\n" + text + "\n")
    os.replace(tmp, results)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--fencegate", default=os.path.join(ROOT, "build", "fencegate"), help="binary to bench (copied)")
    ap.add_argument("--baseline", default=os.environ.get("BENCH_BASELINE", ""),
                    help="an older fencegate binary benched beside --fencegate as `baseline-enforce` (before/after)")
    ap.add_argument("--write-results", action="store_true",
                    help="make this run the newest in bench/RESULTS.md (the run it replaces moves to bench/HISTORY.md)")
    ap.add_argument("--results", default=os.path.join(HERE, "RESULTS.md"), help="results file for --write-results")
    ap.add_argument("--history", default=None, help="history file for --write-results (default: HISTORY.md beside --results)")
    ap.add_argument("--note", default="", help="label for this run in the results, e.g. 'before arena allocator'")
    ap.add_argument("--parts", default="throughput,advance,memory,upload,idempotency,scaling,tls,scale",
                    help="comma-separated subset to run")
    args = ap.parse_args()
    command = os.environ.get("BENCH_COMMAND") or "python3 bench/bench.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    # FENCEGATE_* too: the fencegate under test reads its settings from the environment it inherits.
    envs = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(os.environ.items())
                    if k.startswith(("BENCH_", "FENCEGATE_")) and k not in ("BENCH_COMMAND",) and v)
    if envs:
        command = envs + " " + command
    started = datetime.datetime.now(datetime.timezone.utc)

    def on_term(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)
    b = Bench(args)
    t0 = time.time()
    b.run()
    text = b.report(command, started)
    print()
    print(text)
    log(f"done in {time.time() - t0:.0f}s")
    if args.write_results:
        history = args.history or os.path.join(os.path.dirname(os.path.abspath(args.results)), "HISTORY.md")
        write_results(args.results, history, text)
        log(f"wrote the run to {args.results} (the one it replaces is now at the end of {history})")
    failed = [w for w, ok in b.res["checks"] if not ok]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
