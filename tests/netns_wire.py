#!/usr/bin/python3
"""tests/netns_wire.py - a network cable with added latency between two
network namespaces, for tests/dist_netns.sh (these kernels have no netem
qdisc).

    netns_wire.py NS_A IF_A NS_B IF_B DELAY_MS

Creates the TAP interface IF_A in the namespace NS_A (/run/netns/NS_A) and
IF_B in NS_B, prints "ready" once both exist, and then passes every
Ethernet frame from one to the other DELAY_MS milliseconds after it arrived
(in each direction, order kept), so every TCP connection across the pair
sees 2 x DELAY_MS more round trip, whatever its ports.  The caller gives
the interfaces their addresses, brings them up (or down: a cut link) and
ends the wire with SIGTERM.  The interfaces vanish with the process.
"""
import collections
import ctypes
import fcntl
import os
import select
import signal
import struct
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TAP, IFF_NO_PI = 0x0002, 0x1000
CLONE_NEWNET = 0x40000000


def tap_in(ns, name):
    """Open a TAP interface called name inside the network namespace ns."""
    libc = ctypes.CDLL(None, use_errno=True)
    nsfd = os.open("/run/netns/" + ns, os.O_RDONLY)
    if libc.setns(nsfd, CLONE_NEWNET):
        raise OSError(ctypes.get_errno(), "setns " + ns)
    os.close(nsfd)
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
    os.set_blocking(fd, False)
    return fd


def main():
    ns_a, if_a, ns_b, if_b, delay_ms = sys.argv[1:6]
    delay = float(delay_ms) / 1000.0
    a = tap_in(ns_a, if_a)
    b = tap_in(ns_b, if_b)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print("ready", flush=True)
    other = {a: b, b: a}
    queue = {a: collections.deque(), b: collections.deque()}  # frames bound for fd
    while True:
        now = time.monotonic()
        for dst, q in queue.items():
            while q and q[0][0] <= now:
                try:
                    os.write(dst, q.popleft()[1])
                except OSError:
                    pass  # the interface is down: the frame is lost, as on a cut cable
        due = [q[0][0] for q in queue.values() if q]
        wait = max(0.0, min(due) - now) if due else 1.0
        ready, _, _ = select.select([a, b], [], [], wait)
        now = time.monotonic()
        for src in ready:
            while True:
                try:
                    frame = os.read(src, 65536)
                except BlockingIOError:
                    break
                except OSError:
                    break
                queue[other[src]].append((now + delay, frame))


if __name__ == "__main__":
    main()
