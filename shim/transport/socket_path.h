/* The default socket path rule, shared by the shim and the daemon (compiled into both). */
#ifndef PILOT_SOCKET_PATH_H
#define PILOT_SOCKET_PATH_H
#include <stddef.h>

#define PILOT_SOCKET_ENV "PILOT_SOCKET"
#define PILOT_SYSTEM_SOCKET "/run/pilot/pilot.sock"

/* Writes the socket path into buf. $PILOT_SOCKET wins. Otherwise a daemon run by root uses
 * /run/pilot/pilot.sock and one run by an ordinary user $XDG_RUNTIME_DIR/pilot/pilot.sock
 * (/tmp/pilot-UID/pilot.sock without XDG_RUNTIME_DIR). A client uses its user's own daemon
 * when that socket exists, else the system daemon's. Returns 0, or -1 if buf is too small. */
int pilot_socket_path(int for_daemon, char *buf, size_t len);

/* Whether a socket at `path` ("ipc://" allowed) may be pilotd's: the socket and its directory
 * are owned by root or by this process's user, and the directory is writable by no one else
 * (another user could otherwise have created it first, or replace the socket, and receive this
 * user's CUDA calls). 0 if so; else -1 with the problem in why. */
int pilot_socket_trusted(const char *path, char *why, size_t why_len);

#endif
