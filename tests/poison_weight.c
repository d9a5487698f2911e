/* poison_weight.c: test tool. Writes NaN or Inf into one element of an F32
 * tensor of a safetensors file, in place, so the end-to-end tests can give
 * the gate a checkpoint with one non-finite weight (DESIGN §6: NaN must fail,
 * never "agree").
 *
 *   poison_weight FILE TENSOR ELEMENT nan|inf
 *
 * Exit 0 done, 2 bad usage or input. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: poison_weight FILE TENSOR ELEMENT nan|inf\n");
        return 2;
    }
    int rc = 2;
    char *header = NULL;
    cJSON *root = NULL;
    FILE *f = fopen(argv[1], "r+b");
    unsigned char len8[8];
    if (f == NULL || fread(len8, 1, 8, f) != 8) {
        fprintf(stderr, "poison_weight: %s: cannot read\n", argv[1]);
        goto exit;
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | len8[i];
    if (n == 0 || n > (100u << 20) || (header = malloc((size_t)n)) == NULL ||
        fread(header, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "poison_weight: %s: bad header\n", argv[1]);
        goto exit;
    }
    root = cJSON_ParseWithLength(header, (size_t)n);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, argv[2]);
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(t, "dtype");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
    if (!cJSON_IsString(dtype) || strcmp(dtype->valuestring, "F32") != 0 ||
        cJSON_GetArraySize(offs) != 2) {
        fprintf(stderr, "poison_weight: %s: no F32 tensor '%s'\n", argv[1], argv[2]);
        goto exit;
    }
    const double begin = cJSON_GetArrayItem(offs, 0)->valuedouble;
    const double end = cJSON_GetArrayItem(offs, 1)->valuedouble;
    const double elem = strtod(argv[3], NULL);
    if (elem < 0 || begin + 4.0 * (elem + 1.0) > end) {
        fprintf(stderr, "poison_weight: element %s is outside '%s'\n", argv[3], argv[2]);
        goto exit;
    }
    const float v = strcmp(argv[4], "inf") == 0 ? INFINITY : NAN;
    if (fseek(f, (long)(8 + n + begin + 4.0 * elem), SEEK_SET) != 0 || fwrite(&v, 4, 1, f) != 1) {
        fprintf(stderr, "poison_weight: %s: cannot write\n", argv[1]);
        goto exit;
    }
    rc = 0;
exit:
    if (f != NULL && fclose(f) != 0) rc = 2;
    cJSON_Delete(root);
    free(header);
    return rc;
}
