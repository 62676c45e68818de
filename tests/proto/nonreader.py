"""A tenant that never reads its replies (issue 12, attack 6): HELLO, then on a raw connection
to its vGPU endpoint ATTACH and N calls that each have a reply, none read; prints 'sent' (or
'dropped' if pilotd closed the connection), then waits for EOF on stdin."""

import socket
import sys

from client import ProtoClient

from pilot.daemon.protocol import ffi, lib

client = ProtoClient(sys.argv[1])
calls = int(sys.argv[2])
rep = client.hello()
client.session = rep.session
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(ffi.string(rep.endpoint).decode().removeprefix("ipc://"))
greeting = b"\xff" + b"\0" * 8 + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\0") + b"\0" * 32
ready = b"\x05READY" + b"\x0bSocket-Type" + (6).to_bytes(4, "big") + b"DEALER"
attach, info = client.envelope(lib.PILOT_OP_ATTACH), client.envelope(lib.PILOT_OP_MEM_GET_INFO)
frames = (greeting + bytes([0x04, len(ready)]) + ready
          + bytes([0x01, len(attach)]) + attach + bytes([0x00, 0])
          + (bytes([0x01, len(info)]) + info + bytes([0x00, 0])) * calls)
try:
    s.sendall(frames)
    print("sent", flush=True)
except OSError:
    print("dropped", flush=True)
sys.stdin.read()
s.close()
client.close()
