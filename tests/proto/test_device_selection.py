"""Device selection in raw protocol: HELLO carries CUDA_VISIBLE_DEVICES, and pilotd holds the
session to it whatever the client asks later (DEVICE_INFO, DEVICE_JOIN past the selection),
and a selection that names nothing pilotd serves gets no session."""

from __future__ import annotations

from client import ProtoClient, body

from pilot.daemon.backends.base import format_uuid
from pilot.daemon.backends.sim_device import sim_uuid
from pilot.daemon.protocol import ffi, lib

INVALID_DEVICE, NO_DEVICE = 101, 100


def _info(c: ProtoClient, device: int) -> object:
    return c.call(lib.PILOT_OP_DEVICE_INFO, body("pilot_req_device", device=device),
                  rep_type="pilot_rep_device_info")


def _join(c: ProtoClient, device: int) -> object:
    c.main.send_multipart([c.envelope(lib.PILOT_OP_DEVICE_JOIN), body("pilot_req_device", device=device)])
    rep = ffi.new("pilot_rep_hello *")
    ffi.memmove(rep, c.recv(c.main)[1], ffi.sizeof("pilot_rep_hello"))
    return rep


def test_a_selection_holds_for_every_later_call(daemon_with):
    daemon = daemon_with("--sim-devices", "3")
    c = ProtoClient(str(daemon.socket_path))
    c.open(b"2,0")
    info = _info(c, 0)
    assert (info.hdr.err, info.device_count) == (0, 2)
    assert format_uuid(bytes(ffi.buffer(info.uuid))) == format_uuid(sim_uuid(2))
    assert format_uuid(bytes(ffi.buffer(_info(c, 1).uuid))) == format_uuid(sim_uuid(0))
    assert _info(c, 2).hdr.err == INVALID_DEVICE  # GPU 1 exists, but was not selected
    assert _join(c, 2).hdr.err == INVALID_DEVICE
    rep = _join(c, 1)
    assert rep.hdr.err == 0 and rep.device == 1
    assert "device 1 on vGPU" in daemon.log() and "(GPU 0)" in daemon.log()
    c.close()


def test_a_selection_of_nothing_pilotd_serves_gets_no_session(daemon_with):
    daemon = daemon_with("--sim-devices", "2", "--device", "3", "--device", "4")
    pci = lib.PILOT_HELLO_PCI_BUS_ORDER
    for value, flags in ((b"", 0), (b"0,1", 0), (b"5", 0), (b"GPU-ffff", 0), (b"2", pci)):
        c = ProtoClient(str(daemon.socket_path))
        rep = c.hello(value, flags)
        assert (rep.hdr.err, rep.session) == (NO_DEVICE, 0), value
        c.close()
    c = ProtoClient(str(daemon.socket_path))
    c.open(b"4,3")  # the host's numbers of the GPUs pilotd serves
    info = _info(c, 0)
    assert (info.device_count, format_uuid(bytes(ffi.buffer(info.uuid)))) == (2, format_uuid(sim_uuid(1)))
    c.close()
    c = ProtoClient(str(daemon.socket_path))
    c.open(b"1", pci)  # PCI order of the served: sim 1 (0x1B), sim 0 (0x23)
    assert format_uuid(bytes(ffi.buffer(_info(c, 0).uuid))) == format_uuid(sim_uuid(0))
    c.close()
