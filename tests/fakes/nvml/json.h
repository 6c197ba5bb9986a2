/* Minimal JSON DOM parser for the NVML test double (no third-party code). */
#ifndef NVML_DOUBLE_JSON_H
#define NVML_DOUBLE_JSON_H
#include <stddef.h>

typedef enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } jtype;

typedef struct jval {
    jtype t;
    int b;                 /* J_BOOL */
    double n;              /* J_NUM */
    char *s;               /* J_STR */
    struct jval **items;   /* J_ARR / J_OBJ values */
    char **keys;           /* J_OBJ keys */
    int len, cap;
} jval;

/* Parse text; NULL on error with a message in err. */
jval *json_parse(const char *text, char *err, size_t errlen);
void json_free(jval *v);
jval *jget(const jval *obj, const char *key);     /* NULL if absent or not an object */
jval *jat(const jval *arr, int i);                /* NULL if out of range / not an array */
int jlen(const jval *arr);                        /* 0 unless array/object */
/* Accessors with defaults. Numbers may also be given as strings ("0x20B210DE"). */
long long jint(const jval *v, long long def);
const char *jstr(const jval *v, const char *def);
int jbool(const jval *v, int def);
#endif
