"""NVIDIA's cuDNN 9, called through ctypes in pilotd's own CUDA context (the cuda backend's half
of backends/dnn.py).

libcudnn.so.9 is found as cuBLAS is (PILOT_LIBRARY_PATH, the loader, the toolkit, Python
packages: nvidia-cudnn-cu13 is what PyTorch installs); its sub-libraries carry a static CUDA
runtime, which works here because pilotd runs on the real libcuda. Handles are pooled per
device (creating one allocates device memory). Variant packs are built here from the checked
tensors and kept, keyed by their contents: a training loop executes the same plans on the same
buffers (PyTorch's caching allocator hands the same addresses back) step after step.
"""

from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from pilot.daemon.backends.cublas import load_library
from pilot.daemon.backends.dnn import (
    ATTR_VARIANT_PACK_DATA_POINTERS,
    ATTR_VARIANT_PACK_UNIQUE_IDS,
    ATTR_VARIANT_PACK_WORKSPACE,
    BN_BACKWARD,
    BN_BACKWARD_EX,
    BN_FORWARD_INFERENCE,
    BN_FORWARD_TRAINING,
    BN_FORWARD_TRAINING_EX,
    BN_SIZE_BACKWARD_WORKSPACE,
    BN_SIZE_FORWARD_WORKSPACE,
    BN_SIZE_RESERVE,
    DATA_DOUBLE,
    STATUS_BAD_PARAM,
    STATUS_NOT_INITIALIZED,
    STATUS_SUCCESS,
    TYPE_BACKEND_DESCRIPTOR,
    TYPE_HANDLE,
    TYPE_INT64,
    TYPE_VOID_PTR,
    VARIANT_PACK,
    BatchNormCall,
    DnnError,
    TensorDesc,
    attribute_size,
)
from pilot.daemon.backends.libraries import LibraryError

SONAME = "libcudnn.so.9"
POOL_MAX = 8        # idle handles kept per device
PACKS_MAX = 4096    # variant packs kept
TENSORS_MAX = 512   # legacy tensor descriptors kept

_vp, _i, _i64, _sz, _d = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_size_t, ctypes.c_double
_pvp, _pi64, _psz = ctypes.POINTER(_vp), ctypes.POINTER(_i64), ctypes.POINTER(_sz)
_SIGNATURES: dict[str, list[Any]] = {
    "cudnnCreate": [_pvp], "cudnnDestroy": [_vp], "cudnnSetStream": [_vp, _vp],
    "cudnnBackendCreateDescriptor": [_i, _pvp], "cudnnBackendDestroyDescriptor": [_vp],
    "cudnnBackendSetAttribute": [_vp, _i, _i, _i64, _vp],
    "cudnnBackendGetAttribute": [_vp, _i, _i, _i64, _pi64, _vp],
    "cudnnBackendFinalize": [_vp], "cudnnBackendExecute": [_vp, _vp, _vp],
    "cudnnCreateTensorDescriptor": [_pvp], "cudnnDestroyTensorDescriptor": [_vp],
    "cudnnSetTensorNdDescriptor": [_vp, _i, _i, ctypes.POINTER(_i), ctypes.POINTER(_i)],
    "cudnnBatchNormalizationForwardTrainingEx": [
        _vp, _i, _i, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _d, _vp, _vp, _d,
        _vp, _vp, _vp, _vp, _sz, _vp, _sz],
    "cudnnBatchNormalizationForwardTraining": [
        _vp, _i, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _d, _vp, _vp, _d, _vp, _vp],
    "cudnnBatchNormalizationForwardInference": [
        _vp, _i, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _d],
    "cudnnBatchNormalizationBackwardEx": [
        _vp, _i, _i, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp,
        _vp, _vp, _vp, _vp, _d, _vp, _vp, _vp, _vp, _sz, _vp, _sz],
    "cudnnBatchNormalizationBackward": [
        _vp, _i, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _d, _vp,
        _vp],
    "cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize": [
        _vp, _i, _i, _vp, _vp, _vp, _vp, _vp, _psz],
    "cudnnGetBatchNormalizationTrainingExReserveSpaceSize": [_vp, _i, _i, _vp, _vp, _psz],
    "cudnnGetBatchNormalizationBackwardExWorkspaceSize": [
        _vp, _i, _i, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _psz],
}


@dataclass
class DnnHandle:
    device: int
    ptr: int
    stream: int | None = None


# enum pilot_fast_libfn (daemon/native/fast_launch.h): what an execution in C calls
_FAST_DNN = {21: "cudnnSetStream", 22: "cudnnBackendCreateDescriptor", 23: "cudnnBackendSetAttribute",
             24: "cudnnBackendFinalize", 25: "cudnnBackendExecute", 26: "cudnnBackendDestroyDescriptor",
             27: "cudnnCreateTensorDescriptor", 28: "cudnnSetTensorNdDescriptor",
             29: "cudnnDestroyTensorDescriptor", 30: "cudnnBatchNormalizationForwardTrainingEx",
             31: "cudnnBatchNormalizationBackwardEx"}


class CudaDnn:
    """The loaded library, its handle pools, variant packs and legacy tensor descriptors."""

    def __init__(self) -> None:
        self._lib: ctypes.CDLL | None = None
        self._fns: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._pool: dict[int, list[int]] = {}
        self._packs: OrderedDict[tuple[Any, ...], int] = OrderedDict()
        self._tensors: OrderedDict[TensorDesc, int] = OrderedDict()

    def _fn(self, name: str) -> Any:
        fn = self._fns.get(name)
        if fn is None:
            with self._lock:
                if self._lib is None:
                    try:
                        self._lib = load_library(SONAME)
                    except LibraryError as exc:
                        raise DnnError(STATUS_NOT_INITIALIZED, exc.detail) from None
                fn = getattr(self._lib, name)
                if name in ("cudnnGetVersion", "cudnnGetCudartVersion"):
                    fn.argtypes, fn.restype = [], ctypes.c_size_t
                else:
                    fn.argtypes, fn.restype = _SIGNATURES[name], ctypes.c_int
                self._fns[name] = fn
        return fn

    def _call(self, name: str, *args: Any) -> None:
        status = self._fn(name)(*args)
        if status != STATUS_SUCCESS:
            raise DnnError(status, name)

    def version(self) -> tuple[int, int]:
        return int(self._fn("cudnnGetVersion")()), int(self._fn("cudnnGetCudartVersion")())

    def fast_functions(self) -> dict[int, int]:
        """cuDNN's functions fast_library.c calls (enum pilot_fast_libfn), once it is loaded."""
        if self._lib is None:
            return {}
        out = {}
        for index, name in _FAST_DNN.items():
            try:
                out[index] = ctypes.cast(getattr(self._lib, name), ctypes.c_void_p).value or 0
            except AttributeError:
                pass
        return out

    # ---- handles ----

    def create(self, device: int) -> DnnHandle:
        with self._lock:
            idle = self._pool.get(device)
            ptr = idle.pop() if idle else None
        if ptr is None:
            out = ctypes.c_void_p()
            self._call("cudnnCreate", ctypes.byref(out))
            ptr = out.value or 0
        return DnnHandle(device, ptr)

    def release(self, h: DnnHandle) -> None:
        # the program's stream may be destroyed next (the fast path may have set one that
        # h.stream does not know of)
        self._call("cudnnSetStream", h.ptr, None)
        with self._lock:
            idle = self._pool.setdefault(h.device, [])
            if len(idle) < POOL_MAX:
                idle.append(h.ptr)
                h.ptr = 0
        if h.ptr:
            self._call("cudnnDestroy", h.ptr)

    def _on_stream(self, h: DnnHandle, stream: int) -> None:
        if h.stream != stream:
            self._call("cudnnSetStream", h.ptr, stream or None)
            h.stream = stream

    # ---- the backend API ----

    def desc_create(self, dtype: int) -> int:
        out = ctypes.c_void_p()
        self._call("cudnnBackendCreateDescriptor", dtype, ctypes.byref(out))
        return out.value or 0

    def desc_destroy(self, desc: int) -> None:
        self._call("cudnnBackendDestroyDescriptor", desc)

    def desc_set(self, desc: int, attr: int, atype: int, count: int,
                 value: bytes | list[Any]) -> None:
        if isinstance(value, list):
            ptrs = [v.ptr if isinstance(v, DnnHandle) else v for v in value]
            buf: Any = (ctypes.c_void_p * max(1, count))(*ptrs)
        else:
            buf = ctypes.create_string_buffer(value, max(1, len(value)))
        self._call("cudnnBackendSetAttribute", desc, attr, atype, count, buf)

    def desc_get(self, desc: int, attr: int, atype: int, requested: int,
                 descs: list[int] | None) -> tuple[int, bytes]:
        count = ctypes.c_int64(0)
        if atype == TYPE_BACKEND_DESCRIPTOR:
            arr = (ctypes.c_void_p * max(1, requested))(*(descs or []))
            self._call("cudnnBackendGetAttribute", desc, attr, atype, requested,
                       ctypes.byref(count), arr if requested else None)
            return count.value, b""
        if atype in (TYPE_HANDLE, TYPE_VOID_PTR):
            raise DnnError(STATUS_BAD_PARAM, "pointer attributes are not read back")
        size = attribute_size(atype)
        buf = ctypes.create_string_buffer(max(1, requested * size))
        self._call("cudnnBackendGetAttribute", desc, attr, atype, requested, ctypes.byref(count),
                   buf if requested else None)
        return count.value, buf.raw[:min(requested, max(count.value, 0)) * size]

    def desc_finalize(self, desc: int) -> None:
        self._call("cudnnBackendFinalize", desc)

    def _variant_pack(self, uids: list[int], ptrs: list[int], workspace: int) -> int:
        key = (tuple(uids), tuple(ptrs), workspace)
        with self._lock:
            pack = self._packs.get(key)
            if pack is not None:
                self._packs.move_to_end(key)
                return pack
        pack = self.desc_create(VARIANT_PACK)
        try:
            n = len(uids)
            self.desc_set(pack, ATTR_VARIANT_PACK_UNIQUE_IDS, TYPE_INT64, n,
                          b"".join(u.to_bytes(8, "little", signed=True) for u in uids))
            self.desc_set(pack, ATTR_VARIANT_PACK_DATA_POINTERS, TYPE_VOID_PTR, n,
                          b"".join(p.to_bytes(8, "little") for p in ptrs))
            self.desc_set(pack, ATTR_VARIANT_PACK_WORKSPACE, TYPE_VOID_PTR, 1,
                          workspace.to_bytes(8, "little"))
            self.desc_finalize(pack)
        except DnnError:
            self.desc_destroy(pack)
            raise
        evicted = []
        with self._lock:
            self._packs[key] = pack
            while len(self._packs) > PACKS_MAX:
                evicted.append(self._packs.popitem(last=False)[1])
        for old in evicted:  # executions already issued hold what they need
            self.desc_destroy(old)
        return pack

    def execute(self, h: DnnHandle, plan: int, uids: list[int], ptrs: list[int], workspace: int,
                stream: int) -> None:
        pack = self._variant_pack(uids, ptrs, workspace)
        self._on_stream(h, stream)
        self._call("cudnnBackendExecute", h.ptr, plan, pack)

    # ---- batch normalization ----

    def _tensor(self, t: TensorDesc | None) -> int | None:
        if t is None:
            return None
        with self._lock:
            desc = self._tensors.get(t)
            if desc is not None:
                self._tensors.move_to_end(t)
                return desc
        out = ctypes.c_void_p()
        self._call("cudnnCreateTensorDescriptor", ctypes.byref(out))
        n = len(t.dims)
        try:
            self._call("cudnnSetTensorNdDescriptor", out.value, t.dtype, n, (_i * n)(*t.dims),
                       (_i * n)(*t.strides))
        except DnnError:
            self._call("cudnnDestroyTensorDescriptor", out.value)
            raise
        evicted = []
        with self._lock:
            self._tensors[t] = out.value or 0
            while len(self._tensors) > TENSORS_MAX:
                evicted.append(self._tensors.popitem(last=False)[1])
        for old in evicted:
            self._call("cudnnDestroyTensorDescriptor", old)
        return out.value

    def batchnorm(self, h: DnnHandle, c: BatchNormCall, stream: int | None) -> int:
        x, y, dx, bn = self._tensor(c.x), self._tensor(c.y), self._tensor(c.dx), self._tensor(c.bn)
        size = ctypes.c_size_t(0)
        if c.fn == BN_SIZE_FORWARD_WORKSPACE:
            self._call("cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize", h.ptr, c.mode,
                       c.bn_ops, x, None, y, bn, None, ctypes.byref(size))
            return size.value
        if c.fn == BN_SIZE_RESERVE:
            self._call("cudnnGetBatchNormalizationTrainingExReserveSpaceSize", h.ptr, c.mode,
                       c.bn_ops, None, x, ctypes.byref(size))
            return size.value
        if c.fn == BN_SIZE_BACKWARD_WORKSPACE:
            self._call("cudnnGetBatchNormalizationBackwardExWorkspaceSize", h.ptr, c.mode, c.bn_ops,
                       x, None, y, None, dx, bn, None, ctypes.byref(size))
            return size.value
        scalar = ctypes.c_double if c.x.dtype == DATA_DOUBLE else ctypes.c_float
        alpha, beta = scalar(c.alpha), scalar(c.beta)
        alpha_p, beta_p = scalar(c.alpha_param), scalar(c.beta_param)
        a, b, ap, bp = (ctypes.byref(v) for v in (alpha, beta, alpha_p, beta_p))
        self._on_stream(h, stream or 0)
        p = {k: (v or None) for k, v in vars(c).items() if isinstance(v, int)}
        if c.fn == BN_FORWARD_TRAINING_EX:
            self._call("cudnnBatchNormalizationForwardTrainingEx", h.ptr, c.mode, c.bn_ops, a, b,
                       x, p["x_ptr"], None, None, y, p["y_ptr"], bn, p["scale"], p["bias"],
                       c.factor, p["running_mean"], p["running_var"], c.epsilon, p["saved_mean"],
                       p["saved_inv_var"], None, p["workspace"], c.workspace_size, p["reserve"],
                       c.reserve_size)
        elif c.fn == BN_FORWARD_TRAINING:
            self._call("cudnnBatchNormalizationForwardTraining", h.ptr, c.mode, a, b, x,
                       p["x_ptr"], y, p["y_ptr"], bn, p["scale"], p["bias"], c.factor,
                       p["running_mean"], p["running_var"], c.epsilon, p["saved_mean"],
                       p["saved_inv_var"])
        elif c.fn == BN_FORWARD_INFERENCE:
            self._call("cudnnBatchNormalizationForwardInference", h.ptr, c.mode, a, b, x,
                       p["x_ptr"], y, p["y_ptr"], bn, p["scale"], p["bias"], p["running_mean"],
                       p["running_var"], c.epsilon)
        elif c.fn == BN_BACKWARD_EX:
            self._call("cudnnBatchNormalizationBackwardEx", h.ptr, c.mode, c.bn_ops, a, b, ap, bp,
                       x, p["x_ptr"], None, None, y, p["y_ptr"], None, None, dx, p["dx_ptr"], bn,
                       p["scale"], p["bias"], p["dscale"], p["dbias"], c.epsilon,
                       p["saved_mean"], p["saved_inv_var"], None, p["workspace"],
                       c.workspace_size, p["reserve"], c.reserve_size)
        elif c.fn == BN_BACKWARD:
            self._call("cudnnBatchNormalizationBackward", h.ptr, c.mode, a, b, ap, bp, x,
                       p["x_ptr"], y, p["y_ptr"], dx, p["dx_ptr"], bn, p["scale"], p["dscale"],
                       p["dbias"], c.epsilon, p["saved_mean"], p["saved_inv_var"])
        else:
            raise DnnError(STATUS_BAD_PARAM, f"batch normalization function {c.fn}")
        return 0

    def close(self) -> None:
        if self._lib is None:
            return
        with self._lock:
            pools, self._pool = self._pool, {}
            packs, self._packs = list(self._packs.values()), OrderedDict()
            tensors, self._tensors = list(self._tensors.values()), OrderedDict()
        for name, objs in (("cudnnBackendDestroyDescriptor", packs),
                           ("cudnnDestroyTensorDescriptor", tensors),
                           ("cudnnDestroy", [p for ptrs in pools.values() for p in ptrs])):
            for obj in objs:
                try:
                    self._call(name, obj)
                except DnnError:
                    pass
