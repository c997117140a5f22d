"""Soak test of `spot serve`: mixed load for a while, then checks (not run by CI).

Starts `spot serve` (an API key set, so auth is exercised), waits for /health, and for
`--minutes` drives `--workers` threads of mixed requests: completions and chat, plain and
streamed (SSE), n = 1..3, T 0 and 1, several seeds, `spot.method` df / spot / the server's
default, max_tokens 8..64, client cancellations (a stream closed after a random number of
chunks, a plain request's connection closed before its answer) and bad requests (malformed
JSON, no or wrong key, unknown model, over-long prompt, bad temperature, unknown route).

Checks, each failing the run (exit 1):
- every request is answered as expected (no client errors, no unexpected status, streams
  well formed: one id, every choice finished once, `[DONE]` last);
- nothing crossed: each deterministic choice (endpoint, prompt, seed + i, temperature,
  method, max_tokens) always gives the same text and finish reason, plain or streamed; a
  cancelled stream's text is a prefix of it; exact methods (df, spot, the server's default)
  agree with each other;
- the server's counters once idle (/stats): accepted == completed + cancelled + failed,
  failed == 0, live == queued == 0, one open cache slot, 0 cache bytes, and accepted within
  what the clients saw accepted;
- the server's resident memory (VmRSS, sampled every 10 s) at the end of the load within 5 %
  of its level after the first sixth of the run (5 minutes of the default 30);
- SIGINT with a stream in flight: the stream completes (drain), the server exits 0.

    python3 tools/serve/soak.py --spot target/release/spot --minutes 30 --out soak.json
"""

import argparse
import http.client
import json
import os
import random
import re
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

COMPLETION_PROMPTS = [
    "def add(a, b):",
    "def fib(n):\n    # the n-th Fibonacci number\n",
    "class Stack:\n    def __init__(self):\n",
    "import os\n\n\ndef list_files(path):\n",
    "for i in range(10):\n",
    "def is_prime(n):\n    if n < 2:\n",
]
CHAT_PROMPTS = [
    "Write a function that adds two numbers.",
    "Write a Python function that reverses a string.",
    "How do I read a file line by line in Python?",
    "Write a class for a queue.",
]
MAX_TOKENS = [8, 12, 16, 24, 32, 48, 64]
SEEDS = [0, 1, 2, 7]
# Methods whose output is draft-free decoding's, token for token.
EXACT = {"df", "ssd", "blockspec", "spiffy", "spot", "spot-gamma", "spot-adaptive", "spot-unit", "spot-reuse"}
MIX = [  # (kind, weight)
    ("completion", 22),
    ("completion_stream", 22),
    ("chat", 12),
    ("chat_stream", 12),
    ("cancel_stream", 10),
    ("cancel_plain", 5),
    ("bad", 17),
]
BAD = ["malformed_json", "wrong_key", "no_key", "unknown_model", "long_prompt", "negative_temperature", "unknown_route"]


class ProtocolError(Exception):
    """A wrong answer; `status` is what the request counts as (an HTTP status, or a word)."""

    def __init__(self, message, status="protocol_error"):
        super().__init__(message)
        self.status = status


def percentile(values, q):
    """Nearest rank, as spot_serve::load does."""
    v = sorted(values)
    if not v:
        return None
    rank = min(max(int(-(-q * len(v) // 1)), 1), len(v))
    return round(v[rank - 1], 4)


class Soak:
    def __init__(self, args, host, port, key, server_method):
        self.args = args
        self.host, self.port, self.key = host, port, key
        self.server_method = server_method
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.counts = {}  # kind -> status -> n
        self.errors = []  # (kind, message)
        self.error_count = 0
        self.mismatches = []
        self.mismatch_count = 0
        self.checked = 0  # later answers compared with a recorded one
        self.expected = {}  # key -> (text, finish, kind)
        self.by_method = {}  # key without method -> (text, finish, method)
        self.latency = {}  # kind -> [s]
        self.first_text = {}  # kind -> [s]
        # Choices the server must have accepted (answered or cancelled after the head came)
        # and those it may have (cancelled before any answer).
        self.accepted_min = 0
        self.accepted_maybe = 0
        self.finished_choices = 0
        rng = random.Random(args.seed)
        self.hot = [self.random_spec(rng) for _ in range(args.hot)]

    # --- bookkeeping -------------------------------------------------------------------

    def count(self, kind, status):
        with self.lock:
            k = self.counts.setdefault(kind, {})
            k[str(status)] = k.get(str(status), 0) + 1

    def error(self, kind, msg):
        with self.lock:
            self.error_count += 1
            if len(self.errors) < 30:
                self.errors.append({"kind": kind, "error": msg[:600]})

    def record(self, kind, spec, i, text, finish, partial=False):
        """Compares choice i of `spec` with what its key gave before (or records it)."""
        method = spec["method"] or self.server_method
        key = (spec["endpoint"], spec["prompt"], spec["seed"] + i, spec["temperature"], spec["method"] or "default", spec["max_tokens"])
        with self.lock:
            want = self.expected.get(key)
            if partial:
                if want is not None:
                    self.checked += 1
                    if not want[0].startswith(text):
                        self.mismatch_locked("cancelled stream not a prefix", key, want[0], text)
                return
            if want is None:
                self.expected[key] = (text, finish, kind)
            else:
                self.checked += 1
                if (text, finish) != want[:2]:
                    self.mismatch_locked(f"{kind} vs {want[2]}", key, list(want[:2]), [text, finish])
            if method in EXACT:
                mkey = key[:4] + key[5:]
                other = self.by_method.get(mkey)
                if other is None:
                    self.by_method[mkey] = (text, finish, method)
                elif other[2] != method and (text, finish) != other[:2]:
                    self.mismatch_locked(f"method {method} vs {other[2]}", key, list(other[:2]), [text, finish])

    def mismatch_locked(self, what, key, want, got):
        self.mismatch_count += 1
        if len(self.mismatches) < 30:
            self.mismatches.append({"what": what, "key": list(key), "want": want, "got": got})

    # --- requests ----------------------------------------------------------------------

    def random_spec(self, rng):
        endpoint = rng.choice(["completion", "chat"])
        prompts = COMPLETION_PROMPTS if endpoint == "completion" else CHAT_PROMPTS
        return {
            "endpoint": endpoint,
            "prompt": rng.randrange(len(prompts)),
            "seed": rng.choice(SEEDS),
            "temperature": rng.choice([0.0, 1.0]),
            "method": rng.choice(["df", "spot", None]),
            "max_tokens": rng.choice(MAX_TOKENS),
        }

    def spec_for(self, rng, endpoint):
        for _ in range(8):
            spec = dict(rng.choice(self.hot)) if rng.random() < self.args.hot_share else self.random_spec(rng)
            if spec["endpoint"] == endpoint:
                return spec
        spec = self.random_spec(rng)
        spec["endpoint"] = endpoint
        spec["prompt"] = rng.randrange(len(COMPLETION_PROMPTS if endpoint == "completion" else CHAT_PROMPTS))
        return spec

    def body(self, spec, n, stream, include_usage=False):
        b = {
            "model": self.args.model_name,
            "max_tokens": spec["max_tokens"],
            "temperature": spec["temperature"],
            "seed": spec["seed"],
            "n": n,
            "stream": stream,
        }
        if spec["endpoint"] == "completion":
            b["prompt"] = COMPLETION_PROMPTS[spec["prompt"]]
        else:
            b["messages"] = [{"role": "user", "content": CHAT_PROMPTS[spec["prompt"]]}]
        if spec["method"]:
            b["spot"] = {"method": spec["method"]}
        if stream and include_usage:
            b["stream_options"] = {"include_usage": True}
        return b

    def connect(self):
        return http.client.HTTPConnection(self.host, self.port, timeout=self.args.timeout)

    def send(self, conn, method, path, body, key="default"):
        headers = {"Content-Type": "application/json"}
        key = self.key if key == "default" else key
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        conn.request(method, path, body=data if method == "POST" else None, headers=headers)

    @staticmethod
    def path(endpoint):
        return "/v1/completions" if endpoint == "completion" else "/v1/chat/completions"

    def plain(self, rng, kind):
        endpoint = kind
        spec, n = self.spec_for(rng, endpoint), rng.randint(1, 3)
        conn = self.connect()
        t0 = time.monotonic()
        try:
            self.send(conn, "POST", self.path(endpoint), self.body(spec, n, False))
            resp = conn.getresponse()
            raw = resp.read()
            dt = time.monotonic() - t0
            if resp.status != 200:
                raise ProtocolError(f"HTTP {resp.status}: {raw[:300]!r}", resp.status)
            with self.lock:
                self.accepted_min += n
            v = json.loads(raw)
            choices = v.get("choices") or []
            if sorted(c.get("index") for c in choices) != list(range(n)):
                raise ProtocolError(f"choices {[c.get('index') for c in choices]} for n = {n}")
            if not str(v.get("id", "")).startswith("cmpl-" if endpoint == "completion" else "chatcmpl-"):
                raise ProtocolError(f"id {v.get('id')!r}")
            if not isinstance(v.get("usage", {}).get("completion_tokens"), int):
                raise ProtocolError(f"no usage: {v.get('usage')}")
            for c in choices:
                text = c["text"] if endpoint == "completion" else c["message"]["content"]
                if c.get("finish_reason") not in ("stop", "length") or not isinstance(text, str):
                    raise ProtocolError(f"bad choice {c}")
                self.record(kind, spec, c["index"], text, c["finish_reason"])
            self.count(kind, 200)
            with self.lock:
                self.finished_choices += n
                self.latency.setdefault(kind, []).append(dt)
        finally:
            conn.close()

    def stream(self, rng, kind, cancel_after=None):
        endpoint = "completion" if kind.startswith("completion") or (kind == "cancel_stream" and rng.random() < 0.5) else "chat"
        spec, n = self.spec_for(rng, endpoint), rng.randint(1, 3)
        include_usage = rng.random() < 0.5
        conn = self.connect()
        t0 = time.monotonic()
        first = None
        try:
            self.send(conn, "POST", self.path(endpoint), self.body(spec, n, True, include_usage))
            resp = conn.getresponse()
            if resp.status != 200:
                raw = resp.read()
                raise ProtocolError(f"HTTP {resp.status}: {raw[:300]!r}", resp.status)
            if not resp.getheader("Content-Type", "").startswith("text/event-stream"):
                raise ProtocolError(f"content type {resp.getheader('Content-Type')}")
            with self.lock:
                self.accepted_min += n
            texts, finish = [""] * n, [None] * n
            ids, done, usage, chunks = set(), False, False, 0
            data = []
            while True:
                line = resp.readline()
                if not line:
                    break
                line = line.decode("utf-8").rstrip("\r\n")
                if line.startswith("data:"):
                    data.append(line[5:].lstrip(" "))
                    continue
                if line.startswith(":") or line.startswith("event:") or line.startswith("id:"):
                    continue
                if line != "" or not data:
                    continue
                event, data = "\n".join(data), []
                if done:
                    raise ProtocolError(f"data after [DONE]: {event[:200]}")
                if event == "[DONE]":
                    done = True
                    continue
                v = json.loads(event)
                if "error" in v:
                    raise ProtocolError(f"the stream failed: {event[:300]}")
                ids.add(v.get("id"))
                if not v.get("choices"):
                    if not include_usage or "usage" not in v or usage:
                        raise ProtocolError(f"unexpected chunk {event[:200]}")
                    usage = True
                    continue
                for c in v["choices"]:
                    i = c.get("index")
                    if not isinstance(i, int) or not 0 <= i < n:
                        raise ProtocolError(f"choice index {i} for n = {n}")
                    delta = c.get("text") if endpoint == "completion" else c.get("delta", {}).get("content")
                    if delta:
                        if finish[i] is not None:
                            raise ProtocolError(f"text after choice {i} finished")
                        texts[i] += delta
                        chunks += 1
                        if first is None:
                            first = time.monotonic() - t0
                    if c.get("finish_reason") is not None:
                        if finish[i] is not None or c["finish_reason"] not in ("stop", "length"):
                            raise ProtocolError(f"finish_reason {c['finish_reason']} (had {finish[i]})")
                        finish[i] = c["finish_reason"]
                if cancel_after is not None and chunks >= cancel_after and not all(finish):
                    # Close mid-stream: the server must cancel, nothing else.
                    try:
                        conn.sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    self.count(kind, "cancelled")
                    for i in range(n):
                        self.record(kind, spec, i, texts[i], None, partial=True)
                    return
            dt = time.monotonic() - t0
            if not done or not all(finish):
                raise ProtocolError(f"the stream ended without {'a finish_reason' if done else '[DONE]'}", "truncated")
            if len(ids) != 1 or not str(next(iter(ids))).startswith("cmpl-" if endpoint == "completion" else "chatcmpl-"):
                raise ProtocolError(f"stream ids {ids}")
            if include_usage and not usage:
                raise ProtocolError("no usage chunk")
            self.count(kind, 200 if cancel_after is None else "finished_before_cancel")
            for i in range(n):
                self.record(kind, spec, i, texts[i], finish[i])
            with self.lock:
                self.finished_choices += n
                if cancel_after is None:
                    self.latency.setdefault(kind, []).append(dt)
                    if first is not None:
                        self.first_text.setdefault(kind, []).append(first)
        finally:
            conn.close()

    def cancel_plain(self, rng, kind):
        endpoint = rng.choice(["completion", "chat"])
        spec, n = self.spec_for(rng, endpoint), rng.randint(1, 3)
        conn = self.connect()
        try:
            self.send(conn, "POST", self.path(endpoint), self.body(spec, n, False))
            time.sleep(rng.uniform(0.05, 1.5))
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.count(kind, "cancelled")
            with self.lock:
                self.accepted_maybe += n
        finally:
            conn.close()

    def bad(self, kind):
        what = kind.removeprefix("bad_")
        ok = {"model": self.args.model_name, "prompt": "def add(a, b):", "max_tokens": 8}
        method, path, body, key = "POST", "/v1/completions", ok, "default"
        want = (400, None)
        if what == "malformed_json":
            body = b'{"model": "' + self.args.model_name.encode() + b'", "prompt": "x", "max_tokens": 8'
        elif what == "wrong_key":
            key, want = "wrong-" + self.key, (401, "invalid_api_key")
        elif what == "no_key":
            key, want = None, (401, "invalid_api_key")
        elif what == "unknown_model":
            body, want = dict(ok, model="not-" + self.args.model_name), (400, "model_not_found")
        elif what == "long_prompt":
            long = "def f(x):\n" + "".join(f"    x{i} = x + {i}\n" for i in range(800))
            body, want = dict(ok, prompt=long), (400, "context_length_exceeded")
        elif what == "negative_temperature":
            body = dict(ok, temperature=-1)
        elif what == "unknown_route":
            method, path, body, want = "GET", "/v1/nothing", None, (404, None)
        conn = self.connect()
        try:
            self.send(conn, method, path, body, key)
            resp = conn.getresponse()
            raw = resp.read()
            err = json.loads(raw).get("error", {}) if raw.startswith(b"{") else {}
            if resp.status != want[0] or (want[1] and err.get("code") != want[1]) or not err.get("message"):
                raise ProtocolError(f"want {want}, got HTTP {resp.status}: {raw[:300]!r}", f"unexpected_{resp.status}")
            self.count(kind, resp.status)
        finally:
            conn.close()

    def worker(self, index):
        rng = random.Random(self.args.seed * 1000 + index + 1)
        kinds, weights = zip(*MIX)
        while not self.stop.is_set():
            kind = rng.choices(kinds, weights)[0]
            if kind == "bad":
                kind = "bad_" + rng.choice(BAD)
            try:
                if kind in ("completion", "chat"):
                    self.plain(rng, kind)
                elif kind in ("completion_stream", "chat_stream"):
                    self.stream(rng, kind)
                elif kind == "cancel_stream":
                    self.stream(rng, kind, cancel_after=rng.randint(0, 3))
                elif kind == "cancel_plain":
                    self.cancel_plain(rng, kind)
                else:
                    self.bad(kind)
            except Exception as e:  # every failure is a finding
                self.count(kind, e.status if isinstance(e, ProtocolError) else type(e).__name__)
                self.error(kind, f"{type(e).__name__}: {e}")


def get_json(host, port, path, key, timeout=10):
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {key}"})
        resp = conn.getresponse()
        raw = resp.read()
        return resp.status, raw
    finally:
        conn.close()


def rss_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def start_server(args, key):
    log = open(args.log, "w") if args.log else tempfile.NamedTemporaryFile("w", prefix="spot-soak-", suffix=".log", delete=False)
    cmd = [args.spot, "serve", "--model", args.model, "--host", "127.0.0.1", "--port", str(args.port), "--api-key", key, "--method", args.method]
    cmd += ["--max-batch", str(args.max_batch)] + shlex.split(args.server_args)
    env = {k: v for k, v in os.environ.items() if k != "SPOT_API_KEY"}
    # Its own session: a Ctrl-C at the terminal stops the soak, which then stops the server.
    proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=env, start_new_session=True)
    shown = ["KEY" if c == key else shlex.quote(c) for c in cmd]
    print(f"soak: {' '.join(shown)} (log {log.name})", flush=True)
    try:
        return wait_healthy(args, proc, log.name)
    except BaseException:
        proc.kill()
        proc.wait()
        raise


def wait_healthy(args, proc, log):
    deadline = time.monotonic() + args.start_timeout
    addr = None
    while time.monotonic() < deadline and addr is None:
        if proc.poll() is not None:
            break
        with open(log) as f:
            m = re.search(r"listening on http://([^ :]+):(\d+)", f.read())
        if m:
            addr = (m.group(1), int(m.group(2)))
        else:
            time.sleep(0.2)
    while addr and time.monotonic() < deadline:
        try:
            status, raw = get_json(addr[0], addr[1], "/health", None)
            if status == 200 and raw.strip() == b"ok":
                return proc, addr, log
        except OSError:
            pass
        time.sleep(0.2)
    with open(log) as f:
        raise SystemExit(f"soak: spot serve did not become healthy:\n{f.read()[-4000:]}")


def drain_check(soak):
    """A stream in flight when SIGINT comes must still complete."""
    result = {"started": False, "completed": False, "done_before_sigint": None, "error": None}
    got_chunk = threading.Event()
    spec = {"endpoint": "completion", "prompt": 0, "seed": 3, "temperature": 1.0, "method": "df", "max_tokens": 512}

    def run():
        conn = soak.connect()
        try:
            soak.send(conn, "POST", "/v1/completions", soak.body(spec, 1, True))
            resp = conn.getresponse()
            result["started"] = resp.status == 200
            done = False
            while True:
                line = resp.readline()
                if not line:
                    break
                if line.startswith(b"data:"):
                    got_chunk.set()
                    done = done or line.strip() == b"data: [DONE]"
            result["completed"] = done
        except Exception as e:
            result["error"] = f"{type(e).__name__}: {e}"
        finally:
            got_chunk.set()
            conn.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, got_chunk, result


def main():
    target = os.environ.get("CARGO_TARGET_DIR", "target")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spot", default=os.path.join(target, "release", "spot"), help="the spot binary (default $CARGO_TARGET_DIR/release/spot)")
    ap.add_argument("--model", default="models/sdar-tiny-code")
    ap.add_argument("--model-name", default=None, help="the served model id (default: the folder's name)")
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--port", type=int, default=0, help="0 picks a free one")
    ap.add_argument("--method", default="blockspec", help="the server's --method (requests also name df and spot)")
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--server-args", default="", help="more `spot serve` arguments, one shell-quoted string")
    ap.add_argument("--api-key", default=None, help="default: a random one")
    ap.add_argument("--seed", type=int, default=0, help="seed of the request mix")
    ap.add_argument("--hot", type=int, default=24, help="request specs repeated often (to compare answers)")
    ap.add_argument("--hot-share", type=float, default=0.6)
    ap.add_argument("--timeout", type=float, default=300.0, help="client socket timeout, s")
    ap.add_argument("--start-timeout", type=float, default=120.0)
    ap.add_argument("--rss-tolerance", type=float, default=0.05)
    ap.add_argument("--log", default=None, help="the server's log (default: a temporary file)")
    ap.add_argument("--out", default=None, help="write the JSON summary here")
    args = ap.parse_args()
    if args.model_name is None:
        args.model_name = os.path.basename(os.path.normpath(os.path.realpath(args.model)))
    key = args.api_key or "soak-" + secrets.token_hex(16)

    proc, (host, port), log = start_server(args, key)
    summary, checks = {}, {}
    try:
        soak = Soak(args, host, port, key, args.method)
        status, raw = get_json(host, port, "/v1/models", key)
        checks["models_lists_the_model"] = status == 200 and json.loads(raw)["data"][0]["id"] == args.model_name
        interrupted = threading.Event()

        def on_sigint(_sig, _frame):
            print("soak: interrupted; stopping the load", flush=True)
            interrupted.set()
            soak.stop.set()

        signal.signal(signal.SIGINT, on_sigint)
        duration = args.minutes * 60
        mark_s = duration / 6
        samples = []

        def sample(t):
            s = {"t": round(t, 1), "rss_kb": rss_kb(proc.pid)}
            try:
                st, raw = get_json(host, port, "/stats", key)
                if st == 200:
                    s["stats"] = json.loads(raw)
            except (OSError, http.client.HTTPException) as e:
                s["stats_error"] = str(e)
            samples.append(s)

        t0 = time.monotonic()
        workers = [threading.Thread(target=soak.worker, args=(i,), daemon=True) for i in range(args.workers)]
        for w in workers:
            w.start()
        next_sample = 0.0
        while not soak.stop.is_set():
            t = time.monotonic() - t0
            if t >= duration:
                break
            if t >= next_sample:
                sample(t)
                s = samples[-1]
                total = sum(sum(c.values()) for c in soak.counts.values())
                print(f"soak: {t:6.0f} s  rss {s['rss_kb']} kB  requests {total}  errors {soak.error_count}  "
                      f"mismatches {soak.mismatch_count}  stats {s.get('stats')}", flush=True)
                next_sample += 10.0
            soak.stop.wait(min(1.0, max(0.05, next_sample - t)))
        sample(time.monotonic() - t0)  # the end of the load
        load_s = time.monotonic() - t0
        soak.stop.set()
        print("soak: load stopped; waiting for the workers", flush=True)
        for w in workers:
            w.join(args.timeout + 30)
        checks["workers_finished"] = not any(w.is_alive() for w in workers)

        # Idle: cancelled requests leave at the engine's next step.
        stats = None
        for _ in range(300):
            st, raw = get_json(host, port, "/stats", key)
            stats = json.loads(raw) if st == 200 else None
            if stats and stats["live"] == 0 and stats["queued"] == 0:
                break
            time.sleep(0.1)
        stats = stats or {}
        acc, comp, canc, fail = (stats.get(k, -1) for k in ("accepted", "completed", "cancelled", "failed"))
        checks["stats_accepted_eq_completed_cancelled_failed"] = acc == comp + canc + fail
        checks["stats_failed_zero"] = fail == 0
        checks["stats_idle_live_queued_zero"] = stats.get("live") == 0 and stats.get("queued") == 0
        checks["stats_idle_cache_freed"] = stats.get("open_slots", 99) <= 1 and stats.get("cache_bytes") == 0
        checks["stats_accepted_matches_clients"] = soak.accepted_min <= acc <= soak.accepted_min + soak.accepted_maybe
        checks["stats_completed_covers_answers"] = comp >= soak.finished_choices
        checks["no_client_errors"] = soak.error_count == 0
        checks["no_mismatches"] = soak.mismatch_count == 0

        # RSS: the level after the first sixth of the run against the end of the load.
        rss = [s for s in samples if s["rss_kb"]]
        at_mark = next((s for s in rss if s["t"] >= mark_s), rss[-1] if rss else None)
        end = rss[-1] if rss else None
        ratio = end["rss_kb"] / at_mark["rss_kb"] if at_mark and end else None
        checks["rss_end_within_tolerance_of_mark"] = ratio is not None and ratio <= 1 + args.rss_tolerance
        rss_idle = rss_kb(proc.pid)

        # Drain: SIGINT while a stream runs; it must complete and the server exit 0.
        t, got_chunk, drain = drain_check(soak)
        got_chunk.wait(60)
        drain["done_before_sigint"] = not t.is_alive()
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(120)
        except subprocess.TimeoutExpired:
            code = "timeout"
        t.join(30)
        checks["drain_stream_completed"] = drain["started"] and drain["completed"]
        checks["server_exit_code_zero"] = code == 0

        lat = {
            kind: {"count": len(v), "median_s": percentile(v, 0.5), "p95_s": percentile(v, 0.95)}
            for kind, v in sorted(soak.latency.items())
        }
        for kind, v in sorted(soak.first_text.items()):
            lat[kind].update(first_text_median_s=percentile(v, 0.5), first_text_p95_s=percentile(v, 0.95))
        totals = {}
        for c in soak.counts.values():
            for s, n in c.items():
                totals[s] = totals.get(s, 0) + n
        summary = {
            "config": {k: v for k, v in vars(args).items() if k != "api_key"},
            "load_s": round(load_s, 1),
            "requests": {k: dict(sorted(v.items())) for k, v in sorted(soak.counts.items())},
            "requests_total": dict(sorted(totals.items())),
            "client_errors": {"count": soak.error_count, "samples": soak.errors},
            "crossing": {
                "keys": len(soak.expected),
                "compared": soak.checked,
                "mismatches": soak.mismatch_count,
                "samples": soak.mismatches,
            },
            "client_choices": {"accepted_at_least": soak.accepted_min, "maybe_accepted": soak.accepted_maybe, "answered": soak.finished_choices},
            "rss": {
                "mark_s": round(mark_s, 1),
                "at_mark_kb": at_mark and at_mark["rss_kb"],
                "at_mark_t": at_mark and at_mark["t"],
                "end_kb": end and end["rss_kb"],
                "end_t": end and end["t"],
                "ratio": ratio and round(ratio, 4),
                "max_kb": max((s["rss_kb"] for s in rss), default=None),
                "idle_kb": rss_idle,
                "samples": [[s["t"], s["rss_kb"]] for s in rss],
            },
            "server": {"stats_idle": stats, "exit_code": code, "drain": drain, "log": log},
            "stats_samples": [[s["t"], s.get("stats")] for s in samples],
            "latency": lat,
            "checks": checks,
            "interrupted": interrupted.is_set(),
        }
        summary["ok"] = all(checks.values())
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = json.dumps(summary, indent=2)
    brief = {k: v for k, v in summary.items() if k not in ("stats_samples", "config")}
    brief["rss"] = {k: v for k, v in summary["rss"].items() if k != "samples"}
    print(json.dumps(brief, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    failed = [k for k, v in checks.items() if not v]
    print(f"soak: {'FAILED: ' + ', '.join(failed) if failed else 'all checks passed'}")
    if failed:
        with open(log) as f:
            print("--- spot serve log (tail)\n" + f.read()[-3000:])
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
