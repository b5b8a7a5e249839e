-- | Sampling names with a cache of each layer's keys and values: every
-- position runs the network once for the one new token of each sample
-- (a few matrix-vector products per layer), instead of over the whole
-- prefix again.
--
-- A name is bos, then the prefix, then tokens drawn from
-- softmax(logits / temperature) until bos or max_length characters.  The
-- draw of character i of sample j uses uniform seed j i, so a batch of
-- samples gives the same names as any other split of the same indices.
--
-- The draw is engine/sampling.py's definition, written the same way there
-- (NumPy, CuPy): a seed gives the same names on every backend.

import "model"

-- | SplitMix64's output for the state x (Steele, Lea and Flood 2014).
def splitmix64 (x: u64): u64 =
  let z = x + 0x9e3779b97f4a7c15
  let z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
  let z = (z ^ (z >> 27)) * 0x94d049bb133111eb
  in z ^ (z >> 31)

-- | A uniform number in [0, 1) for one (seed, sample, position): the top
-- 53 bits of the key over 2^53.
def uniform (seed: u64) (sample: i64) (position: i64): f64 =
  let key = splitmix64 (splitmix64 (splitmix64 seed ^ u64.i64 sample) ^ u64.i64 position)
  in f64.u64 (key >> 11) / 9007199254740992  -- 2^53: exact, as NumPy's * 2**-53

-- | One token drawn from softmax(logits / temperature), in f64, by inverse
-- CDF of u: the number of CDF entries below u.
def draw [v] (logits: [v]f32) (temperature: f64) (u: f64): i32 =
  let scaled = map (\l -> f64.f32 l / temperature) logits
  let top = f64.maximum scaled
  let e = map (\l -> f64.exp (l - top)) scaled
  let z = f64.sum e
  let cdf = scan (+) 0 (map (/ z) e)
  let below = i64.sum (map (\c -> i64.bool (c < u)) cdf)
  in i32.i64 (i64.min below (v - 1))

-- | Head h's attention weights for one new query q (C) over the first n
-- cached keys (S, C): softmax(q . k_j / sqrt D) over j < n.
def attention_weights [s][c] (d: i64) (scale: f32) (n: i64) (q: [c]f32) (keys: [s][c]f32) (h: i64): [n]f32 =
  let qh = #[unsafe] q[h * d:h * d + d] :> [d]f32
  let scores = map (\j -> dot qh (#[unsafe] keys[j, h * d:h * d + d] :> [d]f32) * scale) (iota n)
  let top = f32.maximum scores
  let e = map (\x -> f32.exp (x - top)) scores
  let z = f32.sum e
  in map (/ z) e

-- | The network for one new token per sample at position pos, with the
-- cache (keys, then values: (2, L, N, S, C)) of positions 0 .. pos - 1:
-- the logits (N, V) of the next token, and the cache with position pos
-- written in.
def decode_step [p][l][n][s][c] (d: dims) (layout: []i64) (flat: [p]f32) (pos: i64) (tokens: [n]i32)
                                (cache: *[2][l][n][s][c]f32): ([n][]f32, *[2][l][n][s][c]f32) =
  let (v, b) = (d.vocab, d.block_size)
  let (c3, f, h) = (3 * c, 4 * c, d.n_head)
  let hd = c / h
  let scale = f32.f64 (1 / f64.sqrt (f64.i64 hd))
  let (wte, wpe, lm_head) = embeddings flat layout v b c
  let x = map (\tok -> rmsnorm (map2 (+) wte[i64.i32 tok] wpe[pos])) tokens
  let (x, cache) =
    loop (x, cache) for i < l do
      let w = layer_at flat layout c c3 f i
      let qkv = linear (map rmsnorm x) w.wqkv  -- (N, 3C)
      let part k = map (\row -> #[unsafe] (row[k * c:k * c + c] :> [c]f32)) qkv
      let q = part 0
      let cache = cache with [0, i, :, pos] = part 1
      let cache = cache with [1, i, :, pos] = part 2
      let weights = map2 (\qn kn -> map (attention_weights hd scale (pos + 1) qn kn) (iota h)) q cache[0, i]
      -- the heads' outputs side by side, (N, C), as one array: built from
      -- per-head pieces, the multicore backend read it through two
      -- divisions per element in the next product (3 times slower)
      let y = tabulate_2d n c (\s j -> #[unsafe]
                                       let w = weights[s, j / hd]
                                       in loop acc = 0f32 for k < pos + 1 do acc + w[k] * cache[1, i, s, k, j])
      let x = add_rows x (linear y w.wo)
      let (out, _, _, _) = mlp w.fc1 w.fc2 x
      in (add_rows x out, cache)
  in (linear x lm_head, cache)

-- | Positions the cache holds at first; it doubles (up to block_size)
-- when a sample runs past it.  Names are short: most never grow it.
def first_capacity: i64 = 32

-- | num_samples names, samples first .. first + num_samples - 1, after bos
-- and the prefix: row j holds the max_length - len(prefix) tokens drawn
-- after the prefix, bos from the sample's end on.  The caller checks
-- len(prefix) < max_length <= block_size.
--
-- Only the samples still running are computed: when some finish, the
-- others' caches are gathered into a smaller batch (an untrained model
-- writes names of hundreds of tokens, a few of which would otherwise keep
-- every finished sample running).
def sample_tokens [p][np] (d: dims) (layout: []i64) (flat: [p]f32) (prefix: [np]i32)
                          (num_samples: i64) (temperature: f64) (seed: u64) (first: i64) (max_length: i64)
                          : [num_samples][]i32 =
  let (b, c, nl) = (i64.min max_length d.block_size, d.n_embd, d.n_layer)  -- b: positions used
  let bos = i32.i64 (d.vocab - 1)
  let width = b - np
  let cap0 = i64.min b (i64.max first_capacity (np + 1))
  let zeros cap = replicate cap (replicate c 0f32)
  let grow [n][s] (cache: [2][nl][n][s][c]f32): *[2][nl][n][][c]f32 =
    let cap = i64.min b (2 * s)
    in map (map (map (\rows -> rows ++ zeros (cap - s)))) cache
  -- The loop runs the active samples: their indices in this batch, their
  -- last tokens and their caches (keys, values: (2, L, active, S, C)).
  let (_, drawn, _, _, _) =
    loop (cache: *[2][nl][][][c]f32, drawn: *[width][num_samples]i32, active: []i64, last: []i32, pos) =
         (replicate 2 (replicate nl (replicate num_samples (zeros cap0))),
          replicate width (replicate num_samples bos), iota num_samples, replicate num_samples bos, 0)
    while pos < b && length active > 0 do
      let n = length active
      let active = active :> [n]i64
      let cache = cache :> [2][nl][n][][c]f32
      let cache = if pos < length cache[0, 0, 0] then cache else grow cache
      let tokens = if pos == 0 then replicate n bos
                   else if pos <= np then replicate n prefix[pos - 1]
                   else last :> [n]i32
      let (logits, cache) = decode_step d layout flat pos tokens cache
      in if pos < np
         then (cache, drawn, active, last, pos + 1)
         else let next = map2 (\j l -> draw l temperature (uniform seed (first + j) pos))
                              active logits
              let row = scatter (replicate num_samples bos) active next
              let going = filter (\a -> next[a] != bos) (iota n)
              let cache = if length going == n then cache
                          else map (map (\per_sample -> map (\a -> per_sample[a]) going)) cache
              in (cache, drawn with [pos - np] = row, map (\a -> active[a]) going,
                  map (\a -> next[a]) going, pos + 1)
  in transpose drawn
