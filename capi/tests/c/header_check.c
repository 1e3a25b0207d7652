/* Compiled as C99 and as C++ with -Wall -Wextra -Werror by .ci/capi.sh: the header is
 * valid, warning-free C and C++, and its declarations are usable as written. */
#include "kvcore.h"

#ifdef __cplusplus
#include <cstdio>
#else
#include <stdio.h>
#endif

int main(void) {
    kvcore_model_params mp = kvcore_model_default_params();
    kvcore_sampler_params sp = kvcore_sampler_default_params();
    kvcore_generate_params gp = kvcore_generate_default_params();
    kvcore_model *model = NULL;
    kvcore_status status = kvcore_model_load(NULL, &mp, &model);
    printf("%s %s %s %u %d %f\n", kvcore_version(), kvcore_status_name((int32_t)status),
           kvcore_last_error(), (unsigned)sp.top_k, (int)gp.max_tokens, (double)sp.top_p);
    kvcore_model_free(model);
    return status == KVCORE_ERR_INVALID_ARGUMENT ? 0 : 1;
}
