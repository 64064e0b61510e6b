/* GPU device management (device.h): enumeration, the build-vs-card check
 * made at start, and the pinned-memory bandwidth probe of the self-test.
 *
 * Which code a card can run is decided from its properties and the build's
 * list in device_arch.c (plain C, tested with fake cards). That prediction
 * is printed by --list-devices; the check at start does not trust it alone
 * and launches a probe kernel, the only sure test.
 */
#include <string.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/device.h"
#include "backend/cuda/device_arch.h"

#ifndef STRATA_GPU_ARCHS
#define STRATA_GPU_ARCHS "unknown"
#endif

extern "C" const char *gpu_build_archs(void) { return STRATA_GPU_ARCHS; }

extern "C" const char *gpu_code_name(gpu_code_kind k) {
    return k == GPU_CODE_NATIVE ? "native" : k == GPU_CODE_PTX ? "PTX (JIT)" : "none";
}

extern "C" int gpu_device_count(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* no driver / no device: clear the sticky error, report none */
        return 0;
    }
    return n;
}

static gpu_card_props card_props(int dev, const cudaDeviceProp *p) {
    gpu_card_props c;
    c.index = dev;
    c.name = p->name;
#if ST_GPU_IS_HIP
    c.arch_raw = p->gcnArchName;
#else
    c.arch_raw = NULL;
#endif
    c.cc_major = p->major;
    c.cc_minor = p->minor;
    c.warp_size = p->warpSize;
    c.smem_per_block = p->sharedMemPerBlock;
    return c;
}

extern "C" int gpu_device_info_get(int dev, gpu_device_info *out) {
    memset(out, 0, sizeof *out);
    int n = gpu_device_count();
    if (dev < 0 || dev >= n) {
        st_error_set("GPU %d does not exist (%d GPU%s found)", dev, n, n == 1 ? "" : "s");
        return -1;
    }
    cudaDeviceProp p;
    CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
    out->index = dev;
    snprintf(out->name, sizeof out->name, "%s", p.name);
    out->cc_major = p.major;
    out->cc_minor = p.minor;
    const gpu_card_props c = card_props(dev, &p);
    gpu_arch_name(ST_GPU_IS_HIP, &c, out->arch, sizeof out->arch);
    out->n_sm = p.multiProcessorCount;
    out->warp_size = p.warpSize;
    out->pci_bus = p.pciBusID;
    out->vram_total = p.totalGlobalMem;
    out->code = gpu_arch_code(ST_GPU_IS_HIP, STRATA_GPU_ARCHS, &c);
    int prev = 0;
    CUDA_CHECK(cudaGetDevice(&prev));
    CUDA_CHECK(cudaSetDevice(dev));
    size_t fr = 0, tot = 0;
    CUDA_CHECK(cudaMemGetInfo(&fr, &tot));
    CUDA_CHECK(cudaSetDevice(prev));
    out->vram_free = fr;
    return 0;
}

static __global__ void probe_kernel(int *out) { out[threadIdx.x] = (int)threadIdx.x * 3 + 1; }

extern "C" int gpu_device_check(int dev) {
    gpu_device_info d;
    if (gpu_device_info_get(dev, &d) != 0) return -1;
    cudaDeviceProp p;
    CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
    const gpu_card_props c = card_props(dev, &p);
    char msg[512];
    if (gpu_arch_verdict(ST_GPU_IS_HIP, STRATA_GPU_ARCHS, &c, msg, sizeof msg) != 0) {
        st_error_set("%s", msg);
        return -1;
    }
    const char *fix = ST_GPU_IS_HIP ? "-DCMAKE_HIP_ARCHITECTURES" : "-DCMAKE_CUDA_ARCHITECTURES";
    CUDA_CHECK(cudaSetDevice(dev));
    int *buf = NULL, host[32];
    CUDA_CHECK(cudaMalloc(&buf, sizeof host));
    probe_kernel<<<1, 32>>>(buf);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e == cudaSuccess) e = cudaMemcpy(host, buf, sizeof host, cudaMemcpyDeviceToHost);
    CUDA_CHECK(cudaFree(buf));
    if (e != cudaSuccess) {
        st_error_set("GPU %d '%s' is %s; this build (code for %s) cannot run on it: %s; rebuild with %s including it",
                     dev, d.name, d.arch, gpu_build_archs(), cudaGetErrorString(e), fix);
        return -1;
    }
    for (int i = 0; i < 32; i++)
        if (host[i] != i * 3 + 1) {
            st_error_set("GPU %d '%s' (%s): the probe kernel returned wrong values", dev, d.name, d.arch);
            return -1;
        }
    return 0;
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

extern "C" int gpu_measure_bandwidth(int dev, size_t bytes, int reps, double *h2d, double *d2h) {
    if (gpu_device_check(dev) != 0) return -1;
    if (reps < 1 || reps > 64) reps = 8;
    void *host = NULL, *devp = NULL;
    CUDA_CHECK(cudaMallocHost(&host, bytes));
    CUDA_CHECK(cudaMalloc(&devp, bytes));
    memset(host, 0x5a, bytes); /* touch every page: nothing faults during the timing */
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreate(&s));
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    float ms[2][64];
    for (int dir = 0; dir < 2; dir++) {
        for (int r = -1; r < reps; r++) { /* r = -1: warm-up */
            CUDA_CHECK(cudaEventRecord(e0, s));
            if (dir == 0) CUDA_CHECK(cudaMemcpyAsync(devp, host, bytes, cudaMemcpyHostToDevice, s));
            else CUDA_CHECK(cudaMemcpyAsync(host, devp, bytes, cudaMemcpyDeviceToHost, s));
            CUDA_CHECK(cudaEventRecord(e1, s));
            CUDA_CHECK(cudaEventSynchronize(e1));
            if (r >= 0) CUDA_CHECK(cudaEventElapsedTime(&ms[dir][r], e0, e1));
        }
        qsort(ms[dir], (size_t)reps, sizeof(float), cmp_float);
    }
    *h2d = (double)bytes / (ms[0][reps / 2] * 1e-3) / 1e9;
    *d2h = (double)bytes / (ms[1][reps / 2] * 1e-3) / 1e9;
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    CUDA_CHECK(cudaStreamDestroy(s));
    CUDA_CHECK(cudaFree(devp));
    CUDA_CHECK(cudaFreeHost(host));
    return 0;
}
