#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""The responder of the cluster suite, run on node 1: an RPC server on the
wire that makes memory, MRs and QPs when the tests on node 0 ask, and tells
them what it sees (bytes, completions, ODP counters). It serves one client
and exits when that client says so (status 0) or goes away (status 1)."""
import ctypes
import json
import multiprocessing.connection as mpc
import subprocess
import sys
import threading
import traceback

from pyverbs.device import Context
from pyverbs.pd import PD

import verbs
from odpwatch_memwatch import MemWatch  # noqa: E402 (rxe_env puts it on the path)


class Agent:
    def __init__(self):
        self.ctx = Context(name=verbs.RDMA_DEV)
        self.pd = PD(self.ctx)
        self.objs, self.next = {}, 1
        self.mw = None

    def _keep(self, obj):
        h, self.next = self.next, self.next + 1
        self.objs[h] = obj
        return h

    # Memory and MRs
    def mem(self, mode, length, seed=None):
        """A buffer (filled with pattern(seed) if given) and an MR of @mode over it."""
        addr = verbs.mmap_anon(length)
        # Registered before it is written: an ODP MR then has no page mapped.
        mr = verbs.register(self.pd, mode, addr, length)
        if seed is not None:
            ctypes.memmove(addr, verbs.pattern(seed, length), length)
        m = {"addr": addr, "length": length, "mr": mr, "mode": mode}
        return {"h": self._keep(m), "addr": addr, "rkey": mr.rkey, "lkey": mr.lkey}

    def read(self, h, off, length):
        m = self.objs[h]
        return ctypes.string_at(m["addr"] + off, length)

    def fill(self, h, seed):
        m = self.objs[h]
        ctypes.memmove(m["addr"], verbs.pattern(seed, m["length"]), m["length"])

    def counters(self, h):
        return verbs.mr_counters(self.objs[h]["mr"].lkey)

    def replace(self, h, seed):
        """Free the buffer and map a new one at the same address, filled with
        pattern(seed): what a registration cache sees when an application
        frees a buffer and malloc hands the range out again. The MR stays."""
        m = self.objs[h]
        verbs.munmap(m["addr"], m["length"])
        verbs.mmap_anon(m["length"], m["addr"])
        ctypes.memmove(m["addr"], verbs.pattern(seed, m["length"]), m["length"])

    # memwatch: the pinned cache's validity check
    def watch(self, h):
        self.mw = self.mw or MemWatch()
        m = self.objs[h]
        m["watch"] = self.mw.add(m["addr"], m["length"])

    def lookup(self, h):
        """As a pinned registration cache with memwatch would answer a get():
        the cached MR if its watch is valid, else a new registration (and a
        new watch). Returns the rkey to use and whether it re-registered."""
        m = self.objs[h]
        if m["watch"].is_valid():
            return {"rkey": m["mr"].rkey, "reregistered": False}
        m["watch"].remove()
        m["mr"].close()
        m["mr"] = verbs.register(self.pd, m["mode"], m["addr"], m["length"])
        m["watch"] = self.mw.add(m["addr"], m["length"])
        return {"rkey": m["mr"].rkey, "reregistered": True}

    # Invalidations while the peer streams
    def churn_start(self, h):
        """A thread that zaps the buffer's pages again and again."""
        m = self.objs[h]
        m["stop"], m["zaps"] = threading.Event(), 0

        def run():
            while not m["stop"].is_set():
                verbs.madvise_dontneed(m["addr"], m["length"])
                m["zaps"] += 1
        m["thread"] = threading.Thread(target=run)
        m["thread"].start()

    def churn_stop(self, h):
        m = self.objs[h]
        m["stop"].set()
        m["thread"].join()
        return m["zaps"]

    # QPs
    def qp(self):
        q = verbs.RemoteQP(self.ctx, self.pd)
        return {"h": self._keep(q), "qpn": q.qpn, "gid": q.gid}

    def connect(self, h, qpn, gid):
        self.objs[h].connect(qpn, gid)

    def post_recv(self, qh, mh, length):
        m = self.objs[mh]
        self.objs[qh].post_recv(m["mr"], m["addr"], length)

    def poll(self, qh, timeout=60.0):
        return self.objs[qh].poll(timeout)

    def qp_state(self, qh):
        return self.objs[qh].qp.query(0x1)[0].cur_qp_state

    # Processes (perftest servers)
    def spawn(self, argv):
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        return self._keep(p)

    def wait(self, h, timeout=300):
        p = self.objs.pop(h)
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            return {"rc": None, "out": out}
        return {"rc": p.returncode, "out": out}

    # A process that holds a QP and is killed
    def victim_start(self):
        p = subprocess.Popen([sys.executable, "victim.py"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        info = json.loads(p.stdout.readline())
        info["h"] = self._keep(p)
        return info

    def victim_connect(self, h, qpn, gid):
        p = self.objs[h]
        p.stdin.write(json.dumps({"qpn": qpn, "gid": gid}) + "\n")
        p.stdin.flush()
        return json.loads(p.stdout.readline())

    def victim_kill(self, h):
        p = self.objs.pop(h)
        p.kill()
        return p.wait(timeout=60)

    def gid_index(self):
        return verbs.roce_v2_ipv4_gid(verbs.RDMA_DEV)[0]

    def close(self, h):
        """Destroy an object now (a QP mid-stream, an MR, a buffer)."""
        obj = self.objs.pop(h)
        if isinstance(obj, dict):
            if "watch" in obj:
                obj["watch"].remove()
            obj["mr"].close()
            verbs.munmap(obj["addr"], obj["length"])
        elif isinstance(obj, verbs.RemoteQP):
            obj.qp.close()
            obj.cq.close()


def main():
    agent = Agent()
    with mpc.Listener(("0.0.0.0", verbs.PORT), authkey=verbs.AUTHKEY) as listener:
        print(f"agent: listening on port {verbs.PORT}", flush=True)
        conn = listener.accept()
    calls = 0
    while True:
        try:
            name, args = conn.recv()
        except EOFError:
            print(f"agent: the client went away after {calls} calls", flush=True)
            return 1
        if name == "shutdown":
            conn.send(("ok", calls))
            print(f"agent: shutdown after {calls} calls", flush=True)
            return 0
        calls += 1
        try:
            conn.send(("ok", getattr(agent, name)(*args)))
        except Exception as ex:  # the test on node 0 reports it
            conn.send(("error", f"{name}{tuple(args)}: {ex!r}\n{traceback.format_exc()}"))


if __name__ == "__main__":
    sys.exit(main())
