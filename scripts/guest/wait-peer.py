#!/usr/bin/env python3
"""wait-peer.py ADDR SECONDS: wait until the kernel at ADDR answers a TCP
connection attempt (a refusal counts: it proves the peer is up and the wire
carries frames both ways). Exit status 0 once it does, 1 at the deadline."""
import socket
import sys
import time

addr, deadline = sys.argv[1], time.monotonic() + float(sys.argv[2])
while time.monotonic() < deadline:
    try:
        with socket.create_connection((addr, 9), timeout=2):
            sys.exit(0)
    except ConnectionRefusedError:
        sys.exit(0)
    except OSError:
        time.sleep(1)
sys.exit(1)
