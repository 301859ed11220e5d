/* mmx — a product's input per activation type, and the kernel per tensor (mmx.h). */
#include "nn/mmx.h"
#include "nn/amx.h"
#include "nn/i8t.h"
#include "nn/kernels.h"
#include "nn/pool.h"
#include "nn/q8r.h"
#include "tandem.h"
#include "util/util.h"

void td_mm_plan(td_mm_in *in, int act_type, const td_tensor *const *w, int n_w, const float *x, int ldx, int M, int K,
                uint16_t *xa_buf, uint8_t *xq_buf) {
    *in = (td_mm_in){.x = x, .ldx = ldx, .M = M, .K = K, .xa_buf = xa_buf, .xq_buf = xq_buf, .hw = -1};
    int bf16 = 0, rp = 0, ip = 0, pk = 1;
    for (int i = 0; i < n_w; i++) {
        bf16 |= w[i]->dtype == TD_DTYPE_BF16;
        if (w[i]->dtype == TD_DTYPE_BF16 && !w[i]->pk) pk = 0;
        /* rp is read only in the bf16 and amx modes, ip only in amx mode: another context's first
         * open in such a mode may be writing them */
        if (act_type != TD_DTYPE_F32) rp |= w[i]->rp != NULL;
        if (act_type == TD_ACT_AMX) ip |= w[i]->ip != NULL;
    }
    if (ip && xq_buf && M >= TD_MM_I8T_MIN_M) { /* the int8 rows, then their scales (K % 64 == 0: aligned) */
        in->xi = (const uint32_t *)(const void *)xq_buf;
        in->xs = (const float *)(const void *)(xq_buf + (size_t)M * K);
    } else if (rp && xq_buf) {
        in->xq = xq_buf;
    }
    if (!bf16 || !xa_buf || act_type == TD_DTYPE_F32) return;
    if (act_type == TD_ACT_AMX && td_amx_fits(K)) in->xp = (const uint32_t *)(const void *)xa_buf;
    else {
        in->xa = xa_buf;
        in->p24 = pk;
    }
}

void td_mm_fill(const td_mm_in *in, int m0, int m1) {
    int K = in->K, n = m1 - m0;
    if (n <= 0) return;
    TD_ASSERT(m0 % 16 == 0 && (m1 % 16 == 0 || m1 == in->M) && m1 <= in->M);
    const float *x = in->x + (size_t)m0 * (size_t)in->ldx;
    /* each layout is a function of the row alone, or of its 16-row chunk */
    if (in->xi)
        td_i8t_act((uint32_t *)(void *)in->xq_buf + (size_t)m0 * (size_t)K / 4,
                   (float *)(void *)(in->xq_buf + (size_t)in->M * K) + m0, x, in->ldx, n, K);
    else if (in->xq)
        td_q8r_act(in->xq_buf + (size_t)m0 * td_q8r_row_bytes(K), x, in->ldx, n, K);
    if (in->xp) td_amx_pack((uint32_t *)(void *)in->xa_buf + (size_t)m0 * (size_t)K / 2, x, in->ldx, n, K);
    else if (in->xa)
        for (int m = 0; m < n; m++)
            td_from_f32(in->xa_buf + (size_t)(m0 + m) * K, x + (size_t)m * in->ldx, TD_DTYPE_BF16, (size_t)K);
}

int td_mm_fill_cols(const td_mm_in *in, int k0, int k1) {
    int K = in->K;
    if (!td_mm_fills_cols(in)) return -1;
    if (k1 <= k0) return 0;
    TD_ASSERT(k0 % 32 == 0 && k1 % 32 == 0 && k1 <= K);
    if (in->xq) td_q8r_act_cols(in->xq_buf, in->x, in->ldx, in->M, K, k0, k1);
    if (in->xp) td_amx_pack_cols((uint32_t *)(void *)in->xa_buf, in->x, in->ldx, in->M, K, k0, k1);
    else if (in->xa)
        for (int m = 0; m < in->M; m++)
            td_from_f32(in->xa_buf + (size_t)m * K + k0, in->x + (size_t)m * in->ldx + k0, TD_DTYPE_BF16, (size_t)(k1 - k0));
    return 0;
}

void td_mm_prepare(td_mm_in *in, int act_type, const td_tensor *const *w, int n_w, const float *x, int ldx, int M, int K,
                   uint16_t *xa_buf, uint8_t *xq_buf) {
    td_mm_plan(in, act_type, w, n_w, x, ldx, M, K, xa_buf, xq_buf);
    td_mm_fill(in, 0, M);
}

void td_mm_run(const td_mm_in *in, float *y, int ldy, int M, const td_tensor *w, int K, int n0, int n1, int add) {
    if (n0 >= n1) return;
    if (in->xi && w->ip)
        td_i8t_matmul(y, ldy, in->xi, in->xs, M, w->ip, (const float *)(const void *)((const int8_t *)w->ip + (size_t)w->shape[0] * K),
                      K, n0, n1, add);
    else if (in->xq && w->rp)
        td_q8r_matmul_hw(y, ldy, in->xq, M, w->rp, K, n0, n1, add, in->stream ? (int)w->shape[0] : 0, td_q8r_format(w->dtype),
                         in->hw);
    else if (in->xp && w->dtype == TD_DTYPE_BF16)
        td_amx_matmul(y, ldy, in->xp, M, w->data, K, n0, n1, add, in->stream ? (int)w->shape[0] : 0);
    else if (in->xa && w->dtype == TD_DTYPE_BF16 && w->pk)
        td_matmul_bf16p(y, ldy, in->xa, K, M, w->pk, w->data, K, (int)w->shape[0], n0, n1, add, in->stream, in->hw);
    else if (in->xa && w->dtype == TD_DTYPE_BF16) td_matmul_bf16a_pf(y, ldy, in->xa, K, M, w->data, K, n0, n1, add, in->stream, in->hw);
    else td_matmul(y, ldy, in->x, in->ldx, M, w->data, w->dtype, K, n0, n1, add);
}

typedef struct { int M, K, n, add; const td_mm_part *part; td_mm_in in; } parts_job;
static void parts_run(void *arg, int ith, int nth) {
    const parts_job *j = arg;
    for (int i = 0; i < j->n; i++) {
        const td_mm_part *q = &j->part[i];
        int n0, n1;
        td_mm_range(q->N, td_mm_block(&j->in), ith, nth, &n0, &n1);
        td_mm_run(&j->in, q->y, q->ldy, j->M, q->w, j->K, n0, n1, j->add);
    }
}

void td_mm_parts(td_pool *pool, int act_type, const float *x, int ldx, int M, int K, const td_mm_part *parts, int n,
                 int add, uint16_t *xa_buf, uint8_t *xq_buf) {
    parts_job j = {M, K, n, add, parts, {0}};
    /* what td_mm_prepare asks of the weights: is one bf16, has one a repack */
    const td_tensor *ws[2];
    int nw = 0, bf = 0, rp = 0;
    for (int i = 0; i < n; i++) {
        const td_tensor *w = parts[i].w;
        if (!bf && w->dtype == TD_DTYPE_BF16) { ws[nw++] = w; bf = 1; }
        else if (!rp && ((act_type != TD_DTYPE_F32 && w->rp) || (act_type == TD_ACT_AMX && w->ip))) { ws[nw++] = w; rp = 1; }
    }
    td_mm_prepare(&j.in, act_type, ws, nw, x, ldx, M, K, xa_buf, xq_buf);
    td_pool_run(pool, parts_run, &j);
}
