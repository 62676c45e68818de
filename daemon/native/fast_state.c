/* A vGPU's fast-path state, below the paths that use it (fast_launch.c, fast_library.c): the
 * hash maps and sorted tables of its sessions, what a session owns, its streams, the clock. */
#include "fast_internal.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t mix(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return k;
}

struct entry *map_find(const struct map *m, uint64_t key)
{
    if (!m->cap || !key)
        return NULL;
    for (uint32_t i = (uint32_t)mix(key) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        struct entry *e = &m->slots[i];
        if (e->key == key)
            return e->value ? e : NULL;
        if (!e->key)
            return NULL;
    }
}

int map_put(struct map *m, uint64_t key, uint64_t value, uint32_t extra)
{
    if (!key)
        return -1;
    struct entry *e = NULL;
    if (m->cap) {
        for (uint32_t i = (uint32_t)mix(key) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
            if (m->slots[i].key == key || !m->slots[i].key) {
                e = &m->slots[i];
                break;
            }
        }
    }
    if (e && e->key == key) {
        e->value = value;
        e->extra = extra;
        return 0;
    }
    if (!value)
        return 0; /* removing what is not there */
    if ((m->used + 1) * 4 > m->cap * 3) { /* grow (and drop tombstones) */
        uint32_t cap = m->cap ? m->cap * 2 : 16;
        struct entry *slots = calloc(cap, sizeof *slots);
        if (!slots)
            return -1;
        struct map grown = {slots, cap, 0};
        for (uint32_t i = 0; i < m->cap; i++)
            if (m->slots[i].key && m->slots[i].value)
                map_put(&grown, m->slots[i].key, m->slots[i].value, m->slots[i].extra);
        free(m->slots);
        *m = grown;
        return map_put(m, key, value, extra);
    }
    e->key = key;
    e->value = value;
    e->extra = extra;
    m->used++;
    return 0;
}

struct fconn *fast_find_conn(pilot_fast *f, uint32_t conn)
{
    for (uint32_t i = 0; i < f->nconns; i++)
        if (f->conns[i]->conn == conn)
            return f->conns[i];
    return NULL;
}

void fast_stream_dirty(struct fconn *c, uint64_t stream)
{
    if (c->all_dirty)
        return;
    for (uint32_t i = 0; i < c->nsyncs; i++) {
        if (c->syncs[i] == stream) {
            c->sync_dirty[i] = 1;
            return;
        }
    }
    c->all_dirty = 1; /* a stream the list lacks: wait for everything */
}

/* The index of the first item whose key is above `at`. */
uint32_t sorted_after(const struct sorted *a, size_t size, uint64_t at)
{
    uint32_t lo = 0, hi = a->n;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        uint64_t key;
        memcpy(&key, (const char *)a->items + mid * size, sizeof key);
        if (key <= at)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

void *sorted_item(const struct sorted *a, size_t size, uint32_t i)
{
    return (char *)a->items + i * size;
}

/* The item keyed exactly `key`, or NULL. */
void *sorted_find(const struct sorted *a, size_t size, uint64_t key)
{
    uint32_t i = sorted_after(a, size, key);
    if (!i)
        return NULL;
    uint64_t *found = sorted_item(a, size, i - 1);
    return *found == key ? found : NULL;
}

void sorted_remove(struct sorted *a, size_t size, uint32_t i)
{
    memmove(sorted_item(a, size, i), sorted_item(a, size, i + 1), (a->n - i - 1) * size);
    a->n--;
}

/* Room for a new item at its key's place (the caller fills it), or NULL when out of memory. */
void *sorted_insert(struct sorted *a, size_t size, uint64_t key)
{
    if (a->n == a->cap) {
        uint32_t cap = a->cap ? a->cap * 2 : 16;
        void *grown = realloc(a->items, cap * size);
        if (!grown)
            return NULL;
        a->items = grown;
        a->cap = cap;
    }
    uint32_t i = sorted_after(a, size, key);
    memmove(sorted_item(a, size, i + 1), sorted_item(a, size, i), (a->n - i) * size);
    a->n++;
    return sorted_item(a, size, i);
}

/* The item whose [key, key+extent) holds `at` (extent: the uint64_t after the key), or NULL. */
void *sorted_holding(const struct sorted *a, size_t size, uint64_t at, int extent_is_end)
{
    uint32_t i = sorted_after(a, size, at);
    if (!i)
        return NULL;
    const uint64_t *it = sorted_item(a, size, i - 1);
    uint64_t end = extent_is_end ? it[1] : it[0] + it[1];
    return at < end ? (void *)it : NULL;
}

int fast_owns(const struct fconn *c, uint64_t ptr, uint64_t count)
{
    const struct range *r = sorted_holding(&c->ranges, sizeof *r, ptr, 0);
    return r && count <= r->size - (ptr - r->base);
}

double fast_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

uint64_t fast_stream(struct fconn *c, uint64_t token)
{
    uint64_t stream;
    if (!token) {
        stream = c->legacy_slow ? 0 : c->legacy;
    } else {
        const struct entry *st = map_find(&c->streams, token);
        stream = st && st->value != ~(uint64_t)0 ? st->value : 0;
    }
    if (stream)
        fast_stream_dirty(c, stream);
    return stream;
}
