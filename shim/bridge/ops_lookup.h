/* How a library beside libpilot.so (the driver API library, the CUDA library stand-ins) finds
 * libpilot.so's table of session operations (driver_ops.h). */
#ifndef PILOT_OPS_LOOKUP_H
#define PILOT_OPS_LOOKUP_H

#include "driver_ops.h"

/* The table already in the process (libpilot.so preloaded, or the program's libcudart), else
 * that of the libpilot.so installed beside the calling library; NULL (after one line on stderr
 * naming `library` and `consequence`) when neither is there or it is older than this library. */
const struct pilot_driver_ops *pilot_ops_find(const char *library, const char *consequence);

#endif
