/* Checks of a request before it is routed (srv_internal.h): the header
 * syntax and framing that a proxy in front could read otherwise (request
 * smuggling), the Host and Origin a browser sends (what a web page may
 * reach: DNS rebinding, cross-site requests), CORS, and the body's media
 * type. Each names what is wrong; srv_http.c answers and closes. */
#include <arpa/inet.h>
#include <ctype.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include "server/srv_internal.h"

/* ---- Host and Origin: what a web page in a browser may reach ----
 * A page on another site can make the browser send requests here (and, by DNS rebinding, read
 * the answers under its own name). The Host a browser sends names the site, so only the
 * names this server is known by are served (--allowed-hosts; by default, on a loopback address,
 * localhost and the loopback addresses); an Origin (sent by browsers on cross-site and POST
 * requests) must be this server's own or one of --cors-origin. */

/* The host of a Host value, without its port: "[::1]:8080" -> "::1", "Example.com:80" ->
 * "Example.com". */
static void host_name(const char *h, char *out, size_t cap) {
    const char *e;
    if (*h == '[') {
        h++;
        e = strchr(h, ']');
        if (!e) e = h + strlen(h);
    } else {
        e = strrchr(h, ':');
        if (!e) e = h + strlen(h);
    }
    size_t n = (size_t)(e - h);
    if (n && h[n - 1] == '.') n--; /* "localhost." */
    snprintf(out, cap, "%.*s", (int)(n < cap ? n : cap - 1), h);
}

/* 1 when name is in the comma-separated list (case-insensitive); "*" matches all. */
static int in_list(const char *list, const char *name) {
    for (const char *p = list; p && *p;) {
        while (*p == ' ' || *p == ',') p++;
        size_t n = strcspn(p, ",");
        size_t m = n;
        while (m && p[m - 1] == ' ') m--;
        if ((m == 1 && *p == '*') || (m && m == strlen(name) && !strncasecmp(p, name, m))) return 1;
        p += n;
    }
    return 0;
}

int srv_host_allowed(srv_ctx *s, const char *host) {
    if (!host) return 1; /* HTTP/1.0 without Host: no browser sends that */
    char name[256];
    host_name(host, name, sizeof name);
    if (s->p.allowed_hosts) return in_list(s->p.allowed_hosts, name);
    if (!s->loopback) return 1; /* open to the network: its names are not known here */
    struct in_addr a4;
    if (inet_pton(AF_INET, name, &a4) == 1 && (ntohl(a4.s_addr) >> 24) == 127) return 1; /* 127.0.0.0/8 */
    return in_list("localhost,::1", name) || !strcasecmp(name, s->p.host);
}

/* 2: allowed by --cors-origin (answers carry Access-Control-Allow-Origin); 1: this server's own
 * origin (same-origin, the web page); 0: refused. */
int srv_origin_allowed(srv_ctx *s, const char *origin, const char *host) {
    if (s->p.cors_origin && in_list(s->p.cors_origin, origin)) return 2;
    if (host) {
        const char *o = !strncasecmp(origin, "http://", 7) ? origin + 7 : NULL;
        if (o && !strcasecmp(o, host)) return 1;
    }
    return 0;
}

/* The request's Origin when --cors-origin allows it (its answers name it in
 * Access-Control-Allow-Origin), else NULL. */
const char *srv_cors_origin(srv_ctx *s, struct MHD_Connection *c) {
    if (!s->p.cors_origin) return NULL;
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
    return origin && srv_origin_allowed(s, origin, host) == 2 ? origin : NULL;
}

/* The media type of Content-Type is application/json (parameters such as charset aside). */
int srv_is_json_type(const char *ct) {
    if (!ct) return 0;
    while (*ct == ' ') ct++;
    size_t n = strcspn(ct, "; ");
    return n == 16 && !strncasecmp(ct, "application/json", 16);
}

/* RFC 9110 5.6.2: a field name is a token. */
static int is_tchar(unsigned char ch) { return isalnum(ch) || (ch && strchr("!#$%&'*+-.^_`|~", ch)); }

static enum MHD_Result framing_header(void *cls, enum MHD_ValueKind kind, const char *key, size_t key_size,
                                      const char *value, size_t value_size) {
    (void)kind;
    srv_headers *f = cls;
    if (!f->bad[0]) {
        /* libmicrohttpd keeps a space before the colon in the name ("Transfer-Encoding " is then no
         * Transfer-Encoding to it, where a lenient proxy reads chunked: request smuggling) */
        size_t i = 0;
        while (i < key_size && is_tchar((unsigned char)key[i])) i++;
        if (!key_size || i < key_size)
            snprintf(f->bad, sizeof f->bad,
                     "the header name '%.40s' is not a token (RFC 9110 5.6.2: no spaces, "
                     "no space before the colon, no control characters)",
                     key);
        /* libmicrohttpd appends a folded continuation line (obs-fold) to the header's *name*:
         * "Transfer-Encoding: x\r\n chunked" arrives as "Transfer-Encodingchunked: x". Folds cannot be
         * seen in general, but one in a framing header, where a proxy that unfolds reads another
         * framing, leaves this trace */
        static const char *const framing_names[] = {"Content-Length", "Transfer-Encoding"};
        for (size_t k = 0; k < 2 && !f->bad[0]; k++) {
            const size_t n = strlen(framing_names[k]);
            if (key_size > n && !strncasecmp(key, framing_names[k], n))
                snprintf(f->bad, sizeof f->bad,
                         "the header name '%.40s' is %s with more after it (a folded line? obs-fold is not "
                         "accepted, RFC 9112 5.2)",
                         key, framing_names[k]);
        }
        for (size_t k = 0; value && k < value_size && !f->bad[0]; k++) {
            unsigned char ch = (unsigned char)value[k];
            if ((ch < 0x20 && ch != '\t') || ch == 0x7f)
                snprintf(f->bad, sizeof f->bad, "the value of header '%.40s' holds a control character", key);
        }
        if (value && !f->bad[0] && strlen(value) != value_size)
            snprintf(f->bad, sizeof f->bad, "the value of header '%.40s' holds a NUL byte", key);
    }
    if (!strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH)) {
        if (f->cl && strcmp(f->cl, value ? value : "")) f->cl_differ = 1;
        if (!f->cl) f->cl = value ? value : "";
    } else if (!strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING)) {
        f->n_te++;
        f->te = value ? value : "";
    } else if (!strcasecmp(key, MHD_HTTP_HEADER_HOST)) {
        f->n_host++;
        f->host = value ? value : "";
    }
    return MHD_YES;
}

/* What makes the body's end ambiguous (RFC 9112 6.1, 6.3: the ground of request smuggling
 * behind a proxy), or NULL: Content-Length headers that disagree, Transfer-Encoding together
 * with Content-Length (400); a transfer coding other than chunked (501: MHD decodes chunked
 * only, and would wait out --read-timeout for a body it cannot frame). Also the header syntax
 * (a name that is not a token, a control character or NUL in a value) and Host: required once
 * in HTTP/1.1 (RFC 9112 3.2), never twice. */
const char *srv_headers_problem(const srv_headers *f, const char *version, int *status) {
    *status = 400;
    if (f->bad[0]) return f->bad;
    if (f->cl_differ) return "Content-Length is given twice with different values";
    if (f->n_te && f->cl) return "both Transfer-Encoding and Content-Length are given";
    if (f->n_te > 1 || (f->n_te && strcasecmp(f->te, "chunked"))) {
        *status = 501;
        return "Transfer-Encoding: only 'chunked' is supported";
    }
    if (f->n_host > 1) return "the Host header is given more than once";
    if (!f->n_host && version && !strcmp(version, MHD_HTTP_VERSION_1_1))
        return "an HTTP/1.1 request needs a Host header";
    return NULL;
}

/* 1 for an address only this machine reaches: 127.0.0.0/8, ::1, localhost. */
int srv_is_loopback(const struct addrinfo *ai, const char *host) {
    if (!strcasecmp(host, "localhost")) return 1;
    if (ai->ai_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)ai->ai_addr)->sin_addr.s_addr) >> 24) == 127;
    if (ai->ai_family == AF_INET6) return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)ai->ai_addr)->sin6_addr);
    return 0;
}

void srv_headers_read(struct MHD_Connection *c, srv_headers *h) {
    *h = (srv_headers){0};
    MHD_get_connection_values_n(c, MHD_HEADER_KIND, framing_header, h);
}
