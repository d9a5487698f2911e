/* json_describe.c: naming a JSON value in error messages. */
#include "json_describe.h"

#include <stdio.h>
#include <string.h>

void kv_json_describe(const cJSON *it, char *buf, size_t size) {
    if (it == NULL) {
        snprintf(buf, size, "nothing (missing)");
    } else if (cJSON_IsNull(it)) {
        snprintf(buf, size, "null");
    } else if (cJSON_IsTrue(it)) {
        snprintf(buf, size, "true");
    } else if (cJSON_IsFalse(it)) {
        snprintf(buf, size, "false");
    } else if (cJSON_IsNumber(it)) {
        snprintf(buf, size, "the number %.17g", it->valuedouble);
    } else if (cJSON_IsString(it)) {
        char s[48];
        snprintf(s, sizeof s, "%s", it->valuestring);
        for (char *p = s; *p; p++) {
            if ((unsigned char)*p < 0x20) *p = '?';
        }
        snprintf(buf, size, "the string \"%s\"%s", s,
                 strlen(it->valuestring) >= sizeof s ? "..." : "");
    } else if (cJSON_IsArray(it)) {
        snprintf(buf, size, "an array of %d", cJSON_GetArraySize(it));
    } else if (cJSON_IsObject(it)) {
        snprintf(buf, size, "an object");
    } else {
        snprintf(buf, size, "an unknown JSON value");
    }
}
