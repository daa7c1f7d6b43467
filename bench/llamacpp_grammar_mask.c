// llama.cpp's grammar sampler on a fixed token sequence: for each token, the time of one
// llama_sampler_apply over the whole vocabulary (the mask llama.cpp computes when it applies the
// grammar to every candidate) and how many tokens it leaves, then llama_sampler_accept of the token.
// Built and run by bench/grammar_speed.py against the vendored libllama:
//
//     llamacpp_grammar_mask MODEL.gguf GRAMMAR.gbnf TOKENS.txt [MASKS.txt]
//
// prints one "ms n_allowed" line per token; MASKS.txt gets one line per token: "+ ids..." (the allowed
// tokens) or "- ids..." (the others), whichever list is shorter.

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "llama.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static char * read_file(const char * path) {
    FILE * f = fopen(path, "rb");
    if (!f) { perror(path); exit(1); }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char * buf = malloc(n + 1);
    if (fread(buf, 1, n, f) != (size_t) n) { perror(path); exit(1); }
    buf[n] = 0;
    fclose(f);
    return buf;
}

int main(int argc, char ** argv) {
    if (argc != 4 && argc != 5) {
        fprintf(stderr, "usage: %s MODEL.gguf GRAMMAR.gbnf TOKENS.txt [MASKS.txt]\n", argv[0]);
        return 2;
    }
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    struct llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "cannot load %s\n", argv[1]); return 1; }
    const struct llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);

    char * grammar = read_file(argv[2]);
    double t0 = now_ms();
    struct llama_sampler * smpl = llama_sampler_init_grammar(vocab, grammar, "root");
    if (!smpl) { fprintf(stderr, "grammar refused\n"); return 1; }
    fprintf(stderr, "init_ms %.3f\n", now_ms() - t0);

    llama_token_data * data = malloc(sizeof(llama_token_data) * n_vocab);
    FILE * tf = fopen(argv[3], "r");
    if (!tf) { perror(argv[3]); return 1; }
    FILE * mf = argc == 5 ? fopen(argv[4], "w") : NULL;
    int token;
    while (fscanf(tf, "%d", &token) == 1) {
        for (int i = 0; i < n_vocab; i++) {
            data[i].id = i;
            data[i].logit = 0.0f;
            data[i].p = 0.0f;
        }
        llama_token_data_array arr = { data, (size_t) n_vocab, -1, false };
        double t = now_ms();
        llama_sampler_apply(smpl, &arr);
        double dt = now_ms() - t;
        int allowed = 0;
        for (size_t i = 0; i < arr.size; i++) {
            allowed += isfinite(arr.data[i].logit) ? 1 : 0;
        }
        printf("%.4f %d\n", dt, allowed);
        if (mf) {
            const bool list_allowed = 2 * allowed <= n_vocab;
            fputc(list_allowed ? '+' : '-', mf);
            for (size_t i = 0; i < arr.size; i++) {
                if ((isfinite(arr.data[i].logit) != 0) == list_allowed) {
                    fprintf(mf, " %d", arr.data[i].id);
                }
            }
            fputc('\n', mf);
        }
        llama_sampler_accept(smpl, token);
    }
    fclose(tf);
    if (mf) {
        fclose(mf);
    }
    llama_sampler_free(smpl);
    llama_model_free(model);
    free(data);
    free(grammar);
    return 0;
}
