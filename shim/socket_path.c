#include "socket_path.h"

#include <stdio.h>
#include <stdlib.h>
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
