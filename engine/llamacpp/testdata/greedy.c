// greedy: llama.cpp's own single-sequence greedy decoding, the reference
// the llama.cpp engine's tests hold dpnode's output to. It drives the same
// prebuilt library as dpnode's worker, with nothing of dpnode in between:
// one sequence, the whole prompt in one decode, then one token at a time,
// argmax of the logits.
//
// usage: greedy MODEL BACKEND_DIR KV_TYPE(f16|f32) MAX_TOKENS [logprobs] < prompts
// Each line of stdin is a prompt of space-separated token ids; each line
// of stdout is its continuation, MAX_TOKENS ids, end-of-generation tokens
// included: the caller stops where its request would. With "logprobs",
// each id is followed by ":" and its log-probability, the log-softmax of
// the logits computed in double.
//
// usage: greedy MODEL BACKEND_DIR KV_TYPE 0 logits FILE < lines
// Each line is a prompt, "|", and a continuation; for each token of the
// continuation, the logits that predict it (after the prompt and the
// continuation's tokens before it) are appended to FILE, n_vocab floats in
// the machine's order, and stdout gets the number of rows and n_vocab.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llama.h"
#include "ggml-backend.h"

static void quiet(enum ggml_log_level level, const char * text, void * user) {
    (void)user;
    if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

int main(int argc, char ** argv) {
    int forced = argc == 7 && strcmp(argv[5], "logits") == 0;
    if (argc != 5 && !(argc == 6 && strcmp(argv[5], "logprobs") == 0) && !forced) {
        fprintf(stderr, "usage: %s MODEL BACKEND_DIR f16|f32 MAX_TOKENS [logprobs] < prompts\n"
                        "       %s MODEL BACKEND_DIR f16|f32 0 logits FILE < prompt|continuation lines\n", argv[0], argv[0]);
        return 2;
    }
    int logprobs = argc == 6;
    FILE * rows = NULL;
    if (forced && !(rows = fopen(argv[6], "wb"))) { fprintf(stderr, "cannot write %s\n", argv[6]); return 1; }
    int f32 = strcmp(argv[3], "f32") == 0;
    int max_tokens = atoi(argv[4]);
    llama_log_set(quiet, NULL);
    ggml_backend_load_all_from_path(argv[2]);
    llama_backend_init();

    struct llama_model_params mp = llama_model_default_params();
    struct llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "cannot load %s\n", argv[1]); return 1; }
    int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 8192;
    cp.n_batch = 8192;
    cp.n_seq_max = 1;
    cp.n_threads = 1;
    cp.n_threads_batch = 1;
    cp.type_k = cp.type_v = f32 ? GGML_TYPE_F32 : GGML_TYPE_F16;
    cp.flash_attn_type = f32 ? LLAMA_FLASH_ATTN_TYPE_DISABLED : LLAMA_FLASH_ATTN_TYPE_AUTO;
    struct llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "cannot create a context\n"); return 1; }
    struct llama_batch batch = llama_batch_init(8192, 0, 1);

    static char line[1 << 20];
    while (fgets(line, sizeof line, stdin)) {
        llama_memory_clear(llama_get_memory(ctx), 1);
        int n = 0;
        static int cont[8192];
        int n_cont = -1;
        for (char * tok = strtok(line, " \n"); tok; tok = strtok(NULL, " \n")) {
            if (forced && strcmp(tok, "|") == 0) { n_cont = 0; continue; }
            if (n_cont >= 0) { if (n_cont < 8192) cont[n_cont++] = atoi(tok); continue; }
            batch.token[n] = atoi(tok);
            batch.pos[n] = n;
            batch.n_seq_id[n] = 1;
            batch.seq_id[n][0] = 0;
            batch.logits[n] = 0;
            n++;
        }
        if (n == 0) { putchar('\n'); continue; }
        batch.logits[n - 1] = 1;
        batch.n_tokens = n;
        int pos = n;
        if (forced) {
            for (int t = 0; t < n_cont; t++) {
                if (llama_decode(ctx, batch) != 0) { fprintf(stderr, "decode failed\n"); return 1; }
                fwrite(llama_get_logits_ith(ctx, batch.n_tokens - 1), sizeof(float), n_vocab, rows);
                batch.token[0] = cont[t];
                batch.pos[0] = pos++;
                batch.n_seq_id[0] = 1;
                batch.seq_id[0][0] = 0;
                batch.logits[0] = 1;
                batch.n_tokens = 1;
            }
            printf("%d %d\n", n_cont < 0 ? 0 : n_cont, n_vocab);
            fflush(stdout);
            continue;
        }
        for (int t = 0; t < max_tokens; t++) {
            if (llama_decode(ctx, batch) != 0) { fprintf(stderr, "decode failed\n"); return 1; }
            const float * logits = llama_get_logits_ith(ctx, batch.n_tokens - 1);
            int best = 0;
            for (int v = 1; v < n_vocab; v++) if (logits[v] > logits[best]) best = v;
            printf(t ? " %d" : "%d", best);
            if (logprobs) {
                double sum = 0;
                for (int v = 0; v < n_vocab; v++) sum += exp((double)logits[v] - (double)logits[best]);
                printf(":%.9g", -log(sum));
            }
            batch.token[0] = best;
            batch.pos[0] = pos++;
            batch.n_seq_id[0] = 1;
            batch.seq_id[0][0] = 0;
            batch.logits[0] = 1;
            batch.n_tokens = 1;
        }
        putchar('\n');
        fflush(stdout);
    }
    if (rows && fclose(rows) != 0) { fprintf(stderr, "cannot write %s\n", argv[6]); return 1; }
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
