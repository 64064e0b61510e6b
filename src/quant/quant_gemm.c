/* Dispatcher of the gemm kernels (quant_gemm.h): per-ISA tables filled by
 * quant_gemm_avx2.c, quant_gemm_avx512.c and quant_gemm_amx.c, and the
 * generic fallback.
 *
 * Unlike qt_vec_dot, a format without a kernel on the asked ISA does NOT fall
 * back to the lower ISA's kernel: the AVX-512 table covers every format the
 * AVX2 table does, and the scalar ISA has none, so "NULL" always means "use
 * the dot product" (a scalar request must stay scalar for the tests that
 * compare paths).
 */
#include "quant/quant_gemm.h"
#include "quant/quant_gemm_impl.h"

#include "core/timer.h"

qt_gemm_fn qt_gemm(qt_type t, qt_isa isa) {
    if ((int)t < 0 || t >= QT_COUNT) return NULL;
    /* a path the CPU cannot run is never handed out, whatever was asked */
    while ((int)isa > 0 && !qt_isa_supported(isa)) isa = (qt_isa)((int)isa - 1);
    switch (isa) {
    case QT_ISA_AMX: return qt_gemms_amx[t];
    case QT_ISA_AVX512: return qt_gemms_avx512[t];
    case QT_ISA_AVX2: return qt_gemms_avx2[t];
    default: return NULL;
    }
}

int qt_gemm_max_tok(qt_isa isa) {
    while ((int)isa > 0 && !qt_isa_supported(isa)) isa = (qt_isa)((int)isa - 1);
    return isa == QT_ISA_AMX ? QT_GEMM_AMX_MAX_TOK : QT_GEMM_MAX_TOK;
}

qt_gemm_fn qt_gemm_small(qt_type t, qt_isa isa) {
    if ((int)t < 0 || t >= QT_COUNT) return NULL;
    while ((int)isa > 0 && !qt_isa_supported(isa)) isa = (qt_isa)((int)isa - 1);
    return isa >= QT_ISA_AVX512 ? qt_gemms_small_avx512[t] : NULL;
}

/* Up to how many tokens the small-batch kernel is used rather than the gemm.
 * Its cost grows with every token (the dot's per-block work, once per
 * token), the gemm's barely between 2 and 8 (its fixed cost is decoding and
 * interleaving the rows). In cache on one core (`test_gemm --small-speed`)
 * the small kernel wins to 6 tokens and ties at 8; in SmolLM2-135M Q4_1's
 * decode step on 2 threads (`test_batch --time-steps --only N`, three
 * alternated rounds, docs/cpu-kernels.md) it took 12-14.5 / 15-17 / 18 ms at
 * 2 / 3 / 4 sequences against the gemm's 17-20 / 20-21 / 20-21, tied at 5
 * and 6 and lost at 8 (28 vs 24-26 ms). So: 2..4 tokens. */
#define SMALL_MAX_TOK 4

int qt_gemm_small_max_tok(qt_type t, qt_isa isa) { return qt_gemm_small(t, isa) ? SMALL_MAX_TOK : 0; }

/* One ISA's loop, iters rounds: multiply-adds done (quant_gemm_impl.h). */
static uint64_t peak_round(qt_isa isa, int zmm, int64_t iters) {
    switch (isa) {
    case QT_ISA_AMX: return qt_peak_amx(iters);
    case QT_ISA_AVX512: return qt_peak_avx512(iters, zmm);
    default: return qt_peak_avx2(iters);
    }
}

double qt_int8_rate(qt_isa isa, double seconds) {
    if (isa == QT_ISA_SCALAR || !qt_isa_supported(isa)) return 0;
    double best = 0;
    for (int zmm = 0; zmm <= (isa == QT_ISA_AVX512); zmm++) {
        /* grow the round until it lasts a tenth of the time, then take the best of what is left */
        int64_t iters = 1024;
        double spent = 0;
        while (spent < seconds) {
            const int64_t t0 = st_now_ns();
            const uint64_t macs = peak_round(isa, zmm, iters);
            const double dt = (double)(st_now_ns() - t0) * 1e-9;
            spent += dt;
            if (dt > 0 && (double)macs / dt > best) best = (double)macs / dt;
            if (dt < seconds / 10) iters *= 2;
        }
    }
    return best;
}

void qt_gemm_by_dot(qt_vec_dot_fn dot, int n, int nr, int nc, const void *w, size_t w_stride, const void *const *act,
                    float *y, size_t ldy) {
    const unsigned char *wr = w;
    for (int r = 0; r < nr; r++, wr += w_stride)
        for (int c = 0; c < nc; c++) dot(n, &y[(size_t)c * ldy + (size_t)r], wr, act[c]);
}
