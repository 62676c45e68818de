/*
 * pilot wire protocol: the one definition of every message between libpilot.so and pilotd.
 *
 * The shim compiles this header; the daemon reads the part between PILOT_CDEF_BEGIN and
 * PILOT_CDEF_END through cffi (pilot.shim._proto, built in API mode so the C compiler checks
 * every struct layout the daemon uses). That part stays plain: fixed-width types, structs,
 * enums, integer #defines. Includes and static asserts live outside it.
 *
 * Framing (ZMTP/3.0 multipart, DEALER client -> ROUTER daemon):
 *   frame 0: pilot_envelope          (the ROUTER adds the peer's identity frame in front)
 *   frame 1: request body, the struct named for the opcode below
 *   frame 2: optional payload (inline copy data, fatbin image, packed kernel arguments, names)
 * A reply echoes the envelope (same opcode and seq), then a body that starts with
 * pilot_reply_hdr, then an optional payload (data of a small device-to-host copy, param info).
 *
 * Opcodes are numbered in blocks that follow the CUDA runtime reference manual, as cricket's
 * IDL does: 1 session, 100 device management, 140 error handling, 250 streams, 280 events,
 * 310 execution control, 400 memory (424: arrays, 430: pinned host memory, 440: textures and
 * surfaces), 500 unified memory, 600 the CUDA math libraries. Unassigned
 * numbers are reserved.
 */
#ifndef PILOT_PROTO_H
#define PILOT_PROTO_H

#include <stdint.h>

/* PILOT_CDEF_BEGIN */

#define PILOT_PROTO_VERSION 5
#define PILOT_ENDPOINT_MAX 256
#define PILOT_NAME_MAX 256
#define PILOT_ATTR_COUNT 160          /* covers every cudaDeviceAttr value of CUDA 13.0 (max 147) */
#define PILOT_INLINE_MAX 65536        /* copies up to this size travel inside the message */
#define PILOT_MAX_PARAMS 1024         /* kernel parameters the daemon reports for one function */
#define PILOT_MAX_DEVICES 16          /* devices one session sees (program ordinals 0..15) */
#define PILOT_HANDLE_DEVICE_SHIFT 40  /* bits 40..47 of a stream/event handle: its device */

/* Envelope flags. */
#define PILOT_F_NO_REPLY 1            /* asynchronous call: the daemon sends no reply */
#define PILOT_F_FAULT_CHANNEL 2       /* ATTACH: this connection is the session's fault channel */
#define PILOT_F_DEVICE_OUTPUT 4       /* reply: its last frame is the program's kernels' printf
                                       * output, to be written to its stdout (shim/transport/transport.c) */
#define PILOT_F_GPU_WORD 8            /* request (DEVICE_SYNCHRONIZE, STREAM_SYNCHRONIZE, a small
                                       * MEMCPY_D2H): the shim can wait on its ring's completion
                                       * word (pilot_ring.h) */
#define PILOT_F_WORD_PENDING 16       /* reply to one: not done yet; done when the word reaches
                                       * the body's value (pilot_rep_u64; value2: a copy's bytes,
                                       * in the GPU page's data) */

enum pilot_op {
    /* 1: session */
    PILOT_OP_HELLO = 1,               /* main socket: open a session, get its vGPU endpoint */
    PILOT_OP_ATTACH = 2,              /* vGPU socket: first message on a session's connection */
    PILOT_OP_BYE = 3,                 /* orderly exit: release everything the session owns */
    PILOT_OP_STAGING_OPEN = 4,        /* map the session's pinned shared-memory staging area */
    PILOT_OP_RING_OPEN = 5,           /* vGPU socket, after ATTACH: move the connection's byte
                                       * stream into shared-memory rings (pilot_ring.h); answered
                                       * by the endpoint in C (daemon/native/vgpu_server.c) with a
                                       * status reply that carries the rings' memfd (SCM_RIGHTS) */
    PILOT_OP_SESSIONS = 10,           /* main socket: list sessions (JSON payload in reply) */
    PILOT_OP_PING = 11,               /* main socket: is pilotd alive? (status reply; a client
                                       * whose call waits long asks, shim/transport/transport.c) */

    /* 100: device management */
    PILOT_OP_DEVICE_INFO = 101,
    PILOT_OP_DEVICE_SYNCHRONIZE = 102,
    PILOT_OP_DEVICE_RESET = 103,
    /* 104-119: limits and stream priorities (api_misc.c) */
    PILOT_OP_DEVICE_SET_LIMIT = 104,  /* pilot_req_limit; reply pilot_rep_u64: effective value */
    PILOT_OP_DEVICE_GET_LIMIT = 105,  /* pilot_req_limit; reply pilot_rep_u64 */
    PILOT_OP_DEVICE_PRIORITY_RANGE = 106, /* no body; reply pilot_rep_priority_range */
    /* 120-129: several devices per session (api_peer.c, daemon/devices.py) */
    PILOT_OP_DEVICE_JOIN = 120,       /* main socket: pilot_req_device {device: program ordinal};
                                       * reply pilot_rep_hello: the session's part on that device */
    PILOT_OP_PEER_ENABLE = 121,       /* pilot_req_device {device: the peer}; status reply */
    PILOT_OP_DEVICE_QUERY = 122,      /* no body: cudaErrorNotReady while any stream of the
                                       * session's part is busy (polled instead of a blocking
                                       * synchronize while host callbacks are outstanding) */
    /* 104-139 reserved: limits, cache config, flags (issue 3) */

    /* 140: error handling: served inside the shim, no messages */

    /* 250: stream management */
    PILOT_OP_STREAM_CREATE = 250,
    PILOT_OP_STREAM_DESTROY = 251,
    PILOT_OP_STREAM_SYNCHRONIZE = 252,
    PILOT_OP_STREAM_QUERY = 253,
    PILOT_OP_STREAM_WAIT_EVENT = 254,
    /* 255-269: stream queries (api_misc.c) */
    PILOT_OP_STREAM_GET_INFO = 255,   /* pilot_req_handle; reply pilot_rep_stream_info */
    /* 270-279: host callbacks (shim/runtime/stream/callbacks.c, daemon/callbacks.py) */
    PILOT_OP_STREAM_CALLBACK = 270,   /* pilot_req_stream_callback; status reply */
    PILOT_OP_CALLBACK_ATTACH = 271,   /* callback socket: first message; status reply */
    PILOT_OP_CALLBACK_RUN = 272,      /* daemon -> client on the callback socket: pilot_msg_callback */
    PILOT_OP_CALLBACK_DONE = 273,     /* client -> daemon, posted: pilot_msg_callback */
    /* 256-269 reserved: priorities, attach (issues 3, 4) */

    /* 280: event management */
    PILOT_OP_EVENT_CREATE = 280,
    PILOT_OP_EVENT_RECORD = 281,
    PILOT_OP_EVENT_SYNCHRONIZE = 282,
    PILOT_OP_EVENT_QUERY = 283,
    PILOT_OP_EVENT_ELAPSED = 284,
    PILOT_OP_EVENT_DESTROY = 285,

    /* 310: execution control */
    PILOT_OP_MODULE_LOAD = 310,
    PILOT_OP_FUNCTION_GET = 311,
    PILOT_OP_LAUNCH = 312,
    /* 313-329: function attributes and occupancy (api_misc.c) */
    PILOT_OP_FUNC_GET_ATTRIBUTES = 313, /* pilot_req_handle (function); reply pilot_rep_func_attrs */
    PILOT_OP_FUNC_SET_ATTRIBUTE = 314,  /* pilot_req_func_attr; reply pilot_rep_func_attrs */
    PILOT_OP_OCCUPANCY = 315,           /* pilot_req_occupancy; reply pilot_rep_u64 */
    /* 320-329: launches with attributes (api_launch_ex.c, daemon/execution.py) */
    PILOT_OP_LAUNCH_EX = 320,         /* pilot_req_launch_ex; frame 2: packed arguments. Posted, or a
                                       * call when the launch has checks only the device makes */
    /* 330-349: the driver API (libpilot-cuda.so, shim/driver/drv_*.c) */
    PILOT_OP_MODULE_UNLOAD = 330,     /* pilot_req_handle (module); status reply */
    PILOT_OP_MEMSET_WIDE = 331,       /* pilot_req_memset_wide: cuMemsetD16/D32; posted when async */
    PILOT_OP_LINK = 332,              /* cuLinkComplete (shim/driver/drv_link.c, daemon/ops/linker.py):
                                       * pilot_req_link; frame 2: `count` pilot_link_input, each
                                       * followed by its name and data, padded to 8 bytes; reply
                                       * pilot_rep_link. The image and log stay in the session
                                       * until the next LINK, read by LINK_FETCH */
    PILOT_OP_LINK_FETCH = 333,        /* pilot_req_link_fetch; reply payload: those bytes of the
                                       * last LINK's image followed by its log */
    /* 360-369: CUDA graphs instantiated in pilotd (shim/runtime/graph/graph_remote.c, daemon/ops/graphs.py) */
    PILOT_OP_GRAPH_INSTANTIATE = 360, /* pilot_req_graph {exec, stream: the recording stream,
                                       * count}; frame 2: `count` pilot_graph_record, each followed
                                       * by its request and payload, padded to 8 bytes; reply
                                       * pilot_rep_graph. Replaces what pilotd held for `exec`. */
    PILOT_OP_GRAPH_LAUNCH = 361,      /* pilot_req_graph {exec, stream: the launch stream}; posted */
    PILOT_OP_GRAPH_DESTROY = 362,     /* pilot_req_graph {exec}; posted */
    /* 316-399 reserved (issue 3) */

    /* 400: memory management */
    PILOT_OP_MALLOC = 400,
    PILOT_OP_FREE = 401,
    PILOT_OP_MEMCPY_H2D = 402,        /* inline data in frame 2 */
    PILOT_OP_MEMCPY_D2H = 403,        /* inline data back in the reply's frame 2 */
    PILOT_OP_MEMCPY_D2D = 404,
    PILOT_OP_MEMCPY_H2D_STAGED = 405, /* one chunk from a staging slot */
    PILOT_OP_MEMCPY_D2H_STAGED = 406, /* one chunk into a staging slot */
    PILOT_OP_MEMSET = 407,
    PILOT_OP_MEM_GET_INFO = 408,
    /* 409-419: symbols (__device__ and __constant__ variables) */
    PILOT_OP_SYMBOL_GET = 409,        /* frame 2: the variable's ELF name; reply pilot_rep_u64 */
    /* 420-429: pitched memory, 2D copies and memsets (api_misc.c) */
    PILOT_OP_MALLOC_PITCH = 420,      /* pilot_req_malloc_pitch; reply pilot_rep_u64 {ptr, pitch} */
    PILOT_OP_MEMCPY_2D = 421,         /* pilot_req_memcpy_2d; H2D rows packed in frame 2, D2H
                                       * rows packed in the reply's frame 2 */
    PILOT_OP_MEMSET_2D = 422,         /* pilot_req_memset_2d */
    /* 423-429: peer copies (api_peer.c) */
    PILOT_OP_MEMCPY_PEER = 423,       /* pilot_req_memcpy_peer; posted when async */
    /* 424-429: CUDA arrays (shim/runtime/texture/api_array.c, daemon/ops/arrays.py) */
    PILOT_OP_ARRAY_CREATE = 424,      /* pilot_req_array_create; reply pilot_rep_u64 {value: the
                                       * session's handle of the array (never a device address),
                                       * value2: its element size in bytes} */
    PILOT_OP_ARRAY_DESTROY = 425,     /* pilot_req_handle (an array handle) */
    PILOT_OP_MEMCPY_3D = 426,         /* pilot_req_memcpy_3d: a box between two endpoints, at least
                                       * one an array; host rows packed in frame 2 (to the device)
                                       * or in the reply's frame 2 (to the host); posted when async
                                       * and nothing comes back */
    /* 430-439: pinned and mapped host memory (shim/runtime/memory/api_host.c, daemon/pinned.py) */
    PILOT_OP_HOST_REGISTER = 430,     /* pilot_req_host_register: the client's memfd, which the
                                       * daemon maps and pins; reply pilot_rep_u64 {value: the
                                       * daemon's address of the mapping, value2: its device
                                       * pointer} */
    PILOT_OP_HOST_UNREGISTER = 431,   /* pilot_req_free {ptr: the mapping's client address}:
                                       * the session's streams finish, then unpin and unmap */
    PILOT_OP_MEMCPY_PINNED = 432,     /* pilot_req_memcpy_pinned: DMA between device memory and
                                       * a registered host range; posted when async */
    /* 433-439 reserved */
    /* 440-469: texture and surface objects (shim/runtime/texture/api_texture.c, daemon/ops/arrays.py) */
    PILOT_OP_TEXTURE_CREATE = 440,    /* pilot_req_texture_create; reply pilot_rep_u64 {value: the
                                       * driver's cudaTextureObject_t, which kernels use} */
    PILOT_OP_TEXTURE_DESTROY = 441,   /* pilot_req_handle (a texture object of the session) */
    PILOT_OP_SURFACE_CREATE = 442,    /* pilot_req_texture_create (resource only); reply
                                       * pilot_rep_u64 {value: the cudaSurfaceObject_t} */
    PILOT_OP_SURFACE_DESTROY = 443,   /* pilot_req_handle (a surface object of the session) */
    /* 444-469 reserved: textures and surfaces */
    /* 470-479: the stream-ordered allocator (shim/runtime/memory/api_mempool.c,
     * daemon/ops/mempool.py) */
    PILOT_OP_MALLOC_ASYNC = 470,      /* pilot_req_malloc_async; reply pilot_rep_u64 {ptr}. May
                                       * reuse a block the session freed on the same stream */
    PILOT_OP_FREE_ASYNC = 471,        /* pilot_req_free_async: the allocation leaves the session
                                       * at once; its memory is zeroed and freed in the order of
                                       * `stream`, after the work issued there before; no wait.
                                       * Posted (no reply) for an allocation's start the shim
                                       * knows; an error is then asynchronous */
    /* 472-479 reserved */
    /* 480-489: CUDA IPC between the processes of one tenant (shim/runtime/memory/api_ipc.c,
     * daemon/ops/ipc.py, daemon/resources/ipc.py) */
    PILOT_OP_IPC_MEM_EXPORT = 480,    /* pilot_req_free {ptr: in one of the session's device
                                       * allocations}; reply pilot_rep_ipc_handle */
    PILOT_OP_IPC_MEM_OPEN = 481,      /* pilot_req_ipc_open; reply pilot_rep_u64 {value: the
                                       * allocation's base, value2: its size}; the range joins the
                                       * session's memory (opened again: the same base, counted) */
    PILOT_OP_IPC_MEM_CLOSE = 482,     /* pilot_req_free {ptr: an opened base}; reply pilot_rep_u64
                                       * {value: opens of it left}; the last close waits for the
                                       * session's work */
    PILOT_OP_IPC_EVENT_EXPORT = 483,  /* pilot_req_handle (an event made with
                                       * cudaEventInterprocess); reply pilot_rep_ipc_handle */
    PILOT_OP_IPC_EVENT_OPEN = 484,    /* pilot_req_ipc_open; reply pilot_rep_u64 {value: a new
                                       * event handle of the session, naming the same event} */
    /* 485-499 reserved */
    /* 500: unified memory (shim/runtime/managed/api_managed.c, shim/runtime/managed/coherence.c, daemon/managed.py) */
    PILOT_OP_MALLOC_MANAGED = 500,    /* pilot_req_malloc_managed; reply pilot_rep_u64 {ptr} */
    PILOT_OP_SHADOW_ATTACH = 501,     /* pilot_req_shadow_attach: the client shadows a range */
    PILOT_OP_SHADOW_FLUSH = 502,      /* pilot_req_memcpy {dst, count, slot}: staging -> device */
    PILOT_OP_SHADOW_FETCH = 503,      /* pilot_req_memcpy {src, count, slot}: device -> the fault
                                       * channel's staging (sent on the fault channel) */
    PILOT_OP_MANAGED_VAR = 504,       /* pilot_req_symbol_get + name; reply pilot_rep_managed_var */
    PILOT_OP_MEM_ADVISE = 505,        /* pilot_req_mem_advise */
    PILOT_OP_MEM_PREFETCH = 506,      /* pilot_req_mem_prefetch (asynchronous) */
    PILOT_OP_MEM_RANGE_ATTR = 507,    /* pilot_req_mem_range_attr; reply payload: the value */
    PILOT_OP_STREAM_ATTACH_MEM = 508, /* pilot_req_stream_attach_mem (asynchronous) */
    /* 509-599 reserved: unified memory */
    /* 600: the CUDA math libraries, run by pilotd on the session's streams (shim/blas_*.c,
     * daemon/ops/libraries.py) */
    PILOT_OP_LIB_CREATE = 600,        /* pilot_req_lib_create; reply pilot_rep_lib {status, handle,
                                       * version}: a handle of the real library in pilotd */
    PILOT_OP_LIB_DESTROY = 601,       /* pilot_req_handle (a library handle); status reply */
    PILOT_OP_BLAS_GEMM = 602,         /* pilot_req_blas_gemm; posted */
    PILOT_OP_BLASLT_MATMUL = 603,     /* pilot_req_blaslt_matmul; frame 2: the descriptors'
                                       * attributes (pilot_lt_attr records); posted */
    PILOT_OP_BLASLT_HEURISTIC = 604,  /* pilot_req_blaslt_matmul (pointers, algo unused); frame 2
                                       * as MATMUL; reply pilot_rep_lib {status, value: results},
                                       * frame 2: the results (PILOT_LT_RESULT_BYTES each) */
    PILOT_OP_BLAS_CALL = 605,         /* pilot_req_blas_call; frame 2: the function's name (a row of
                                       * shim/tables/cublas_calls.tsv). Posted, or a call when it returns
                                       * a result to the host: reply pilot_rep_lib, frame 2 the
                                       * result's bytes */
    /* cuDNN (shim/libs/cudnn_api.c, daemon/ops/dnn.py): the backend API's descriptors live in pilotd
     * (numbers it gave out), except variant packs, which the stand-in keeps and sends with the
     * execution. Handles are LIB_CREATE's (PILOT_LIB_CUDNN). */
    PILOT_OP_DNN_DESC_CREATE = 606,   /* pilot_req_dnn_attr {type in attr}; reply pilot_rep_lib
                                       * {status, value: the descriptor} */
    PILOT_OP_DNN_DESC_SET = 607,      /* pilot_req_dnn_attr; frame 2: the elements (descriptors and
                                       * handles as pilotd's numbers, 8 bytes each); reply
                                       * pilot_rep_lib {status} */
    PILOT_OP_DNN_DESC_GET = 608,      /* pilot_req_dnn_attr {count: requested}; frame 2 for
                                       * descriptor results: the numbers to fill; reply
                                       * pilot_rep_lib {status, value: element count}, frame 2 the
                                       * elements' bytes (other types) */
    PILOT_OP_DNN_DESC_FINALIZE = 609, /* pilot_req_handle (a descriptor); reply pilot_rep_lib */
    PILOT_OP_DNN_DESC_DESTROY = 610,  /* pilot_req_handle (a descriptor); reply pilot_rep_lib */
    PILOT_OP_DNN_EXECUTE = 611,       /* pilot_req_dnn_execute; frame 2: `count` pilot_dnn_ptr;
                                       * posted */
    PILOT_OP_DNN_BATCHNORM = 612,     /* pilot_req_dnn_bn; posted, or a call for the size queries:
                                       * reply pilot_rep_lib {status, value: bytes} */
    /* 613-699 reserved: CUDA libraries */
};

/* cudaMemcpyKind values, as the daemon sees them. */
enum pilot_copy_kind {
    PILOT_COPY_H2H = 0,
    PILOT_COPY_H2D = 1,
    PILOT_COPY_D2H = 2,
    PILOT_COPY_D2D = 3,
    PILOT_COPY_DEFAULT = 4
};

typedef struct pilot_envelope {
    uint16_t version;                 /* PILOT_PROTO_VERSION */
    uint16_t opcode;                  /* enum pilot_op */
    uint32_t flags;                   /* PILOT_F_* */
    uint64_t seq;                     /* chosen by the client, echoed in the reply */
    uint64_t session;                 /* 0 in HELLO; checked against the peer's credentials */
} pilot_envelope;

/* Every reply body starts with this. err is the call's own cudaError_t; deferred is the first
 * error an earlier asynchronous call of this session raised since the last reply (0 if none). */
typedef struct pilot_reply_hdr {
    int32_t err;
    int32_t deferred;
} pilot_reply_hdr;

/* Reusable reply shapes (cricket's int_result / ptr_result). */
typedef struct pilot_rep_status {
    pilot_reply_hdr hdr;
} pilot_rep_status;

typedef struct pilot_rep_u64 {
    pilot_reply_hdr hdr;
    uint64_t value;
    uint64_t value2;
} pilot_rep_u64;

/* ---- session ---- */
/* HELLO carries the program's device selection (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER of its
 * environment), which pilotd resolves against the GPUs it serves (daemon/sessions/visible.py):
 * it can only narrow what the session sees. ATTACH sends the same struct with flags 0. */
#define PILOT_VISIBLE_MAX 1024        /* bytes of CUDA_VISIBLE_DEVICES carried, NUL included */
#define PILOT_HELLO_VISIBLE_SET 1     /* CUDA_VISIBLE_DEVICES is set (an empty value too) */
#define PILOT_HELLO_PCI_BUS_ORDER 2   /* CUDA_DEVICE_ORDER=PCI_BUS_ID */
/* pilot_rep_hello.hdr.err of a HELLO to be said again at another main socket, named in
 * `endpoint`: the program's tenant is isolated in a pilotd of its own (router/isolation.py). The
 * shim then uses that socket for every main-socket request of the session. Not a cudaError_t. */
#define PILOT_HELLO_REDIRECT 65536

typedef struct pilot_req_hello {
    uint32_t proto_version;
    uint32_t cuda_abi;                /* CUDART_VERSION the shim was built for, e.g. 13000 */
    uint32_t flags;                   /* PILOT_HELLO_* */
    uint32_t reserved;
    uint64_t start_time;              /* the sender's start time, /proc/self/stat field 22 (clock
                                       * ticks after boot): pilotd refuses a HELLO whose peer pid
                                       * now names another process (reused); 0: not checked */
    char visible_devices[PILOT_VISIBLE_MAX]; /* CUDA_VISIBLE_DEVICES, NUL-terminated (cut at
                                              * the last whole entry that fits) */
} pilot_req_hello;

typedef struct pilot_rep_hello {
    pilot_reply_hdr hdr;
    uint64_t session;
    uint32_t vgpu;
    int32_t device;                   /* program ordinal of this part of the session */
    char endpoint[PILOT_ENDPOINT_MAX];/* vGPU socket path to attach to */
    char callbacks[PILOT_ENDPOINT_MAX]; /* host-callback socket (CALLBACK_ATTACH) */
} pilot_rep_hello;

typedef struct pilot_req_staging_open {
    uint64_t min_bytes;
    uint32_t fault;                   /* 1: the fault channel's own area (SHADOW_FETCH) */
    uint32_t reserved;
} pilot_req_staging_open;

typedef struct pilot_rep_staging {
    pilot_reply_hdr hdr;
    uint64_t slot_bytes;
    uint32_t slots;
    uint32_t reserved;
    char path[PILOT_ENDPOINT_MAX];    /* shared-memory file, owned by the client's uid */
} pilot_rep_staging;

/* ---- device ---- */
typedef struct pilot_req_device {
    int32_t device;
    uint32_t reserved;
} pilot_req_device;

typedef struct pilot_rep_device_info {
    pilot_reply_hdr hdr;
    int32_t device_count;
    int32_t driver_version;
    uint64_t total_mem;               /* the capacity pilot grants, not necessarily the card's */
    char name[PILOT_NAME_MAX];
    uint8_t uuid[16];
    int32_t attrs[PILOT_ATTR_COUNT];  /* indexed by cudaDeviceAttr; 0 where not reported */
    uint32_t peer_mask;               /* bit p: this device can access device p's memory */
    uint32_t reserved;
} pilot_rep_device_info;

/* ---- streams and events ---- */
typedef struct pilot_req_stream_create {
    uint32_t flags;
    int32_t priority;
} pilot_req_stream_create;

typedef struct pilot_req_handle {     /* one stream or event handle: destroy, sync, query */
    uint64_t handle;
} pilot_req_handle;

typedef struct pilot_req_stream_wait_event {
    uint64_t stream;
    uint64_t event;
    uint32_t flags;
    uint32_t reserved;
} pilot_req_stream_wait_event;

typedef struct pilot_req_event_create {
    uint32_t flags;
    uint32_t reserved;
} pilot_req_event_create;

typedef struct pilot_req_event_record {
    uint64_t event;
    uint64_t stream;
} pilot_req_event_record;

typedef struct pilot_req_event_elapsed {
    uint64_t start;
    uint64_t end;
} pilot_req_event_elapsed;

typedef struct pilot_rep_elapsed {
    pilot_reply_hdr hdr;
    float ms;
    uint32_t reserved;
} pilot_rep_elapsed;

/* ---- execution control ---- */
typedef struct pilot_req_module_load {  /* frame 2: the fatbin image */
    uint64_t image_size;
} pilot_req_module_load;

typedef struct pilot_req_function_get { /* frame 2: the kernel's (mangled) name */
    uint64_t module;
} pilot_req_function_get;

typedef struct pilot_param_info {
    uint32_t offset;
    uint32_t size;
} pilot_param_info;

typedef struct pilot_rep_function {     /* frame 2: nparams pilot_param_info */
    pilot_reply_hdr hdr;
    uint64_t function;
    uint32_t nparams;
    uint32_t arg_bytes;               /* size of the packed argument buffer */
    int32_t max_threads_per_block;    /* cuFuncGetAttribute(MAX_THREADS_PER_BLOCK) */
    int32_t static_shared_bytes;
    int32_t max_dynamic_shared_bytes;
    uint32_t reserved;
} pilot_rep_function;

typedef struct pilot_req_launch {       /* frame 2: packed arguments, arg_bytes long */
    uint64_t function;
    uint64_t stream;
    uint32_t grid[3];
    uint32_t block[3];
    uint32_t shared_bytes;
    uint32_t arg_bytes;
} pilot_req_launch;

/* ---- CUDA graphs (PILOT_OP_GRAPH_*) ---- */
typedef struct pilot_req_graph {
    uint64_t exec;   /* the program's executable graph: its handle in the shim */
    uint64_t stream; /* instantiate: the stream the records were made on; launch: where it runs */
    uint32_t count;  /* instantiate: the records in frame 2 */
    uint32_t flags;  /* 0 */
} pilot_req_graph;

/* One posted call of a recorded graph, as the shim would have sent it on the recording stream. */
typedef struct pilot_graph_record {
    uint16_t opcode;
    uint16_t pad;
    uint32_t req_len;     /* then req_len bytes of request */
    uint32_t payload_len; /* then payload_len bytes of payload (frame 2 of the call) */
    uint32_t pad2;
} pilot_graph_record;

/* Why pilotd holds no CUDA graph for an executable graph: the shim then replays its nodes. */
enum pilot_graph_replay {
    PILOT_GRAPH_INSTANTIATED = 0,
    PILOT_GRAPH_REPLAY_NODE = 1,    /* a node pilotd cannot put in a graph (its opcode or kind) */
    PILOT_GRAPH_REPLAY_POLICY = 2,  /* the session's launches go through a policy, the capacity
                                     * enforcer, kernel timing or managed memory, per launch */
    PILOT_GRAPH_REPLAY_CAPTURE = 3, /* the driver refused to capture a node */
    PILOT_GRAPH_REPLAY_LIMIT = 4,   /* the session holds as many graphs as pilotd keeps for one */
};

typedef struct pilot_rep_graph {
    pilot_reply_hdr hdr;
    uint32_t replay; /* enum pilot_graph_replay */
    uint32_t nodes;  /* nodes of the CUDA graph pilotd instantiated */
} pilot_rep_graph;

/* ---- memory ---- */
typedef struct pilot_req_malloc {
    uint64_t size;
} pilot_req_malloc;

typedef struct pilot_req_free {
    uint64_t ptr;
} pilot_req_free;

typedef struct pilot_req_malloc_async {
    uint64_t size;
    uint64_t stream;                  /* the program's stream handle (0: legacy) */
} pilot_req_malloc_async;

typedef struct pilot_req_free_async {
    uint64_t ptr;
    uint64_t stream;                  /* the program's stream handle (0: legacy) */
} pilot_req_free_async;

/* ---- the driver's linker (cuLink*) ---- */
#define PILOT_LINK_OPTIONS 16

typedef struct pilot_link_option {
    uint32_t option;                  /* a CUjit_option with a plain value (drv_link.c lists them) */
    uint32_t value;
} pilot_link_option;

typedef struct pilot_req_link {
    uint32_t count;                   /* inputs in frame 2 */
    uint32_t noptions;
    pilot_link_option options[PILOT_LINK_OPTIONS];
} pilot_req_link;

typedef struct pilot_link_input {
    uint32_t type;                    /* CUjitInputType */
    uint32_t name_len;                /* bytes of the name that follow, no NUL */
    uint64_t size;                    /* bytes of data after the name */
} pilot_link_input;

typedef struct pilot_rep_link {
    pilot_reply_hdr hdr;
    uint32_t result;                  /* the link's CUresult (0: linked) */
    uint32_t reserved;
    uint64_t image_bytes;             /* the linked cubin's size */
    uint64_t log_bytes;               /* the log's (info log when linked, else error log) */
} pilot_rep_link;

typedef struct pilot_req_link_fetch {
    uint64_t offset;                  /* into the image followed by the log */
    uint64_t count;                   /* at most PILOT_INLINE_MAX */
} pilot_req_link_fetch;

/* A cudaIpcMemHandle_t / cudaIpcEventHandle_t, opaque to the shim: pilotd makes it (the bytes
 * "pilotIPC", a random token naming the export in pilotd, zeros: daemon/resources/ipc.py). */
#define PILOT_IPC_HANDLE_BYTES 64

typedef struct pilot_rep_ipc_handle {
    pilot_reply_hdr hdr;
    uint8_t handle[PILOT_IPC_HANDLE_BYTES];
} pilot_rep_ipc_handle;

typedef struct pilot_req_ipc_open {
    uint8_t handle[PILOT_IPC_HANDLE_BYTES];
    uint32_t flags;                   /* cudaIpcMemLazyEnablePeerAccess (memory), 0 (events) */
    uint32_t reserved;
} pilot_req_ipc_open;

typedef struct pilot_req_memcpy {       /* H2D, D2H, D2D, and staged chunks */
    uint64_t dst;
    uint64_t src;
    uint64_t count;
    uint64_t stream;
    uint32_t slot;                    /* staging slot for the _STAGED opcodes */
    uint32_t sync;                    /* 1: cudaMemcpy (host-synchronous), 0: async */
} pilot_req_memcpy;

typedef struct pilot_req_memset {
    uint64_t ptr;
    uint64_t count;
    uint64_t stream;
    int32_t value;
    uint32_t sync;
} pilot_req_memset;

/* cuMemsetD16/D32[Async]: `count` elements of `elem_size` (2 or 4) bytes set to `value`. */
typedef struct pilot_req_memset_wide {
    uint64_t ptr;
    uint64_t count;
    uint64_t stream;
    uint32_t value;
    uint32_t elem_size;
    uint32_t sync;
    uint32_t pad;
} pilot_req_memset_wide;

/* ---- symbols ---- */
typedef struct pilot_req_symbol_get {   /* frame 2: the variable's name (deviceName, no NUL) */
    uint64_t module;                  /* reply: pilot_rep_u64 {value: address, value2: size} */
} pilot_req_symbol_get;

/* ---- limits, stream queries, function attributes, occupancy, 2D memory (api_misc.c) ---- */
#define PILOT_FUNC_ATTR_COUNT 16      /* CUfunction_attribute values 0..15 (CUDA 13.0) */

typedef struct pilot_req_limit {        /* DEVICE_SET_LIMIT (value used) and DEVICE_GET_LIMIT */
    uint32_t limit;                   /* enum cudaLimit */
    uint32_t reserved;
    uint64_t value;
} pilot_req_limit;

typedef struct pilot_rep_priority_range {
    pilot_reply_hdr hdr;
    int32_t least;                    /* numerically largest: lowest priority (0) */
    int32_t greatest;                 /* numerically smallest: highest priority (-5 on H100) */
} pilot_rep_priority_range;

typedef struct pilot_rep_stream_info {
    pilot_reply_hdr hdr;
    uint32_t flags;                   /* as created: cudaStreamDefault or cudaStreamNonBlocking */
    int32_t priority;                 /* as clamped at creation */
} pilot_rep_stream_info;

typedef struct pilot_rep_func_attrs {   /* values[i] = cuFuncGetAttribute(i), 0 if not reported */
    pilot_reply_hdr hdr;
    int32_t values[PILOT_FUNC_ATTR_COUNT];
} pilot_rep_func_attrs;

typedef struct pilot_req_func_attr {
    uint64_t function;
    int32_t attr;                     /* enum cudaFuncAttribute (= CUfunction_attribute) */
    int32_t value;
} pilot_req_func_attr;

typedef struct pilot_req_occupancy {
    uint64_t function;
    uint64_t dynamic_smem;            /* with PILOT_OCCUPANCY_AVAILABLE_SMEM: the blocks per SM */
    int32_t block_size;
    uint32_t flags;                   /* cudaOccupancyDefault / DisableCachingOverride */
} pilot_req_occupancy;
/* In pilot_req_occupancy.flags: the reply is the dynamic shared memory per block that lets
 * `dynamic_smem` blocks of `block_size` threads reside on an SM
 * (cudaOccupancyAvailableDynamicSMemPerBlock), not a block count. */
#define PILOT_OCCUPANCY_AVAILABLE_SMEM 0x80000000

typedef struct pilot_req_malloc_pitch {
    uint64_t width;                   /* bytes */
    uint64_t height;
} pilot_req_malloc_pitch;

typedef struct pilot_req_memcpy_2d {    /* rows of `width` bytes, `pitch` apart */
    uint64_t dst;                     /* device for H2D and D2D; unused for D2H */
    uint64_t dpitch;
    uint64_t src;                     /* device for D2H and D2D; unused for H2D */
    uint64_t spitch;
    uint64_t width;
    uint64_t height;
    uint64_t stream;
    uint32_t kind;                    /* PILOT_COPY_H2D, _D2H or _D2D */
    uint32_t sync;
} pilot_req_memcpy_2d;

typedef struct pilot_req_memset_2d {
    uint64_t ptr;
    uint64_t pitch;
    uint64_t width;
    uint64_t height;
    uint64_t stream;
    int32_t value;
    uint32_t sync;
} pilot_req_memset_2d;

/* ---- unified memory ----
 * A managed range lives in the daemon (real managed memory) and, at the same virtual address,
 * in the client as a shadow: private memory of the client's. The client tracks which chunks of
 * the shadow it wrote (flushed to the device before device work, through the session's staging
 * area) and which it must fetch before the host reads them (through the fault channel's own
 * staging area); docs/ARCHITECTURE.md, coherence. */
#define PILOT_MANAGED_ATTACH_GLOBAL 1   /* cudaMemAttachGlobal */
#define PILOT_MANAGED_ATTACH_HOST 2     /* cudaMemAttachHost */
/* Or'ed into the flags: a range the client packs its small managed allocations into (shim/
 * um_pack.c); charged in full to the session, never shared with another session. */
#define PILOT_MANAGED_PACKED_RANGE 0x100
#define PILOT_UM_PACK_RANGE 0x200000   /* bytes of such a range (2 MiB) */

typedef struct pilot_req_malloc_managed {
    uint64_t size;
    uint32_t flags;                   /* PILOT_MANAGED_ATTACH_*, PILOT_MANAGED_PACKED_RANGE */
    uint32_t reserved;
} pilot_req_malloc_managed;

typedef struct pilot_req_shadow_attach {
    uint64_t base;                    /* page-aligned start of the client's shadow mapping */
    uint64_t length;                  /* bytes mapped (a multiple of the page size) */
    uint64_t chunk;                   /* the client's chunk size (accounting: host-written chunks) */
} pilot_req_shadow_attach;

typedef struct pilot_rep_managed_var {  /* a __managed__ variable and the range that holds it */
    pilot_reply_hdr hdr;
    uint64_t address;
    uint64_t size;
    uint64_t range_base;              /* cuMemGetAddressRange of address */
    uint64_t range_size;
} pilot_rep_managed_var;

typedef struct pilot_req_mem_advise {
    uint64_t ptr;
    uint64_t count;
    int32_t advice;                   /* enum cudaMemoryAdvise */
    int32_t location_type;            /* enum cudaMemLocationType */
    int32_t location_id;
    uint32_t reserved;
} pilot_req_mem_advise;

typedef struct pilot_req_mem_prefetch {
    uint64_t ptr;
    uint64_t count;
    uint64_t stream;
    int32_t location_type;
    int32_t location_id;
    uint32_t flags;
    uint32_t reserved;
} pilot_req_mem_prefetch;

typedef struct pilot_req_mem_range_attr {  /* reply payload: data_size bytes of the attribute */
    uint64_t ptr;
    uint64_t count;
    uint64_t data_size;
    int32_t attribute;                /* enum cudaMemRangeAttribute */
    uint32_t reserved;
} pilot_req_mem_range_attr;

typedef struct pilot_req_stream_attach_mem {
    uint64_t stream;
    uint64_t ptr;
    uint64_t length;
    uint32_t flags;                   /* cudaMemAttachGlobal / Host / Single */
    uint32_t reserved;
} pilot_req_stream_attach_mem;

/* ---- pinned and mapped host memory ----
 * A pinned range is a memfd of the client, mapped in the client and in the daemon (at the same
 * address when it can be had), which the daemon registers (cuMemHostRegister, portable and
 * device-mapped): copies from and to it are DMA from the daemon's view, and kernels reach it. */
#define PILOT_HOST_ALLOC 0              /* cudaHostAlloc / cudaMallocHost */
#define PILOT_HOST_REGISTERED 1         /* cudaHostRegister on the program's own memory */

typedef struct pilot_req_host_register {
    uint64_t address;                 /* the client's page-aligned address of the mapping; 0: the
                                       * daemon chooses (and the client maps the memfd there) */
    uint64_t length;                  /* bytes mapped (whole pages) */
    uint64_t offset;                  /* the program's range: [base + offset, + size) */
    uint64_t size;
    int32_t fd;                       /* the client's memfd; the daemon opens /proc/<pid>/fd/<fd> */
    uint32_t flags;                   /* cudaHostAlloc* or cudaHostRegister* flags, as given */
    uint32_t kind;                    /* PILOT_HOST_ALLOC or PILOT_HOST_REGISTERED */
    uint32_t reserved;
} pilot_req_host_register;

typedef struct pilot_req_memcpy_pinned {  /* the host side lies inside one registered range */
    uint64_t dst;
    uint64_t src;
    uint64_t count;
    uint64_t stream;
    uint32_t kind;                    /* PILOT_COPY_H2D (src is host) or PILOT_COPY_D2H */
    uint32_t sync;                    /* 1: cudaMemcpy (returns when done), 0: stream-ordered */
} pilot_req_memcpy_pinned;

/* ---- host callbacks (shim/runtime/stream/callbacks.c, daemon/callbacks.py) ---- */
#define PILOT_CALLBACK_HOST_FUNC 0    /* cudaLaunchHostFunc: not called after a context error */
#define PILOT_CALLBACK_STREAM 1       /* cudaStreamAddCallback: called with the error status */
#define PILOT_CALLBACK_SKIP 1         /* pilot_msg_callback.flags: drop it, never call it */

typedef struct pilot_req_stream_callback {
    uint64_t stream;
    uint64_t id;                      /* the shim's number for it, echoed in CALLBACK_RUN */
    uint32_t kind;                    /* PILOT_CALLBACK_HOST_FUNC or PILOT_CALLBACK_STREAM */
    uint32_t reserved;
} pilot_req_stream_callback;

typedef struct pilot_msg_callback {     /* CALLBACK_RUN and CALLBACK_DONE */
    uint64_t id;
    int32_t status;                   /* RUN: the cudaError_t a stream callback receives */
    uint32_t flags;                   /* RUN: PILOT_CALLBACK_SKIP */
} pilot_msg_callback;

/* ---- launches with attributes, peer copies ---- */
typedef struct pilot_req_launch_ex {    /* frame 2: packed arguments, launch.arg_bytes long */
    pilot_req_launch launch;
    uint32_t cooperative;
    int32_t priority;                 /* used when has_priority */
    uint32_t has_priority;
    uint32_t cluster[3];              /* cluster dimensions; 0 0 0: no cluster */
    uint32_t cluster_policy;          /* cudaClusterSchedulingPolicy; 0: default */
    uint32_t reserved;
} pilot_req_launch_ex;

typedef struct pilot_req_memcpy_peer {
    uint64_t dst;
    uint64_t src;
    uint64_t count;
    uint64_t stream;                  /* a stream of the device the call goes to */
    int32_t dst_device;               /* program ordinals */
    int32_t src_device;
    uint32_t sync;
    uint32_t reserved;
} pilot_req_memcpy_peer;

/* ---- CUDA arrays, texture and surface objects (shim/runtime/texture/api_array.c, shim/runtime/texture/api_texture.c) ----
 * An array is the daemon's (a CUarray); the client knows it by a handle of its session. Channel
 * formats use the runtime's numbering (struct cudaChannelFormatDesc: bits per channel x y z w
 * and enum cudaChannelFormatKind). */
typedef struct pilot_channel_desc {
    int32_t x, y, z, w;
    int32_t f;
    uint32_t reserved;
} pilot_channel_desc;

typedef struct pilot_req_array_create {
    uint64_t width;                   /* elements; height 0: a 1D array, depth 0: 1D or 2D */
    uint64_t height;
    uint64_t depth;
    pilot_channel_desc desc;
    uint32_t flags;                   /* cudaArray* flags as given */
    uint32_t reserved;
} pilot_req_array_create;

/* One side of a 3D copy. Positions and pitches are in bytes (the shim converts the runtime's
 * element units with the array's element size). */
#define PILOT_MEM_HOST 1              /* rows packed in the message (width bytes apart) */
#define PILOT_MEM_DEVICE 2            /* linear device memory: ptr, pitch, rows per slice */
#define PILOT_MEM_ARRAY 3             /* an array of the session: handle */

typedef struct pilot_copy_side {
    uint64_t ptr;                     /* device address (PILOT_MEM_DEVICE) */
    uint64_t array;                   /* array handle (PILOT_MEM_ARRAY) */
    uint64_t pitch;                   /* bytes between rows (PILOT_MEM_DEVICE) */
    uint64_t rows;                    /* rows between slices (PILOT_MEM_DEVICE) */
    uint64_t x;                       /* byte offset in a row */
    uint64_t y;
    uint64_t z;
    uint32_t type;                    /* PILOT_MEM_* */
    uint32_t reserved;
} pilot_copy_side;

typedef struct pilot_req_memcpy_3d {
    pilot_copy_side dst;
    pilot_copy_side src;
    uint64_t width;                   /* bytes per row */
    uint64_t height;                  /* rows per slice */
    uint64_t depth;                   /* slices */
    uint64_t stream;
    uint32_t sync;
    uint32_t reserved;
} pilot_req_memcpy_3d;

/* A texture's or surface's resource (struct cudaResourceDesc, flattened). */
typedef struct pilot_resource {
    uint32_t type;                    /* enum cudaResourceType: 0 array, 2 linear, 3 pitch2D */
    uint32_t flags;                   /* must be 0 */
    uint64_t array;                   /* array handle (type 0) */
    uint64_t ptr;                     /* device address (types 2, 3) */
    uint64_t size;                    /* bytes (type 2) */
    uint64_t width;                   /* elements (type 3) */
    uint64_t height;                  /* rows (type 3) */
    uint64_t pitch;                   /* bytes (type 3) */
    pilot_channel_desc desc;          /* types 2, 3 */
} pilot_resource;

typedef struct pilot_texture_desc {     /* struct cudaTextureDesc, field by field */
    int32_t address_mode[3];
    int32_t filter_mode;
    int32_t read_mode;
    int32_t srgb;
    float border_color[4];
    int32_t normalized_coords;
    uint32_t max_anisotropy;
    int32_t mipmap_filter_mode;
    float mipmap_level_bias;
    float min_mipmap_level_clamp;
    float max_mipmap_level_clamp;
    int32_t disable_trilinear_optimization;
    int32_t seamless_cubemap;
} pilot_texture_desc;

typedef struct pilot_view_desc {        /* struct cudaResourceViewDesc, field by field */
    int32_t format;                   /* enum cudaResourceViewFormat */
    uint32_t reserved;
    uint64_t width;
    uint64_t height;
    uint64_t depth;
    uint32_t first_mipmap_level;
    uint32_t last_mipmap_level;
    uint32_t first_layer;
    uint32_t last_layer;
} pilot_view_desc;

typedef struct pilot_req_texture_create {
    pilot_resource res;
    pilot_texture_desc tex;           /* textures only */
    pilot_view_desc view;             /* textures only, when has_view */
    uint32_t has_view;
    uint32_t reserved;
} pilot_req_texture_create;

/* ---- the CUDA math libraries (shim/blas_*.c, daemon/ops/libraries.py) ---- */
enum pilot_library {
    PILOT_LIB_CUBLAS = 1,
    PILOT_LIB_CUBLASLT = 2,
    PILOT_LIB_CUDNN = 3               /* reply version: cudnnGetVersion; value (version_only):
                                       * cudnnGetCudartVersion */
};

typedef struct pilot_req_lib_create {
    uint32_t library;                 /* pilot_library */
    uint32_t version_only;            /* 1: only the version (cublasGetProperty), no handle */
} pilot_req_lib_create;

/* A library call's reply: `status` is the library's own (cublasStatus_t), for the client to
 * return as is; transport and session errors are the header's, as for any call. */
typedef struct pilot_rep_lib {
    pilot_reply_hdr hdr;
    int32_t status;
    uint32_t reserved;
    uint64_t value;                   /* LIB_CREATE: the handle; HEURISTIC: results returned */
    uint64_t version;                 /* LIB_CREATE: the library's version (cublasGetVersion) */
} pilot_rep_lib;

/* Which cuBLAS function a GEMM request is: the daemon calls the same one. */
enum pilot_gemm_fn {
    PILOT_GEMM_S = 1,                 /* cublasSgemm_v2 */
    PILOT_GEMM_D = 2,                 /* cublasDgemm_v2 */
    PILOT_GEMM_H = 3,                 /* cublasHgemm */
    PILOT_GEMM_EX = 4,                /* cublasGemmEx */
    PILOT_GEMM_S_STRIDED = 5,         /* cublasSgemmStridedBatched */
    PILOT_GEMM_D_STRIDED = 6,         /* cublasDgemmStridedBatched */
    PILOT_GEMM_H_STRIDED = 7,         /* cublasHgemmStridedBatched */
    PILOT_GEMM_EX_STRIDED = 8,        /* cublasGemmStridedBatchedEx */
    PILOT_GEMM_C = 9,                 /* cublasCgemm_v2 */
    PILOT_GEMM_Z = 10,                /* cublasZgemm_v2 */
    PILOT_GEMM_C_STRIDED = 11,        /* cublasCgemmStridedBatched */
    PILOT_GEMM_Z_STRIDED = 12,        /* cublasZgemmStridedBatched */
    /* Batches of pointer arrays: a, b, c are device addresses of `batch` device pointers each;
     * pilotd reads them (in stream order), checks every matrix and passes its own copy. */
    PILOT_GEMM_S_BATCHED = 13,        /* cublasSgemmBatched */
    PILOT_GEMM_D_BATCHED = 14,        /* cublasDgemmBatched */
    PILOT_GEMM_C_BATCHED = 15,        /* cublasCgemmBatched */
    PILOT_GEMM_Z_BATCHED = 16,        /* cublasZgemmBatched */
    PILOT_GEMM_EX_BATCHED = 17        /* cublasGemmBatchedEx */
};

/* One GEMM of a cuBLAS handle, with the handle's settings at the time of the call. alpha and
 * beta travel by value under CUBLAS_POINTER_MODE_HOST (the first bytes of alpha/beta), as device
 * addresses (alpha_ptr/beta_ptr) under CUBLAS_POINTER_MODE_DEVICE. Types are cudaDataType
 * values (the S/D/H functions' implied ones filled in by the shim). */
typedef struct pilot_req_blas_gemm {
    uint64_t handle;                  /* LIB_CREATE's handle (PILOT_LIB_CUBLAS) */
    uint64_t stream;                  /* daemon stream handle (cublasSetStream) */
    uint64_t workspace;               /* cublasSetWorkspace's, when workspace_set */
    uint64_t workspace_size;
    uint64_t a, b, c;
    int64_t stride_a, stride_b, stride_c;
    uint64_t alpha_ptr, beta_ptr;
    uint8_t alpha[16], beta[16];
    int32_t fn;                       /* pilot_gemm_fn */
    int32_t transa, transb;
    int32_t m, n, k;
    int32_t lda, ldb, ldc;
    int32_t batch;
    int32_t atype, btype, ctype;
    int32_t compute_type;             /* cublasComputeType_t (the Ex functions) */
    int32_t algo;                     /* cublasGemmAlgo_t */
    int32_t math_mode;                /* cublasSetMathMode */
    int32_t pointer_mode;             /* cublasSetPointerMode */
    int32_t atomics_mode;             /* cublasSetAtomicsMode */
    int32_t workspace_set;
    int32_t sm_count_target;          /* cublasSetSmCountTarget */
} pilot_req_blas_gemm;

/* A cuBLAS function of the generic path (shim/tables/cublas_calls.tsv): its arguments after the handle
 * in order, each as 64 bits (ints sign-extended, pointers); a scalar under
 * CUBLAS_POINTER_MODE_HOST travels by value in `scalars` (the n-th scalar argument in the n-th
 * slot) and its args entry is 0. */
#define PILOT_BLAS_ARGS_MAX 16
typedef struct pilot_req_blas_call {
    uint64_t handle;
    uint64_t stream;
    uint64_t workspace;
    uint64_t workspace_size;
    uint64_t args[PILOT_BLAS_ARGS_MAX];
    uint8_t scalars[2][16];
    int32_t nargs;
    int32_t pointer_mode;
    int32_t math_mode;
    int32_t atomics_mode;
    int32_t workspace_set;
    int32_t sm_count_target;
} pilot_req_blas_call;

/* cublasLtMatmul (and the heuristic query, with the same descriptors). The descriptors travel as
 * attribute records in frame 2, each {object, attribute id, size} then `size` bytes padded to 8:
 * only what the program set (the create functions' arguments included), so the daemon builds
 * the same descriptors on the real library. */
#define PILOT_LT_RESULT_BYTES 96      /* sizeof(cublasLtMatmulHeuristicResult_t) */
#define PILOT_LT_ATTR_MAX 16          /* the largest attribute value */
enum pilot_lt_object {
    PILOT_LT_DESC = 0,                /* cublasLtMatmulDesc_t */
    PILOT_LT_LAYOUT_A = 1,            /* cublasLtMatrixLayout_t of A, B, C, D */
    PILOT_LT_LAYOUT_B = 2,
    PILOT_LT_LAYOUT_C = 3,
    PILOT_LT_LAYOUT_D = 4,
    PILOT_LT_PREFERENCE = 5           /* cublasLtMatmulPreference_t (the heuristic query) */
};

/* Matmul descriptor attributes (PILOT_LT_DESC) that hold device pointers, as a mask of attribute
 * numbers: bias 8, epilogue aux 11, A/B/C/D scale 17-20, amax D 21, aux scale 23, aux amax 24,
 * D out scale 36. A descriptor set is the same set whatever buffers they name: pilotd keys its
 * descriptors on the records with these values blanked and applies each call's values. */
#define PILOT_LT_POINTER_ATTRS 0x1001be0900

typedef struct pilot_lt_attr {
    uint16_t object;                  /* pilot_lt_object */
    uint16_t attr;                    /* the library's attribute number */
    uint32_t size;
} pilot_lt_attr;

typedef struct pilot_req_blaslt_matmul {
    uint64_t handle;                  /* LIB_CREATE's handle (PILOT_LIB_CUBLASLT) */
    uint64_t stream;                  /* daemon stream handle */
    uint64_t a, b, c, d;
    uint64_t workspace, workspace_size;
    uint64_t alpha_ptr, beta_ptr;     /* device pointer modes */
    uint8_t alpha[16], beta[16];      /* host pointer mode: the values */
    uint64_t algo[8];                 /* cublasLtMatmulAlgo_t, when has_algo */
    int32_t has_algo;
    int32_t requested;                /* HEURISTIC: results wanted */
} pilot_req_blaslt_matmul;

/* ---- cuDNN ---- */
/* A backend API descriptor call: the descriptor (pilotd's number), the attribute and its type
 * (cudnnBackendAttributeName_t, cudnnBackendAttributeType_t) and the element count. */
typedef struct pilot_req_dnn_attr {
    uint64_t desc;
    uint32_t attr;                    /* DESC_CREATE: the descriptor type */
    uint32_t type;
    int64_t count;
} pilot_req_dnn_attr;

/* cudnnBackendExecute: the plan, the handle's stream, and the variant pack's workspace; its
 * tensors follow as pairs (unique id, device pointer). */
typedef struct pilot_req_dnn_execute {
    uint64_t handle;                  /* LIB_CREATE's (PILOT_LIB_CUDNN) */
    uint64_t stream;                  /* daemon stream handle (cudnnSetStream) */
    uint64_t plan;
    uint64_t workspace;
    uint32_t count;
    uint32_t reserved;
} pilot_req_dnn_execute;

typedef struct pilot_dnn_ptr {
    int64_t uid;
    uint64_t ptr;
} pilot_dnn_ptr;

/* A legacy cudnnTensorDescriptor_t by value (dims and strides in elements). */
#define PILOT_DNN_DIM_MAX 8
typedef struct pilot_dnn_tensor {
    int32_t dtype;                    /* cudnnDataType_t */
    int32_t nbdims;                   /* 0: no descriptor (NULL) */
    int32_t dims[PILOT_DNN_DIM_MAX];
    int32_t strides[PILOT_DNN_DIM_MAX];
} pilot_dnn_tensor;

/* Which batch normalization function a request is (the daemon calls the same one). */
enum pilot_dnn_bn_fn {
    PILOT_BN_FORWARD_TRAINING_EX = 1,
    PILOT_BN_FORWARD_TRAINING = 2,
    PILOT_BN_FORWARD_INFERENCE = 3,   /* running_mean/var: the estimated mean and variance */
    PILOT_BN_BACKWARD_EX = 4,
    PILOT_BN_BACKWARD = 5,
    PILOT_BN_SIZE_FORWARD_WORKSPACE = 6,
    PILOT_BN_SIZE_RESERVE = 7,
    PILOT_BN_SIZE_BACKWARD_WORKSPACE = 8
};

/* One batch normalization call: forward ones use x, y; backward ones x, dy (in y), dx. The
 * host scalars travel as values (double). */
typedef struct pilot_req_dnn_bn {
    uint64_t handle;
    uint64_t stream;
    int32_t fn;                       /* pilot_dnn_bn_fn */
    int32_t mode;                     /* cudnnBatchNormMode_t */
    int32_t bn_ops;                   /* cudnnBatchNormOps_t */
    int32_t reserved;
    pilot_dnn_tensor x, y, dx, bn;
    uint64_t x_ptr, y_ptr, dx_ptr;
    uint64_t scale, bias, dscale, dbias;
    uint64_t running_mean, running_var, saved_mean, saved_inv_var;
    uint64_t workspace, workspace_size, reserve, reserve_size;
    double factor, epsilon;
    double alpha, beta, alpha_param, beta_param;
} pilot_req_dnn_bn;

/* PILOT_CDEF_END */

/* Stream handle values the shim never hands out: CUDA's special streams. */
#define PILOT_STREAM_LEGACY 0x1u
#define PILOT_STREAM_PER_THREAD 0x2u

#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
_Static_assert(sizeof(pilot_envelope) == 24, "envelope layout");
_Static_assert(sizeof(pilot_reply_hdr) == 8, "reply header layout");
_Static_assert(sizeof(pilot_req_launch) == 48, "launch layout");
_Static_assert(sizeof(pilot_req_memcpy) == 40, "memcpy layout");
_Static_assert(sizeof(pilot_lt_attr) == 8, "library attribute record layout");
#endif

#endif /* PILOT_PROTO_H */
