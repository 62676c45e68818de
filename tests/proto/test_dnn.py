"""cuDNN's opcodes in raw protocol (606-612): descriptors are the session's own, malformed
attribute calls get cuDNN's statuses, and nothing a client claims reaches the library unchecked."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

from client import ProtoClient, body

from pilot.daemon.backends import dnn
from pilot.daemon.protocol import lib

HERE = Path(__file__).parent


def _client(daemon) -> ProtoClient:
    c = ProtoClient(str(daemon.socket_path))
    c.open()
    return c


def _lib(c: ProtoClient, op: int, req: bytes, payload: bytes | None = None) -> tuple[int, int]:
    rep = c.call(op, req, payload, rep_type="pilot_rep_lib")
    assert rep.hdr.err == 0, rep.hdr.err
    return int(rep.status), int(rep.value)


def create(c: ProtoClient, dtype: int) -> tuple[int, int]:
    return _lib(c, lib.PILOT_OP_DNN_DESC_CREATE, body("pilot_req_dnn_attr", attr=dtype))


def set_attr(c: ProtoClient, desc: int, attr: int, atype: int, count: int, raw: bytes) -> int:
    return _lib(c, lib.PILOT_OP_DNN_DESC_SET,
                body("pilot_req_dnn_attr", desc=desc, attr=attr, type=atype, count=count), raw)[0]


def finalize(c: ProtoClient, desc: int) -> int:
    return _lib(c, lib.PILOT_OP_DNN_DESC_FINALIZE, body("pilot_req_handle", handle=desc))[0]


def handle(c: ProtoClient) -> int:
    status, number = _lib(c, lib.PILOT_OP_LIB_CREATE,
                          body("pilot_req_lib_create", library=lib.PILOT_LIB_CUDNN))
    assert status == 0
    return number


def tensor(c: ProtoClient, uid: int) -> int:
    status, t = create(c, dnn.TENSOR)
    assert status == 0
    q = struct.pack
    for attr, atype, count, raw in (
            (dnn.ATTR_TENSOR_DATA_TYPE, dnn.TYPE_DATA_TYPE, 1, q("<i", dnn.DATA_FLOAT)),
            (dnn.ATTR_TENSOR_DIMENSIONS, dnn.TYPE_INT64, 4, q("<4q", 1, 1, 4, 4)),
            (dnn.ATTR_TENSOR_STRIDES, dnn.TYPE_INT64, 4, q("<4q", 16, 16, 4, 1)),
            (dnn.ATTR_TENSOR_UNIQUE_ID, dnn.TYPE_INT64, 1, q("<q", uid)),
            (dnn.ATTR_TENSOR_BYTE_ALIGNMENT, dnn.TYPE_INT64, 1, q("<q", 4))):
        assert set_attr(c, t, attr, atype, count, raw) == 0
    return t


INTRUDER = """
import struct, sys
sys.path.insert(0, sys.argv[2])
from test_dnn import _client_at, create, set_attr, finalize, _lib, body, lib, dnn
c = _client_at(sys.argv[1])
theirs, their_handle = int(sys.argv[3]), int(sys.argv[4])
_, mine = create(c, dnn.OPERATIONGRAPH)
print(set_attr(c, theirs, dnn.ATTR_TENSOR_UNIQUE_ID, dnn.TYPE_INT64, 1, struct.pack("<q", 7)),
      finalize(c, theirs),
      set_attr(c, mine, dnn.ATTR_OPERATIONGRAPH_OPS, dnn.TYPE_BACKEND_DESCRIPTOR, 1,
               struct.pack("<Q", theirs)),
      set_attr(c, mine, dnn.ATTR_OPERATIONGRAPH_HANDLE, dnn.TYPE_HANDLE, 1,
               struct.pack("<Q", their_handle)),
      _lib(c, lib.PILOT_OP_DNN_DESC_DESTROY, body("pilot_req_handle", handle=theirs))[0])
c.close()
"""


def _client_at(socket_path: str) -> ProtoClient:
    c = ProtoClient(socket_path)
    c.open()
    return c


def test_another_session_cannot_touch_a_descriptor_or_handle(daemon) -> None:
    owner = _client(daemon)
    h = handle(owner)
    t = tensor(owner, 1)
    other = subprocess.run([sys.executable, "-c", INTRUDER, str(daemon.socket_path), str(HERE),
                            str(t), str(h)], capture_output=True, text=True, timeout=60, cwd=HERE)
    assert other.returncode == 0, other.stderr
    bad = str(dnn.STATUS_BAD_PARAM)
    assert other.stdout.split() == [bad] * 5, other.stdout
    assert finalize(owner, t) == 0  # still the owner's, untouched
    owner.close()


def test_malformed_attribute_calls_get_cudnn_statuses(daemon) -> None:
    c = _client(daemon)
    assert create(c, 999)[0] == dnn.STATUS_BAD_PARAM
    assert create(c, dnn.VARIANT_PACK)[0] == dnn.STATUS_NOT_SUPPORTED  # travel with executions
    _, t = create(c, dnn.TENSOR)
    dims = struct.pack("<4q", 1, 1, 4, 4)
    assert set_attr(c, t, dnn.ATTR_TENSOR_DIMENSIONS, dnn.TYPE_INT64, 5, dims) == \
        dnn.STATUS_BAD_PARAM  # 5 elements in 32 bytes
    assert set_attr(c, t, dnn.ATTR_TENSOR_DIMENSIONS, 99, 4, dims) == \
        dnn.STATUS_BAD_PARAM_ATTRIBUTE_TYPE
    assert set_attr(c, t, 1001, dnn.TYPE_VOID_PTR, 1, struct.pack("<Q", 0x1000)) == \
        dnn.STATUS_NOT_SUPPORTED  # device pointers only in variant packs
    assert set_attr(c, t, dnn.ATTR_TENSOR_UNIQUE_ID, dnn.TYPE_BACKEND_DESCRIPTOR, 1,
                    struct.pack("<Q", 0xdead)) == dnn.STATUS_BAD_PARAM  # no such descriptor
    assert _lib(c, lib.PILOT_OP_DNN_DESC_GET,
                body("pilot_req_dnn_attr", desc=t, attr=dnn.ATTR_TENSOR_UNIQUE_ID,
                     type=dnn.TYPE_INT64, count=-1))[0] == dnn.STATUS_BAD_PARAM
    assert _lib(c, lib.PILOT_OP_DNN_DESC_DESTROY, body("pilot_req_handle", handle=t))[0] == 0
    assert finalize(c, t) == dnn.STATUS_BAD_PARAM  # destroyed
    c.close()


def test_an_execution_of_a_foreign_or_unknown_plan_fails_the_next_synchronize(daemon) -> None:
    c = _client(daemon)
    h = handle(c)
    _, t = create(c, dnn.TENSOR)
    ptr = c.malloc(4096)
    for plan in (0xdead, t):  # unknown; not a plan
        c.send(lib.PILOT_OP_DNN_EXECUTE,
               body("pilot_req_dnn_execute", handle=h, plan=plan, count=1),
               struct.pack("<qQ", 1, ptr), flags=lib.PILOT_F_NO_REPLY)
        assert c.call(lib.PILOT_OP_DEVICE_SYNCHRONIZE, b"").deferred == 1  # cudaErrorInvalidValue
        assert c.call(lib.PILOT_OP_DEVICE_SYNCHRONIZE, b"").deferred == 0
    c.close()
