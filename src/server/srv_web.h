/* The web page (GET /: a streaming chat and a monitor panel) and the GPU
 * numbers its monitor shows (GET /metrics/gpu, read through NVML when the
 * driver's library is present).
 *
 * The page's files live in src/server/web/ and are compiled into the binary
 * (web/embed.cmake writes them as byte arrays at build time), so a strata
 * binary serves its page with nothing installed beside it. */
#ifndef STRATA_SERVER_SRV_WEB_H
#define STRATA_SERVER_SRV_WEB_H

#include <stddef.h>

#include "server/srv_internal.h"

typedef struct {
    const char *path;          /* "/" or "/web/NAME" */
    const char *type;          /* Content-Type */
    const unsigned char *data; /* (len) the file's bytes */
    size_t len;
} srv_web_asset;

/* Written by web/embed.cmake. */
extern const srv_web_asset SRV_WEB_ASSETS[];
extern const int SRV_WEB_N_ASSETS;

/* The asset served at url, or NULL. */
const srv_web_asset *srv_web_find(const char *url);
/* 200 with the asset and a Content-Security-Policy that allows only this
 * origin (the page loads nothing from elsewhere and runs no inline script). */
enum MHD_Result srv_web_send(srv_ctx *s, struct MHD_Connection *c, const srv_web_asset *a);
/* GET /metrics/gpu: Prometheus text, per GPU utilisation, memory,
 * temperature and power from NVML; strata_gpu_count 0 without NVML. */
enum MHD_Result srv_web_gpu_metrics(srv_ctx *s, struct MHD_Connection *c);
/* The same lines appended to b (GET /metrics carries them too). */
void srv_web_gpu_metrics_text(sbuf *b);

#endif
