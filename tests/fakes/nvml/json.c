/* Minimal JSON DOM parser for the NVML test double (no third-party code). */
#include "json.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { const char *p; const char *start; char *err; size_t errlen; int depth; } jp;

static void jerr(jp *s, const char *msg)
{
    if (s->err && s->err[0] == '\0')
        snprintf(s->err, s->errlen, "%s at offset %ld", msg, (long)(s->p - s->start));
}

static void skipws(jp *s)
{
    while (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r')
        s->p++;
}

static jval *newv(jtype t)
{
    jval *v = calloc(1, sizeof(*v));
    if (v) v->t = t;
    return v;
}

static int push(jval *v, char *key, jval *item)
{
    if (v->len == v->cap) {
        int nc = v->cap ? v->cap * 2 : 8;
        jval **ni = realloc(v->items, (size_t)nc * sizeof(*ni));
        if (!ni) return -1;
        v->items = ni;
        if (v->t == J_OBJ) {
            char **nk = realloc(v->keys, (size_t)nc * sizeof(*nk));
            if (!nk) return -1;
            v->keys = nk;
        }
        v->cap = nc;
    }
    v->items[v->len] = item;
    if (v->t == J_OBJ) v->keys[v->len] = key;
    v->len++;
    return 0;
}

static void put_utf8(char **o, unsigned cp)
{
    char *q = *o;
    if (cp < 0x80) { *q++ = (char)cp; }
    else if (cp < 0x800) { *q++ = (char)(0xC0 | (cp >> 6)); *q++ = (char)(0x80 | (cp & 0x3F)); }
    else if (cp < 0x10000) { *q++ = (char)(0xE0 | (cp >> 12)); *q++ = (char)(0x80 | ((cp >> 6) & 0x3F)); *q++ = (char)(0x80 | (cp & 0x3F)); }
    else { *q++ = (char)(0xF0 | (cp >> 18)); *q++ = (char)(0x80 | ((cp >> 12) & 0x3F)); *q++ = (char)(0x80 | ((cp >> 6) & 0x3F)); *q++ = (char)(0x80 | (cp & 0x3F)); }
    *o = q;
}

static int hex4(const char *p, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

static char *parse_string(jp *s)
{
    /* s->p at opening quote */
    const char *p = s->p + 1;
    size_t n = 0;
    const char *q = p;
    while (*q && *q != '"') { if (*q == '\\' && q[1]) q++; q++; n++; }
    if (*q != '"') { jerr(s, "unterminated string"); return NULL; }
    char *out = malloc(n * 4 + 1), *o = out;
    if (!out) return NULL;
    while (*p != '"') {
        unsigned char c = (unsigned char)*p;
        if (c < 0x20) { s->p = p; jerr(s, "control character in string"); free(out); return NULL; }
        if (c != '\\') { *o++ = (char)c; p++; continue; }
        p++;
        switch (*p) {
        case '"': *o++ = '"'; break;
        case '\\': *o++ = '\\'; break;
        case '/': *o++ = '/'; break;
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'n': *o++ = '\n'; break;
        case 'r': *o++ = '\r'; break;
        case 't': *o++ = '\t'; break;
        case 'u': {
            unsigned cp;
            if (hex4(p + 1, &cp)) { s->p = p; jerr(s, "bad \\u escape"); free(out); return NULL; }
            p += 4;
            if (cp >= 0xD800 && cp < 0xDC00 && p[1] == '\\' && p[2] == 'u') {
                unsigned lo;
                if (!hex4(p + 3, &lo) && lo >= 0xDC00 && lo < 0xE000) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    p += 6;
                }
            }
            put_utf8(&o, cp);
            break;
        }
        default: s->p = p; jerr(s, "bad escape"); free(out); return NULL;
        }
        p++;
    }
    *o = '\0';
    s->p = p + 1;
    return out;
}

static jval *parse_value(jp *s);

static jval *parse_container(jp *s, int obj)
{
    jval *v = newv(obj ? J_OBJ : J_ARR);
    if (!v) return NULL;
    if (++s->depth > 64) { jerr(s, "nesting too deep"); json_free(v); return NULL; }
    s->p++;
    skipws(s);
    char close = obj ? '}' : ']';
    if (*s->p == close) { s->p++; s->depth--; return v; }
    for (;;) {
        char *key = NULL;
        skipws(s);
        if (obj) {
            if (*s->p != '"') { jerr(s, "expected object key"); goto fail; }
            key = parse_string(s);
            if (!key) goto fail;
            skipws(s);
            if (*s->p != ':') { free(key); jerr(s, "expected ':'"); goto fail; }
            s->p++;
        }
        jval *item = parse_value(s);
        if (!item) { free(key); goto fail; }
        if (push(v, key, item)) { free(key); json_free(item); goto fail; }
        skipws(s);
        if (*s->p == ',') { s->p++; continue; }
        if (*s->p == close) { s->p++; break; }
        jerr(s, obj ? "expected ',' or '}'" : "expected ',' or ']'");
        goto fail;
    }
    s->depth--;
    return v;
fail:
    json_free(v);
    return NULL;
}

static jval *parse_value(jp *s)
{
    skipws(s);
    char c = *s->p;
    if (c == '{' || c == '[') return parse_container(s, c == '{');
    if (c == '"') {
        char *str = parse_string(s);
        if (!str) return NULL;
        jval *v = newv(J_STR);
        if (!v) { free(str); return NULL; }
        v->s = str;
        return v;
    }
    if (!strncmp(s->p, "true", 4)) { s->p += 4; jval *v = newv(J_BOOL); if (v) v->b = 1; return v; }
    if (!strncmp(s->p, "false", 5)) { s->p += 5; return newv(J_BOOL); }
    if (!strncmp(s->p, "null", 4)) { s->p += 4; return newv(J_NULL); }
    if (c == '-' || (c >= '0' && c <= '9')) {
        char *end;
        double d = strtod(s->p, &end);
        if (end == s->p) { jerr(s, "bad number"); return NULL; }
        s->p = end;
        jval *v = newv(J_NUM);
        if (v) v->n = d;
        return v;
    }
    jerr(s, c ? "unexpected character" : "unexpected end of input");
    return NULL;
}

jval *json_parse(const char *text, char *err, size_t errlen)
{
    jp s = { text, text, err, errlen, 0 };
    if (err && errlen) err[0] = '\0';
    jval *v = parse_value(&s);
    if (!v) return NULL;
    skipws(&s);
    if (*s.p) { jerr(&s, "trailing characters"); json_free(v); return NULL; }
    return v;
}

void json_free(jval *v)
{
    if (!v) return;
    for (int i = 0; i < v->len; i++) {
        json_free(v->items[i]);
        if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->s);
    free(v);
}

jval *jget(const jval *obj, const char *key)
{
    if (!obj || obj->t != J_OBJ) return NULL;
    for (int i = 0; i < obj->len; i++)
        if (!strcmp(obj->keys[i], key)) return obj->items[i];
    return NULL;
}

jval *jat(const jval *arr, int i)
{
    if (!arr || arr->t != J_ARR || i < 0 || i >= arr->len) return NULL;
    return arr->items[i];
}

int jlen(const jval *arr)
{
    return (arr && (arr->t == J_ARR || arr->t == J_OBJ)) ? arr->len : 0;
}

long long jint(const jval *v, long long def)
{
    if (!v) return def;
    if (v->t == J_NUM) return (long long)v->n;
    if (v->t == J_BOOL) return v->b;
    if (v->t == J_STR) {
        char *end;
        long long r = strtoll(v->s, &end, 0);
        if (end != v->s && *end == '\0') return r;
    }
    return def;
}

const char *jstr(const jval *v, const char *def)
{
    return (v && v->t == J_STR) ? v->s : def;
}

int jbool(const jval *v, int def)
{
    if (!v || v->t == J_NULL) return def;
    if (v->t == J_BOOL) return v->b;
    if (v->t == J_NUM) return v->n != 0;
    return def;
}
