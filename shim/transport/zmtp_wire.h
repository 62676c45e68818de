/* ZMTP/3.0 frame headers: the one definition for the shim's client (zmtp.c) and pilotd's vGPU
 * endpoint (daemon/native/vgpu_server.c). A frame is a flags byte, then its size in one byte or,
 * with ZMTP_FLAG_LONG, in eight (big-endian), then the bytes. */
#ifndef PILOT_ZMTP_WIRE_H
#define PILOT_ZMTP_WIRE_H

#include <stddef.h>
#include <stdint.h>

#define ZMTP_FLAG_MORE 0x01
#define ZMTP_FLAG_LONG 0x02
#define ZMTP_FLAG_COMMAND 0x04
#define ZMTP_HEADER_MAX 9

/* Writes a frame's header into out (ZMTP_HEADER_MAX bytes); returns its length. */
static inline size_t zmtp_encode_header(uint8_t *out, uint8_t flags, uint64_t size)
{
    if (size <= 255) {
        out[0] = flags;
        out[1] = (uint8_t)size;
        return 2;
    }
    out[0] = flags | ZMTP_FLAG_LONG;
    for (int i = 8; i >= 1; i--) {
        out[i] = (uint8_t)size;
        size >>= 8;
    }
    return 9;
}

/* Reads the header at p (avail bytes): its length, or 0 when it is not all there yet. */
static inline size_t zmtp_decode_header(const uint8_t *p, size_t avail, uint8_t *flags,
                                        uint64_t *size)
{
    if (avail < 2)
        return 0;
    *flags = p[0];
    if (!(p[0] & ZMTP_FLAG_LONG)) {
        *size = p[1];
        return 2;
    }
    if (avail < 9)
        return 0;
    uint64_t v = 0;
    for (int i = 1; i < 9; i++)
        v = (v << 8) | p[i];
    *size = v;
    return 9;
}

#endif
