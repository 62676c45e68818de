/* A minimal ZMTP/3.0 DEALER peer over a UNIX stream socket: enough to talk to pilotd's libzmq
 * ROUTER sockets without loading libzmq (and its I/O threads) into the user's program.
 * Blocking I/O on the caller's thread; a closed peer shows as an error at once, never a hang.
 * NULL security mechanism only (the daemon authenticates by the kernel's peer credentials). */
#ifndef PILOT_ZMTP_H
#define PILOT_ZMTP_H

#include <stddef.h>
#include <stdint.h>

#include "pilot_ring.h"

#define ZMTP_MAX_FRAMES 4

struct zmtp_conn {
    int fd;
    int spin_us; /* poll this long for a reply before sleeping */
    /* Liveness: while zmtp_recv waits for a message, every `alive_ms` (0: never) it calls
     * alive(); a 0 from it ends the wait with -ETIMEDOUT (the peer stopped answering). */
    int alive_ms;
    int (*alive)(void);
    /* receive buffer for one whole multipart message */
    uint8_t *buf;
    size_t cap;
    /* bytes read from the socket ahead of the parser: one recv takes a small reply whole
     * (headers and frames) instead of one recv per header and per frame */
    uint32_t rpos, rlen;
    uint8_t ahead[4096];
    /* After zmtp_use_ring the stream runs through shared-memory rings (pilot_ring.h); the socket
     * then carries doorbells and EOF only. */
    void *ring_map;
    struct pilot_ring rout, rin; /* requests out, replies in */
};

struct zmtp_frame {
    const void *data;
    size_t len;
};

/* Connects to a UNIX socket path and completes the ZMTP handshake. Returns 0 or -errno
 * (-EPROTO when the peer does not speak ZMTP/3 with the NULL mechanism). */
int zmtp_connect(struct zmtp_conn *c, const char *path);

/* Every send and receive on the connection fails with -EAGAIN after `ms` milliseconds without
 * progress (0: wait for ever). For set-up: a stopped daemon, or a socket that is no pilotd
 * endpoint, must not hang the program. */
int zmtp_set_timeout(struct zmtp_conn *c, int ms);

/* zmtp_connect with the handshake bounded by `ms` (the timeout stays set: clear it with
 * zmtp_set_timeout(c, 0) when the connection is up). */
int zmtp_connect_timeout(struct zmtp_conn *c, const char *path, int ms);
void zmtp_close(struct zmtp_conn *c);

/* Sends one multipart message. Returns 0 or -errno (-EPIPE when the daemon went away). */
int zmtp_send(struct zmtp_conn *c, const struct zmtp_frame *frames, int nframes);

/* Receives one multipart message into the connection's buffer; frames point into it and stay
 * valid until the next zmtp_recv. Returns the number of frames or -errno. */
int zmtp_recv(struct zmtp_conn *c, struct zmtp_frame *frames, int max_frames);

/* zmtp_recv for a reply that carries a descriptor (SCM_RIGHTS): *fd is it, or -1. Nothing may be
 * read ahead on the connection (a synchronous request's reply). */
int zmtp_recv_fd(struct zmtp_conn *c, struct zmtp_frame *frames, int max_frames, int *fd);

/* Moves the connection's stream into the rings of the memfd pilotd handed over (RING_OPEN,
 * pilot_ring.h); takes fd. Returns 0 or -errno (then the connection is unusable: pilotd has
 * switched already). */
int zmtp_use_ring(struct zmtp_conn *c, int fd);

/* The completion word of a connection in rings (pilot_ring.h): whether it has one, and a wait
 * until it reaches `target` (polling, for at most budget_us), then copies len bytes (at most
 * PILOT_RING_GPU_DATA) of the GPU page's data to out. 0, or -1 when the budget ran out (or no
 * word): the caller then asks pilotd the usual way. */
int zmtp_has_word(const struct zmtp_conn *c);
int zmtp_wait_word(struct zmtp_conn *c, uint32_t target, long budget_us, void *out, size_t len);

/* After fork, in the child: lets go of the parent's connection (its socket and rings) without
 * touching what the parent shares. */
void zmtp_abandon(struct zmtp_conn *c);

#endif
