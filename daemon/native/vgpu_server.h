/* The daemon's data-plane endpoint: a ZMTP/3.0 ROUTER-side server on a UNIX socket, driven by
 * one vGPU thread (compiled into pilot.shim._proto, called through cffi with the GIL released).
 *
 * Why not libzmq here: libzmq moves every message through its I/O thread, which costs two extra
 * thread wake-ups per direction on the hot path of every synchronous CUDA call. This server reads
 * and writes the connections on the calling thread, spinning briefly before it sleeps. It speaks
 * the same wire protocol (any ZeroMQ DEALER can connect) and takes each peer's uid/gid/pid from
 * the kernel (SO_PEERCRED) when it accepts the connection.
 *
 * The declarations between the CDEF markers are read by cffi. */
#ifndef PILOT_VGPU_SERVER_H
#define PILOT_VGPU_SERVER_H

#include <stddef.h>
#include <stdint.h>

/* PILOT_SRV_CDEF_BEGIN */
typedef struct pilot_srv pilot_srv;

typedef struct pilot_srv_msg {
    uint32_t conn;     /* connection id, never reused by one server */
    uint32_t nframes;  /* 1..4 */
    const uint8_t *frame[4];
    uint64_t len[4];
} pilot_srv_msg;

/* Binds and listens on path. control_fd (or -1) is watched too: wait() reports it readable. */
pilot_srv *pilot_srv_open(const char *path, int control_fd, char *err, size_t errlen);
void pilot_srv_close(pilot_srv *s);

/* Waits for requests: first spins up to spin_us without sleeping, then sleeps up to timeout_ms
 * (-1: no limit). Fills up to max messages and returns their number (0 on timeout or control),
 * or -1 on a fatal error. *control is set to 1 when control_fd is readable. Frames point into
 * the server's buffers and stay valid until the next call of pilot_srv_wait. */
int pilot_srv_wait(pilot_srv *s, int timeout_ms, int spin_us, pilot_srv_msg *out, int max,
                   int *control);

/* Sends a 2- or 3-frame message (f2 may be NULL) to a connection, without waiting: what the
 * socket does not take now is queued and written when the peer reads (the server's wait does
 * it). A peer that lets more than 1 MiB of replies pile up is disconnected. Returns 0, or -1 if
 * the connection is gone. */
int pilot_srv_send(pilot_srv *s, uint32_t conn, const void *f0, size_t l0, const void *f1,
                   size_t l1, const void *f2, size_t l2);
/* The same with one more frame after them, f3 (l3 bytes, not NULL): a reply carrying the
 * program's kernels' printf output (PILOT_F_DEVICE_OUTPUT in the envelope f0). */
int pilot_srv_send4(pilot_srv *s, uint32_t conn, const void *f0, size_t l0, const void *f1,
                    size_t l1, const void *f2, size_t l2, const void *f3, size_t l3);

/* The kernel's credentials of a connection's peer. Returns 0, or -1 if the connection is gone. */
int pilot_srv_peer(pilot_srv *s, uint32_t conn, uint32_t *uid, uint32_t *gid, int32_t *pid);

/* A connection attached a session: its messages may now be as large as any request (1 GiB);
 * before, a frame over 64 KiB closes the connection, so an unattached peer cannot make the
 * server buffer more than that. Returns 0, or -1 if the connection is gone. */
int pilot_srv_trust(pilot_srv *s, uint32_t conn);

/* Closes a connection (its session was ended): the peer sees EOF at once. Returns 0 or -1. */
int pilot_srv_disconnect(pilot_srv *s, uint32_t conn);

/* Number of open connections (for reports and tests). */
int pilot_srv_connections(pilot_srv *s);

/* Connections every endpoint server of the process may hold together, and one uid on one
 * endpoint (issue 27: a user's idle connections must not fill a socket others need, nor
 * pilotd's descriptors); more are closed as they are accepted. Any thread, before or after open. */
void pilot_srv_set_limits(int total, int per_uid);
/* Connections the endpoint servers of this process refused (past those limits, or out of
 * descriptors) since it started, and the uid of the last one (UINT32_MAX: unknown). */
void pilot_srv_refusals(uint64_t *count, uint32_t *last_uid);
/* A session of `uid` began (+1) or ended (-1) in this process. The endpoint servers serve only
 * sessions, so they accept connections only of uids that hold one (and root's): another user's
 * connections are closed as they are accepted, before any handshake or frame reaches the thread
 * that serves the tenants (issue 27: a flood of them on a vGPU's socket delayed its tenants'
 * calls). Any thread. Returns the uid's sessions now, or -1 when the table is full (then every
 * uid is accepted, as before: never a session refused its own endpoint). */
int pilot_srv_session_uid(uint32_t uid, int delta);
/* PILOT_SRV_CDEF_END */

/* A filter of the messages wait() receives: it runs a message in C and says FAST_DONE, or leaves
 * it to Python (FAST_PYTHON, FAST_LEARN: fast_launch.h); wait() then returns only the messages
 * left for Python (possibly 0). NULL turns it off. Set by the fast path, which sits above this
 * server (pilot_srv_set_fast, fast_launch.c). */
typedef int (*pilot_srv_filter_fn)(void *ctx, pilot_srv *s, const pilot_srv_msg *m);
void pilot_srv_set_filter(pilot_srv *s, pilot_srv_filter_fn filter, void *ctx);

/* A connection's ring mapping (pilot_ring.h, after RING_OPEN), or NULL. */
void *pilot_srv_ring_map(pilot_srv *s, uint32_t conn);
/* Called when a connection ends, before its ring is unmapped: a return of 1 takes the mapping
 * over (the callee unmaps it later: the GPU may still write its page, fast_words.c). NULL: none. */
typedef int (*pilot_srv_ring_release_fn)(void *ctx, uint32_t conn, void *map);
void pilot_srv_set_ring_release(pilot_srv *s, pilot_srv_ring_release_fn fn, void *ctx);

#endif
