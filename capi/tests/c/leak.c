/* A deliberate leak (a sampler never freed): .ci/capi.sh checks that LeakSanitizer
 * reports it, so the clean run of examples/c/chat.c under ASan means something. */
#include "kvcore.h"

int main(void) {
    kvcore_sampler *sampler = NULL;
    kvcore_sampler_params params = kvcore_sampler_default_params();
    return kvcore_sampler_new(&params, &sampler) == KVCORE_OK ? 0 : 2;
}
