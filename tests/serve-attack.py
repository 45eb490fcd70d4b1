#!/usr/bin/python3
"""Hostile clients of psm-run serve, for tests/serve-hostile.sh (issue 58).

serve-attack.py PORT PID ATTACK: runs one attack against the server on
127.0.0.1:PORT (loopback only; every loop is bounded in count and time),
then one normal request, and prints one line:

    ATTACK <TAB> ANSWER <TAB> PEAK_RSS_MB <TAB> SECONDS_TO_NEXT_ANSWER <TAB> OK|FAIL [why]

ANSWER says what the attack got; PEAK_RSS_MB is the server's VmHWM
(/proc/PID/status) after it; OK when the answer is the expected one and
the normal request after it was answered 200 with a summary.
"""
import json
import os
import socket
import sys
import threading
import time

HOST = "127.0.0.1"
NORMAL = b'{"text": "the cat sat on the mat . the dog ran in the park 3 .", "beam": 2, "max_len": 6}'


def status_mb(pid, key):
    """A memory figure of /proc/PID/status (VmHWM: peak RSS, VmRSS: now) in MB."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024.0
    return -1.0


def request(port, body, ctype="application/json", host=None, path="/summarize", method="POST", timeout=60):
    """One request on its own connection: (status, body bytes), status 0
    for a connection reset or closed without an answer."""
    s = socket.create_connection((HOST, port), timeout=timeout)
    try:
        head = "%s %s HTTP/1.1\r\nHost: %s\r\n" % (method, path, host or "127.0.0.1:%d" % port)
        if ctype:
            head += "Content-Type: %s\r\n" % ctype
        if body is not None:
            head += "Content-Length: %d\r\n" % len(body)
        head += "Connection: close\r\n\r\n"
        s.sendall(head.encode() + (body or b""))
        return read_answer(s)
    except (ConnectionResetError, BrokenPipeError):
        return 0, b""
    finally:
        s.close()


def read_answer(s):
    data = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    except ConnectionResetError:
        if not data:
            return 0, b""
    if not data.startswith(b"HTTP/1."):
        return 0, data
    status = int(data.split(b" ", 2)[1])
    return status, data.split(b"\r\n\r\n", 1)[-1]


def normal(port):
    t0 = time.time()
    st, body = request(port, NORMAL)
    ok = st == 200 and b'"summary": "' in body
    return ok, time.time() - t0, st


def stream_body(port, head, total, block=1 << 16, chunked=False):
    """Sends head, then up to total bytes (chunked or not) until the server
    answers or closes: (status, bytes sent)."""
    s = socket.create_connection((HOST, port), timeout=30)
    s.sendall(head)
    sent, status = 0, 0
    piece = b"x" * block
    try:
        while sent < total:
            if chunked:
                s.sendall(b"%x\r\n" % block + piece + b"\r\n")
            else:
                s.sendall(piece)
            sent += block
    except (ConnectionResetError, BrokenPipeError, socket.timeout):
        pass
    try:
        s.settimeout(5)
        status, _ = read_answer(s)
    except (OSError, ValueError):
        status = 0
    s.close()
    return status, sent


def attack(port, pid, name):
    """Returns (answer text, expected?)."""
    if name == "deep-nesting":   # item 1: 100 KB of '[' must not crash the parser
        st, body = request(port, b"[" * 100000)
        return "%d %s" % (st, body[:60].decode(errors="replace").strip()), st == 400
    if name == "content-length-1e9":   # item 2: refused from the headers, nothing read
        head = (b"POST /summarize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Content-Length: 1000000000\r\n\r\n")
        st, sent = stream_body(port, head, 64 << 20)
        return "%d after %d MB sent" % (st, sent >> 20), st in (413, 0) and sent < (64 << 20)
    if name == "chunked-400MB":   # item 2: a streamed body stops being read at --max-body
        head = (b"POST /summarize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n")
        st, sent = stream_body(port, head, 400 << 20, chunked=True)
        return "%d after %d MB sent" % (st, sent >> 20), st in (413, 0) and sent < (64 << 20)
    if name == "half-open-300":   # item 3: 300 half-sent requests, held, then closed
        socks = []
        for _ in range(300):
            try:
                s = socket.create_connection((HOST, port), timeout=5)
                s.sendall(b"POST /summarize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le")
                socks.append(s)
            except OSError:
                break
        time.sleep(3)   # past the test server's --header-timeout 2
        closed = 0
        for s in socks:
            try:
                s.settimeout(0.5)
                if s.recv(1 << 16) == b"":
                    closed += 1
            except (OSError, socket.timeout):
                pass
            s.close()
        return "%d opened, %d closed by the server" % (len(socks), closed), closed >= len(socks) // 2
    if name == "fd-exhaustion":   # item 3: accept() failing with EMFILE does not stop the server
        import resource
        soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        base = len(os.listdir("/proc/%d/fd" % pid))
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (base + 8, hard))   # below the server's connection cap
        socks = []
        try:
            for _ in range(40):
                s = socket.create_connection((HOST, port), timeout=5)
                s.sendall(b"POST /summarize HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                socks.append(s)
            time.sleep(3)   # past --header-timeout: the held ones are closed
        finally:
            for s in socks:
                s.close()
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
        time.sleep(0.5)
        st, body = request(port, None, ctype=None, path="/health", method="GET")
        drops = json.loads(body)["fd_drops"] if st == 200 else -1
        return "limit %d fds: %d connections dropped at accept" % (base + 8, drops), drops > 0
    if name == "burst-200":   # item 4: no resets while the queue has room; 503 beyond
        results = []
        lock = threading.Lock()

        def one():
            try:
                st, _ = request(port, NORMAL)
            except OSError:
                st = 0
            with lock:
                results.append(st)
        ts = [threading.Thread(target=one) for _ in range(200)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        n200, n503, n0 = results.count(200), results.count(503), results.count(0)
        return "%d x 200, %d x 503, %d resets" % (n200, n503, n0), n0 == 0 and n200 + n503 == 200
    if name == "one-1MB-word":   # item 5: a word's length is bounded, and so the reply
        body = json.dumps({"text": "a" * 1000000, "beam": 1, "min_len": 400, "max_len": 400}).encode()
        st, out = request(port, body)
        return "%d, reply %d KB" % (st, len(out) >> 10), st == 200 and len(out) < (8 << 20)
    if name == "unique-words-1000":   # item 6: new words do not stay in memory
        before = status_mb(pid, "VmRSS")
        for i in range(1000):
            words = " ".join("w%06d%s" % (i * 100 + k, "q" * 90) for k in range(100))
            st, _ = request(port, json.dumps({"text": words, "beam": 1, "max_len": 2}).encode())
            if st != 200:
                return "request %d: %d" % (i, st), False
            if i == 199:
                before = status_mb(pid, "VmRSS")
        grew = status_mb(pid, "VmRSS") - before
        sanitized = os.environ.get("PSM_TEST_SANITIZED") == "1"   # ASan's quarantine holds freed memory
        return "1000 x 200, RSS +%.1f MB over the last 800" % grew, grew < 8.0 or sanitized
    if name == "hung-up-8":   # item 7: work for clients that left is dropped
        socks = []
        body = json.dumps({"text": " ".join(["the cat sat on the mat ."] * 60), "beam": 64, "min_len": 400,
                           "max_len": 400}).encode()
        for _ in range(8):
            s = socket.create_connection((HOST, port), timeout=5)
            s.sendall(b"POST /summarize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(body) + body)
            socks.append(s)
        time.sleep(1)
        for s in socks:
            s.close()
        return "8 sent, clients gone after 1 s", True
    if name == "text/plain":   # item 8
        st, _ = request(port, NORMAL, ctype="text/plain")
        return str(st), st == 415
    if name == "foreign-host":
        st, _ = request(port, NORMAL, host="attacker.example:80")
        return str(st), st == 403
    if name == "health-path":
        st, body = request(port, None, ctype=None, path="/health", method="GET")
        ck = json.loads(body)["checkpoint"]
        return "%d checkpoint %s" % (st, ck), st == 200 and "/" not in ck
    if name == "nul-escape":
        st, _ = request(port, b'{"text": "the cat \\u0000 sat"}')
        return str(st), st == 400
    raise SystemExit("unknown attack " + name)


def main():
    port, pid, name = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    answer, expected = attack(port, pid, name)
    ok, secs, st = normal(port)
    why = "" if expected and ok else (" (unexpected answer)" if not expected else " (next request: %d)" % st)
    print("%s\t%s\t%.0f\t%.2f\t%s%s" % (name, answer, status_mb(pid, "VmHWM"), secs,
                                        "OK" if expected and ok else "FAIL", why))
    sys.exit(0 if expected and ok else 1)


if __name__ == "__main__":
    main()
