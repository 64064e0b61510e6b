/* The tensor-core instruction the prompt kernels share (attention_tc.cu,
 * moe_mma.cu): c += a b with mma.sync m16n8k16, f16 inputs, f32
 * accumulators; the fragment loads from shared memory (ldmatrix); and the
 * asynchronous copies that feed it (cp.async: 16 bytes global -> shared, no
 * registers held in flight).
 * PTX fragments (g = lane / 4, c = lane % 4):
 *   A 16x16: a0 (g, 2c..2c+1), a1 (g+8, 2c..), a2 (g, 2c+8..), a3 (g+8, 2c+8..)
 *   B 16x8:  b0 (k 2c..2c+1, n g), b1 (k 2c+8.., n g)
 *   C 16x8:  c0 c1 (g, 2c, 2c+1), c2 c3 (g+8, 2c, 2c+1)
 * CUDA only (mma.sync is PTX); the callers' launchers check sm_80+.
 */
#ifndef STRATA_BACKEND_CUDA_MMA_CUH
#define STRATA_BACKEND_CUDA_MMA_CUH

#include <stdint.h>

static __device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    (void)c, (void)a, (void)b0, (void)b1; /* never launched there (the launchers check the device) */
#endif
}

/* Four 8x8 f16 matrices from shared memory (ldmatrix .x4): lanes 8i..8i+7
 * give the 16-byte rows of matrix i; lane l receives in r[i] row l / 4,
 * values 2 (l % 4) and 2 (l % 4) + 1 of matrix i, a mma B (or A) fragment
 * word. TRANS = 1 (.trans) hands each lane the transpose's: values at rows
 * 2 (l % 4) and 2 (l % 4) + 1 of column l / 4. */
template <int TRANS = 0> static __device__ __forceinline__ void mq_ldsm4(uint32_t (&r)[4], const void *p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a)
                     : "memory");
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a)
                     : "memory");
#else
    (void)p;
    r[0] = r[1] = r[2] = r[3] = 0;
#endif
}

/* 16 bytes global -> shared (sm_80+). */
static __device__ __forceinline__ void mq_cp16(void *dst, const void *src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
#else
    (void)dst, (void)src;
#endif
}

/* The same with only the first n (0..16) bytes read, the rest zero-filled:
 * the last chunk of a row's span never reads past the span's last byte. */
static __device__ __forceinline__ void mq_cp16n(void *dst, const void *src, unsigned n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(n) : "memory");
#else
    (void)dst, (void)src, (void)n;
#endif
}

static __device__ __forceinline__ void mq_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

/* Wait until at most N of this thread's most recent groups are pending. */
template <int N> static __device__ __forceinline__ void mq_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

#endif
