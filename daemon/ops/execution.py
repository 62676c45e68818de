"""Execution control (chapter 6.8): modules, kernels, launches, function attributes,
occupancy, module variables."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pilot.daemon.backends.base import (
    CUDA_ERROR_INVALID_DEVICE_FUNCTION,
    CUDA_ERROR_INVALID_RESOURCE_HANDLE,
    CUDA_ERROR_INVALID_SYMBOL,
    CUDA_ERROR_INVALID_VALUE,
    BackendError,
    LaunchAttrs,
)
from pilot.daemon.backends.fatbin import may_print, readable_globals, variable_names
from pilot.daemon.ops.registry import OpTable
from pilot.daemon.ops.replies import need_payload, u64
from pilot.daemon.protocol import ffi, lib, new
from pilot.daemon.scheduling import launch as launches
from pilot.daemon.scheduling import streams
from pilot.daemon.sessions.session import Session

if TYPE_CHECKING:
    from pilot.daemon.vgpu.server import VGpu

OPS = OpTable("execution")


def _variable_names(image: bytes) -> set[str]:
    try:
        return variable_names(image)
    except ValueError:
        return set()

@OPS.handler(lib.PILOT_OP_MODULE_LOAD, "pilot_req_module_load")
def module_load(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    """Each load of an image is the session's own module, whose globals (`__device__`,
    `__constant__`, `__managed__` variables) take device memory: charged to the tenant at every
    load, given back when the session ends. The charge is what the backend says the load took
    (the driver chooses the entry it loads, JIT-compiles PTX, decompresses), never less than
    pilot's reader expects; past the quota the module is unloaded and the load refused."""
    need_payload(payload, req.image_size, "module image")
    image = bytes(payload)
    variables = readable_globals(image)
    module = vg.backend.module_load(image)
    try:
        charge = max(variables.size, vg.backend.module_loaded_bytes(module, image))
        vg.broker.allocate(s, "module", charge, lambda: module, ptr_of=lambda _m: 0)
    except BaseException:
        vg.backend.module_unload(module)
        raise
    handle = s.new_handle()
    s.modules[handle] = module
    # zeroed before unload (teardown.py): every readable entry's, PTX declarations included
    s.module_variables[handle] = tuple(sorted(set(variables.variables) | _variable_names(image)))
    s.module_charges[handle] = charge
    if vg.preempt is not None:  # its kernels' preemptible variants, should it be gated
        vg.preempt.module_loaded(s, handle, image)
    if vg.device_output is not None and not vg.device_output.prints(s.id) and may_print(image):
        vg.device_output.printer(s.id)  # whose kernels' printf output it may be
        if vg.fast is not None and s.identity is not None:
            lib.pilot_fast_printer(vg.fast.ptr, s.identity)  # -1 until C meets it: told then
    return u64(handle)

@OPS.handler(lib.PILOT_OP_MODULE_UNLOAD, "pilot_req_handle", synchronizing=True)
def module_unload(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    """cuModuleUnload (the driver API library): the session's work is finished first (the
    module's code and variables may be in use), its variables are zeroed (teardown.py says why)
    and its functions forgotten; its charge goes back to the tenant."""
    module = s.modules.get(req.handle)
    if module is None:
        raise BackendError(CUDA_ERROR_INVALID_RESOURCE_HANDLE, f"no module {req.handle:#x}")
    streams.synchronize_session(vg, s)
    s.forget_module_symbols(req.handle)
    s.zero_module_globals(vg.backend, req.handle, module, s.legacy or vg.stream)
    del s.modules[req.handle]
    for handle in [h for h, f in s.functions.items() if f.module_handle == req.handle]:
        del s.functions[handle]
    vg.backend.module_unload(module)
    vg.broker.release(s, "module", s.module_charges.pop(req.handle, 0))
    if vg.preempt is not None:
        vg.preempt.module_unloaded(s, req.handle)

@OPS.handler(lib.PILOT_OP_FUNCTION_GET, "pilot_req_function_get")
def function_get(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    module = s.modules.get(req.module)
    if module is None:
        raise BackendError(CUDA_ERROR_INVALID_RESOURCE_HANDLE, f"no module {req.module:#x}")
    name = bytes(payload).decode(errors="strict")
    info = vg.backend.function_get(module, name)
    if len(info.params) > lib.PILOT_MAX_PARAMS:
        raise BackendError(CUDA_ERROR_INVALID_VALUE, f"{name}: {len(info.params)} parameters")
    info.name = name
    info.module_handle = req.module
    handle = s.new_handle()
    s.functions[handle] = info
    rep = new("pilot_rep_function")
    rep.function = handle
    rep.nparams = len(info.params)
    rep.arg_bytes = info.arg_bytes
    rep.max_threads_per_block = info.max_threads_per_block
    rep.static_shared_bytes = info.static_shared_bytes
    rep.max_dynamic_shared_bytes = info.max_dynamic_shared_bytes
    params = ffi.new("pilot_param_info[]", max(1, len(info.params)))
    for i, (offset, size) in enumerate(info.params):
        params[i].offset, params[i].size = offset, size
    return rep, ffi.buffer(params, ffi.sizeof("pilot_param_info") * len(info.params))[:]

@OPS.handler(lib.PILOT_OP_LAUNCH, "pilot_req_launch")
def launch(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    """<<<>>> and cudaLaunchKernel (posted): the one launch path (scheduling/launch.py)."""
    g, b = req.grid, req.block
    launches.submit(vg, s, req.function, (g[0], g[1], g[2]), (b[0], b[1], b[2]), req.shared_bytes,
                    req.stream, payload)

@OPS.handler(lib.PILOT_OP_LAUNCH_EX, "pilot_req_launch_ex")
def launch_ex(vg: VGpu, s: Session, req: Any, payload: memoryview) -> None:
    """cudaLaunchKernelExC and cudaLaunchCooperativeKernel (shim/runtime/launch/api_launch_ex.c): the shim has
    parsed the program's attributes and refused those pilot does not carry; what arrives is
    cooperative or not, an optional cluster shape and scheduling preference, and an optional
    priority. Cooperative and cluster launches come as calls, not posts, because only the device
    knows whether it can run them (cudaErrorCooperativeLaunchTooLarge and the cluster errors are
    returned by the launch itself, natively too). Then the same path as every launch."""
    base = req.launch
    cluster = tuple(req.cluster)
    attrs = LaunchAttrs(cooperative=bool(req.cooperative),
                        cluster=(cluster[0], cluster[1], cluster[2]) if any(cluster) else None,
                        cluster_policy=req.cluster_policy,
                        priority=req.priority if req.has_priority else None)
    g, b = base.grid, base.block
    launches.submit(vg, s, base.function, (g[0], g[1], g[2]), (b[0], b[1], b[2]), base.shared_bytes,
                    base.stream, payload, attrs)

@OPS.handler(lib.PILOT_OP_SYMBOL_GET, "pilot_req_symbol_get")
def symbol_get(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    """Address and size of a variable of one of the session's modules, which become memory the
    session may copy to and from (the shim then copies at address + offset)."""
    module = s.modules.get(req.module)
    if module is None:
        raise BackendError(CUDA_ERROR_INVALID_RESOURCE_HANDLE, f"no module {req.module:#x}")
    try:
        name = bytes(payload).decode()
    except UnicodeDecodeError:
        name = ""
    if not name or "\0" in name or len(name) > 4096:
        raise BackendError(CUDA_ERROR_INVALID_SYMBOL, f"bad variable name {bytes(payload)[:64]!r}")
    address, size = vg.backend.module_get_global(module, name)
    s.add_symbol(req.module, address, size)
    return u64(address, size)

def _function(s: Session, handle: int) -> Any:
    info = s.functions.get(handle)
    if info is None:
        raise BackendError(CUDA_ERROR_INVALID_DEVICE_FUNCTION, f"no function {handle:#x}")
    return info

def _func_attrs(vg: VGpu, info: Any) -> Any:
    values = vg.backend.function_attributes(info.handle)
    rep = new("pilot_rep_func_attrs")
    for i, value in enumerate(values[: lib.PILOT_FUNC_ATTR_COUNT]):
        rep.values[i] = value
    info.max_dynamic_shared_bytes = values[8]  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    return rep

@OPS.handler(lib.PILOT_OP_FUNC_GET_ATTRIBUTES, "pilot_req_handle")
def func_get_attributes(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    return _func_attrs(vg, _function(s, req.handle))

@OPS.handler(lib.PILOT_OP_FUNC_SET_ATTRIBUTE, "pilot_req_func_attr")
def func_set_attribute(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    """On the session's own CUfunction (each session loads its own modules), so no other
    tenant's kernels change."""
    info = _function(s, req.function)
    vg.backend.function_set_attribute(info.handle, req.attr, req.value)
    return _func_attrs(vg, info)

@OPS.handler(lib.PILOT_OP_OCCUPANCY, "pilot_req_occupancy")
def occupancy(vg: VGpu, s: Session, req: Any, payload: memoryview) -> Any:
    info = _function(s, req.function)
    if req.flags & lib.PILOT_OCCUPANCY_AVAILABLE_SMEM:
        if req.flags != lib.PILOT_OCCUPANCY_AVAILABLE_SMEM or req.dynamic_smem > 1 << 31:
            raise BackendError(CUDA_ERROR_INVALID_VALUE, f"occupancy flags {req.flags:#x}")
        return u64(vg.backend.available_dynamic_smem(info.handle, req.dynamic_smem, req.block_size))
    return u64(vg.backend.occupancy(info.handle, req.block_size, req.dynamic_smem, req.flags))
