/* fp16/bf16 conversions: f16->f32->f16 round-trips all 65536 bit patterns
 * (NaNs stay NaN), and f32->f16 rounds to nearest even, checked exhaustively
 * at the midpoints between neighbouring halves. */
#include "core/fp16.h"

#include <math.h>
#include <stdio.h>

int main(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = st_f16_to_f32((uint16_t)h);
        uint16_t back = st_f32_to_f16(f);
        if (isnan(f) ? !isnan(st_f16_to_f32(back)) : back != h) {
            if (bad++ < 5) printf("round trip %04x -> %g -> %04x\n", h, f, back);
        }
    }
    /* midpoints between consecutive finite positive halves round to the even one */
    for (uint32_t h = 0; h < 0x7bff; h++) {
        float a = st_f16_to_f32((uint16_t)h), b = st_f16_to_f32((uint16_t)(h + 1));
        float mid = (float)(((double)a + (double)b) / 2);
        uint16_t want = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        if (st_f32_to_f16(mid) != want) {
            if (bad++ < 10) printf("midpoint %04x/%04x -> %04x\n", h, h + 1, st_f32_to_f16(mid));
        }
        if (st_f32_to_f16(-mid) != (want | 0x8000)) bad++;
    }
    if (st_f32_to_f16(1e6f) != 0x7c00) bad++;
    if (st_bf16_to_f32(st_f32_to_bf16(1.0f)) != 1.0f) bad++;
    if (st_f32_to_bf16(1.00390625f) != 0x3f80) bad++; /* tie rounds to even */
    printf("fp16: %d failures\n", bad);
    return bad != 0;
}
