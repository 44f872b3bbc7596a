// Paged attention on the CPU over an int8 KV cache (kv_quant.h): decode and varlen
// causal prefill, the same work items and online softmax as attention.cpp, reading one
// byte per cached value in place through the block table.  Nothing is dequantized into
// a copy: a key row is converted to fp32 lanes as it is loaded for Q K^T and its scale
// multiplies that key's scores; a value row likewise for P V, its scale multiplying the
// key's softmax weight first.  All math is fp32.
#include "kv_quant.h"
#include "cpu_common.h"

namespace infbench_cpu {
namespace {

constexpr int64_t KEY_TILE = 32;       // keys per online-softmax step
constexpr int64_t PREFILL_ROWS = 64;   // query rows (tokens x group heads) per prefill item
constexpr int64_t MIN_PARALLEL_WORK = 1 << 18;  // multiply-adds below which one thread runs
constexpr int ROW_BLOCK = 4;           // query rows sharing one load of a key or value chunk

// ---- int8 lanes -> fp32 vectors (cpu_common.h has float, bf16 and fp16) ---------------
#if defined(INFBENCH_AVX512)
inline vec::V load_i8(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline vec::V load_i8(const int8_t* p, int64_t n) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(vec::tail_mask(n), p)));
}
#elif defined(INFBENCH_AVX2)
inline vec::V load_i8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline vec::V load_i8(const int8_t* p, int64_t n) {
  int8_t buf[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::memcpy(buf, p, static_cast<size_t>(n));
  return load_i8(buf);
}
#else
inline vec::V load_i8(const int8_t* p) { return static_cast<float>(*p); }
inline vec::V load_i8(const int8_t* p, int64_t) { return static_cast<float>(*p); }
#endif

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

// s[r * lds] = dot(q[r * ldq : + D], k[0:D]) * k_scale for NR rows: each chunk of the
// int8 key loaded and converted once for all rows.
template <int NR>
inline void qk_rows(const float* q, int64_t ldq, const int8_t* k, float k_scale, int64_t D,
                    float* s, int64_t lds) {
  vec::V acc[NR];
  for (int r = 0; r < NR; ++r) acc[r] = vec::zero();
  int64_t d = 0;
  for (; d + vec::W <= D; d += vec::W) {
    const vec::V kv = load_i8(k + d);
    for (int r = 0; r < NR; ++r) acc[r] = vec::fma(vec::load(q + r * ldq + d), kv, acc[r]);
  }
  if (d < D) {
    const vec::V kv = load_i8(k + d, D - d);
    for (int r = 0; r < NR; ++r) acc[r] = vec::fma(vec::load(q + r * ldq + d, D - d), kv, acc[r]);
  }
  for (int r = 0; r < NR; ++r) s[r * lds] = vec::sum(acc[r]) * k_scale;
}

// acc[r * Dv : + Dv] += sum_j w[r * ldw + j] * v_j for NR rows over n int8 value rows
// (w already carries each value's scale); each accumulator chunk stays in a register.
template <int NR>
inline void pv_rows(const float* w, int64_t ldw, const int8_t* const* v, int64_t n, float* acc,
                    int64_t Dv) {
  for (int64_t d = 0; d < Dv; d += vec::W) {
    const int64_t width = std::min(vec::W, Dv - d);
    const bool full = width == vec::W;
    vec::V a[NR];
    for (int r = 0; r < NR; ++r) a[r] = full ? vec::load(acc + r * Dv + d) : vec::load(acc + r * Dv + d, width);
    for (int64_t j = 0; j < n; ++j) {
      const vec::V vv = full ? load_i8(v[j] + d) : load_i8(v[j] + d, width);
      for (int r = 0; r < NR; ++r) a[r] = vec::fma(vec::set1(w[r * ldw + j]), vv, a[r]);
    }
    for (int r = 0; r < NR; ++r) {
      if (full) vec::store(acc + r * Dv + d, a[r]);
      else vec::store(acc + r * Dv + d, a[r], width);
    }
  }
}

// The query rows of one item: num_tokens consecutive tokens x the group's query heads.
template <typename T>
struct Item {
  const T* q;  // token 0, first head of the group
  int64_t q_stride_tok, q_stride_head;
  T* out;
  int64_t out_stride_tok, out_stride_head;
  int64_t num_tokens;
  int64_t first_pos;  // position of token 0; token t sits at first_pos + t
  int64_t context_len;
  const int32_t* table;  // this sequence's block table row
  int64_t kv_head;
};

template <typename T>
void attend(const PagedAttentionInt8& p, const Item<T>& it) {
  const PagedAttention& a = p.a;
  const int64_t G = a.num_q_heads / a.num_kv_heads;
  const int64_t R = it.num_tokens * G, D = a.head_dim, Dv = a.v_head_dim;
  const int64_t last_pos = it.first_pos + it.num_tokens - 1;
  const bool windowed = a.window > 0;
  // Keys any row can see: from the first token's window start to the last token.
  const int64_t lo = windowed ? std::max<int64_t>(0, it.first_pos - a.window + 1) : 0;
  const int64_t hi = std::min(last_pos + 1, it.context_len);

  float* qf = scratch(R * (D + Dv + KEY_TILE + 2));  // (R, D): the queries, times scale
  float* acc = qf + R * D;                            // (R, Dv) unnormalised output
  float* s = acc + R * Dv;                            // (R, KEY_TILE) scores, then weights
  float* m = s + R * KEY_TILE;                        // (R,) running max
  float* l = m + R;                                   // (R,) running sum
  for (int64_t r = 0; r < R; ++r) {
    vec::load_row(it.q + (r / G) * it.q_stride_tok + (r % G) * it.q_stride_head, qf + r * D, D,
                  a.scale);
    m[r] = -INFINITY;
    l[r] = 0.f;
  }
  std::fill(acc, acc + R * Dv, 0.f);

  const int8_t* k_base = static_cast<const int8_t*>(a.k_cache) + it.kv_head * a.k_stride_head;
  const int8_t* v_base = static_cast<const int8_t*>(a.v_cache) + it.kv_head * a.v_stride_head;
  const float* ks_base = p.k_scales + it.kv_head * p.ks_stride_head;
  const float* vs_base = p.v_scales + it.kv_head * p.vs_stride_head;
  const int8_t* k_rows[KEY_TILE];
  const int8_t* v_rows[KEY_TILE];
  float k_scale[KEY_TILE], v_scale[KEY_TILE];
  for (int64_t p0 = lo; p0 < hi; p0 += KEY_TILE) {
    const int64_t n = std::min(KEY_TILE, hi - p0);
    for (int64_t j = 0; j < n; ++j) {  // where each key of the tile lies: no copy
      const int64_t pos = p0 + j;
      const int64_t block = it.table[pos / a.block_size], slot = pos % a.block_size;
      k_rows[j] = k_base + block * a.k_stride_block + slot * a.k_stride_slot;
      v_rows[j] = v_base + block * a.v_stride_block + slot * a.v_stride_slot;
      k_scale[j] = ks_base[block * p.ks_stride_block + slot * p.ks_stride_slot];
      v_scale[j] = vs_base[block * p.vs_stride_block + slot * p.vs_stride_slot];
    }
    for (int64_t r0 = 0; r0 < R; r0 += ROW_BLOCK) {
      with_rows(std::min<int64_t>(ROW_BLOCK, R - r0), [&](auto nr) {
        for (int64_t j = 0; j < n; ++j)
          qk_rows<decltype(nr)::value>(qf + r0 * D, D, k_rows[j], k_scale[j], D,
                                       s + r0 * KEY_TILE + j, KEY_TILE);
      });
    }
    // Causal and window masks, only where the tile reaches past a row's limits.
    const bool past_first = p0 + n - 1 > it.first_pos;
    const bool before_window = windowed && p0 <= last_pos - a.window;
    if (past_first || before_window) {
      for (int64_t r = 0; r < R; ++r) {
        const int64_t q_pos = it.first_pos + r / G;
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
      for (int64_t j = 0; j < n; ++j) sr[j] *= v_scale[j];  // the value's scale, once per key
    }
    for (int64_t r0 = 0; r0 < R; r0 += ROW_BLOCK) {
      with_rows(std::min<int64_t>(ROW_BLOCK, R - r0), [&](auto nr) {
        pv_rows<decltype(nr)::value>(s + r0 * KEY_TILE, KEY_TILE, v_rows, n, acc + r0 * Dv, Dv);
      });
    }
  }
  for (int64_t r = 0; r < R; ++r) {  // rows that saw no key (l == 0) write zeros
    T* o = it.out + (r / G) * it.out_stride_tok + (r % G) * it.out_stride_head;
    vec::store_row(acc + r * Dv, o, Dv, l[r] > 0.f ? 1.f / l[r] : 0.f);
  }
}

// Keys a sequence's last num_q tokens read: the whole context, or the union of windows.
inline int64_t keys_read(const PagedAttention& a, int64_t context_len, int64_t num_q) {
  return a.window > 0 ? std::min(context_len, a.window + num_q - 1) : context_len;
}

}  // namespace

void paged_decode_attention_int8(const PagedAttentionInt8& p, const void* q, int64_t q_stride_seq,
                                 int64_t q_stride_tok, int64_t q_stride_head, void* out,
                                 int64_t batch, int64_t num_q) {
  const PagedAttention& a = p.a;
  const int64_t G = a.num_q_heads / a.num_kv_heads, Hkv = a.num_kv_heads;
  int64_t work = 0;
  for (int64_t b = 0; b < batch; ++b) work += keys_read(a, a.context_lens[b], num_q);
  work *= num_q * a.num_q_heads * (a.head_dim + a.v_head_dim);
  dispatch(a.dtype, [&](auto tag) {
    using T = decltype(tag);
    for_each_item(batch * Hkv, work, MIN_PARALLEL_WORK, [&](int64_t i) {
      const int64_t b = i / Hkv, h = i % Hkv, context_len = a.context_lens[b];
      Item<T> it{static_cast<const T*>(q) + b * q_stride_seq + h * G * q_stride_head,
                 q_stride_tok, q_stride_head,
                 static_cast<T*>(out) + (b * num_q * a.num_q_heads + h * G) * a.v_head_dim,
                 a.num_q_heads * a.v_head_dim, a.v_head_dim,
                 num_q, context_len - num_q, context_len,
                 a.block_tables + b * a.table_stride, h};
      attend<T>(p, it);
    });
  });
}

void prefill_attention_int8(const PagedAttentionInt8& p, const void* q, int64_t q_stride_tok,
                            int64_t q_stride_head, void* out, const int32_t* cu_seqlens_q,
                            int64_t num_seqs) {
  const PagedAttention& a = p.a;
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
      // Last tiles first: later tokens see more keys, so big items go out first.
      const auto [b, t0] = tiles[num_tiles - 1 - i / Hkv];
      const int64_t h = i % Hkv, q_start = cu_seqlens_q[b];
      const int64_t q_len = cu_seqlens_q[b + 1] - q_start, context_len = a.context_lens[b];
      const int64_t row = q_start + t0;
      Item<T> it{static_cast<const T*>(q) + row * q_stride_tok + h * G * q_stride_head,
                 q_stride_tok, q_stride_head,
                 static_cast<T*>(out) + (row * a.num_q_heads + h * G) * a.v_head_dim,
                 a.num_q_heads * a.v_head_dim, a.v_head_dim,
                 std::min(tile_tokens, q_len - t0), context_len - q_len + t0, context_len,
                 a.block_tables + b * a.table_stride, h};
      attend<T>(p, it);
    });
  });
}

}  // namespace infbench_cpu
