/* bench only (branch lines): e5's final per-token hidden states, for late interaction */
#include "e5.c"
int e5_token_states(e5_model *m, const char *text, float *out, int maxT) {
    int H = m->H, WMAX = m->MAXP - 2;
    size_t tl = strlen(text);
    int capc = (int)tl + 4;
    int *cont = (int *)malloc(sizeof(int) * (capc > 1 ? capc : 1));
    int nc = tok_content(&m->tok, text, cont, capc);
    if (nc > WMAX) nc = WMAX;
    int L = nc + 2;
    int *ids = (int *)malloc(sizeof(int) * L), *pos = (int *)malloc(sizeof(int) * L);
    int *ss = (int *)malloc(sizeof(int) * L), *se = (int *)malloc(sizeof(int) * L);
    int segoff2[2] = {0, L};
    ids[0] = m->tok.bos; pos[0] = 0;
    for (int j = 0; j < nc; j++) { ids[1 + j] = cont[j]; pos[1 + j] = 1 + j; }
    ids[L - 1] = m->tok.eos; pos[L - 1] = L - 1;
    for (int t = 0; t < L; t++) { ss[t] = 0; se[t] = L; }
    float *hid = (float *)malloc((size_t)L * H * sizeof(float));
    forward_batch(m, ids, pos, ss, se, segoff2, 1, L, NULL, hid);
    int n = L < maxT ? L : maxT;
    memcpy(out, hid, (size_t)n * H * sizeof(float));
    free(cont); free(ids); free(pos); free(ss); free(se); free(hid);
    return L;
}
