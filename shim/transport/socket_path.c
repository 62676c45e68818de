#include "socket_path.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int user_socket_path(char *buf, size_t len)
{
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    int n;
    if (xdg && xdg[0] == '/')
        n = snprintf(buf, len, "%s/pilot/pilot.sock", xdg);
    else
        n = snprintf(buf, len, "/tmp/pilot-%u/pilot.sock", (unsigned)getuid());
    return (n < 0 || (size_t)n >= len) ? -1 : 0;
}

int pilot_socket_path(int for_daemon, char *buf, size_t len)
{
    const char *env = getenv(PILOT_SOCKET_ENV);
    int n;
    if (env && env[0]) {
        n = snprintf(buf, len, "%s", env);
        return (n < 0 || (size_t)n >= len) ? -1 : 0;
    }
    if (getuid() == 0) {
        n = snprintf(buf, len, "%s", PILOT_SYSTEM_SOCKET);
        return (n < 0 || (size_t)n >= len) ? -1 : 0;
    }
    if (user_socket_path(buf, len) != 0)
        return -1;
    if (for_daemon || access(buf, F_OK) == 0)
        return 0;
    n = snprintf(buf, len, "%s", PILOT_SYSTEM_SOCKET);
    return (n < 0 || (size_t)n >= len) ? -1 : 0;
}

static int trusted_owner(uid_t owner)
{
    return owner == 0 || owner == getuid();
}

int pilot_socket_trusted(const char *path, char *why, size_t why_len)
{
    char dir[512];
    struct stat st;
    if (strncmp(path, "ipc://", 6) == 0)
        path += 6;
    const char *slash = strrchr(path, '/');
    size_t dlen = !slash ? 1 : slash == path ? 1 : (size_t)(slash - path);
    if (dlen >= sizeof dir) {
        snprintf(why, why_len, "its path is too long");
        return -1;
    }
    memcpy(dir, slash ? path : ".", dlen);
    dir[dlen] = 0;
    if (stat(dir, &st) != 0) {
        snprintf(why, why_len, "cannot read its directory %s: %s", dir, strerror(errno));
        return -1;
    }
    if (!trusted_owner(st.st_uid) || (st.st_mode & (S_IWGRP | S_IWOTH))) {
        snprintf(why, why_len,
                 "its directory %s is %s (uid %u, mode %03o): another user could have put that "
                 "socket there; only root's or your own directory, writable by no one else, is trusted",
                 dir, trusted_owner(st.st_uid) ? "writable by others" : "owned by another user",
                 (unsigned)st.st_uid, (unsigned)(st.st_mode & 0777));
        return -1;
    }
    if (stat(path, &st) != 0)
        return 0; /* absent: connecting says so */
    if (!trusted_owner(st.st_uid)) {
        snprintf(why, why_len, "the socket is owned by another user (uid %u)", (unsigned)st.st_uid);
        return -1;
    }
    return 0;
}
