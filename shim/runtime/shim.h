/* Internal interface between the shim's modules. Nothing here is exported (-fvisibility=hidden
 * plus the version script); the exported CUDA entry points live in api_*.c. */
#ifndef PILOT_SHIM_H
#define PILOT_SHIM_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "pilot_proto.h"

#define PILOT_EXPORT __attribute__((visibility("default")))

/* ---- transport.c: the session with pilotd ---- */

/* Opens the session if needed (HELLO on the main socket, ATTACH on the vGPU socket, device info).
 * Returns cudaSuccess or the error every call gets while the daemon cannot be reached. */
cudaError_t pilot_ensure_session(void);
/* pilot_ensure_session for entry points: also runs, once, the hooks registered to act when the
 * session is up (pilot_on_session_ready; each runs on the thread of that entry point). */
cudaError_t pilot_enter_session(void);
void pilot_on_session_ready(void (*hook)(void));
/* From now on every call of the calling thread that needs the session fails with
 * cudaErrorNotPermitted (the callback thread: a host callback may not call CUDA). */
void pilot_refuse_thread_calls(void);

/* A session spans devices: one part (connection) per device the program uses, joined on first
 * use (DEVICE_JOIN). pilot_call/pilot_post go to the calling thread's route: its current device,
 * unless a pilot_route_begin() scope names the device a pointer, stream or event is on. */
int pilot_device_count(void);               /* devices the daemon offers (after the session) */
int pilot_current_device(void);             /* the calling thread's (cudaSetDevice) */
void pilot_set_current_device(int device); /* cudaSetDevice, once the device's part is joined */
int pilot_route_device(void);
int pilot_route_begin(int device);          /* returns the previous route for pilot_route_end */
void pilot_route_end(int previous);
cudaError_t pilot_ensure_device(int device); /* joins the device's part now */
uint64_t pilot_session_id(void);
const char *pilot_callbacks_endpoint(void); /* the daemon's host-callback socket */

/* One synchronous call: sends the request (and an optional payload), waits for the reply,
 * copies its body into rep (rep_len bytes; shorter bodies are zero-filled) and its payload into
 * out/out_cap (*out_len gets the payload length; NULL if none wanted). Returns the call's error:
 * the reply's err, else an asynchronous error it delivered, else cudaSuccess. */
cudaError_t pilot_call(uint16_t op, const void *req, size_t req_len, const void *payload,
                       size_t payload_len, void *rep, size_t rep_len, void *out, size_t out_cap,
                       size_t *out_len);

/* Asynchronous call: sent, no reply; errors come back with a later synchronizing reply. */
cudaError_t pilot_post(uint16_t op, const void *req, size_t req_len, const void *payload,
                       size_t payload_len);
/* The same on the part of an explicit device. */
cudaError_t pilot_call_on(int device, uint16_t op, const void *req, size_t req_len,
                          const void *payload, size_t payload_len, void *rep, size_t rep_len,
                          void *out, size_t out_cap, size_t *out_len);
cudaError_t pilot_post_on(int device, uint16_t op, const void *req, size_t req_len,
                          const void *payload, size_t payload_len);

/* Recording (graph_remote.c): while a thread records, the posted calls it makes on `device`
 * are appended to the recording (a pilot_graph_record each, then its request and payload, padded
 * to 8 bytes) instead of being sent; any other call (one that waits for an answer, or another
 * device's) is not made and fails the recording. */
struct pilot_recording {
    int device;
    unsigned char *buf;
    size_t len, cap;
    uint32_t count;
    int failed;
};
void pilot_record_begin(struct pilot_recording *r);
void pilot_record_end(void);

/* For pipelined transfers: hold the connection across several sends and receives. */
cudaError_t pilot_lock_session(void);
void pilot_unlock_session(void);
cudaError_t pilot_send_locked(uint16_t op, uint32_t flags, const void *req, size_t req_len,
                              const void *payload, size_t payload_len);
cudaError_t pilot_recv_locked(void *rep, size_t rep_len);

/* The unified-memory fault channel (a second connection of the session's part 0): opened outside
 * any fault, then used by the fault handler only. pilot_fault_call returns the reply's err. */
cudaError_t pilot_fault_channel_open(void);
cudaError_t pilot_fault_call(uint16_t op, const void *req, size_t req_len);
/* A staging area: shared memory the daemon pins, cut into slots, mapped from its STAGING_OPEN
 * reply (each part's by staging.c, the fault channel's by transport.c). */
struct pilot_staging {
    uint8_t *base;
    uint64_t slot_bytes;
    uint32_t slots;
};
cudaError_t pilot_staging_map(const pilot_rep_staging *rep, struct pilot_staging *out);
void pilot_staging_unmap(struct pilot_staging *stage);
/* The fault channel's staging area (mapped when the channel opens), for SHADOW_FETCH. */
const struct pilot_staging *pilot_fault_staging(void);
/* Host to device through the route device's staging area with op (a _STAGED-style opcode taking
 * pilot_req_memcpy {dst, count, slot, sync}), pipelined over its slots; returns once every piece
 * was answered. */
cudaError_t pilot_staged_upload(uint16_t op, uint64_t dst, const void *src, uint64_t count);
/* Opens the route device's staging area now, if it is not open yet (staging.c). */
cudaError_t pilot_staging_ready(void);
/* The copies of api_memory.c through the staging area (staging.c): host to device with op, and
 * device to host, on stream (sync: wait for it), pipelined over the slots. */
cudaError_t pilot_staged_h2d(uint16_t op, uint64_t dst, const uint8_t *src, uint64_t count,
                            uint64_t stream, uint32_t sync);
cudaError_t pilot_staged_d2h(uint8_t *dst, uint64_t src, uint64_t count, uint64_t stream,
                            uint32_t sync);

/* What the daemon says about a device (fetched once); NULL without a session. */
const pilot_rep_device_info *pilot_device_info(void); /* of the route device */
const pilot_rep_device_info *pilot_device_info_of(int device);

/* ---- error_state.c: CUDA's error state ---- */
cudaError_t pilot_set_error(cudaError_t err); /* records err as the thread's last error */
cudaError_t pilot_last_error_swap(cudaError_t err); /* sets the thread's last error, returns the old */
cudaError_t pilot_sticky_error(void);         /* the process's sticky error, or cudaSuccess */
/* The driver API library around its runtime calls (error_state.c, driver_ops.h). */
cudaError_t pilot_driver_begin(void);
void pilot_driver_end(cudaError_t saved);
void pilot_runtime_call(void);  /* a runtime entry point ran on this thread (not the driver's) */
int pilot_runtime_bound(void);  /* 1: this thread used the runtime; 2: some thread did */
void pilot_note_async_error(cudaError_t err);  /* an error delivered from an earlier async call */
int pilot_error_is_sticky(cudaError_t err);
#define PILOT_RETURN(expr) return pilot_set_error(expr)
/* Fails fast with the sticky error, or with the connection error. */
#define PILOT_REQUIRE_SESSION()                              \
    do {                                                     \
        cudaError_t e_ = pilot_sticky_error();               \
        pilot_runtime_call();                                \
        if (e_ == cudaSuccess)                               \
            e_ = pilot_enter_session();                      \
        if (e_ != cudaSuccess)                               \
            return pilot_set_error(e_);                      \
    } while (0)

/* ---- api_mempool.c: the stream-ordered allocator ---- */
void pilot_mempool_forget(uint64_t ptr); /* freed: no longer counted in its pool (a hook) */

/* ---- alloc_table.c: the session's device allocations, mirrored ---- */
/* The index of the last of `count` items, `stride` bytes each and sorted by a leading uint64_t
 * base, whose base <= key; -1 if none. The shim's range tables (allocations, shadows, pinned
 * ranges) all search with it. */
long pilot_find_le(const void *items, size_t count, size_t stride, uint64_t key);
void pilot_alloc_add(uint64_t base, uint64_t size);
int pilot_alloc_remove(uint64_t base); /* 0 if base was an allocation's start */
/* 1 if [ptr, ptr+count) lies inside one device allocation. */
int pilot_alloc_contains(uint64_t ptr, uint64_t count);
int pilot_alloc_is_device(uint64_t ptr);
/* Ranges are recorded on the route device; the device ptr is on, or -1 if it is no range. */
int pilot_alloc_device(uint64_t ptr);
/* The device whose part serves calls on ptr: the one it is on, as with UVA, else the current one. */
int pilot_alloc_owner(uint64_t ptr);
/* Streams pilotd accepted a cudaMallocAsync on and that still exist (stream_handles.c): a
 * cudaFreeAsync on one is posted (api_memory.c); a destroyed one is forgotten. */
int pilot_stream_known(uint64_t stream);
void pilot_stream_accepted(uint64_t stream);
void pilot_stream_forget(uint64_t stream);
/* A module global's range (api_symbols.c): copies may use it, cudaFree refuses it. */
void pilot_alloc_add_symbol(uint64_t base, uint64_t size);
int pilot_alloc_is_symbol(uint64_t ptr);
void pilot_alloc_clear_symbols(void);
#define PILOT_ALLOC_SYMBOL 1  /* a module global: cudaFree refuses it */
#define PILOT_ALLOC_MANAGED 2 /* managed memory: the host may touch it too */
#define PILOT_ALLOC_PACKED 4  /* a range small managed allocations are packed into (um_pack.c) */
#define PILOT_ALLOC_IMPORTED 8 /* opened through CUDA IPC (api_ipc.c): closed, never freed */
void pilot_alloc_add_flags(uint64_t base, uint64_t size, int flags);
/* The flags of the range holding ptr (its base and size too), or -1 if none does. */
int pilot_alloc_flags(uint64_t ptr, uint64_t *base, uint64_t *size);
int pilot_alloc_is_managed(uint64_t ptr);

/* ---- coherence.c: unified-memory shadows (see the comment at its top) ---- */
uint64_t pilot_um_chunk_bytes(void);
int pilot_um_install_handler(void);
/* A shadow mapped at [base, base+len): valid (CLEAN, readable) or INVALID (fetch on access). */
#define PILOT_UM_ALLOCATION 0
#define PILOT_UM_VARIABLE 1
int pilot_um_add(uint64_t base, uint64_t len, int valid, int kind);
int pilot_um_remove(uint64_t base); /* unmaps it too */
int pilot_um_active(void); /* any shadow exists: the one check hot paths make without managed memory */
int pilot_um_contains(uint64_t addr);
/* The first unmapped stretch [start, *gap_end) of [from, to) (start == *gap_end: none). */
uint64_t pilot_um_next_gap(uint64_t from, uint64_t to, uint64_t *gap_end);
cudaError_t pilot_um_flush(void);         /* before device work that reads managed memory */
cudaError_t pilot_um_before_launch(void); /* flush, then invalidate every shadow */
/* After a copy or memset into managed memory that returned err: what it wrote is fetched again
 * when the host touches it, and a synchronous one waits for its stream (coherence.c). */
cudaError_t pilot_um_device_wrote(uint64_t ptr, uint64_t count, uint64_t stream, int sync,
                                  cudaError_t err);
/* Maps a shadow of the daemon's managed range at [base, base+len) and attaches it. *taken is set
 * when the address is in use in this process (the caller may try another one). */
cudaError_t pilot_um_map_shadow(uint64_t base, uint64_t len, int valid, int kind, int *taken);
/* Device work that may write managed memory sent so far (launches, copies and memsets into it):
 * a count that changes whenever some is sent. */
uint64_t pilot_um_device_work(void);

/* ---- um_range.c: managed ranges of the daemon, shadowed ---- */
/* A managed range of size bytes from the daemon (flags: PILOT_MANAGED_*), shadowed here. */
cudaError_t pilot_um_new_range(uint64_t size, uint32_t flags, uint64_t *base);
/* Frees the range at base in the daemon (on the part of `device`) and unmaps its shadow. */
void pilot_um_release_range(uint64_t base, int device);

/* ---- um_pack.c: small managed allocations packed into ranges of the session's ---- */
#define PILOT_UM_PACK_MAX (64u << 10) /* cudaMallocManaged of at most this many bytes is packed */
#define PILOT_UM_PACK_ALIGN 512u      /* pieces start this many bytes apart, as on the H100 */
int pilot_um_pack_wanted(size_t size, unsigned int flags);
cudaError_t pilot_um_pack_alloc(size_t size, void **ptr);
/* cudaFree of ptr, inside the packed range at range_base: cudaErrorInvalidValue unless ptr is
 * the start of a live piece. */
cudaError_t pilot_um_pack_free(uint64_t ptr, uint64_t range_base);
/* The live piece holding ptr inside the packed range at range_base: its start and the bytes
 * asked for; -1 if no piece holds ptr. */
int pilot_um_pack_piece(uint64_t ptr, uint64_t range_base, uint64_t *base, uint64_t *size);
void pilot_um_pack_forget(int device); /* cudaDeviceReset, a hook (-1: every device's) */

/* ---- registry.c: fatbins and kernels registered by the program ---- */
struct pilot_kernel;
struct pilot_kernel *pilot_kernel_from_host(const void *host_fun);
struct pilot_kernel *pilot_kernel_from_handle(const void *handle); /* a cudaKernel_t we issued */
/* Loads the kernel's image on device dev and fetches its function there (and its parameter
 * layout) on first use. The device is the caller's to look up (pilot_route_device()), once. */
cudaError_t pilot_kernel_resolve(struct pilot_kernel *k, int dev);
struct pilot_image;
/* The image's daemon module handle, loading the image (MODULE_LOAD) on first use. */
cudaError_t pilot_image_module(struct pilot_image *img, uint64_t *module);
/* Modules of the driver API (registry.c): an image copied and loaded now on device dev, its
 * validity, its unloading (MODULE_UNLOAD on every device it was loaded on), its functions (one
 * kernel per name, a handle pilot_kernel_from_handle knows) and its variables (range mirrored). */
cudaError_t pilot_module_load_image(const void *data, size_t size, int dev, struct pilot_image **out);
int pilot_module_valid(const struct pilot_image *img);
cudaError_t pilot_module_unload(struct pilot_image *img);
cudaError_t pilot_module_function(struct pilot_image *img, const char *name, int dev,
                                  struct pilot_kernel **out);
cudaError_t pilot_module_global(struct pilot_image *img, const char *name, int dev,
                                uint64_t *ptr, uint64_t *size);
struct pilot_image *pilot_kernel_image(const struct pilot_kernel *k);

/* ---- api_symbols.c: __device__ and __constant__ variables ---- */

struct pilot_kernel_launch_info {
    uint64_t function;
    uint32_t nparams;
    uint32_t arg_bytes;
    const pilot_param_info *params;
    int32_t max_threads_per_block;
    int32_t max_dynamic_shared_bytes;
};
/* What a launch on device dev needs of a resolved kernel. */
void pilot_kernel_info(const struct pilot_kernel *k, int dev, struct pilot_kernel_launch_info *out);
/* The kernel's (mangled) device name, as the fatbin registered it. */
const char *pilot_kernel_name(const struct pilot_kernel *k);
/* cudaFuncSetAttribute / cudaFuncGetAttributes (api_misc.c): the daemon's current limit. */
void pilot_kernel_set_max_dynamic_shared(struct pilot_kernel *k, int32_t bytes);
/* cudaFuncSetAttribute values already set on the kernel's function handle on the current
 * device: setting the same value again needs no call to the daemon (frameworks set the dynamic
 * shared memory maximum before every launch of some kernels). */
#define PILOT_KERNEL_ATTRS 32
int pilot_kernel_attr_is(struct pilot_kernel *k, uint64_t function, int attr, int32_t value);
void pilot_kernel_attr_set(struct pilot_kernel *k, uint64_t function, int attr, int32_t value);
/* The daemon's occupancy answers for the kernel's function handle on the current device, kept
 * until an attribute of it changes (frameworks ask the same question every step). */
#define PILOT_OCCUPANCY_CACHE 8
int pilot_kernel_occupancy(struct pilot_kernel *k, uint64_t function, int32_t block_size,
                           uint64_t value, uint32_t flags, uint64_t *result);
void pilot_kernel_occupancy_answer(struct pilot_kernel *k, uint64_t function, int32_t block_size,
                                   uint64_t value, uint32_t flags, uint64_t result);

/* ---- parallel_copy.c ---- */
void pilot_copy(void *dst, const void *src, size_t len); /* memcpy, on two threads when large */

/* ---- api_memory.c ---- */
/* cudaMemcpy's checks and transports for an already resolved range (stream: daemon handle);
 * routed to the stream's device, else to the device the memory is on. */
cudaError_t pilot_memcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                         uint64_t stream, int sync);
cudaError_t pilot_memset(void *ptr, int value, size_t count, uint64_t stream, int sync);
/* The same in elements of 1, 2 or 4 bytes (cuMemsetD8/D16/D32). */
cudaError_t pilot_memset_elems(void *ptr, uint32_t value, uint32_t elem_size, size_t count,
                               uint64_t stream, int sync);
/* The device a copy or memset runs on: the stream's if one is named, else the memory's. */
int pilot_memory_route(uint64_t stream, const void *a, const void *b);

/* ---- api_misc.c, api_symbols.c: the same for 2D memory and symbols (api_ptds.c) ---- */
cudaError_t pilot_copy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                          size_t height, enum cudaMemcpyKind kind, uint64_t stream, int sync);
cudaError_t pilot_set_2d(void *ptr, size_t pitch, int value, size_t width, size_t height,
                         uint64_t stream, int sync);
cudaError_t pilot_to_symbol(const void *symbol, const void *src, size_t count, size_t offset,
                            enum cudaMemcpyKind kind, uint64_t stream, int sync);
cudaError_t pilot_from_symbol(void *dst, const void *symbol, size_t count, size_t offset,
                              enum cudaMemcpyKind kind, uint64_t stream, int sync);

/* ---- api_array.c: CUDA arrays and copies with an array endpoint ---- */
struct pilot_array_info {          /* what the shim knows of one of the process's arrays */
    uint64_t handle;
    int device;
    uint32_t elem;                 /* bytes per element */
    uint64_t width, height, depth; /* elements, rows, slices (0 in the extent counts as 1) */
    unsigned int flags;
    struct cudaChannelFormatDesc desc;
};
int pilot_array_info(const void *array, struct pilot_array_info *out); /* 0 if not ours */
/* One side of a copy: PILOT_MEM_HOST (host: the box's first byte, pitch bytes between rows,
 * rows per slice), PILOT_MEM_DEVICE (ptr, pitch, rows per slice, position x bytes, y, z) or
 * PILOT_MEM_ARRAY (info; position x in bytes, y, z). */
struct pilot_copy_end {
    int type;
    uint8_t *host;
    uint64_t ptr, pitch, rows;
    uint64_t x, y, z;
    struct pilot_array_info info;
};
cudaError_t pilot_copy_end_memory(struct pilot_copy_end *e, const void *ptr, size_t pitch,
                                  size_t rows, int host_side, int kind_default);
cudaError_t pilot_copy_end_array(struct pilot_copy_end *e, const void *array);
/* A width x height x depth box (bytes, rows, slices) where at least one side is an array. */
cudaError_t pilot_array_copy(const struct pilot_copy_end *dst, const struct pilot_copy_end *src,
                             uint64_t width, uint64_t height, uint64_t depth, uint64_t stream,
                             int sync);

/* ---- api_host.c: pinned and mapped host memory ---- */
/* 1 if [ptr, ptr+count) lies inside one pinned range the daemon holds (copies to and from it
 * are DMA in the daemon: pilot_pinned_copy). One atomic load without pinned memory. */
int pilot_host_pinned(uint64_t ptr, uint64_t count);
/* The program's host address of a registered range's device pointer; other pointers unchanged. */
uint64_t pilot_host_unalias(uint64_t ptr);
/* cudaPointerGetAttributes for pinned memory: 1 if ptr is some (attr filled in). */
int pilot_host_attributes(const void *ptr, struct cudaPointerAttributes *attr);
/* A copy between device memory and a pinned range (host side checked with pilot_host_pinned). */
cudaError_t pilot_pinned_copy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                              uint64_t stream, int sync);
/* page_move.c: from the SIGSEGV handler, 1 if it was a page being moved (the move is over). */
int pilot_host_fault(uint64_t addr);
/* Replaces the pages [base, base+len) by `replacement` (consumed) with their contents; 0 or -1. */
int pilot_move_pages(uint64_t base, uint64_t len, void *replacement);

/* ---- api_peer.c ---- */
/* A copy between two devices' memory (cudaMemcpyPeer, cross-device cudaMemcpy). */
cudaError_t pilot_memcpy_peer(void *dst, int dst_device, const void *src, int src_device,
                              size_t count, uint64_t stream, int sync);

/* ---- api_launch.c, api_launch_ex.c ---- */
struct pilot_launch_ex {
    uint32_t cooperative;
    int32_t priority;
    uint32_t has_priority;
    uint32_t cluster[3];
    uint32_t cluster_policy;
};
/* A kernel launch: <<<>>>, cudaLaunchKernel, and with attributes (ex != NULL). */
cudaError_t pilot_launch(struct pilot_kernel *kernel, dim3 grid, dim3 block, void **args,
                         size_t shared, cudaStream_t stream, const struct pilot_launch_ex *ex);
/* The same with the arguments already packed by the layout (packed != NULL: cuLaunchKernel's
 * CU_LAUNCH_PARAM_BUFFER_POINTER; packed_size must cover the layout), else from args. */
cudaError_t pilot_launch_packed(struct pilot_kernel *kernel, dim3 grid, dim3 block, void **args,
                                const void *packed, size_t packed_size, size_t shared,
                                cudaStream_t stream, const struct pilot_launch_ex *ex);

/* ---- api_helpers.c ---- */
/* An L2 access policy window as CUDA checks it (pilot keeps windows as hints, never applies them). */
cudaError_t pilot_check_access_window(const struct cudaAccessPolicyWindow *w);

/* ---- device_props.c ---- */
void pilot_fill_device_prop(struct cudaDeviceProp *prop, const pilot_rep_device_info *info);

/* ---- stream and event handles (stream_handles.c) ---- */
/* The daemon handle of a program's stream: 0 for the legacy stream (0, cudaStreamLegacy); for
 * cudaStreamPerThread the calling thread's per-thread default stream on its current device
 * (created on first use; UINT64_MAX, a handle no session has, if that failed). */
uint64_t pilot_stream_handle(cudaStream_t stream);
/* The device a handle belongs to (bits PILOT_HANDLE_DEVICE_SHIFT..+7); for stream handle 0
 * the current device. */
int pilot_handle_device(uint64_t handle);
/* Daemon objects a thread keeps per device, created on first use, destroyed when the thread
 * exits, recreated after cudaDeviceReset or fork: its per-thread default stream (a blocking
 * stream), its marker event (callbacks.c). UINT64_MAX if it cannot be created. */
enum { PILOT_PER_THREAD_STREAM, PILOT_MARKER_EVENT, PILOT_THREAD_OBJECT_KINDS };
uint64_t pilot_thread_object(int kind, int device);

/* ---- streams (api_stream.c) ---- */
/* cudaEventRecord: the event and the stream must be on one device. */
cudaError_t pilot_event_record(cudaEvent_t event, cudaStream_t stream);
/* The device of an event handle of this session, -1 if it cannot be one (api_stream.c). */
int pilot_event_device(cudaEvent_t event);

/* ---- callbacks.c: host callbacks run on the shim's callback thread ---- */
/* While host callbacks are outstanding, a call that waits for device work (a synchronize, a
 * copy to or from pageable memory, cudaFree) must neither hold its device's connection nor
 * block the daemon's vGPU thread while it waits: the work may wait for a callback that waits
 * for another thread of the program. These first poll, without holding anything, until the work
 * issued so far on the stream (or event, or the whole device) is done; with no callback
 * outstanding they return at once. For copies from pageable memory this is also CUDA's
 * "a stream sync is performed before the copy is initiated": the copy sees what a callback
 * queued before it wrote. `stream` is a handle of the route device. */
cudaError_t pilot_callbacks_fence(uint64_t stream);
int pilot_callbacks_outstanding(void); /* some host callback is registered and has not run */
cudaError_t pilot_stream_sync(uint64_t handle); /* cudaStreamSynchronize of a handle */
cudaError_t pilot_callbacks_fence_event(int device, uint64_t event);
cudaError_t pilot_callbacks_fence_device(int device);

/* ---- graph_capture.c: stream capture (api_graph.c keeps the graphs) ---- */
/* Each hook returns 0 when the stream does not capture (issue the operation as usual), else 1
 * with *err the operation's result: recorded as a node of the capture, or refused. `stream` is a
 * daemon handle (pilot_stream_handle). One atomic load while nothing captures. */
int pilot_capture_any(void);
/* cudaMallocAsync / cudaFreeAsync on a capturing stream: 1 when recorded as a graph allocation
 * or free node (or refused: *err says), 0 when the stream does not capture. */
int pilot_capture_mem_alloc(uint64_t stream, void **ptr, size_t size, int device, cudaError_t *err);
int pilot_capture_mem_free(uint64_t stream, void *ptr, cudaError_t *err);
/* Graph allocations (graph_mem.c) freed by the program outside a graph (cudaFree and
 * cudaFreeAsync reach it through shim/core/hooks.h). */
int pilot_gmem_user_free(void *ptr, int async, cudaStream_t stream, cudaError_t *err);
/* cudaMalloc on `device` (the calling thread's device kept), allowed during a capture; and the
 * cudaFree that goes with it (api_mempool.c). */
cudaError_t pilot_malloc_on(int device, size_t size, void **ptr);
cudaError_t pilot_free_relaxed(void *ptr);
/* The stream-ordered allocator's calls to pilotd (api_memory.c). pilot_malloc_ordered: an
 * allocation on the route device, made now, that may reuse memory the session freed on `stream`
 * (a handle of that device). pilot_free_ordered: frees device memory in the order of `stream`
 * without waiting for it; 1 when done (*err says how), 0 when the memory must be freed the
 * synchronous way (managed memory, or a stream of another device than the memory's). */
cudaError_t pilot_malloc_ordered(void **ptr, size_t size, uint64_t stream);
int pilot_free_ordered(void *ptr, uint64_t stream, cudaError_t *err);
int pilot_capture_launch(uint64_t stream, struct pilot_kernel *kernel, dim3 grid, dim3 block,
                         unsigned shared, const struct pilot_kernel_launch_info *info,
                         const unsigned char *buf, cudaError_t *err);
/* A copy of height rows of width bytes (height 1: a plain copy, the pitches unused). */
int pilot_capture_copy(uint64_t stream, void *dst, size_t dpitch, const void *src, size_t spitch,
                       size_t width, size_t height, enum cudaMemcpyKind kind, cudaError_t *err);
int pilot_capture_memset(uint64_t stream, void *ptr, size_t pitch, int value, size_t width,
                         size_t height, cudaError_t *err);
int pilot_capture_host(uint64_t stream, cudaHostFn_t fn, void *data, cudaError_t *err);
int pilot_capture_record(uint64_t stream, cudaEvent_t event, int external, cudaError_t *err);
int pilot_capture_wait(uint64_t stream, cudaEvent_t event, unsigned flags, cudaError_t *err);
/* Work pilot cannot record (`what` names it in the log line): cudaErrorNotSupported, and the
 * capture is invalidated. */
int pilot_capture_refuse(uint64_t stream, const char *what, cudaError_t *err);
/* A CUDA library call posted on a capturing stream: recorded as a node that re-posts it (the
 * request's stream handle at stream_offset replaced by the launch stream's). */
int pilot_capture_library(uint64_t stream, uint16_t op, int device, size_t stream_offset,
                          const void *req, size_t req_len, const void *payload,
                          size_t payload_len, cudaError_t *err);
/* What a call that waits must check first: a synchronize or query of `stream` (unsafe 0), a
 * synchronous copy or memset ordered on it (unsafe 1: also refused where the thread's capture
 * mode forbids unsafe calls); cudaDeviceSynchronize; an event query or synchronize. */
cudaError_t pilot_capture_check_sync(uint64_t stream, int unsafe);
cudaError_t pilot_capture_check_device(int device);
cudaError_t pilot_capture_check_unsafe(void); /* cudaMalloc, cudaFree: by the capture modes */
cudaError_t pilot_capture_check_event(cudaEvent_t event);

/* ---- generated from shim/tables/cuda_errors.tsv (errors.c in the build dir) ---- */
const char *pilot_error_name(int code);
const char *pilot_error_string(int code);

#endif
