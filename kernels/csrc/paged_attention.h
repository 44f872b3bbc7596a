// Paged attention on the CPU: decode (the last Q tokens of each sequence) and variable-
// length causal prefill, both reading K and V in place through the block table.  One
// templated body serves the float cache (attention.cpp: rows in q's dtype) and the int8
// cache (attention_kvq.cpp, kv_quant.h: one byte per value and a float32 scale per token
// per KV head); the cache's element type E is the only difference, and all math is fp32.
//
// One work item is one or more KV heads of one sequence and a run of its query tokens:
// the rows of the item are those tokens times the Hq / Hkv query heads sharing each KV
// head, so every key and value row is loaded once per group and used from L1 by all of
// its rows (GQA).  Keys stream in tiles of KEY_TILE tokens with an online softmax in fp32
// (the FlashAttention recurrence), so nothing is gathered or copied: a tile's rows are
// found through the block table and read where they lie, and int8 rows are converted to
// fp32 lanes as they are loaded (no dequantized copy), each key's scale multiplying its
// scores and each value's scale its softmax weight.  Decode items are whole sequences
// when there are at least two per thread, else (sequence, KV head); prefill items cut
// each sequence's new tokens into tiles of about PREFILL_ROWS rows, so long prompts
// spread over all threads.
//
// Decode reads each key and value once and does little with it, so it waits on memory:
// a head's rows lie one slot apart inside blocks that lie anywhere, which the hardware
// prefetchers follow poorly.  Each tile therefore asks for its value rows before computing
// its scores, and for the next tile's key rows (software prefetch).  On the 2-core
// Emerald Rapids dev machine `infbench calibrate`'s decode attention figure (16 sequences
// x 512 tokens of fp32 KV in two GQA shapes, 1 GiB in all) went from 11.4 to 17-18 GB/s.
//
// Everything here is in an unnamed namespace: each of the two translation units compiles
// its own instantiations with internal linkage, as when the body lived in each of them.
#pragma once
#include "cpu_common.h"

namespace infbench_cpu {
namespace {

constexpr int64_t KEY_TILE = 32;       // keys per online-softmax step
constexpr int64_t PREFILL_ROWS = 64;   // query rows (tokens x group heads) per prefill item
constexpr int64_t MIN_PARALLEL_WORK = 1 << 18;  // multiply-adds below which one thread runs
constexpr int ROW_BLOCK = 4;           // query rows sharing one load of a key or value chunk

// The scales of a cache: none for a float cache (NoScales), PagedAttentionInt8's for an
// int8 one.  The cache's element type follows: q's dtype T, or int8_t.
struct NoScales {};
template <typename T, typename Scales>
using CacheElem = std::conditional_t<std::is_same_v<Scales, NoScales>, T, int8_t>;
template <typename E>
constexpr bool kScaled = std::is_same_v<E, int8_t>;  // int8 codes carry a scale per row

// Runs f(std::integral_constant<int, n>) for n = rows in 1..ROW_BLOCK.
template <typename F>
inline void with_rows(int64_t rows, const F& f) {
  switch (rows) {
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    default: f(std::integral_constant<int, 1>{}); break;
  }
}

// s[r * lds] = dot(q[r * ldq : + D], k[0:D]) for NR rows (times k_scale for int8 codes;
// ignored for float rows): each chunk of k loaded, and converted, once for all rows.
template <typename E, int NR>
inline void qk_rows(const float* q, int64_t ldq, const E* k, float k_scale, int64_t D,
                    float* s, int64_t lds) {
  vec::V acc[NR];
  for (int r = 0; r < NR; ++r) acc[r] = vec::zero();
  int64_t d = 0;
  for (; d + vec::W <= D; d += vec::W) {
    const vec::V kv = vec::load(k + d);
    for (int r = 0; r < NR; ++r) acc[r] = vec::fma(vec::load(q + r * ldq + d), kv, acc[r]);
  }
  if (d < D) {
    const vec::V kv = vec::load(k + d, D - d);
    for (int r = 0; r < NR; ++r) acc[r] = vec::fma(vec::load(q + r * ldq + d, D - d), kv, acc[r]);
  }
  for (int r = 0; r < NR; ++r) {
    if constexpr (kScaled<E>) s[r * lds] = vec::sum(acc[r]) * k_scale;
    else s[r * lds] = vec::sum(acc[r]);
  }
}

// acc[r * Dv : + Dv] += sum_j p[r * ldp + j] * v_j for NR rows over n value rows (for
// int8 codes p already carries each value's scale); each accumulator chunk stays in a
// register across the n values.
template <typename E, int NR>
inline void pv_rows(const float* p, int64_t ldp, const E* const* v, int64_t n, float* acc,
                    int64_t Dv) {
  for (int64_t d = 0; d < Dv; d += vec::W) {
    const int64_t width = std::min(vec::W, Dv - d);
    const bool full = width == vec::W;
    vec::V a[NR];
    for (int r = 0; r < NR; ++r) a[r] = full ? vec::load(acc + r * Dv + d) : vec::load(acc + r * Dv + d, width);
    for (int64_t j = 0; j < n; ++j) {
      const vec::V vv = full ? vec::load(v[j] + d) : vec::load(v[j] + d, width);
      for (int r = 0; r < NR; ++r) a[r] = vec::fma(vec::set1(p[r * ldp + j]), vv, a[r]);
    }
    for (int r = 0; r < NR; ++r) {
      if (full) vec::store(acc + r * Dv + d, a[r]);
      else vec::store(acc + r * Dv + d, a[r], width);
    }
  }
}

// The query rows of one item: num_tokens consecutive tokens x the query heads of
// num_kv_heads consecutive KV heads (their groups).  Row r is KV head r / (num_tokens x G)
// of the item, token (r % (num_tokens x G)) / G, query head G x that KV head + r % G.
template <typename T>
struct Item {
  const T* q;  // token 0, first query head of the first KV head
  int64_t q_stride_tok, q_stride_head;
  T* out;
  int64_t out_stride_tok, out_stride_head;
  int64_t num_tokens;
  int64_t first_pos;  // position of token 0; token t sits at first_pos + t
  int64_t context_len;
  const int32_t* table;  // this sequence's block table row
  int64_t kv_head;       // the first KV head
  int64_t num_kv_heads;  // KV heads of the item (1, or all of them: see run_decode)
};

// One item over a cache of E (T, or int8_t with the scales sc).
template <typename E, typename T, typename Scales>
void attend(const PagedAttention& a, const Scales& sc, const Item<T>& it) {
  const int64_t G = a.num_q_heads / a.num_kv_heads;
  const int64_t RH = it.num_tokens * G;  // rows per KV head
  const int64_t R = RH * it.num_kv_heads, D = a.head_dim, Dv = a.v_head_dim;
  const int64_t last_pos = it.first_pos + it.num_tokens - 1;
  const bool windowed = a.window > 0;
  // Keys any row can see: from the first token's window start to the last token.
  const int64_t lo = windowed ? std::max<int64_t>(0, it.first_pos - a.window + 1) : 0;
  const int64_t hi = std::min(last_pos + 1, it.context_len);

  const int64_t scale_floats = kScaled<E> ? 2 * it.num_kv_heads * KEY_TILE : 0;
  float* qf = scratch(R * (D + Dv + KEY_TILE + 2) + scale_floats);  // (R, D): q times scale
  float* acc = qf + R * D;                            // (R, Dv) unnormalised output
  float* s = acc + R * Dv;                            // (R, KEY_TILE) scores, then weights
  float* m = s + R * KEY_TILE;                        // (R,) running max
  float* l = m + R;                                   // (R,) running sum
  // int8 only, (KV heads of the item, KEY_TILE) each: the tile's key and value scales.
  float* k_scale = l + R;
  float* v_scale = k_scale + scale_floats / 2;
  const auto q_offset = [&](int64_t r, int64_t stride_tok, int64_t stride_head) {
    const int64_t rr = r % RH;
    return (rr / G) * stride_tok + ((r / RH) * G + rr % G) * stride_head;
  };
  for (int64_t r = 0; r < R; ++r) {
    vec::load_row(it.q + q_offset(r, it.q_stride_tok, it.q_stride_head), qf + r * D, D, a.scale);
    m[r] = -INFINITY;
    l[r] = 0.f;
  }
  std::fill(acc, acc + R * Dv, 0.f);

  const E* k_base = static_cast<const E*>(a.k_cache) + it.kv_head * a.k_stride_head;
  const E* v_base = static_cast<const E*>(a.v_cache) + it.kv_head * a.v_stride_head;
  const float* ks_base = nullptr;  // int8: the scales of the item's first KV head
  const float* vs_base = nullptr;
  if constexpr (kScaled<E>) {
    ks_base = sc.k_scales + it.kv_head * sc.ks_stride_head;
    vs_base = sc.v_scales + it.kv_head * sc.vs_stride_head;
  }
  const E* k_rows[KEY_TILE];  // this tile's keys and values of the item's first KV head
  const E* v_rows[KEY_TILE];
  const E* head_rows[KEY_TILE];
  // Bytes of one slot's rows of all the item's KV heads (side by side in memory).
  const int64_t k_bytes = ((it.num_kv_heads - 1) * a.k_stride_head + D) *
                          static_cast<int64_t>(sizeof(E));
  const int64_t v_bytes = ((it.num_kv_heads - 1) * a.v_stride_head + Dv) *
                          static_cast<int64_t>(sizeof(E));
  for (int64_t p0 = lo; p0 < hi; p0 += KEY_TILE) {
    const int64_t n = std::min(KEY_TILE, hi - p0);
    for (int64_t j = 0; j < n; ++j) {  // where each key of the tile lies: no copy
      const int64_t pos = p0 + j;
      const int64_t block = it.table[pos / a.block_size], slot = pos % a.block_size;
      k_rows[j] = k_base + block * a.k_stride_block + slot * a.k_stride_slot;
      v_rows[j] = v_base + block * a.v_stride_block + slot * a.v_stride_slot;
      if constexpr (kScaled<E>) {
        const float* ks = ks_base + block * sc.ks_stride_block + slot * sc.ks_stride_slot;
        const float* vs = vs_base + block * sc.vs_stride_block + slot * sc.vs_stride_slot;
        for (int64_t h = 0; h < it.num_kv_heads; ++h) {
          k_scale[h * KEY_TILE + j] = ks[h * sc.ks_stride_head];
          v_scale[h * KEY_TILE + j] = vs[h * sc.vs_stride_head];
        }
      }
    }
    // Values are used after the scores: ask for this tile's now, and for the next tile's
    // keys.
    for (int64_t j = 0; j < n; ++j) {
      const char* vp = reinterpret_cast<const char*>(v_rows[j]);
      for (int64_t off = 0; off < v_bytes; off += 64) __builtin_prefetch(vp + off, 0, 3);
    }
    for (int64_t pos = p0 + KEY_TILE; pos < std::min(p0 + 2 * KEY_TILE, hi); ++pos) {
      const int64_t block = it.table[pos / a.block_size], slot = pos % a.block_size;
      const char* kp = reinterpret_cast<const char*>(k_base + block * a.k_stride_block +
                                                     slot * a.k_stride_slot);
      for (int64_t off = 0; off < k_bytes; off += 64) __builtin_prefetch(kp + off, 0, 3);
    }
    for (int64_t h = 0; h < it.num_kv_heads; ++h) {
      const int64_t k_head = h * a.k_stride_head;
      for (int64_t r0 = h * RH; r0 < (h + 1) * RH; r0 += ROW_BLOCK) {
        with_rows(std::min<int64_t>(ROW_BLOCK, (h + 1) * RH - r0), [&](auto nr) {
          for (int64_t j = 0; j < n; ++j)
            qk_rows<E, decltype(nr)::value>(qf + r0 * D, D, k_rows[j] + k_head,
                                            kScaled<E> ? k_scale[h * KEY_TILE + j] : 1.f, D,
                                            s + r0 * KEY_TILE + j, KEY_TILE);
        });
      }
    }
    // Causal and window masks, only where the tile reaches past a row's limits.
    const bool past_first = p0 + n - 1 > it.first_pos;
    const bool before_window = windowed && p0 <= last_pos - a.window;
    if (past_first || before_window) {
      for (int64_t r = 0; r < R; ++r) {
        const int64_t q_pos = it.first_pos + (r % RH) / G;
        for (int64_t j = 0; j < n; ++j) {
          const int64_t delta = q_pos - (p0 + j);
          if (delta < 0 || (windowed && delta >= a.window)) s[r * KEY_TILE + j] = -INFINITY;
        }
      }
    }
    for (int64_t r = 0; r < R; ++r) {  // online softmax: s becomes the tile's weights
      float* sr = s + r * KEY_TILE;
      const float tile_max = vec::max_row(sr, n);
      if (tile_max == -INFINITY) {  // nothing visible to this row in this tile
        std::fill(sr, sr + n, 0.f);
        continue;
      }
      const float m_new = std::max(m[r], tile_max);
      const float tile_sum = vec::exp_row(sr, n, m_new);
      if (m[r] != -INFINITY && m_new != m[r]) {
        const float alpha = std::exp(m[r] - m_new);
        l[r] *= alpha;
        vec::scale_row(acc + r * Dv, Dv, alpha);
      }
      l[r] += tile_sum;
      m[r] = m_new;
      if constexpr (kScaled<E>) {  // the value's scale, once per key
        const float* vs = v_scale + (it.num_kv_heads == 1 ? 0 : r / RH) * KEY_TILE;
        for (int64_t j = 0; j < n; ++j) sr[j] *= vs[j];
      }
    }
    for (int64_t h = 0; h < it.num_kv_heads; ++h) {
      for (int64_t j = 0; j < n; ++j) head_rows[j] = v_rows[j] + h * a.v_stride_head;
      for (int64_t r0 = h * RH; r0 < (h + 1) * RH; r0 += ROW_BLOCK) {
        with_rows(std::min<int64_t>(ROW_BLOCK, (h + 1) * RH - r0), [&](auto nr) {
          pv_rows<E, decltype(nr)::value>(s + r0 * KEY_TILE, KEY_TILE, head_rows, n,
                                          acc + r0 * Dv, Dv);
        });
      }
    }
  }
  for (int64_t r = 0; r < R; ++r) {  // rows that saw no key (l == 0) write zeros
    T* o = it.out + q_offset(r, it.out_stride_tok, it.out_stride_head);
    vec::store_row(acc + r * Dv, o, Dv, l[r] > 0.f ? 1.f / l[r] : 0.f);
  }
}

// Keys a sequence's last num_q tokens read: the whole context, or the union of windows.
inline int64_t keys_read(const PagedAttention& a, int64_t context_len, int64_t num_q) {
  return a.window > 0 ? std::min(context_len, a.window + num_q - 1) : context_len;
}

// paged_decode_attention of cpu_kernels.h over the cache whose scales are sc.
template <typename Scales>
void run_decode(const PagedAttention& a, const Scales& sc, const void* q, int64_t q_stride_seq,
                int64_t q_stride_tok, int64_t q_stride_head, void* out, int64_t batch,
                int64_t num_q) {
  const int64_t G = a.num_q_heads / a.num_kv_heads, Hkv = a.num_kv_heads;
  int64_t work = 0;
  for (int64_t b = 0; b < batch; ++b) work += keys_read(a, a.context_lens[b], num_q);
  work *= num_q * a.num_q_heads * (a.head_dim + a.v_head_dim);
  // With sequences enough to keep every thread busy, an item is a whole sequence: one
  // prefetch covers all its heads of a slot, side by side in memory (5-15% over one head
  // per item at 4-8 KV heads, timed on the dev machine with an fp32 cache).  With fewer,
  // an item is one KV head of one sequence, so the heads spread over the threads.
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  const int64_t heads_per_item = batch >= 2 * threads ? Hkv : 1;
  const int64_t items_per_seq = Hkv / heads_per_item;
  dispatch(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    for_each_item(batch * items_per_seq, work, MIN_PARALLEL_WORK, [&](int64_t i) {
      const int64_t b = i / items_per_seq, h = (i % items_per_seq) * heads_per_item;
      const int64_t context_len = a.context_lens[b];
      Item<T> it{static_cast<const T*>(q) + b * q_stride_seq + h * G * q_stride_head,
                 q_stride_tok, q_stride_head,
                 static_cast<T*>(out) + (b * num_q * a.num_q_heads + h * G) * a.v_head_dim,
                 a.num_q_heads * a.v_head_dim, a.v_head_dim,
                 num_q, context_len - num_q, context_len,
                 a.block_tables + b * a.table_stride, h, heads_per_item};
      attend<CacheElem<T, Scales>>(a, sc, it);
    });
  });
}

// prefill_attention of cpu_kernels.h over the cache whose scales are sc.
template <typename Scales>
void run_prefill(const PagedAttention& a, const Scales& sc, const void* q, int64_t q_stride_tok,
                 int64_t q_stride_head, void* out, const int32_t* cu_seqlens_q,
                 int64_t num_seqs) {
  const int64_t G = a.num_q_heads / a.num_kv_heads, Hkv = a.num_kv_heads;
  const int64_t tile_tokens = std::max<int64_t>(1, PREFILL_ROWS / G);
  std::vector<std::pair<int64_t, int64_t>> tiles;  // (sequence, first new token of the tile)
  int64_t work = 0;
  for (int64_t b = 0; b < num_seqs; ++b) {
    const int64_t q_len = cu_seqlens_q[b + 1] - cu_seqlens_q[b];
    for (int64_t t0 = 0; t0 < q_len; t0 += tile_tokens) tiles.emplace_back(b, t0);
    work += q_len * keys_read(a, a.context_lens[b], q_len);
  }
  work *= a.num_q_heads * (a.head_dim + a.v_head_dim);
  const int64_t num_tiles = static_cast<int64_t>(tiles.size());
  dispatch(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    for_each_item(num_tiles * Hkv, work, MIN_PARALLEL_WORK, [&](int64_t i) {
      // Last tiles first: later tokens see more keys, so the big items are handed out
      // before the small ones and the threads finish together.
      const auto [b, t0] = tiles[num_tiles - 1 - i / Hkv];
      const int64_t h = i % Hkv, q_start = cu_seqlens_q[b];
      const int64_t q_len = cu_seqlens_q[b + 1] - q_start, context_len = a.context_lens[b];
      const int64_t row = q_start + t0;
      Item<T> it{static_cast<const T*>(q) + row * q_stride_tok + h * G * q_stride_head,
                 q_stride_tok, q_stride_head,
                 static_cast<T*>(out) + (row * a.num_q_heads + h * G) * a.v_head_dim,
                 a.num_q_heads * a.v_head_dim, a.v_head_dim,
                 std::min(tile_tokens, q_len - t0), context_len - q_len + t0, context_len,
                 a.block_tables + b * a.table_stride, h, 1};
      attend<CacheElem<T, Scales>>(a, sc, it);
    });
  });
}

}  // namespace
}  // namespace infbench_cpu
