/* Finding libpilot.so's session table (ops_lookup.h). Compiled into each library that needs it;
 * hidden there. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "ops_lookup.h"

const struct pilot_driver_ops *pilot_ops_find(const char *library, const char *consequence)
{
    void *table = dlvsym(RTLD_DEFAULT, PILOT_DRIVER_OPS_SYMBOL, PILOT_DRIVER_OPS_NODE);
    if (!table) {
        Dl_info self;
        char path[PATH_MAX];
        if (dladdr((void *)pilot_ops_find, &self) && self.dli_fname &&
            strlen(self.dli_fname) < sizeof path) {
            strcpy(path, self.dli_fname);
            char beside[PATH_MAX + 16];
            snprintf(beside, sizeof beside, "%s/libpilot.so", dirname(path));
            void *lib = dlopen(beside, RTLD_NOW | RTLD_GLOBAL);
            if (lib)
                table = dlvsym(lib, PILOT_DRIVER_OPS_SYMBOL, PILOT_DRIVER_OPS_NODE);
        }
    }
    const struct pilot_driver_ops *ops = table;
    if (!ops || ops->version < PILOT_DRIVER_OPS_VERSION) {
        fprintf(stderr, "pilot: %s cannot reach libpilot.so (%s); %s\n", library,
                ops ? "too old" : "not found", consequence);
        return NULL;
    }
    return ops;
}
