#!/usr/bin/env python3
"""tests/store_client.py MODE HOST PORT - a misbehaving client of kiln's
rendezvous store (core/store.h's wire format), for tests/store_abuse.sh.
The token comes from $KILN_STORE_TOKEN.  Modes:

  noauth   connect and SET without presenting the token: prints "refused"
           when the store closes the connection, "served" when it answers
  badtoken present a wrong token's MAC: "refused" or "served"
  stall    authenticate, SET a 4 MiB value, then ask for it 16 times
           without ever reading the answers; sleeps until killed
  hog      authenticate; eight SETs of 64 MiB values (a new connection for
           each, as the store drops one that announces such a value), then
           7 MiB values until the store refuses one: prints
           "big-accepted N" and "filled N" (7 MiB values it took)
  check KEY  print KEY's value (up to a NUL), "(absent)" when unset
"""
import hashlib
import hmac
import os
import socket
import struct
import sys
import time

MAGIC = b"KILNST2\n"  # core/store.h STORE_MAGIC
SET, GET, CHECK, AUTH = 2, 3, 4, 7


def connect(host, port):
    for _ in range(600):
        try:
            return socket.create_connection((host, port), timeout=30)
        except OSError:
            time.sleep(0.1)
    sys.exit("store_client: nothing listens at %s:%d" % (host, port))


def recv_n(s, n):
    b = b""
    while len(b) < n:
        k = s.recv(n - len(b))
        if not k:
            return None
        b += k
    return b


def request(op, key, val):
    return bytes([op]) + struct.pack("<I", len(key)) + key + struct.pack("<I", len(val)) + val


def answer(s):
    """(status, value), or None when the connection closed"""
    try:
        h = recv_n(s, 5)
        if h is None:
            return None
        v = recv_n(s, struct.unpack("<I", h[1:])[0])
        return None if v is None else (h[0], v)
    except (ConnectionResetError, BrokenPipeError):
        return None


def session(host, port, token):
    """a connection past the greeting (and, with a token, authenticated)"""
    s = connect(host, port)
    g = recv_n(s, len(MAGIC) + 32)
    if not g or g[:len(MAGIC)] != MAGIC:
        sys.exit("store_client: no greeting")
    if token is not None:
        mac = hmac.new(token, b"kiln-store-auth-v1" + g[len(MAGIC):], hashlib.sha256).digest()
        s.sendall(request(AUTH, b"", mac))
        a = answer(s)
        if a is None or a[0] != 0:
            return s, False
    return s, True


def main():
    mode, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    token = os.environ["KILN_STORE_TOKEN"].encode()
    if mode in ("noauth", "badtoken"):
        s, ok = session(host, port, None if mode == "noauth" else b"not-" + token)
        if ok:
            try:
                s.sendall(request(SET, b"evil/key", b"x"))
            except OSError:
                pass
            ok = answer(s) is not None
        print("served" if ok else "refused", flush=True)
    elif mode == "stall":
        s, ok = session(host, port, token)
        assert ok, "stall: not authenticated"
        s.sendall(request(SET, b"stall/v", b"s" * (4 << 20)))
        assert answer(s)[0] == 0
        for _ in range(16):
            s.sendall(request(GET, b"stall/v", b""))
        print("stalling", flush=True)
        time.sleep(3600)
    elif mode == "hog":
        big = 0
        for i in range(8):
            s, ok = session(host, port, token)
            try:
                s.sendall(request(SET, b"hog/big/%d" % i, b"h" * (64 << 20)))
                a = answer(s)
            except OSError:
                a = None
            big += a is not None and a[0] == 0
            s.close()
        print("big-accepted %d" % big, flush=True)
        s, ok = session(host, port, token)
        n = 0
        while n < 64:
            s.sendall(request(SET, b"hog/fill/%d" % n, b"f" * (7 << 20)))
            a = answer(s)
            if a is None or a[0] != 0:
                break
            n += 1
        print("filled %d" % n, flush=True)
    elif mode == "check":
        s, ok = session(host, port, token)
        assert ok, "check: not authenticated"
        s.sendall(request(CHECK, sys.argv[4].encode(), b""))
        a = answer(s)
        assert a is not None, "check: the store closed the connection"
        print("(absent)" if a[0] else a[1].split(b"\0")[0].decode(), flush=True)


main()
