"""cuGetExportTable of libpilot-cuda.so (shim/driver/drv_export.c), called as a static runtime calls it:
by UUID, then through the table's entries. Run in a child process (the library is loaded
there)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from pilot.shim import driver_path

CHILD = textwrap.dedent("""
    import ctypes, sys, uuid
    lib = ctypes.CDLL(sys.argv[1])
    lib.cuGetExportTable.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p]

    def table(text):
        out = ctypes.c_void_p()
        err = lib.cuGetExportTable(ctypes.byref(out), uuid.UUID(text).bytes)
        return err, (ctypes.cast(out, ctypes.POINTER(ctypes.c_void_p)) if out.value else None)

    err, cudart = table("6bd5fb6c-5bf4-e74a-8987-d93912fd9df9")
    print("cudart", err, cudart[0])  # the size word: 13 entries of 8 bytes
    err, storage = table("c693336e-1121-df11-a8c3-68f355d89593")
    proto = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                             ctypes.c_void_p)
    put = proto(storage[0])
    delete = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(storage[1])
    get = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p,
                           ctypes.c_void_p)(storage[2])
    ctx, other, key = 0x1000, 0x2000, 0x77
    value = ctypes.c_void_p()
    print("get missing", get(ctypes.byref(value), ctx, key))
    print("put", put(ctx, key, 0xABC, None), put(other, key, 0xDEF, None), put(ctx, key, 0x123, None))
    print("get", get(ctypes.byref(value), ctx, key), hex(value.value),
          get(ctypes.byref(value), other, key), hex(value.value))
    print("delete", delete(ctx, key), delete(ctx, key), get(ctypes.byref(value), ctx, key))
    err, checks = table("263e8860-7cd2-6143-92f6-bbd5006dfa7e")
    flags = ctypes.c_uint32(7)
    check = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint32),
                             ctypes.c_void_p)(checks[2])
    print("check", check(ctx, ctypes.byref(flags), None), flags.value)
    unknown = ctypes.CFUNCTYPE(ctypes.c_int)(cudart[3])
    print("unknown entry", unknown(), unknown())
    err, _ = table("d4082055-bde6-704b-8d34-ba123c66e1f2")
    err, integrity = table("d4082055-bde6-704b-8d34-ba123c66e1f2")
    result = (ctypes.c_uint64 * 2)()
    fn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_void_p)
    print("integrity", err, fn(integrity[1])(13002, 1, result), fn(integrity[1])(13002, 1, result))
    print("no such table", table("00000000-0000-0000-0000-000000000001")[0],
          table("00000000-0000-0000-0000-000000000001")[0])
    print("null", lib.cuGetExportTable(None, uuid.UUID(int=1).bytes))
    print("nvml's", table("69a28e9f-2449-8b47-b030-c5da330ea4e9")[0])
""")


def test_private_tables_as_a_static_runtime_uses_them() -> None:
    res = subprocess.run([sys.executable, "-c", CHILD, str(driver_path())], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [
        "cudart 0 104",
        "get missing 400",  # CUDA_ERROR_INVALID_HANDLE
        "put 0 0 0",
        "get 0 0x123 0 0xdef",  # per context; a second put replaces the value
        "delete 0 400 400",
        "check 0 0",
        "unknown entry 801 801",  # CUDA_ERROR_NOT_SUPPORTED, said once
        "integrity 0 801 801",  # the table exists; the check is refused, said once
        "no such table 801 801",
        "null 1",
        "nvml's 801",  # refused, and said nowhere: NVML works without it
    ], res.stdout + res.stderr
    err = res.stderr
    assert err.count("private entry CUDART_INTERFACE[3]") == 1, err
    assert err.count("asked for the NVIDIA driver's integrity check") == 1, err
    assert err.count("private table 00000000-0000-0000-0000-000000000001") == 1, err
    assert "69a28e9f" not in err, err
