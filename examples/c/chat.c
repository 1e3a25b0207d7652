/*
 * A two-turn chat through kvcore's C API: the second turn runs in the same session and
 * reuses every cached position of the first. Replies stream to stdout as they are
 * generated (greedy, at most 64 tokens each); each turn's statistics go to stderr.
 *
 * Build (from the repository root, after `cargo build --release -p kvcore-capi`):
 *   cc -std=c99 -Wall -Wextra -Werror -Icapi/include examples/c/chat.c \
 *      target/release/libkvcore_c.a -lpthread -ldl -lm -o target/chat
 *   target/chat [MODEL]        (MODEL: a GGUF path, or smollm2 (the default) / gemma3)
 *
 * `kvcore chat --greedy -n 64` given the same two lines prints the same replies.
 */
#include "kvcore.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The reply of one turn, as it streams in. */
struct reply {
    char *text;
    size_t len;
    size_t cap;
    int failed;
};

static bool on_text(const char *piece, size_t len, void *user_data) {
    struct reply *r = user_data;
    if (r->len + len + 1 > r->cap) {
        size_t cap = 2 * (r->len + len + 1);
        char *text = realloc(r->text, cap);
        if (text == NULL) {
            r->failed = 1;
            return false; /* stops the generation */
        }
        r->text = text;
        r->cap = cap;
    }
    memcpy(r->text + r->len, piece, len);
    r->len += len;
    r->text[r->len] = '\0';
    fwrite(piece, 1, len, stdout);
    fflush(stdout);
    return true;
}

static int fail(const char *what, kvcore_status status) {
    fprintf(stderr, "chat: %s: %s: %s\n", what, kvcore_status_name((int32_t)status),
            kvcore_last_error());
    return 1;
}

/* The ids of the conversation so far, rendered for the assistant's reply: asks for the
 * length first (KVCORE_ERR_BUFFER_TOO_SMALL says how many), then fills. */
static kvcore_status chat_ids(const kvcore_model *model, const kvcore_chat_message *messages,
                              size_t n_messages, uint32_t **ids, size_t *n_ids) {
    size_t n = 0;
    kvcore_status status = kvcore_chat_tokenize(model, messages, n_messages, NULL, 0, &n);
    if (status != KVCORE_ERR_BUFFER_TOO_SMALL && status != KVCORE_OK) {
        return status;
    }
    *ids = malloc(n * sizeof **ids);
    if (*ids == NULL) {
        fprintf(stderr, "chat: out of memory\n");
        exit(1);
    }
    status = kvcore_chat_tokenize(model, messages, n_messages, *ids, n, n_ids);
    if (status != KVCORE_OK) {
        free(*ids);
        *ids = NULL;
    }
    return status;
}

int main(int argc, char **argv) {
    const char *model_name = argc > 1 ? argv[1] : "smollm2";
    const char *questions[2] = {"What is the capital of France?", "And of Italy?"};
    kvcore_chat_message messages[4];
    struct reply replies[2];
    size_t n_messages = 0;
    kvcore_model *model = NULL;
    kvcore_session *session = NULL;
    int rc = 0;
    int turn;

    memset(replies, 0, sizeof replies);
    kvcore_model_params params = kvcore_model_default_params();
    kvcore_status status = kvcore_model_load(model_name, &params, &model);
    if (status != KVCORE_OK) {
        return fail("loading the model", status);
    }
    fprintf(stderr, "[kvcore %s | %s backend x%zu threads | vocab %zu | context %zu]\n",
            kvcore_version(), kvcore_model_backend(model), kvcore_model_threads(model),
            kvcore_model_vocab_size(model), kvcore_model_context_length(model));

    /* One session for the whole conversation: its cache is what the second turn reuses. */
    status = kvcore_session_new(model, 0, &session);
    if (status != KVCORE_OK) {
        rc = fail("creating the session", status);
        goto done;
    }

    for (turn = 0; turn < 2; turn++) {
        uint32_t *ids = NULL;
        size_t n_ids = 0;
        kvcore_gen_stats stats;
        kvcore_generate_params gen = kvcore_generate_default_params(); /* greedy */
        gen.max_tokens = 64;

        messages[n_messages].role = "user";
        messages[n_messages].content = questions[turn];
        n_messages++;
        /* The whole conversation each turn: the session finds the prefix it holds. */
        status = chat_ids(model, messages, n_messages, &ids, &n_ids);
        if (status != KVCORE_OK) {
            rc = fail("rendering the chat", status);
            goto done;
        }
        status = kvcore_session_generate(session, ids, n_ids, &gen, on_text, &replies[turn],
                                         &stats);
        free(ids);
        if (status != KVCORE_OK || replies[turn].failed) {
            rc = replies[turn].failed ? 1 : fail("generating", status);
            goto done;
        }
        putchar('\n');
        fflush(stdout);
        fprintf(stderr,
                "[turn %d | %llu positions reused, %llu prefilled | %llu generated | "
                "ttft %.1f ms | decode %.1f tok/s | kv %.2f MiB | peak RSS %.1f MiB]\n",
                turn + 1, (unsigned long long)stats.reused_tokens,
                (unsigned long long)stats.prefilled_tokens,
                (unsigned long long)stats.generated_tokens, stats.ttft_ms, stats.decode_tok_s,
                (double)stats.kv_bytes / (1024.0 * 1024.0),
                (double)stats.peak_rss_bytes / (1024.0 * 1024.0));
        messages[n_messages].role = "assistant";
        messages[n_messages].content = replies[turn].text != NULL ? replies[turn].text : "";
        n_messages++;
    }

done:
    kvcore_session_free(session);
    kvcore_model_free(model);
    free(replies[0].text);
    free(replies[1].text);
    return rc;
}
