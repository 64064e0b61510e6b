/* The web page's assets and the GPU monitor endpoint (srv_web.h).
 *
 * NVML is opened with dlopen at the first /metrics/gpu, not linked: the same
 * binary then runs on machines without the NVIDIA driver (the page says
 * "no GPU") and reports the cards on machines with it, whether or not this
 * build has the CUDA backend. The few entry points used are declared here by
 * their documented C signatures; nothing of NVML's header is copied. */
#include "server/srv_web.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"

const srv_web_asset *srv_web_find(const char *url) {
    for (int i = 0; i < SRV_WEB_N_ASSETS; i++)
        if (!strcmp(url, SRV_WEB_ASSETS[i].path)) return &SRV_WEB_ASSETS[i];
    return NULL;
}

enum MHD_Result srv_web_send(srv_ctx *s, struct MHD_Connection *c, const srv_web_asset *a) {
    struct MHD_Response *r = MHD_create_response_from_buffer(a->len, (void *)a->data, MHD_RESPMEM_PERSISTENT);
    MHD_add_response_header(r, "Content-Type", a->type);
    /* 'self' only: the page, its script and its style come from here, and it talks only to this server */
    MHD_add_response_header(r, "Content-Security-Policy",
                            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                            "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    return srv_queue(s, c, 200, r);
}

/* ---- NVML through dlopen ---- */

typedef struct nvml_device_st *nvml_device;
typedef struct {
    unsigned int gpu, memory; /* percent of the last sample period */
} nvml_utilization;
typedef struct {
    unsigned long long total, free, used; /* bytes */
} nvml_memory;

static struct {
    int ok;
    char why[160];
    int (*device_get_count)(unsigned int *);
    int (*device_get_handle)(unsigned int, nvml_device *);
    int (*device_get_name)(nvml_device, char *, unsigned int);
    int (*device_get_utilization)(nvml_device, nvml_utilization *);
    int (*device_get_memory)(nvml_device, nvml_memory *);
    int (*device_get_temperature)(nvml_device, int, unsigned int *);
    int (*device_get_power)(nvml_device, unsigned int *);
    int (*device_get_power_limit)(nvml_device, unsigned int *);
} g_nvml;
static pthread_once_t g_nvml_once = PTHREAD_ONCE_INIT;

static void nvml_open(void) {
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(g_nvml.why, sizeof g_nvml.why, "no NVML library (libnvidia-ml.so.1)");
        return;
    }
    int (*init)(void) = (int (*)(void))dlsym(h, "nvmlInit_v2");
    /* function pointers from dlsym: the object-to-function cast is POSIX's documented use */
#define SYM(field, name) g_nvml.field = (__typeof__(g_nvml.field))dlsym(h, name)
    SYM(device_get_count, "nvmlDeviceGetCount_v2");
    SYM(device_get_handle, "nvmlDeviceGetHandleByIndex_v2");
    SYM(device_get_name, "nvmlDeviceGetName");
    SYM(device_get_utilization, "nvmlDeviceGetUtilizationRates");
    SYM(device_get_memory, "nvmlDeviceGetMemoryInfo");
    SYM(device_get_temperature, "nvmlDeviceGetTemperature");
    SYM(device_get_power, "nvmlDeviceGetPowerUsage");
    SYM(device_get_power_limit, "nvmlDeviceGetEnforcedPowerLimit");
#undef SYM
    if (!init || !g_nvml.device_get_count || !g_nvml.device_get_handle) {
        snprintf(g_nvml.why, sizeof g_nvml.why, "the NVML library lacks nvmlInit_v2/nvmlDeviceGetCount_v2");
        return;
    }
    int rc = init();
    if (rc != 0) {
        snprintf(g_nvml.why, sizeof g_nvml.why, "nvmlInit_v2 failed (NVML error %d)", rc);
        return;
    }
    g_nvml.ok = 1;
    ST_INFO("web: NVML opened, GPU numbers on /metrics/gpu");
}

/* A Prometheus label value: backslash, quote and newline escaped. */
static void label_value(sbuf *b, const char *v) {
    for (; *v; v++) {
        if (*v == '\\' || *v == '"') sbuf_put(b, "\\", 1);
        if (*v == '\n') sbuf_puts(b, "\\n");
        else sbuf_put(b, v, 1);
    }
}

static void gpu_metric(sbuf *b, const char *name, unsigned i, double v) {
    sbuf_printf(b, "strata_gpu_%s{gpu=\"%u\"} %.17g\n", name, i, v);
}

void srv_web_gpu_metrics_text(sbuf *out) {
    pthread_once(&g_nvml_once, nvml_open);
    sbuf b = {0};
    unsigned int n = 0;
    if (g_nvml.ok && g_nvml.device_get_count(&n) != 0) n = 0;
    sbuf_printf(&b,
                "# HELP strata_gpu_count GPUs NVML reports (0 without NVML: %s).\n# TYPE strata_gpu_count gauge\n"
                "strata_gpu_count %u\n",
                g_nvml.ok ? "it is present" : g_nvml.why, n);
    for (unsigned i = 0; i < n; i++) {
        nvml_device d;
        if (g_nvml.device_get_handle(i, &d) != 0) continue;
        char name[96] = "GPU";
        if (g_nvml.device_get_name) g_nvml.device_get_name(d, name, sizeof name);
        sbuf_printf(&b, "strata_gpu_info{gpu=\"%u\",name=\"", i);
        label_value(&b, name);
        sbuf_puts(&b, "\"} 1\n");
        nvml_utilization u;
        if (g_nvml.device_get_utilization && g_nvml.device_get_utilization(d, &u) == 0)
            gpu_metric(&b, "utilization_percent", i, u.gpu);
        nvml_memory m;
        if (g_nvml.device_get_memory && g_nvml.device_get_memory(d, &m) == 0) {
            gpu_metric(&b, "memory_used_bytes", i, (double)m.used);
            gpu_metric(&b, "memory_total_bytes", i, (double)m.total);
        }
        unsigned int v;
        if (g_nvml.device_get_temperature && g_nvml.device_get_temperature(d, 0 /* the GPU die */, &v) == 0)
            gpu_metric(&b, "temperature_celsius", i, v);
        if (g_nvml.device_get_power && g_nvml.device_get_power(d, &v) == 0)
            gpu_metric(&b, "power_watts", i, v / 1000.0);
        if (g_nvml.device_get_power_limit && g_nvml.device_get_power_limit(d, &v) == 0)
            gpu_metric(&b, "power_limit_watts", i, v / 1000.0);
    }
    sbuf_put(out, b.s ? b.s : "", b.len);
    sbuf_free(&b);
}

enum MHD_Result srv_web_gpu_metrics(srv_ctx *s, struct MHD_Connection *c) {
    sbuf b = {0};
    srv_web_gpu_metrics_text(&b);
    /* MHD frees the buffer with free(): hand it a malloc'd copy */
    char *txt = malloc(b.len + 1);
    ST_ASSERT(txt);
    memcpy(txt, b.s, b.len + 1);
    size_t len = b.len;
    sbuf_free(&b);
    return srv_send_text(s, c, 200, "text/plain; version=0.0.4", txt, len);
}
