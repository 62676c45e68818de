"""A second tenant for isolation tests. Says HELLO, then (unless told 'noattach') attaches and
allocates (with 'managed': 2 MiB of managed memory, shadowed); prints 'session ptr endpoint';
then waits for lines on stdin ('attach', or EOF/empty to exit)."""

import sys

from client import ProtoClient

from pilot.daemon.protocol import ffi, lib

client = ProtoClient(sys.argv[1])
rep = client.hello()
client.session = rep.session
endpoint = ffi.string(rep.endpoint).decode()
client.vgpu = client._connect(endpoint)
ptr = 0
if "noattach" not in sys.argv[2:]:
    assert client.call(1 + 1, b"").err == 0  # PILOT_OP_ATTACH
    if "managed" in sys.argv[2:]:
        req = ffi.new("pilot_req_malloc_managed *", {"size": 2 << 20, "flags": 1})
        ptr = client.call(lib.PILOT_OP_MALLOC_MANAGED, bytes(ffi.buffer(req)), rep_type="pilot_rep_u64").value
        req = ffi.new("pilot_req_shadow_attach *", {"base": ptr, "length": 2 << 20, "chunk": 2 << 20})
        assert client.call(lib.PILOT_OP_SHADOW_ATTACH, bytes(ffi.buffer(req))).err == 0
    else:
        ptr = client.malloc(4096)
print(client.session, ptr, endpoint, flush=True)
for line in sys.stdin:
    if line.strip() == "attach":
        print(client.call(2, b"").err, flush=True)
    else:
        break
client.close()
