"""A second tenant for isolation tests. Says HELLO, then (unless told 'noattach') attaches and
allocates; prints 'session ptr endpoint'; then waits for lines on stdin ('attach', or EOF/empty to
exit)."""

import sys

from client import ProtoClient

from pilot.daemon.protocol import ffi

client = ProtoClient(sys.argv[1])
rep = client.hello()
client.session = rep.session
endpoint = ffi.string(rep.endpoint).decode()
client.vgpu = client._connect(endpoint)
ptr = 0
if "noattach" not in sys.argv[2:]:
    assert client.call(1 + 1, b"").err == 0  # PILOT_OP_ATTACH
    ptr = client.malloc(4096)
print(client.session, ptr, endpoint, flush=True)
for line in sys.stdin:
    if line.strip() == "attach":
        print(client.call(2, b"").err, flush=True)
    else:
        break
client.close()
