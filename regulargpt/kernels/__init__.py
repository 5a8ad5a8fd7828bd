"""Fused compute kernels, one file per kernel (the dispatch stays in `regulargpt.model.sliding_dilated`).

Every sliding-dilated kernel here implements one operator contract, exactly today's
`sliding_dilated_attention` in the projection's own layout:

    out[b, i, h] = Σ_j P[b, i, h, j] · v[b, p_i − j·D, h]        p_i = query_start + i·query_step, j = 0..C−1
    P[b, i, h, :] = softmax_j( q[b, i, h] · k[b, p_i − j·D, h] / sqrt(Dh) + r[h, j] )

* q: (B, Tq, H, Dh); k, v: (B, T, H, Dh); any strides with stride(-1) == 1, so the (B, T, 3, H, Dh) output of the
  fused qkv projection is read in place (no head-transpose copy). Default query_start = 0, query_step = 1, Tq = T
  (sliding mode); tree mode with K = 1 reads only the kept positions t−1, t−1−C, … (query_start = (t−1) % C,
  query_step = C, D = 1).
* rel_bias r: (H, C), used in fp32. A key position below 0 reads pad_k / pad_v ((B, H, Dh), stride 0 along B
  allowed), or is masked out when both pads are None (position p_i itself is always visible).
* out: (B, Tq, H, Dh), contiguous, q's dtype, so out.view(B, Tq, H·Dh) feeds the output projection directly.
* Scores, softmax and every reduction in fp32 (fp64 for fp64 inputs); inputs fp32, bf16, fp16 (fp64 on CPU).
* Gradients to q, k, v, rel_bias, pad_k, pad_v. dk/dv in gather form (key n collects from the queries at
  positions n + j·D), dr/dpad as per-block partial sums reduced once: a rerun is bit-identical.
"""
