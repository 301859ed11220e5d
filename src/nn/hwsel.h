/* hwsel — an online choice between two kernel variants that compute the same
 * bits at different speeds, by the time they are seen to take.
 *
 * Which prefetch suits a product over weights streamed from memory depends on
 * more than the CPU model: on this project's 2-vCPU Zen 5 VMs the hardware
 * prefetchers alone won a decode step by 4-7% in one session and lost it by
 * 4% (two tokens: 17%) in another, the memory's speed itself moving by half
 * within minutes (bench/forward-notes.md, "Stop 51", "Stop 55"). So a forward
 * context does not fix td_kernels_hw_stream's choice: per forward size it keeps
 * a selector that tries both variants, then runs the faster one and retries the
 * other every TD_HWSEL_EXPLORE-th time (every TD_HWSEL_EXPLORE_FAR-th where it
 * was more than 10% slower: a retry then costs more), so a change of the
 * machine's phase is followed within a hundred forwards. Times enter as
 * exponential moving averages (a new sample weighs 1/8), each sample clipped
 * to 1.25 times its variant's average, so one forward that was descheduled
 * moves it by 3% at most. Which variant runs never changes an output bit, so
 * the choice is free to follow the clock. */
#ifndef TD_HWSEL_H
#define TD_HWSEL_H

#define TD_HWSEL_SEED 3     /* samples of each variant before the choice is made */
#define TD_HWSEL_EXPLORE 16 /* then every 16th pick runs the other variant ... */
#define TD_HWSEL_EXPLORE_FAR 64 /* ... or every 64th where it was over TD_HWSEL_FAR slower */
#define TD_HWSEL_FAR 1.10

typedef struct td_hwsel {
    double avg[2];    /* [variant] moving average of its samples (any time unit) */
    int n[2];         /* [variant] samples taken (saturates) */
    unsigned picks;   /* picks since the choice was first made */
    int best;         /* the faster variant so far (the default before both are seeded) */
} td_hwsel;

/* A selector that starts from variant dflt (0 or 1). */
void td_hwsel_init(td_hwsel *s, int dflt);
/* The variant to run next: alternating until each has TD_HWSEL_SEED samples,
 * then the faster, or the other one on every TD_HWSEL_EXPLORE-th pick
 * (TD_HWSEL_EXPLORE_FAR-th while it is TD_HWSEL_FAR times slower or more). */
int td_hwsel_pick(td_hwsel *s);
/* Record that variant v took t (> 0; other values are ignored). */
void td_hwsel_record(td_hwsel *s, int v, double t);

#endif
