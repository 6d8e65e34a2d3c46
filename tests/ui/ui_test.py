#!/usr/bin/python3
"""The status page (GET /ui) in a real browser: headless Chromium (Debian's chromium,
chromium-driver and python3-selenium) loads it from a running fencegate, the test checks its
resource table against GET /v1/resources, makes a stale write and sees it appear in the live tail,
and saves a screenshot (CI keeps it as an artifact).

Usage: ui_test.py FENCEGATE_BINARY SCREENSHOT_PATH
Exits 0 on success, 1 on failure, and 0 with "SKIPPED: ..." when Chromium is absent.
"""
import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

CHROMEDRIVER = "/usr/bin/chromedriver"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Upstream(http.server.BaseHTTPRequestHandler):
    """A loopback upstream that answers every write 200."""

    def _answer(self):
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            self.rfile.read(n)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    do_POST = do_PUT = do_GET = _answer

    def log_message(self, *args):
        pass


def write(port, path, token=None, agent="ui-test/1"):
    headers = {"User-Agent": agent}
    if token is not None:
        headers["Fencing-Token"] = str(token)
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path), data=b"x", headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def admin_json(port, path):
    with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=10) as r:
        return json.loads(r.read())


def wait_for(pred, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            v = pred()
            if v:
                return v
        except Exception:  # the page may be mid-update (a stale element): try again
            pass
        time.sleep(0.2)
    raise AssertionError("timed out waiting for " + what)


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    binary, shot = sys.argv[1], sys.argv[2]
    if not (os.path.exists(CHROMEDRIVER) and (shutil.which("chromium") or os.path.exists("/usr/bin/chromium"))):
        print("SKIPPED: chromium or chromium-driver is not installed (apt-get install chromium chromium-driver)")
        return 0
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
        from selenium.webdriver.common.by import By
    except ImportError:
        print("SKIPPED: python3-selenium is not installed for /usr/bin/python3")
        return 0

    tmp = tempfile.mkdtemp(prefix="fencegate-ui-")
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    up = "http://127.0.0.1:%d" % upstream.server_address[1]
    port, admin = free_port(), free_port()
    cfg = {
        "listen": "127.0.0.1:%d" % port,
        "db": os.path.join(tmp, "fence.db"),
        "threads": 1,
        "admin": {"listen": "127.0.0.1:%d" % admin},
        "routes": [
            {"prefix": "/obs/", "upstream": up, "resource": "obs", "mode": "observe"},
            {"prefix": "/", "upstream": up, "resource": "ledger", "mode": "enforce"},
        ],
    }
    with open(os.path.join(tmp, "fencegate.json"), "w") as f:
        json.dump(cfg, f)
    log = open(os.path.join(tmp, "fencegate.log"), "w")
    proc = subprocess.Popen([binary, "serve", "--config", os.path.join(tmp, "fencegate.json")], stdout=log, stderr=log)
    driver = None
    try:
        wait_for(lambda: admin_json(admin, "/healthz"), 15, "fencegate's admin API")
        assert write(port, "/a", 5) == 200
        assert write(port, "/obs/a", 3) == 200
        assert write(port, "/obs/b") == 200  # observe: no token, would be refused
        assert write(port, "/b", 5, agent="ledger-writer/2") == 200

        opts = webdriver.ChromeOptions()
        for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--window-size=1400,1100", "--user-data-dir=" + os.path.join(tmp, "chrome")):
            opts.add_argument(a)
        opts.binary_location = "/usr/bin/chromium"
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
        driver.set_page_load_timeout(30)
        driver.get("http://127.0.0.1:%d/ui" % admin)
        assert "fencegate" in driver.title, driver.title

        # The table against the JSON API.
        api = {r["resource"]: r for r in admin_json(admin, "/v1/resources")["resources"]}

        def table():
            rows = driver.find_elements(By.CSS_SELECTOR, "#resources tbody tr")
            got = {}
            for tr in rows:
                tds = [td.text for td in tr.find_elements(By.TAG_NAME, "td")]
                got[tr.get_attribute("data-resource")] = tds
            return got if set(got) == set(api) else None

        got = wait_for(table, 30, "the resource table to list " + ", ".join(sorted(api)))
        for name, r in api.items():
            tds = got[name]
            assert tds[0] == name, tds
            assert tds[1] == r["mode"], (tds, r)
            assert tds[2] == str(r["generation"]), (tds, r)
            assert tds[3] == (r["advanced_by"] or ""), (tds, r)
            assert tds[4] == (r["advanced_at"] or ""), (tds, r)
        assert got["ledger"][1] == "enforce" and got["ledger"][2] == "5"
        assert got["obs"][1] == "observe"

        # The observe resource is not ready to enforce (a write without a token), with evidence.
        verdict = wait_for(lambda: driver.find_element(By.CSS_SELECTOR, '#readiness tr[data-resource="obs"] .verdict').text,
                           30, "the readiness verdict of obs")
        assert verdict == "not ready", verdict

        # A stale write appears in the live tail without a reload.
        before = len(driver.find_elements(By.CSS_SELECTOR, "#tailtable tbody tr"))
        assert write(port, "/c", 4, agent="zombie/1") == 409

        def stale_row():
            for tr in driver.find_elements(By.CSS_SELECTOR, "#tailtable tbody tr"):
                tds = [td.text for td in tr.find_elements(By.TAG_NAME, "td")]
                if tds[1] == "ledger" and tds[2] == "rejected_stale" and tds[3] == "4":
                    return tds
            return None

        row = wait_for(stale_row, 30, "the stale write in the live tail")
        assert row[4] == "5", row
        assert len(driver.find_elements(By.CSS_SELECTOR, "#tailtable tbody tr")) > before

        # The unfenced-callers report lists the tokenless observe caller.
        wait_for(lambda: "obs" in driver.find_element(By.ID, "unfenced").text, 30, "the unfenced callers report")
        # No error shown (every read the page made was allowed).
        assert driver.find_element(By.ID, "error").text == "", driver.find_element(By.ID, "error").text

        os.makedirs(os.path.dirname(os.path.abspath(shot)), exist_ok=True)
        driver.save_screenshot(shot)
        assert os.path.getsize(shot) > 1000
        print("ok: table matches /v1/resources, stale write in the live tail; screenshot at " + shot)
        return 0
    except Exception:
        log.flush()
        with open(os.path.join(tmp, "fencegate.log")) as f:
            sys.stderr.write("fencegate log:\n" + f.read()[-8000:])
        if driver is not None:
            try:
                sys.stderr.write("page error: " + driver.find_element(By.ID, "error").text + "\n")
                driver.save_screenshot(shot)
            except Exception:
                pass
        raise
    finally:
        if driver is not None:
            driver.quit()
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        upstream.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
