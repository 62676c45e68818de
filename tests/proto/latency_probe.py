"""A well-behaved tenant for the fuzz suite: attaches, then allocates and frees 256 bytes in a
loop until a line (or EOF) arrives on stdin; prints 'ready' first, then its calls and the
slowest call's seconds."""

import select
import sys
import time

from client import ProtoClient, body

from pilot.daemon.protocol import lib

c = ProtoClient(sys.argv[1])
c.open()
print("ready", flush=True)
calls, slowest = 0, 0.0
while not select.select([sys.stdin], [], [], 0)[0]:
    t0 = time.monotonic()
    ptr = c.malloc(256)
    assert ptr != 0
    assert c.call(lib.PILOT_OP_FREE, body("pilot_req_free", ptr=ptr)).err == 0
    slowest = max(slowest, time.monotonic() - t0)
    calls += 1
print(calls, slowest, flush=True)
c.close()
