/* Retreat words: see preempt_words.h. */
#include "preempt_words.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

struct pilot_preempt {
    pthread_mutex_t lock;      /* orders raise and clear writes on the stream */
    _Atomic uint32_t armed;
    _Atomic uint32_t raised;   /* changed under the lock only */
    _Atomic uint64_t entered, left;
    pilot_write_word_fn write;
    uint64_t stream, words;
    uint32_t nwords;
    uint64_t raises, clears, failed; /* under the lock */
};

pilot_preempt *pilot_preempt_new(pilot_write_word_fn write, uint64_t stream, uint64_t words,
                                 uint32_t nwords)
{
    if (!write || nwords == 0 || nwords > 32)
        return NULL;
    pilot_preempt *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    pthread_mutex_init(&p->lock, NULL);
    p->write = write;
    p->stream = stream;
    p->words = words;
    p->nwords = nwords;
    return p;
}

void pilot_preempt_free(pilot_preempt *p)
{
    if (!p)
        return;
    pthread_mutex_destroy(&p->lock);
    free(p);
}

void pilot_preempt_arm(pilot_preempt *p, uint32_t words)
{
    atomic_store(&p->armed, words);
}

uint32_t pilot_preempt_armed(pilot_preempt *p)
{
    return atomic_load(&p->armed);
}

/* Writes `value` into each word of `bits`; the bits written. Under the lock. */
static uint32_t write_words(pilot_preempt *p, uint32_t bits, uint32_t value)
{
    uint32_t done = 0;
    for (uint32_t i = 0; i < p->nwords; i++) {
        if (!(bits & (1u << i)))
            continue;
        if (p->write(p->stream, p->words + 4ull * i, value, 0) == 0)
            done |= 1u << i;
        else
            p->failed++;
    }
    return done;
}

void pilot_preempt_enter(pilot_preempt *p, uint32_t words)
{
    if (!p)
        return;
    atomic_fetch_add(&p->entered, 1);
    uint32_t want = atomic_load(&p->armed) & words;
    if (!want || !(want & ~atomic_load(&p->raised)))
        return; /* nothing armed, or raised already: the common case costs no lock */
    pthread_mutex_lock(&p->lock);
    uint32_t add = want & ~atomic_load(&p->raised);
    if (add) {
        uint32_t done = write_words(p, add, 1);
        atomic_fetch_or(&p->raised, done);
        p->raises += done != 0;
    }
    pthread_mutex_unlock(&p->lock);
}

void pilot_preempt_leave(pilot_preempt *p)
{
    if (p)
        atomic_fetch_add(&p->left, 1);
}

uint64_t pilot_preempt_seen(pilot_preempt *p)
{
    uint64_t left = atomic_load(&p->left);
    uint64_t entered = atomic_load(&p->entered);
    return entered == left ? entered : UINT64_MAX;
}

int pilot_preempt_clear(pilot_preempt *p, uint64_t seen, uint32_t words)
{
    pthread_mutex_lock(&p->lock);
    uint32_t raised = atomic_fetch_and(&p->raised, ~words) & words;
    if (!raised) {
        pthread_mutex_unlock(&p->lock);
        return 1;
    }
    if (atomic_load(&p->entered) != seen) { /* a launch entered since: it may rely on a word */
        atomic_fetch_or(&p->raised, raised);
        pthread_mutex_unlock(&p->lock);
        return 0;
    }
    uint32_t done = write_words(p, raised, 0);
    if (done != raised) /* a word the driver would not lower stays marked, to be tried again */
        atomic_fetch_or(&p->raised, raised & ~done);
    p->clears++;
    pthread_mutex_unlock(&p->lock);
    return done == raised ? 1 : -1;
}

int pilot_preempt_reassert(pilot_preempt *p)
{
    pthread_mutex_lock(&p->lock);
    uint32_t down = ~atomic_load(&p->raised) & ((p->nwords == 32) ? ~0u : (1u << p->nwords) - 1);
    uint32_t done = write_words(p, down, 0);
    pthread_mutex_unlock(&p->lock);
    return done == down ? 0 : -1;
}

uint32_t pilot_preempt_raised(pilot_preempt *p)
{
    return atomic_load(&p->raised);
}

void pilot_preempt_counts(pilot_preempt *p, uint64_t *raises, uint64_t *clears, uint64_t *failed)
{
    pthread_mutex_lock(&p->lock);
    *raises = p->raises;
    *clears = p->clears;
    *failed = p->failed;
    pthread_mutex_unlock(&p->lock);
}
