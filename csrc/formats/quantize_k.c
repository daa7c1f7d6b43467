/*
 * quantize_k.c - the K-quant quantizers (Q2_K .. Q6_K) as llama.cpp writes model files: each group's scale (and min)
 * found by a search over candidate scales, the superblock's scales then quantized in turn and every element requantized
 * against the rounded scales. Without an importance matrix these give the bytes of ggml's quantize_row_q*_K_ref;
 * with one (a weight per column), those of its quantize_q*_K. Every float operation is the one ggml does, in its
 * order (the build keeps a*b+c unfused), since a different rounding anywhere picks a different scale.
 */
#include "formats/formats.h"

/* Below this a group counts as all zero. */
#define GROUP_MAX_EPS 1e-15f

static inline int clamp_int(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* ---- the scale searches -------------------------------------------------------------------------------- */

/* Symmetric: L[i] in [0, 2 nmax) with x ~ scale * (L - nmax). Starting from the scale that maps the extreme element
 * to -nmax, tries 18 nearby ones and keeps the one with the least weighted square error (weights: qw, or x^2 when
 * qw is NULL). Returns the scale. */
static float search_symmetric(int n, int nmax, const float *x, int8_t *L, const float *qw) {
    float max = 0.0f, amax = 0.0f;
    for (int i = 0; i < n; ++i) {
        const float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float iscale = (float)-nmax / max;
    float sumlx = 0.0f, suml2 = 0.0f;
    for (int i = 0; i < n; ++i) {
        const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)(l + nmax);
        const float w = qw ? qw[i] : x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int step = -9; step <= 9; ++step) {
        if (step == 0) continue;
        iscale = -((float)nmax + 0.1f * (float)step) / max;
        sumlx = suml2 = 0.0f;
        for (int i = 0; i < n; ++i) {
            const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
            const float w = qw ? qw[i] : x[i] * x[i];
            sumlx += w * x[i] * (float)l;
            suml2 += w * (float)l * (float)l;
        }
        if (suml2 > 0.0f && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; ++i) L[i] = (int8_t)(nmax + clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Q3_K's symmetric search: the extreme element's scale, then up to 5 passes that move single elements to the level
 * that lowers the x^2-weighted error. L[i] in [0, 2 nmax) (all 0 for a zero group). Returns the scale. */
static float search_q3(int n, int nmax, const float *x, int8_t *L) {
    float max = 0.0f, amax = 0.0f;
    for (int i = 0; i < n; ++i) {
        const float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    const float iscale = (float)-nmax / max;
    float sumlx = 0.0f, suml2 = 0.0f;
    for (int i = 0; i < n; ++i) {
        const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)l;
        const float w = x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    for (int pass = 0; pass < 5; ++pass) {
        int changed = 0;
        for (int i = 0; i < n; ++i) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * (float)L[i];
            if (slx > 0.0f) {
                float sl2 = suml2 - w * (float)L[i] * (float)L[i];
                const int new_l = clamp_int(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
                if (new_l != L[i]) {
                    slx += w * x[i] * (float)new_l;
                    sl2 += w * (float)new_l * (float)new_l;
                    if (sl2 > 0.0f && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        ++changed;
                    }
                }
            }
        }
        if (!changed) break;
    }
    for (int i = 0; i < n; ++i) L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* Asymmetric: L[i] in [0, nmax] with x ~ scale * L - min_out (min_out >= 0). From the scale spanning [min(x, 0),
 * max(x)], tries nstep + 1 candidates (rmin + rdelta * k + nmax levels over the span), fitting scale and offset by
 * weighted least squares for each, and keeps the least error (absolute when use_mad, else squared). weights NULL:
 * x^2. Returns the scale; *min_out the offset, negated. Laux is scratch of n. */
static float search_asymmetric(int n, int nmax, const float *x, const float *weights, uint8_t *L, float *min_out,
                               uint8_t *Laux, float rmin, float rdelta, int nstep, int use_mad) {
    float min = x[0], max = x[0];
    float sum_w = weights ? weights[0] : x[0] * x[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        const float w = weights ? weights[i] : x[i] * x[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0.0f) min = 0.0f;
    if (max <= min) {  /* ggml's two searches test == and <=: the same, as min <= x[0] <= max (nan aside) */
        memset(L, 0, (size_t)n);
        *min_out = -min;
        return 0.0f;
    }
    float iscale = (float)nmax / (max - min);
    float scale = 1.0f / iscale;
    float best_error = 0.0f;
    for (int i = 0; i < n; ++i) {
        L[i] = (uint8_t)clamp_int(nearest_int(iscale * (x[i] - min)), 0, nmax);
        float diff = scale * (float)L[i] + min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        const float w = weights ? weights[i] : x[i] * x[i];
        best_error += w * diff;
    }
    if (nstep < 1) {
        *min_out = -min;
        return scale;
    }
    for (int step = 0; step <= nstep; ++step) {
        iscale = (rmin + rdelta * (float)step + (float)nmax) / (max - min);
        float sum_l = 0.0f, sum_l2 = 0.0f, sum_xl = 0.0f;
        for (int i = 0; i < n; ++i) {
            const int l = clamp_int(nearest_int(iscale * (x[i] - min)), 0, nmax);
            Laux[i] = (uint8_t)l;
            const float w = weights ? weights[i] : x[i] * x[i];
            sum_l += w * (float)l;
            sum_l2 += w * (float)l * (float)l;
            sum_xl += w * (float)l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0.0f) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0.0f) {
                this_min = 0.0f;
                this_scale = sum_xl / sum_l2;
            }
            float error = 0.0f;
            for (int i = 0; i < n; ++i) {
                float diff = this_scale * (float)Laux[i] + this_min - x[i];
                diff = use_mad ? fabsf(diff) : diff * diff;
                const float w = weights ? weights[i] : x[i] * x[i];
                error += w * diff;
            }
            if (error < best_error) {
                memcpy(L, Laux, (size_t)n);
                best_error = error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *min_out = -min;
    return scale;
}

/* Non-negative values (a superblock's scales or mins) to L[i] in [0, nmax] with x ~ scale * L, weighted by qw: the
 * best of 9 scales near max / nmax, then up to 5 passes moving single levels. Returns the scale. */
static float search_positive(int n, int nmax, const float *x, uint8_t *L, const float *qw) {
    float max = 0.0f;
    for (int i = 0; i < n; ++i) max = max > x[i] ? max : x[i];
    if (max < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float iscale = (float)nmax / max;
    for (int i = 0; i < n; ++i) L[i] = (uint8_t)nearest_int(iscale * x[i]);
    const float scale = 1.0f / iscale;
    float best_mse = 0.0f;
    for (int i = 0; i < n; ++i) {
        const float diff = x[i] - scale * (float)L[i];
        best_mse += qw[i] * diff * diff;
    }
    for (int step = -4; step <= 4; ++step) {
        if (step == 0) continue;
        const float iscale_step = (0.1f * (float)step + (float)nmax) / max;
        const float scale_step = 1.0f / iscale_step;
        float mse = 0.0f;
        for (int i = 0; i < n; ++i) {
            int l = nearest_int(iscale_step * x[i]);
            l = l < nmax ? l : nmax;
            const float diff = x[i] - scale_step * (float)l;
            mse += qw[i] * diff * diff;
        }
        if (mse < best_mse) {
            best_mse = mse;
            iscale = iscale_step;
        }
    }
    float sumlx = 0.0f, suml2 = 0.0f;
    for (int i = 0; i < n; ++i) {
        int l = nearest_int(iscale * x[i]);
        l = l < nmax ? l : nmax;
        L[i] = (uint8_t)l;
        sumlx += qw[i] * x[i] * (float)l;
        suml2 += qw[i] * (float)l * (float)l;
    }
    for (int pass = 0; pass < 5; ++pass) {
        int changed = 0;
        for (int i = 0; i < n; ++i) {
            const float w = qw[i];
            float slx = sumlx - w * x[i] * (float)L[i];
            float sl2 = suml2 - w * (float)L[i] * (float)L[i];
            if (slx > 0.0f && sl2 > 0.0f) {
                int new_l = nearest_int(x[i] * sl2 / slx);
                new_l = new_l < nmax ? new_l : nmax;
                if (new_l != L[i]) {
                    slx += w * x[i] * (float)new_l;
                    sl2 += w * (float)new_l * (float)new_l;
                    if (slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (uint8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        ++changed;
                    }
                }
            }
        }
        if (!changed) break;
    }
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* ---- packing ------------------------------------------------------------------------------------------------ */

/* 2-bit levels L[0..256) into Q2_K / Q3_K qs: byte l of each 128-element half holds elements l, l+32, l+64, l+96. */
static void pack_2bit(const uint8_t *L, uint8_t qs[QK_K / 4]) {
    for (int j = 0; j < QK_K; j += 128) {
        for (int l = 0; l < 32; ++l) {
            qs[j / 4 + l] = (uint8_t)(L[j + l] | L[j + l + 32] << 2 | L[j + l + 64] << 4 | L[j + l + 96] << 6);
        }
    }
}

/* The 8 six-bit scales and mins of a Q4_K / Q5_K superblock (the layout scale_min_k4 reads). */
static void pack_scales_mins(const uint8_t ls[8], const uint8_t lm[8], uint8_t scales[12]) {
    for (int j = 0; j < QK_K / 32; ++j) {
        if (j < 4) {
            scales[j] = ls[j];
            scales[j + 4] = lm[j];
        } else {
            scales[j + 4] = (uint8_t)((ls[j] & 0xF) | (lm[j] & 0xF) << 4);
            scales[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
            scales[j] |= (uint8_t)((lm[j] >> 4) << 6);
        }
    }
}

/* The 16 six-bit Q3_K scales (already offset by 32) into its 12 bytes (the layout q3_K_scales reads). */
static void pack_q3_scales(const int levels[16], uint8_t scales[12]) {
    memset(scales, 0, 12);
    for (int j = 0; j < QK_K / 16; ++j) {
        int l = levels[j];
        if (j < 8) scales[j] = (uint8_t)(l & 0xF);
        else scales[j - 8] |= (uint8_t)((l & 0xF) << 4);
        l >>= 4;
        scales[j % 4 + 8] |= (uint8_t)(l << (2 * (j / 4)));
    }
}

/* Each element of a group of `len` requantized against its rounded scale d and offset dm: round((x + dm) / d)
 * into [0, nmax]. A zero d keeps the search's levels. */
static void requantize_asymmetric(const float *x, int len, float d, float dm, int nmax, uint8_t *L) {
    if (d == 0.0f) return;
    for (int i = 0; i < len; ++i) L[i] = (uint8_t)clamp_int(nearest_int((x[i] + dm) / d), 0, nmax);
}

/* ---- Q2_K --------------------------------------------------------------------------------------------------- */

/* The superblock's requantize and pack, once d, dmin and the scales byte are set. */
static void finish_q2_K(const float *x, block_q2_K *y, uint8_t L[QK_K]) {
    const float d_all = fp16_to_fp32(y->d), dmin_all = fp16_to_fp32(y->dmin);
    for (int j = 0; j < QK_K / 16; ++j) {
        const float d = d_all * (float)(y->scales[j] & 0xF);
        const float dm = dmin_all * (float)(y->scales[j] >> 4);
        requantize_asymmetric(x + 16 * j, 16, d, dm, 3, L + 16 * j);
    }
    pack_2bit(L, y->qs);
}

void quantize_row_q2_K_ref(const float *x, void *dst, int64_t n) {
    block_q2_K *y = dst;
    for (int64_t i = 0; i < n / QK_K; ++i, x += QK_K) {
        uint8_t L[QK_K], Laux[16];
        float weights[16], mins[QK_K / 16], scales[QK_K / 16];
        float max_scale = 0.0f, max_min = 0.0f;
        for (int j = 0; j < QK_K / 16; ++j) {
            for (int l = 0; l < 16; ++l) weights[l] = fabsf(x[16 * j + l]);
            scales[j] = search_asymmetric(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, 1);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        if (max_scale > 0.0f) {
            const float iscale = 15.0f / max_scale;
            for (int j = 0; j < QK_K / 16; ++j) y[i].scales[j] = (uint8_t)nearest_int(iscale * scales[j]);
            y[i].d = fp32_to_fp16(max_scale / 15.0f);
        } else {
            memset(y[i].scales, 0, sizeof y[i].scales);
            y[i].d = fp32_to_fp16(0.0f);
        }
        if (max_min > 0.0f) {
            const float iscale = 15.0f / max_min;
            for (int j = 0; j < QK_K / 16; ++j) {
                y[i].scales[j] |= (uint8_t)((unsigned)nearest_int(iscale * mins[j]) << 4);
            }
            y[i].dmin = fp32_to_fp16(max_min / 15.0f);
        } else {
            y[i].dmin = fp32_to_fp16(0.0f);
        }
        finish_q2_K(x, &y[i], L);
    }
}

/* With importance: each weight qw * sqrt(sigma2 + x^2), sigma2 the superblock's mean square. */
static void quantize_row_q2_K_weighted(const float *x, void *dst, int64_t n, const float *importance) {
    block_q2_K *y = dst;
    for (int64_t i = 0; i < n / QK_K; ++i, x += QK_K) {
        uint8_t L[QK_K], Laux[16], Ls[QK_K / 16], Lm[QK_K / 16];
        float mins[QK_K / 16], scales[QK_K / 16], sw[QK_K / 16], weight[16];
        float sumx2 = 0.0f;
        for (int j = 0; j < QK_K; ++j) sumx2 += x[j] * x[j];
        const float sigma2 = sumx2 / (float)QK_K;
        for (int j = 0; j < QK_K / 16; ++j) {
            const float *qw = importance + QK_K * i + 16 * j;
            for (int l = 0; l < 16; ++l) weight[l] = qw[l] * sqrtf(sigma2 + x[16 * j + l] * x[16 * j + l]);
            sw[j] = 0.0f;
            for (int l = 0; l < QK_K / 16; ++l) sw[j] += weight[l];
            scales[j] = search_asymmetric(16, 3, x + 16 * j, weight, L + 16 * j, &mins[j], Laux, -0.9f, 0.05f, 36, 0);
        }
        const float dm = search_positive(QK_K / 16, 15, scales, Ls, sw);
        const float mm = search_positive(QK_K / 16, 15, mins, Lm, sw);
        y[i].d = fp32_to_fp16(dm);
        y[i].dmin = fp32_to_fp16(mm);
        for (int j = 0; j < QK_K / 16; ++j) y[i].scales[j] = (uint8_t)(Ls[j] | Lm[j] << 4);
        finish_q2_K(x, &y[i], L);
    }
}

/* ---- Q3_K --------------------------------------------------------------------------------------------------- */

/* Requantize against the packed scales, set the high-bit mask and pack; L holds levels 0..7 (or 0 for a group whose
 * scale rounded to zero and whose search found it zero). */
static void finish_q3_K(const float *x, block_q3_K *y, int8_t L[QK_K]) {
    int8_t sc[16];
    q3_K_scales(y->scales, sc);
    const float d_all = fp16_to_fp32(y->d);
    for (int j = 0; j < QK_K / 16; ++j) {
        const float d = d_all * (float)sc[j];
        if (d == 0.0f) continue;
        for (int i = 0; i < 16; ++i) L[16 * j + i] = (int8_t)(clamp_int(nearest_int(x[16 * j + i] / d), -4, 3) + 4);
    }
    memset(y->hmask, 0, sizeof y->hmask);
    uint8_t low[QK_K];
    for (int j = 0; j < QK_K; ++j) {
        int l = L[j];
        if (l > 3) {
            y->hmask[j % 32] |= (uint8_t)(1u << (j / 32));
            l -= 4;
        }
        low[j] = (uint8_t)l;
    }
    pack_2bit(low, y->qs);
}

void quantize_row_q3_K_ref(const float *x, void *dst, int64_t n) {
    block_q3_K *y = dst;
    for (int64_t i = 0; i < n / QK_K; ++i, x += QK_K) {
        int8_t L[QK_K];
        float scales[QK_K / 16];
        float max_scale = 0.0f, amax = 0.0f;
        for (int j = 0; j < QK_K / 16; ++j) {
            scales[j] = search_q3(16, 4, x + 16 * j, L + 16 * j);
            const float scale = fabsf(scales[j]);
            if (scale > amax) {
                amax = scale;
                max_scale = scales[j];
            }
        }
        int levels[16] = {0};
        if (max_scale != 0.0f) {
            const float iscale = -32.0f / max_scale;
            for (int j = 0; j < QK_K / 16; ++j) levels[j] = clamp_int(nearest_int(iscale * scales[j]), -32, 31) + 32;
            pack_q3_scales(levels, y[i].scales);
            y[i].d = fp32_to_fp16(1.0f / iscale);
        } else {
            memset(y[i].scales, 0, sizeof y[i].scales);
            y[i].d = fp32_to_fp16(0.0f);
        }
        finish_q3_K(x, &y[i], L);
    }
}

/* With importance (or without, as ggml's weighted path takes NULL): weights qw * sqrt(sigma2 + x^2), sigma2 twice
 * the mean square; the scales found by the weighted symmetric search, then quantized by it too. */
static void quantize_row_q3_K_weighted(const float *x, void *dst, int64_t n, const float *importance) {
    block_q3_K *y = dst;
    for (int64_t i = 0; i < n / QK_K; ++i, x += QK_K) {
        int8_t L[QK_K], Ls[QK_K / 16];
        float scales[QK_K / 16], weight[16], sw[QK_K / 16];
        float sumx2 = 0.0f;
        for (int j = 0; j < QK_K; ++j) sumx2 += x[j] * x[j];
        const float sigma2 = 2.0f * sumx2 / (float)QK_K;
        for (int j = 0; j < QK_K / 16; ++j) {
            const float *xg = x + 16 * j;
            if (importance) {
                const float *qw = importance + QK_K * i + 16 * j;
                for (int l = 0; l < 16; ++l) weight[l] = qw[l] * sqrtf(sigma2 + xg[l] * xg[l]);
            } else {
                for (int l = 0; l < 16; ++l) weight[l] = xg[l] * xg[l];
            }
            float sumw = 0.0f;
            for (int l = 0; l < 16; ++l) sumw += weight[l];
            sw[j] = sumw;
            scales[j] = search_symmetric(16, 4, xg, L + 16 * j, weight);
        }
        const float d_block = search_symmetric(QK_K / 16, 32, scales, Ls, sw);
        int levels[16];
        for (int j = 0; j < QK_K / 16; ++j) levels[j] = Ls[j];
        pack_q3_scales(levels, y[i].scales);
        y[i].d = fp32_to_fp16(d_block);
        finish_q3_K(x, &y[i], L);
    }
}

/* ---- Q4_K and Q5_K ------------------------------------------------------------------------------------------ */

/* The 8 groups of 32 of a superblock: each group's weights av_x + |x| (av_x its root mean square), its scale and min
 * by the asymmetric search (nmax 15 or 31; the searches' ranges are ggml's for each), then the scales and mins to
 * 6 bits against their maxima. Fills d, dmin, scales and the levels L. */
static void scales_mins_ref(const float *x, int nmax, float rmin, float rdelta, int nstep, uint8_t L[QK_K],
                            fp16_t *d_out, fp16_t *dmin_out, uint8_t packed[12]) {
    uint8_t Laux[32], ls[8], lm[8];
    float weights[32], mins[QK_K / 32], scales[QK_K / 32];
    float max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < QK_K / 32; ++j) {
        float sum_x2 = 0.0f;
        for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
        const float av_x = sqrtf(sum_x2 / 32.0f);
        for (int l = 0; l < 32; ++l) weights[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = search_asymmetric(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, rdelta, nstep,
                                      0);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
    const float inv_min = max_min > 0.0f ? 63.0f / max_min : 0.0f;
    for (int j = 0; j < QK_K / 32; ++j) {
        /* ggml stores the rounded int in a byte before clamping: the same wrap-around, kept */
        const uint8_t s = (uint8_t)nearest_int(inv_scale * scales[j]);
        const uint8_t m = (uint8_t)nearest_int(inv_min * mins[j]);
        ls[j] = s < 63 ? s : 63;
        lm[j] = m < 63 ? m : 63;
    }
    pack_scales_mins(ls, lm, packed);
    *d_out = fp32_to_fp16(max_scale / 63.0f);
    *dmin_out = fp32_to_fp16(max_min / 63.0f);
}

/* The same with importance (or ggml's weighted path without it): weights qw * sqrt(sigma2 + x^2) (else
 * sqrt(sigma2) + |x|), sigma2 twice the mean square, a finer search, and the scales and mins by the positive search. */
static void scales_mins_weighted(const float *x, const float *qw_block, int nmax, uint8_t L[QK_K], fp16_t *d_out,
                                 fp16_t *dmin_out, uint8_t packed[12]) {
    /* ggml clamps the found levels to 63 for Q5_K only: they differ when a level wrapped (a negative scale) */
    const int clamp_levels = nmax == 31;
    uint8_t Laux[32], Ls[QK_K / 32], Lm[QK_K / 32];
    float weights[32], sw[QK_K / 32], mins[QK_K / 32], scales[QK_K / 32];
    float sum_x2 = 0.0f;
    for (int l = 0; l < QK_K; ++l) sum_x2 += x[l] * x[l];
    const float sigma2 = 2.0f * sum_x2 / (float)QK_K;
    const float av_x = sqrtf(sigma2);
    for (int j = 0; j < QK_K / 32; ++j) {
        if (qw_block) {
            const float *qw = qw_block + 32 * j;
            for (int l = 0; l < 32; ++l) weights[l] = qw[l] * sqrtf(sigma2 + x[32 * j + l] * x[32 * j + l]);
        } else {
            for (int l = 0; l < 32; ++l) weights[l] = av_x + fabsf(x[32 * j + l]);
        }
        float sumw = 0.0f;
        for (int l = 0; l < 32; ++l) sumw += weights[l];
        sw[j] = sumw;
        scales[j] = search_asymmetric(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, -0.9f, 0.05f, 36, 0);
    }
    const float d_block = search_positive(QK_K / 32, 63, scales, Ls, sw);
    const float m_block = search_positive(QK_K / 32, 63, mins, Lm, sw);
    for (int j = 0; clamp_levels && j < QK_K / 32; ++j) {
        Ls[j] = Ls[j] < 63 ? Ls[j] : 63;
        Lm[j] = Lm[j] < 63 ? Lm[j] : 63;
    }
    pack_scales_mins(Ls, Lm, packed);
    *d_out = fp32_to_fp16(d_block);
    *dmin_out = fp32_to_fp16(m_block);
}

/* Every group requantized against the rounded 6-bit scales and mins. */
static void requantize_groups_of_32(const float *x, fp16_t d16, fp16_t dmin16, const uint8_t packed[12], int nmax,
                                    uint8_t L[QK_K]) {
    for (int j = 0; j < QK_K / 32; ++j) {
        uint8_t sc, m;
        scale_min_k4(j, packed, &sc, &m);
        const float d = fp16_to_fp32(d16) * (float)sc;
        const float dm = fp16_to_fp32(dmin16) * (float)m;
        requantize_asymmetric(x + 32 * j, 32, d, dm, nmax, L + 32 * j);
    }
}

static void pack_q4_K(const uint8_t L[QK_K], uint8_t qs[QK_K / 2]) {
    for (int j = 0; j < QK_K; j += 64) {
        for (int l = 0; l < 32; ++l) qs[j / 2 + l] = (uint8_t)(L[j + l] | L[j + l + 32] << 4);
    }
}

static void pack_q5_K(const uint8_t L[QK_K], uint8_t qh[QK_K / 8], uint8_t qs[QK_K / 2]) {
    memset(qh, 0, QK_K / 8);
    for (int j = 0; j < QK_K; j += 64) {
        const int bit = j / 32;  /* elements j..j+31 take bit `bit`, j+32..j+63 the next */
        for (int l = 0; l < 32; ++l) {
            int lo = L[j + l], hi = L[j + l + 32];
            if (lo > 15) {
                lo -= 16;
                qh[l] |= (uint8_t)(1u << bit);
            }
            if (hi > 15) {
                hi -= 16;
                qh[l] |= (uint8_t)(1u << (bit + 1));
            }
            qs[j / 2 + l] = (uint8_t)(lo | hi << 4);
        }
    }
}

void quantize_row_q4_K_ref(const float *x, void *dst, int64_t n) {
    block_q4_K *y = dst;
    for (int64_t i = 0; i < n / QK_K; ++i, x += QK_K) {
        uint8_t L[QK_K];
        scales_mins_ref(x, 15, -1.0f, 0.1f, 20, L, &y[i].d, &y[i].dmin, y[i].scales);
        requantize_groups_of_32(x, y[i].d, y[i].dmin, y[i].scales, 15, L);
        pack_q4_K(L, y[i].qs);
    }
}

static void quantize_row_q4_K_weighted(const float *x, void *dst, int64_t n, const float *importance) {
    block_q4_K *y = dst;
    for (int64_t i = 0; i < n / QK_K; ++i, x += QK_K) {
        uint8_t L[QK_K];
        scales_mins_weighted(x, importance ? importance + QK_K * i : NULL, 15, L, &y[i].d, &y[i].dmin, y[i].scales);
        requantize_groups_of_32(x, y[i].d, y[i].dmin, y[i].scales, 15, L);
        pack_q4_K(L, y[i].qs);
    }
}

void quantize_row_q5_K_ref(const float *x, void *dst, int64_t n) {
    block_q5_K *y = dst;
    for (int64_t i = 0; i < n / QK_K; ++i, x += QK_K) {
        uint8_t L[QK_K];
        scales_mins_ref(x, 31, -0.5f, 0.1f, 15, L, &y[i].d, &y[i].dmin, y[i].scales);
        requantize_groups_of_32(x, y[i].d, y[i].dmin, y[i].scales, 31, L);
        pack_q5_K(L, y[i].qh, y[i].qs);
    }
}

static void quantize_row_q5_K_weighted(const float *x, void *dst, int64_t n, const float *importance) {
    block_q5_K *y = dst;
    for (int64_t i = 0; i < n / QK_K; ++i, x += QK_K) {
        uint8_t L[QK_K];
        scales_mins_weighted(x, importance ? importance + QK_K * i : NULL, 31, L, &y[i].d, &y[i].dmin, y[i].scales);
        requantize_groups_of_32(x, y[i].d, y[i].dmin, y[i].scales, 31, L);
        pack_q5_K(L, y[i].qh, y[i].qs);
    }
}

/* ---- Q6_K --------------------------------------------------------------------------------------------------- */

/* 16 groups of 16 by the symmetric search (weights: the importance, else x^2), the scales to signed 8 bits against
 * the largest, each element requantized to [-32, 31]. */
static void quantize_row_q6_K_any(const float *x, void *dst, int64_t n, const float *importance) {
    block_q6_K *y = dst;
    for (int64_t i = 0; i < n / QK_K; ++i, x += QK_K) {
        int8_t L[QK_K];
        float scales[QK_K / 16];
        float max_scale = 0.0f, max_abs_scale = 0.0f;
        for (int g = 0; g < QK_K / 16; ++g) {
            const float *qw = importance ? importance + QK_K * i + 16 * g : NULL;
            scales[g] = search_symmetric(16, 32, x + 16 * g, L + 16 * g, qw);
            const float abs_scale = fabsf(scales[g]);
            if (abs_scale > max_abs_scale) {
                max_abs_scale = abs_scale;
                max_scale = scales[g];
            }
        }
        if (max_abs_scale < GROUP_MAX_EPS) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -128.0f / max_scale;
        y[i].d = fp32_to_fp16(1.0f / iscale);
        for (int g = 0; g < QK_K / 16; ++g) {
            const int s = nearest_int(iscale * scales[g]);
            y[i].scales[g] = (int8_t)(s < 127 ? s : 127);
        }
        for (int g = 0; g < QK_K / 16; ++g) {
            const float d = fp16_to_fp32(y[i].d) * (float)y[i].scales[g];
            if (d == 0.0f) continue;
            for (int k = 0; k < 16; ++k) {
                L[16 * g + k] = (int8_t)(clamp_int(nearest_int(x[16 * g + k] / d), -32, 31) + 32);
            }
        }
        q6_K_put_quants((const uint8_t *)L, &y[i]);
    }
}

void quantize_row_q6_K_ref(const float *x, void *dst, int64_t n) { quantize_row_q6_K_any(x, dst, n, NULL); }

/* ---- the 32-element formats with importance (their reference quantizers are in quantize.c) ------------------ */

/* Per block: weights qw * sqrt(sigma2 + x^2) (sigma2 the row's mean square), the weighted symmetric search. */
static void quantize_row_symmetric_weighted(const float *x, int levels, void *dst, int64_t n, const float *importance,
                                            int with_fifth_bit) {
    float sum_x2 = 0.0f;
    for (int64_t j = 0; j < n; ++j) sum_x2 += x[j] * x[j];
    const float sigma2 = sum_x2 / (float)n;
    for (int64_t b = 0; b < n / QK32; ++b) {
        const float *xb = x + QK32 * b, *qw = importance + QK32 * b;
        float weight[QK32];
        int8_t L[QK32];
        for (int j = 0; j < QK32; ++j) weight[j] = qw[j] * sqrtf(sigma2 + xb[j] * xb[j]);
        const fp16_t d = fp32_to_fp16(search_symmetric(QK32, levels / 2, xb, L, weight));
        uint8_t q[QK32];
        for (int j = 0; j < QK32; ++j) q[j] = (uint8_t)L[j];
        if (with_fifth_bit) {
            block_q5_0 *y = (block_q5_0 *)dst + b;
            y->d = d;
            pack_nibbles_32(q, y->qs);
            pack_fifth_bits_32(q, y->qh);
        } else {
            block_q4_0 *y = (block_q4_0 *)dst + b;
            y->d = d;
            pack_nibbles_32(q, y->qs);
        }
    }
}

/* Per block: the same weights, the asymmetric search's finer range over [0, levels). */
static void quantize_row_asymmetric_weighted(const float *x, int levels, void *dst, int64_t n, const float *importance,
                                             int with_fifth_bit) {
    float sum_x2 = 0.0f;
    for (int64_t j = 0; j < n; ++j) sum_x2 += x[j] * x[j];
    const float sigma2 = sum_x2 / (float)n;
    for (int64_t b = 0; b < n / QK32; ++b) {
        const float *xb = x + QK32 * b, *qw = importance + QK32 * b;
        float weight[QK32], min;
        uint8_t L[QK32], Laux[QK32];
        for (int j = 0; j < QK32; ++j) weight[j] = qw[j] * sqrtf(sigma2 + xb[j] * xb[j]);
        const float d = search_asymmetric(QK32, levels - 1, xb, weight, L, &min, Laux, -0.9f, 0.05f, 36, 0);
        if (with_fifth_bit) {
            block_q5_1 *y = (block_q5_1 *)dst + b;
            y->d = fp32_to_fp16(d);
            y->m = fp32_to_fp16(-min);
            pack_nibbles_32(L, y->qs);
            pack_fifth_bits_32(L, y->qh);
        } else {
            block_q4_1 *y = (block_q4_1 *)dst + b;
            y->d = fp32_to_fp16(d);
            y->m = fp32_to_fp16(-min);
            pack_nibbles_32(L, y->qs);
        }
    }
}

/* ---- any weight format with importance ----------------------------------------------------------------------- */

int quantize_row_weighted(int type, const float *x, void *dst, int64_t n, const float *importance) {
    switch (type) {
    case PYLLM_TYPE_Q4_0: quantize_row_symmetric_weighted(x, 16, dst, n, importance, 0); return PYLLM_OK;
    case PYLLM_TYPE_Q5_0: quantize_row_symmetric_weighted(x, 32, dst, n, importance, 1); return PYLLM_OK;
    case PYLLM_TYPE_Q4_1: quantize_row_asymmetric_weighted(x, 16, dst, n, importance, 0); return PYLLM_OK;
    case PYLLM_TYPE_Q5_1: quantize_row_asymmetric_weighted(x, 32, dst, n, importance, 1); return PYLLM_OK;
    case PYLLM_TYPE_Q2_K: quantize_row_q2_K_weighted(x, dst, n, importance); return PYLLM_OK;
    case PYLLM_TYPE_Q3_K: quantize_row_q3_K_weighted(x, dst, n, importance); return PYLLM_OK;
    case PYLLM_TYPE_Q4_K: quantize_row_q4_K_weighted(x, dst, n, importance); return PYLLM_OK;
    case PYLLM_TYPE_Q5_K: quantize_row_q5_K_weighted(x, dst, n, importance); return PYLLM_OK;
    case PYLLM_TYPE_Q6_K: quantize_row_q6_K_any(x, dst, n, importance); return PYLLM_OK;
    default: return PYLLM_ERR_TYPE;
    }
}
