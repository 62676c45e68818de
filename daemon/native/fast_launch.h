/* The daemon's fast path: posted kernel launches, small copies between the program's device
 * memory and its host (cudaMemcpy H2D and D2H carried inline), cudaDeviceSynchronize /
 * cudaStreamSynchronize of the program's streams, the flushes of its unified-memory shadows,
 * and library calls and memsets (fast_library.c: cuBLAS GEMMs, cuBLASLt matmuls, cuDNN
 * executions and batch normalization, cudaMemset), that need nothing of the daemon's Python (no
 * policy decision, no capacity enforcement, no timing) run here, in C, on the vGPU thread,
 * without the GIL, as the endpoint receives them; a copy is answered from here too. Everything else (and anything this path is not sure of) goes to
 * Python as before.
 *
 * Python (daemon/vgpu/fast.py) owns every decision: it says which sessions qualify, which of
 * their kernels and streams may be launched here (the first launch of each goes through Python,
 * which registers them), and it folds the counts of what ran here into its own bookkeeping after
 * each wait. Order is kept per connection: once one message of a connection goes to Python, the
 * rest of that connection's messages in the same batch do too.
 *
 * The declarations between the CDEF markers are read by cffi. */
#ifndef PILOT_FAST_LAUNCH_H
#define PILOT_FAST_LAUNCH_H

#include <stdint.h>

#include "pilot_proto.h"
#include "preempt_words.h"
#include "vgpu_server.h"

/* PILOT_FAST_CDEF_BEGIN */
typedef struct pilot_fast pilot_fast;

/* PILOT_FAST_NEXT_LAUNCH: as ALL, except that the next posted launch goes to Python (FAST_LEARN:
 * the messages after it are put back), for a policy that must see one launch (Python then tells
 * the session's mode again). */
enum pilot_fast_mode { PILOT_FAST_OFF = 0, PILOT_FAST_ALL = 1, PILOT_FAST_NEXT_LAUNCH = 2 };

/* What ran here for one connection since the last pilot_fast_take. */
#define PILOT_FAST_BUCKETS 24 /* latency buckets of the copies (+Inf last), see pilot_fast_new */
#define PILOT_FAST_GEMM_FNS 13 /* pilot_gemm_fn 1..12 (not the pointer-array batches) */

typedef struct pilot_fast_count {
    uint32_t conn;
    uint32_t launches;       /* kernels put on a stream */
    uint32_t legacy;         /* of which on the session's legacy (default) stream */
    int32_t synced;          /* the last thing done here: 1 a copy (synchronizing), 0 a launch */
    uint32_t d2h, h2d;       /* copies answered here */
    uint64_t d2h_bytes, h2d_bytes;
    uint32_t d2h_buckets[PILOT_FAST_BUCKETS], h2d_buckets[PILOT_FAST_BUCKETS];
    double d2h_seconds, h2d_seconds;
    /* cudaDeviceSynchronize [0] and cudaStreamSynchronize [1] answered here */
    uint32_t syncs[2];
    uint32_t sync_buckets[2][PILOT_FAST_BUCKETS];
    double sync_seconds[2];
    /* shadow flushes answered here, and whether any shadow has counts to take
     * (pilot_fast_take_shadows) */
    uint32_t flushes;
    uint64_t flush_bytes;
    uint32_t flush_buckets[PILOT_FAST_BUCKETS];
    double flush_seconds;
    int32_t shadows_touched;
    /* library calls and memsets put on their stream here: cuBLAS GEMMs by pilot_gemm_fn,
     * cuBLASLt matmuls, cudaMemset[Async] */
    uint32_t gemms[PILOT_FAST_GEMM_FNS];
    uint32_t lt_matmuls;
    uint32_t memsets;
    uint32_t dnn_executes; /* cudnnBackendExecute */
    uint32_t dnn_bn[2];    /* cudnnBatchNormalizationForwardTrainingEx, ...BackwardEx */
    uint32_t graphs;       /* executable graphs launched (cuGraphLaunch) */
    uint32_t words;        /* of the synchronizations and copies: answered by the completion
                            * word (fast_words.c), the GPU still working */
} pilot_fast_count;

/* What ran here for one unified-memory shadow since it was last taken. */
typedef struct pilot_fast_shadow_count {
    uint64_t base;
    uint64_t launches;      /* launches passing a pointer into one of its segments */
    uint64_t flushes, flushed_bytes, dirty_chunks;
} pilot_fast_shadow_count;

/* A generic launcher and copier (the sim backend's, through cffi callbacks): return 0 or a
 * CUresult. copy: to_host 1 copies device `src` to host `dst`, 0 host `src` to device `dst`;
 * a copy to the host returns once the bytes are there. */
typedef int (*pilot_fast_launch_fn)(uint64_t function, const uint32_t *grid, const uint32_t *block,
                                    uint32_t shared_bytes, uint64_t stream, const void *args,
                                    uint32_t arg_bytes);
typedef int (*pilot_fast_copy_fn)(int to_host, uint64_t dst, uint64_t src, uint64_t count,
                                  uint64_t stream);
typedef int (*pilot_fast_sync_fn)(uint64_t stream);

/* The driver's cuLaunchKernel, cuMemcpyDtoHAsync_v2, cuMemcpyHtoDAsync_v2 (copies to pageable
 * memory return once done) and cuStreamSynchronize, or NULL and the generic functions. bounds:
 * the copies' and synchronizations' latency buckets in seconds (nbounds < PILOT_FAST_BUCKETS;
 * +Inf follows). protocol_version: the envelope version requests must carry. */
pilot_fast *pilot_fast_new(void *cuda_launch, void *cuda_dtoh, void *cuda_htod, void *cuda_sync,
                           pilot_fast_launch_fn generic_launch, pilot_fast_copy_fn generic_copy,
                           pilot_fast_sync_fn generic_sync, const double *bounds, int nbounds,
                           uint16_t protocol_version);
void pilot_fast_free(pilot_fast *f);
/* The driver's cuStreamQuery, cuEventCreate, cuEventRecord, cuEventSynchronize, cuEventDestroy
 * and cuCtxGetCurrent. With them, while the spin budget has a limit (spin_budget.h), a GPU wait
 * of this path (a synchronization; a copy to the host behind queued work) spins only while it
 * holds a token of the budget, for at most PILOT_FAST_SPIN_WAIT_US, and otherwise sleeps on an
 * event made with CU_EVENT_BLOCKING_SYNC in the thread's current context; it then calls
 * cuStreamSynchronize on the finished stream (which returns at once, reports the stream's error
 * and makes the driver print kernels' printf output). Without them or a limit every wait is
 * cuStreamSynchronize, which waits as the context's schedule says (pilotd's one context on many
 * cores: it spins). Returns 0, or -1 when one is NULL (nothing is changed then). */
int pilot_fast_waits(pilot_fast *f, void *stream_query, void *event_create, void *event_record,
                     void *event_synchronize, void *event_destroy, void *ctx_get_current);
/* Completion words (fast_words.c, pilot_ring.h's GPU page): a synchronization or a small copy
 * to the host carrying PILOT_F_GPU_WORD is answered PILOT_F_WORD_PENDING as soon as a write of
 * the connection's word is queued behind its work; the shim polls the word. Native: the driver's
 * cuMemHostRegister_v2, cuMemHostGetDevicePointer_v2, cuMemHostUnregister,
 * cuStreamWriteValue32_v2 and cuEventQuery (after pilot_fast_waits, whose events it uses).
 * Generic (the sim): one callback, by op: REGISTER (a: host page, b: bytes; *out: its device
 * address), WRITE (a: stream, b: device address, value; *out: a marker of the write), DONE (a:
 * marker; returns 1 once written), FORGET (a: marker), UNREGISTER (a: host page); 0 or an
 * error otherwise. Without either, every call is answered the usual way. Return 0 or -1. */
enum pilot_fast_word_op {
    PILOT_WORD_REGISTER = 0,
    PILOT_WORD_WRITE = 1,
    PILOT_WORD_DONE = 2,
    PILOT_WORD_FORGET = 3,
    PILOT_WORD_UNREGISTER = 4
};
typedef int (*pilot_fast_word_fn)(int op, uint64_t a, uint64_t b, uint32_t value, uint64_t *out);
int pilot_fast_words(pilot_fast *f, void *host_register, void *host_device_pointer,
                     void *host_unregister, void *write_value, void *event_query);
int pilot_fast_words_generic(pilot_fast *f, pilot_fast_word_fn generic);
/* A synchronization of `stream` as this path makes them (the budgeted wait, then
 * cuStreamSynchronize; the sim's callback): 0 or the CUresult. */
int pilot_fast_sync(pilot_fast *f, uint64_t stream);

/* A connection's session qualifies (enabled PILOT_FAST_ALL, or PILOT_FAST_NEXT_LAUNCH) or not
 * (PILOT_FAST_OFF, the default). legacy_stream is the
 * CUstream that work on the program's stream 0 goes to, or 0 when none exists yet; legacy_slow:
 * such work must go through Python (its blocking streams have work the legacy stream must wait
 * for). context: the key of
 * the (green) context the session's work runs in; a launch runs here only while the thread's
 * current key (pilot_fast_context) is the same. Returns 0, or -1 when out of memory. */
int pilot_fast_session(pilot_fast *f, uint32_t conn, uint64_t session, int enabled,
                       uint64_t legacy_stream, int legacy_slow, int deferred, uint64_t context);
/* The session's device memory [base, base+size) that copies may touch (size 0: forget the range
 * at base). deferred (above): an asynchronous error waits for the next synchronizing call, so
 * copies go to Python, which reports it. Returns 0, or -1. */
int pilot_fast_range(pilot_fast *f, uint32_t conn, uint64_t base, uint64_t size);
/* Every CUstream of the session (its legacy stream first): cudaDeviceSynchronize is answered
 * here by synchronizing those that may have work since the last one (all after Python handled a
 * call), while none of its work waits in Python (n 0: such calls go to
 * Python). cudaStreamSynchronize of the legacy stream or of a stream C launches on is answered
 * here too, under the same condition. Copies the list; returns 0, or -1. */
int pilot_fast_sync_streams(pilot_fast *f, uint32_t conn, const uint64_t *streams, uint32_t n);
/* Python handled a call of the connection's session: the next device synchronization C
 * answers waits for every stream (C knows only which streams its own work went to). */
void pilot_fast_python_work(pilot_fast *f, uint32_t conn);
/* The session on `conn` preempts: its launches, graph launches, library calls and memsets in C
 * enter and leave `p` with these words (preempt_words.h); words 0 or p NULL: it does not. */
int pilot_fast_raises(pilot_fast *f, uint32_t conn, pilot_preempt *p, uint32_t words);
/* The file the kernels' printf output is captured in (daemon/vgpu/device_output.py; fd -1:
 * none) and how much of it Python has taken: a synchronization or copy after which the file is
 * longer goes to Python (which synchronizes again, a no-op, and sends the output with the
 * reply), so the output reaches the program where the driver would have printed it. */
void pilot_fast_output(pilot_fast *f, int fd, uint64_t taken);
/* How many sessions attached to this pilotd may print (device_output.py; any thread): with more
 * than one, their output goes to nobody, and a synchronization may be answered by the completion
 * word although kernels ran since the last one (PILOT_F_GPU_WORD). */
void pilot_fast_output_sessions(int n);
/* The connection's session loaded code that may print (vprintf, __assertfail): while it is the
 * only such session attached, its synchronizations after launches go to Python, which sends the
 * output with the reply. Sessions that cannot print are answered by the word beside it. */
int pilot_fast_printer(pilot_fast *f, uint32_t conn);
/* Python launched a kernel of the connection's session: its next blocking copy to the host
 * makes the driver print what kernels printed (C's own launches count themselves). */
void pilot_fast_mark_launched(pilot_fast *f, uint32_t conn);
/* The context now current on the vGPU thread. */
void pilot_fast_context(pilot_fast *f, uint64_t context);
/* The session's function handle `token` is CUfunction `function` taking `arg_bytes` of packed
 * arguments; its stream handle `token` is CUstream `stream` (0: forgotten, the stream is gone),
 * or with `slow` a stream whose launches go through Python (a blocking stream). Return 0, or -1
 * when out of memory or the connection is unknown. */
int pilot_fast_function(pilot_fast *f, uint32_t conn, uint64_t token, uint64_t function,
                        uint32_t arg_bytes);
int pilot_fast_stream(pilot_fast *f, uint32_t conn, uint64_t token, uint64_t stream, int slow);
/* Unified memory. A shadow of the session (shim/runtime/managed/coherence.c) mapped at [base, base+length),
 * cut by the client into chunks of `chunk` bytes (length 0: forget it; its counts not taken yet
 * go to *left when left is not NULL, else are lost); and one managed segment [lo, hi) inside
 * it, which flushes copy and launches count (a shadow of __managed__ variables has several).
 * Launches here count, per shadow, those passing a pointer into one of its segments (any
 * 8-byte-aligned argument word), as Python's Session.note_managed_launch does. Return 0, or -1
 * when out of memory, the connection is unknown or the segment lies outside every shadow. */
int pilot_fast_shadow(pilot_fast *f, uint32_t conn, uint64_t base, uint64_t length,
                      uint64_t chunk, pilot_fast_shadow_count *left);
int pilot_fast_segment(pilot_fast *f, uint32_t conn, uint64_t lo, uint64_t hi);
/* The session's staging area as the daemon maps it (shadow flushes read their slots from it;
 * base NULL: none open). Returns 0, or -1 for an unknown connection. */
int pilot_fast_staging(pilot_fast *f, uint32_t conn, const uint8_t *base, uint64_t slot_bytes,
                       uint32_t slots);
/* The vGPU's coherence stream (daemon/ops/unified.py): a shadow flush copies on it and
 * synchronizes it before the reply, so that later work on any stream sees the bytes. 0: none
 * yet, flushes go to Python. */
void pilot_fast_coherence(pilot_fast *f, uint64_t stream);
/* Copies up to max counts of the connection's shadows with anything counted since the last
 * take, and zeroes them; returns how many were copied. */
int pilot_fast_take_shadows(pilot_fast *f, uint32_t conn, pilot_fast_shadow_count *out, int max);
/* Library calls and memsets (cuBLAS GEMMs, cuBLASLt matmuls, cudaMemset of the session's device
 * memory), checked and issued here as launches are: every matrix, workspace, bias and scalar
 * range must lie in one of the session's device allocations (pilot_fast_range), the stream must
 * be one C knows, the handle one Python registered. Anything else (pointer arrays, device-memory
 * scalars, managed memory, an unknown handle or descriptor set) goes to Python.
 *
 * fns: the functions, by enum pilot_fast_libfn (native mode: cuMemsetD8Async, cuBLAS's setters
 * and GEMMs, cublasLtMatmul; an entry may be NULL, and its calls then go to Python), or NULL
 * with `generic` (the sim backend: C checks, then calls back with the request). type_sizes:
 * bytes of each cudaDataType value below ntypes (0: a type C does not size). Returns 0 or -1. */
enum pilot_fast_libfn {
    PILOT_FAST_MEMSET_D8 = 0,
    PILOT_FAST_BLAS_SET_STREAM = 1,
    PILOT_FAST_BLAS_SET_WORKSPACE = 2,
    PILOT_FAST_BLAS_SET_MATH_MODE = 3,
    PILOT_FAST_BLAS_SET_ATOMICS_MODE = 4,
    PILOT_FAST_BLAS_SET_SM_COUNT_TARGET = 5,
    PILOT_FAST_BLAS_SET_POINTER_MODE = 6,
    PILOT_FAST_LT_MATMUL = 7,
    PILOT_FAST_GEMM_BASE = 8, /* + pilot_gemm_fn 1..12 */
    PILOT_FAST_DNN_SET_STREAM = 21,
    PILOT_FAST_DNN_CREATE = 22,   /* cudnnBackendCreateDescriptor */
    PILOT_FAST_DNN_SET = 23,      /* cudnnBackendSetAttribute */
    PILOT_FAST_DNN_FINALIZE = 24,
    PILOT_FAST_DNN_EXECUTE = 25,
    PILOT_FAST_DNN_DESTROY = 26,
    PILOT_FAST_DNN_TENSOR_CREATE = 27, /* cudnnCreateTensorDescriptor */
    PILOT_FAST_DNN_TENSOR_SET = 28,    /* cudnnSetTensorNdDescriptor */
    PILOT_FAST_DNN_TENSOR_DESTROY = 29,
    PILOT_FAST_DNN_BN_FORWARD = 30,    /* cudnnBatchNormalizationForwardTrainingEx */
    PILOT_FAST_DNN_BN_BACKWARD = 31,   /* cudnnBatchNormalizationBackwardEx */
    PILOT_FAST_GRAPH_LAUNCH = 32,      /* cuGraphLaunch */
    PILOT_FAST_LT_DESC_SET = 33,       /* cublasLtMatmulDescSetAttribute (a call's pointers) */
    PILOT_FAST_LIBFNS = 34
};
/* The session's executable graph `token` (the program's handle) is pilotd's CUgraphExec
 * `graph_exec` (the sim: a value standing for its graph); 0 forgets it. Its launches run here
 * (cuGraphLaunch, or the sim's callback with PILOT_OP_GRAPH_LAUNCH) on a stream C knows. */
int pilot_fast_graph(pilot_fast *f, uint32_t conn, uint64_t token, uint64_t graph_exec);
typedef int (*pilot_fast_call_fn)(uint32_t conn, uint16_t opcode, uint64_t stream, const void *req,
                                  uint32_t req_len, const void *payload, uint32_t payload_len);
int pilot_fast_libraries(pilot_fast *f, void *const *fns, int nfns, const uint8_t *type_sizes,
                         int ntypes, pilot_fast_call_fn generic);
/* The session's library handle `token` is the library's handle `handle` (0: forget it, and its
 * descriptor sets and plans), of the kind below: a cuBLAS handle runs GEMMs and matmuls, a
 * cuBLASLt one matmuls only, a cuDNN one executions. A (re)registration also says Python has
 * just used the handle: C applies every setting (stream, modes) again at its next call.
 * Returns 0, or -1. */
enum pilot_fast_handle_kind { PILOT_FAST_CUBLASLT = 0, PILOT_FAST_CUBLAS = 1, PILOT_FAST_CUDNN = 2 };
int pilot_fast_library_handle(pilot_fast *f, uint32_t conn, uint64_t token, uint64_t handle,
                              int kind);
/* cuDNN's values C needs to build a variant pack: the descriptor type, the attributes of its
 * unique ids, data pointers and workspace, and the attribute types int64 and void pointer. */
void pilot_fast_dnn_constants(pilot_fast *f, int64_t variant_pack, int64_t attr_uids,
                              int64_t attr_pointers, int64_t attr_workspace, int64_t type_int64,
                              int64_t type_void_ptr);
/* A finalized execution plan of the session (pilotd's number `token`, cuDNN's `plan`): its
 * workspace size and the unique id and span in bytes of each tensor it reads or writes through
 * a pointer. An execution runs here when its variant pack names exactly these tensors, each
 * range inside one of the session's allocations. plan 0 with n 0: forget it; plan 0 with
 * python_only: a plan only Python runs (tensors pilot cannot size), so its executions do not
 * come back to learn. Returns 0, or -1. */
int pilot_fast_dnn_plan(pilot_fast *f, uint32_t conn, uint64_t token, uint64_t plan,
                        uint64_t workspace_size, const int64_t *uids, const uint64_t *spans,
                        uint32_t n, int python_only);
/* A cuBLASLt descriptor set of handle `token`: the attribute records the stand-in sends (frame
 * 2 of BLASLT_MATMUL) with the values of pointer attributes blanked (PILOT_LT_POINTER_ATTRS;
 * compared byte for byte with a call's records blanked the same way), the real descriptors
 * (matmul, A, B, C, D), the spans in bytes of A, B, C and D as the layouts give them, and
 * `nfixed` (attribute, span) pairs: every pointer attribute the records hold (bias, scale
 * pointers), whose value each call gives, is checked against the session and set on the matmul
 * descriptor before the call. Registered only for host-memory scalars. descs NULL: forget the
 * set. Returns 0, or -1. */
int pilot_fast_lt_plan(pilot_fast *f, uint32_t conn, uint64_t token, const uint8_t *records,
                       uint32_t len, const uint64_t *descs, const uint64_t *spans,
                       const uint64_t *fixed, uint32_t nfixed);
/* A batch normalization shape of the session Python has run (cudnnBatchNormalizationForward-
 * TrainingEx or BackwardEx: `req`'s function, mode, operations and tensors; its pointers and
 * scalars are not part of it) and the spans in bytes of its x, y, dx and scale/bias tensors.
 * Later calls of that shape are checked here (every range batch_norm_ranges in ops/dnn.py names,
 * optional ones when not NULL) and issued with tensor descriptors C makes for the shape.
 * Returns 0, or -1. */
int pilot_fast_dnn_bn(pilot_fast *f, uint32_t conn, const pilot_req_dnn_bn *req,
                      const uint64_t *spans);
/* Use f for the endpoint's launches (vgpu_server.h; NULL: none). */
void pilot_srv_set_fast(pilot_srv *s, pilot_fast *f);
/* Forget a connection (its session ended). */
void pilot_fast_forget(pilot_fast *f, uint32_t conn);
/* Copies up to max counts of connections with launches run here since the last take, and zeroes
 * them; returns how many were copied. */
int pilot_fast_take(pilot_fast *f, pilot_fast_count *out, int max);
/* The filter pilot_srv_set_fast puts on the endpoint (vgpu_server.c): runs the message's launch here (FAST_DONE), or says it goes to Python
 * (FAST_PYTHON), or goes to Python, which will teach this path something (FAST_LEARN: the
 * first launch of a kernel, or on a stream, not known here yet). */
enum pilot_fast_verdict { FAST_PYTHON = 0, FAST_DONE = 1, FAST_LEARN = 2 };
int pilot_fast_try(pilot_fast *f, pilot_srv *srv, const pilot_srv_msg *m);
/* PILOT_FAST_CDEF_END */


#endif
