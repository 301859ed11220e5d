/* hwsel — an online choice among a few schedules of the same computation
 * (kernel variants, work splits) that give the same bits at different speeds,
 * by the time they are seen to take.
 *
 * Which schedule is fastest depends on more than the CPU model. On this
 * project's 2-vCPU Zen 5 VMs the hardware prefetchers alone (no software
 * prefetch) won a decode step by 4-7% in one session and lost it by 4% (two
 * tokens: 17%) in another, the memory's speed itself moving by half within
 * minutes; and one vCPU ran the same arithmetic 15-50% slower than the other
 * for minutes at a time, so a product cut into one chunk a thread left the
 * faster one waiting, where eight chunks a thread (the faster one stealing)
 * took 0.95 of the time, but 1.10 of it for a Q8_0 verify whose chunks break
 * its prefetch (bench/forward-notes.md, "Stop 51", "Stop 55"). So a forward
 * context fixes neither: per forward size it keeps a selector over the
 * schedules ("arms") that tries each TD_HWSEL_SEED times, then runs the
 * fastest (the chosen arm, at first the default, gives way only to one 2%
 * faster: arms closer than that, their averages moved by noise, would
 * otherwise trade places and cost more than they differ) and gives every TD_HWSEL_EXPLORE-th forward to another arm in turn
 * (an arm more than 10% slower takes one of four turns offered, passing the
 * others on), so a change of
 * the machine's phase is followed within a few hundred forwards (seconds). Times enter as
 * exponential moving averages (a new sample weighs 1/8), each sample clipped
 * to 1.25 times its arm's average, so one forward that was descheduled moves
 * it by 3% at most. No arm changes an output bit, so the choice is free to
 * follow the clock. */
#ifndef TD_HWSEL_H
#define TD_HWSEL_H

#define TD_HWSEL_ARMS 4     /* at most this many arms */
#define TD_HWSEL_SEED 3     /* samples of each arm before the choice is made */
#define TD_HWSEL_EXPLORE 32 /* then every 32nd pick runs another arm (round robin) ... */
#define TD_HWSEL_FAR 1.10   /* ... an arm this much slower passing three turns in four on */

typedef struct td_hwsel {
    double avg[TD_HWSEL_ARMS]; /* [arm] moving average of its samples (any time unit) */
    int n[TD_HWSEL_ARMS];      /* [arm] samples taken (saturates) */
    int skip[TD_HWSEL_ARMS];   /* [arm] exploration turns offered to it while far */
    unsigned picks;            /* picks since the choice was first made */
    int arms;                  /* 1 .. TD_HWSEL_ARMS */
    int best;                  /* the chosen arm (dflt until another is 2% faster) */
    int turn;                  /* the last arm given an exploration turn */
} td_hwsel;

/* A selector over arms arms (clamped to 1 .. TD_HWSEL_ARMS) that starts from
 * arm dflt (taken modulo arms). */
void td_hwsel_init(td_hwsel *s, int arms, int dflt);
/* The arm to run next: seeding (the arm with the fewest samples, from dflt
 * on) until each has TD_HWSEL_SEED, then the fastest, or on every
 * TD_HWSEL_EXPLORE-th pick the next other arm (see above). */
int td_hwsel_pick(td_hwsel *s);
/* Record that arm v took t (> 0; other values and arms are ignored). */
void td_hwsel_record(td_hwsel *s, int v, double t);
/* The chosen arm once every arm is seeded, else -1. */
int td_hwsel_chosen(const td_hwsel *s);

#endif
