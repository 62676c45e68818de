/* Retreat words (issue 29): how a higher class's launches stop the preemptible kernels of lower
 * classes on the same GPU, and how the words come down again.
 *
 * One u32 per victim class in device memory, read by every preemptible variant of that class
 * before each claim (daemon/backends/ptx_preempt.py). A session whose launches preempt (its class
 * is above a gated one) *enters* before it puts kernels on a stream and *leaves* after: entering
 * raises each armed word it preempts that is not raised yet, with cuStreamWriteValue32 on the
 * GPU's stream of the greatest priority, so the write lands on the GPU's front end before the
 * kernel that wants the SMs, while the variants run. Python *arms* a class while it has
 * preemptible launches of that class on the GPU (an unarmed class costs a raising launch one
 * atomic load).
 *
 * A word comes down when the sessions that preempt its class have nothing left on the GPU:
 * Python reads how many raising launches entered (`seen`, only when each that entered also
 * left), checks those sessions' streams are idle, and asks to clear that word with that count.
 * (Only those sessions: a normal session raises the low word and is itself preempted by the
 * high one, so its stream, waiting for the normal word, must not keep that word up.) The clear takes the lock, marks nothing
 * raised, and gives up (putting the marks back) if another launch entered since; otherwise it
 * writes 0 into each raised word on the same stream. A launch marks itself entered before it
 * reads what is raised, and a clear marks nothing raised before it reads the count, so one of
 * them sees the other: a clear never lands after the raise of a launch it did not see, and raise
 * and clear writes reach the stream in the order their lock decided.
 *
 * Compiled into pilot.shim._proto; the part between the CDEF markers is read by cffi. */
#ifndef PILOT_PREEMPT_WORDS_H
#define PILOT_PREEMPT_WORDS_H

#include <stdint.h>

/* PILOT_PREEMPT_CDEF_BEGIN */
typedef struct pilot_preempt pilot_preempt;
/* cuStreamWriteValue32's shape (the driver's, or the sim's through a cffi callback). */
typedef int (*pilot_write_word_fn)(uint64_t stream, uint64_t address, uint32_t value,
                                   unsigned flags);
/* The words: `nwords` (at most 32) u32s at device address `words`, written on `stream`. */
pilot_preempt *pilot_preempt_new(pilot_write_word_fn write, uint64_t stream, uint64_t words,
                                 uint32_t nwords);
void pilot_preempt_free(pilot_preempt *p);
/* Which words (bit i: word i) may be raised from now on. */
void pilot_preempt_arm(pilot_preempt *p, uint32_t words);
uint32_t pilot_preempt_armed(pilot_preempt *p);
/* A launch of a raising session, before and after it puts work on its stream. */
void pilot_preempt_enter(pilot_preempt *p, uint32_t words);
void pilot_preempt_leave(pilot_preempt *p);
/* Raising launches that entered so far, when every one of them also left; else UINT64_MAX. */
uint64_t pilot_preempt_seen(pilot_preempt *p);
/* The raised words among `words` back to 0 unless a raising launch entered since `seen`: 1
 * lowered (or none of them was raised), 0 not now, -1 when a write failed. */
int pilot_preempt_clear(pilot_preempt *p, uint64_t seen, uint32_t words);
uint32_t pilot_preempt_raised(pilot_preempt *p);
/* Writes 0 into every word not raised (a kernel of the shared context may have written one):
 * 0, or -1 when a write failed. */
int pilot_preempt_reassert(pilot_preempt *p);
/* Raises, clears, and writes the driver refused, since the words were made. */
void pilot_preempt_counts(pilot_preempt *p, uint64_t *raises, uint64_t *clears, uint64_t *failed);
/* PILOT_PREEMPT_CDEF_END */

#endif
