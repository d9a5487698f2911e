/* json_describe.h: naming a JSON value in error messages ("found ..."),
 * shared by the config.json and safetensors header parsers. */
#ifndef KV_JSON_DESCRIBE_H
#define KV_JSON_DESCRIBE_H

#include <stddef.h>

#include <cjson/cJSON.h>

/* A short description of `it` ("null", "the number 1.5", "the string
 * \"abc\"", "an array of 3", "nothing (missing)" for NULL, ...); control
 * characters in strings are shown as '?'. */
void kv_json_describe(const cJSON *it, char *buf, size_t size);

#endif
