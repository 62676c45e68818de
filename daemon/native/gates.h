/* Host-callback gates: the few lines of C that run on the CUDA driver's callback thread.
 *
 * pilotd turns a program's host callback into two stream operations on its own stream: a host
 * function (pilot_gate_fire, no Python, no GIL) that reports "the stream got here" by writing
 * the gate's token into a pipe the callback hub (daemon/callbacks.py) watches, then a wait on
 * the gate's word in pinned host memory (cuStreamWaitValue32) that holds back everything queued
 * after it until the hub opens the gate, once the client ran the callback. Where the device
 * cannot wait on memory, the host function itself waits for the word (gate.wait = 1).
 *
 * Compiled into pilot.shim._proto (the daemon's cffi module), not into libpilot.so. The part
 * between the CDEF markers is read by cffi. */
#ifndef PILOT_GATES_H
#define PILOT_GATES_H

#include <stdint.h>

/* PILOT_GATE_CDEF_BEGIN */
typedef struct pilot_gate {
    uint32_t word;     /* the stream goes on once (int32_t)(word - target) >= 0 */
    uint32_t target;
    int32_t status;    /* the stream's CUresult, set by pilot_gate_fire_status */
    int32_t fd;        /* pipe the token is written to when the stream reaches the gate */
    uint64_t token;
    uint32_t wait;     /* 1: the host function waits for the word itself */
    uint32_t reserved;
} pilot_gate;

/* CUhostFn: cuLaunchHostFunc(stream, pilot_gate_fire, gate). */
void pilot_gate_fire(void *gate);
/* CUstreamCallback: cuStreamAddCallback(stream, pilot_gate_fire_status, gate, 0). */
void pilot_gate_fire_status(void *stream, int status, void *gate);
/* Opens the gate: word = value (the stream's wait ends; a waiting host function returns). */
void pilot_gate_open(pilot_gate *gate, uint32_t value);
/* PILOT_GATE_CDEF_END */

#endif
