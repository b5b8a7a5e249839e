-- | microgpt's training step and sampler, written once and compiled to
-- sequential C, multicore C, CUDA or OpenCL.
--
-- The same model, loss, Adam and sampling as engine/model.py (the NumPy
-- reference), in f32:
--
--     x = rmsnorm(wte[tok] + wpe[pos])
--     per layer:  x += attn(rmsnorm x) @ wo.T        (causal, 1/sqrt(head_dim))
--                 x += relu(rmsnorm x @ fc1.T) @ fc2.T
--     logits = x @ lm_head.T                        (no final norm)
--     loss = mean cross-entropy over the document's T positions
--
-- The gradient comes from `vjp`.  Nothing is a compile-time constant: the
-- widths are run-time values or array shapes, so one compiled library
-- serves every model size.  A step computes only the document's real
-- positions (T <= block_size), never a padded block.
--
-- Shapes are written (T, C) etc.: T positions, C = n_embd, H heads of
-- D = C/H columns, F = 4C hidden units, V tokens, B = block_size.
--
-- Parameters live in one flat f32 buffer in engine/params.py's order; the
-- host passes the offset of each matrix (`layout`: wte, wpe, lm_head,
-- then per layer wq, wk, wv, wo, fc1, fc2), so the layout is defined in
-- one place only.
--
-- Written for Futhark 0.25 using only what 0.24 has too: sizes in types
-- are plain variables, never expressions.

-- * Building blocks

def dot [n] (xs: [n]f32) (ys: [n]f32): f32 =
  f32.sum (map2 (*) xs ys)

-- | x @ w.T for x (T, I) and a weight w (O, I) stored as (out, in).
--
-- The map runs over the weight's rows outermost, so the sequential C
-- reads each row of w once and uses it for all T positions (T is a
-- name's length, ~7).  The natural `map (\row -> map (dot row) w) x`
-- streams the whole matrix once per position instead, and Futhark fuses
-- a layer's products per position, so every step re-read all weights T
-- times: 15-20% slower at s64/s128 (measured with futhark c 0.25.9).
-- The result (O, T) is turned back by indexing rather than `transpose`,
-- which makes Futhark 0.25.9 fail (an internal error in `vjp` of the
-- layer loop: "referenced after being consumed").
def linear [t][i][o] (x: [t][i]f32) (w: [o][i]f32): [t][o]f32 =
  let y = map (\wr -> map (\xr -> dot xr wr) x) w  -- (O, T)
  in tabulate_2d t o (\a b -> y[b, a])

-- | a @ b for a (N, K) and b (K, M).
def matmul [n][k][m] (a: [n][k]f32) (b: [k][m]f32): [n][m]f32 =
  linear a (transpose b)

def add_rows [t][c] (x: [t][c]f32) (y: [t][c]f32): [t][c]f32 =
  map2 (map2 (+)) x y

def relu (x: f32): f32 = f32.max x 0

-- | x / sqrt(mean(x^2) + 1e-5), without weights.
def rmsnorm [c] (x: [c]f32): [c]f32 =
  let r = 1 / f32.sqrt (f32.sum (map (\a -> a * a) x) / f32.i64 c + 1e-5)
  in map (* r) x

-- | The (rows, cols) matrix stored row-major at `offset` of the flat buffer.
-- Unchecked: `new_state` asserts that every matrix of the layout fits.
--
-- Built from row slices rather than element by element (`tabulate_2d`
-- with flat[offset + i * cols + j]): a slice's adjoint in `vjp` is added
-- to the gradient row by row, an element gather's through a bounds-checked
-- scatter per element; 8-11% faster per step from s32 up with futhark c.  (`unflatten`
-- of one slice is as fast but takes its sizes differently in 0.24.)
def matrix [p] (flat: [p]f32) (offset: i64) (rows: i64) (cols: i64): [rows][cols]f32 =
  #[unsafe] map (\i -> let start = offset + i * cols
                       in flat[start:start + cols] :> [cols]f32)
                (iota rows)

-- * The network

-- | Sizes of a network; the vocabulary includes the bos token (the last id).
type dims = {n_embd: i64, n_layer: i64, n_head: i64, block_size: i64, vocab: i64}

-- | One transformer layer's weights: C = n_embd, F = 4 * n_embd.
type layer [c][f] = {wq: [c][c]f32, wk: [c][c]f32, wv: [c][c]f32, wo: [c][c]f32,
                     fc1: [f][c]f32, fc2: [c][f]f32}

-- | Whether a layout (wte, wpe, lm_head, then six matrices per layer) has
-- the right length and every matrix lies inside P parameters.
def layout_fits [l] (d: dims) (p: i64) (layout: [l]i64): bool =
  let (c, f) = (d.n_embd, 4 * d.n_embd)
  let rows j = if j == 0 || j == 2 then d.vocab
               else if j == 1 then d.block_size
               else if (j - 3) % 6 == 4 then f
               else c
  let cols j = if j >= 3 && (j - 3) % 6 == 5 then f else c
  in l == 3 + 6 * d.n_layer
     && and (map2 (\j offset -> offset >= 0 && offset + rows j * cols j <= p) (iota l) layout)

-- | Layer l's weights, gathered from the flat buffer.
def layer_at [p] (flat: [p]f32) (layout: []i64) (c: i64) (f: i64) (l: i64): layer [c][f] =
  let at j = layout[3 + 6 * l + j]
  in {wq = matrix flat (at 0) c c, wk = matrix flat (at 1) c c,
      wv = matrix flat (at 2) c c, wo = matrix flat (at 3) c c,
      fc1 = matrix flat (at 4) f c, fc2 = matrix flat (at 5) c f}

-- | Softmax of row i of the attention scores over positions j <= i.
def causal_softmax [t] (i: i64) (scores: [t]f32): [t]f32 =
  let masked = map2 (\j s -> if j <= i then s else -f32.inf) (iota t) scores
  let top = f32.maximum masked
  let e = map (\s -> f32.exp (s - top)) masked
  let z = f32.sum e
  in map (/ z) e

-- | One head's causal attention: q, k, v (T, D) -> (T, D).
def causal_attention [t][d] (scale: f32) (q: [t][d]f32) (k: [t][d]f32) (v: [t][d]f32): [t][d]f32 =
  let probs = map2 (\i qi -> causal_softmax i (map (\kj -> dot qi kj * scale) k)) (iota t) q
  in matmul probs v

-- | Multi-head attention: q, k, v (T, C) split into H heads of D columns.
def attention [t][c] (n_head: i64) (q: [t][c]f32) (k: [t][c]f32) (v: [t][c]f32): [t][c]f32 =
  let d = c / n_head
  let scale = f32.f64 (1 / f64.sqrt (f64.i64 d))
  let split (x: [t][c]f32): [n_head][t][d]f32 =
    tabulate_3d n_head t d (\h i j -> x[i, h * d + j])
  let heads = map3 (causal_attention scale) (split q) (split k) (split v)  -- (H, T, D)
  in tabulate_2d t c (\i j -> heads[j / d, i, j % d])

-- | One pre-norm transformer layer (T, C) -> (T, C).
def block [t][c][f] (n_head: i64) (w: layer [c][f]) (x: [t][c]f32): [t][c]f32 =
  let xn = map rmsnorm x
  let x = add_rows x (linear (attention n_head (linear xn w.wq) (linear xn w.wk) (linear xn w.wv)) w.wo)
  let hidden = map (map relu) (linear (map rmsnorm x) w.fc1)  -- (T, F)
  in add_rows x (linear hidden w.fc2)

-- | Final hidden states (T, C) of T tokens, given the embeddings wte (V, C)
-- and wpe (B, C) and the layers in the flat buffer.
def transformer [p][v][b][c][t] (n_head: i64) (n_layer: i64) (layout: []i64) (flat: [p]f32)
                                (wte: [v][c]f32) (wpe: [b][c]f32) (tokens: [t]i32): [t][c]f32 =
  let f = 4 * c
  let x = map2 (\tok pos -> rmsnorm (map2 (+) wte[i64.i32 tok] wpe[pos])) tokens (iota t)
  in loop x for l < n_layer do block n_head (layer_at flat layout c f l) x

-- | The embedding and output matrices: wte (V, C), wpe (B, C), lm_head (V, C).
def embeddings [p] (flat: [p]f32) (layout: []i64) (v: i64) (b: i64) (c: i64)
                   : ([v][c]f32, [b][c]f32, [v][c]f32) =
  (matrix flat layout[0] v c, matrix flat layout[1] b c, matrix flat layout[2] v c)

-- | -log softmax(logits)[target], computed stably.
def cross_entropy [v] (logits: [v]f32) (target: i32): f32 =
  let top = f32.maximum logits
  let z = map (\l -> l - top) logits
  in f32.log (f32.sum (map f32.exp z)) - z[i64.i32 target]

-- | Mean cross-entropy of predicting targets[i] after inputs[0..i].
def loss [p][t] (d: dims) (layout: []i64) (inputs: [t]i32) (targets: [t]i32) (flat: [p]f32): f32 =
  let (v, b, c) = (d.vocab, d.block_size, d.n_embd)
  let (wte, wpe, lm_head) = embeddings flat layout v b c
  let x = transformer d.n_head d.n_layer layout flat wte wpe inputs
  in f32.sum (map2 cross_entropy (linear x lm_head) targets) / f32.i64 t

-- * Training

-- | microgpt's Adam with a linearly decaying learning rate.
type adam = {learning_rate: f64, beta1: f64, beta2: f64, eps: f64, num_steps: i64}

-- | One Adam update of every parameter, with the bias corrections and the
-- learning rate of `step` (counted from 0).  The scalars are computed in
-- f64 and rounded to f32, as the NumPy reference does.
def adam_update [p] (a: adam) (step: i64) (params: [p]f32) (grad: [p]f32)
                    (m: [p]f32) (v: [p]f32): ([p]f32, [p]f32, [p]f32) =
  let t = f64.i64 (step + 1)
  let lr_t = a.learning_rate * (1 - f64.i64 step / f64.i64 a.num_steps)
  let step_size = f32.f64 (lr_t / (1 - a.beta1 ** t))
  let inv_bias2 = f32.f64 (1 / (1 - a.beta2 ** t))
  let (b1, c1) = (f32.f64 a.beta1, f32.f64 (1 - a.beta1))
  let (b2, c2) = (f32.f64 a.beta2, f32.f64 (1 - a.beta2))
  let eps = f32.f64 a.eps
  let update p g m v =
    let m = m * b1 + g * c1
    let v = v * b2 + g * g * c2
    in (p - step_size * (m / (f32.sqrt (v * inv_bias2) + eps)), m, v)
  in unzip3 (map4 update params grad m v)

def finite (x: f32): bool = !(f32.isnan x || f32.isinf x)

-- | Everything a run needs between calls, kept in the Futhark context:
-- P parameters with their Adam moments, the layout (3 + 6 n_layer
-- offsets), and the corpus as N tokens of D documents, document i being
-- tokens[offsets[i] : offsets[i] + lengths[i]] = [bos] ++ name ++ [bos].
type state [p][l][n][d] =
  {dims: dims, adam: adam, layout: [l]i64,
   params: [p]f32, m: [p]f32, v: [p]f32, step: i64,
   tokens: [n]i32, offsets: [d]i64, lengths: [d]i32}

def with_training [p][l][n][d] (s: state [p][l][n][d]) (params: [p]f32) (m: [p]f32) (v: [p]f32)
                                (step: i64): state [p][l][n][d] =
  {dims = s.dims, adam = s.adam, layout = s.layout, params, m, v, step,
   tokens = s.tokens, offsets = s.offsets, lengths = s.lengths}

-- | Loss and gradient of training step `step`: document step % D, its
-- first T = min(block_size, length - 1) positions, no padding.
def step_loss_grad [p][l][n][d] (s: state [p][l][n][d]) (params: [p]f32) (step: i64): (f32, [p]f32) =
  let doc = step % d
  let t = i64.min s.dims.block_size (i64.i32 s.lengths[doc] - 1)
  let start = s.offsets[doc]
  let inputs = s.tokens[start:start + t] :> [t]i32
  let targets = s.tokens[start + 1:start + 1 + t] :> [t]i32
  in vjp2 (loss s.dims s.layout inputs targets) params 1

-- | Runs up to k steps; returns the new state and the k losses.  A
-- non-finite loss stops the loop without applying that step's update
-- (its loss is reported, the later entries stay NaN), so the state keeps
-- the parameters from before it.
def train_steps [p][l][n][d] (s: state [p][l][n][d]) (k: i64): (state [p][l][n][d], [k]f32) =
  -- The loop writes `losses` in place, which consumes its whole initial
  -- tuple: hence copies of the state's arrays, which stay untouched.
  let (params, m, v, step, losses, _) =
    loop (params: [p]f32, m: [p]f32, v: [p]f32, step, losses, i) =
         (copy s.params, copy s.m, copy s.v, s.step, replicate k f32.nan, 0)
    while i < k do
      let (l, grad) = step_loss_grad s params step
      in if finite l
         then let (params, m, v) = adam_update s.adam step params grad m v
              in (params, m, v, step + 1, losses with [i] = l, i + 1)
         else (params, m, v, step, losses with [i] = l, k)
  in (with_training s params m v step, losses)

-- * Sampling

-- | A 32-bit integer hash (Wellons' lowbias32): enough randomness for
-- sampling, with no package dependencies.
def hash32 (x: u32): u32 =
  let x = (x ^ (x >> 16)) * 0x7feb352d
  let x = (x ^ (x >> 15)) * 0x846ca68b
  in x ^ (x >> 16)

-- | A uniform number in [0, 1) for one (seed, sample, position).
def uniform (seed: i64) (sample: i64) (position: i64): f32 =
  let h = hash32 (u32.i64 seed ^ hash32 (u32.i64 (seed >> 32)))
  let h = hash32 (h ^ u32.i64 sample)
  let h = hash32 (h ^ u32.i64 position)
  in f32.u32 (h >> 8) / 16777216

-- | One token drawn from softmax(logits) by inverse CDF of u.
def draw [v] (logits: [v]f32) (u: f32): i32 =
  let top = f32.maximum logits
  let e = map (\l -> f32.exp (l - top)) logits
  let z = f32.sum e
  let cdf = scan (+) 0 (map (/ z) e)
  let below = i64.sum (map (\c -> i64.bool (c < u)) cdf)
  in i32.i64 (i64.min below (v - 1))

-- | Logits (V) of the token after a sequence of T tokens.
def next_logits [p][t] (d: dims) (layout: []i64) (flat: [p]f32) (v: i64) (tokens: [t]i32): [v]f32 =
  let (b, c) = (d.block_size, d.n_embd)
  let (wte, wpe, lm_head) = embeddings flat layout v b c
  let x = transformer d.n_head d.n_layer layout flat wte wpe tokens
  in map (dot x[t - 1]) lm_head

-- | num_samples names generated in parallel, each starting at bos and
-- drawing from softmax(logits / temperature) until bos or block_size
-- tokens.  Row i holds sample i's tokens, then bos to the end.
def sample_tokens [p] (d: dims) (layout: []i64) (flat: [p]f32)
                      (num_samples: i64) (temperature: f32) (seed: i64): [num_samples][]i32 =
  let v = d.vocab
  let bos = i32.i64 (v - 1)
  let width = d.block_size + 1
  let (tokens, _, _) =
    loop (tokens: [num_samples][width]i32, done, i) =
         (replicate num_samples (replicate width bos), replicate num_samples false, 0)
    while i < d.block_size && !(and done) do
      let t = i + 1
      let prefixes = map (\row -> row[0:t] :> [t]i32) tokens
      let logits = map (next_logits d layout flat v) prefixes  -- (N, V)
      let drawn = map2 (\j l -> draw (map (/ temperature) l) (uniform seed j i)) (iota num_samples) logits
      let next = map2 (\finished tok -> if finished then bos else tok) done drawn
      -- column t := next (rebuilt, not updated in place: `tokens with [:, t]`
      -- in this loop crashes Futhark 0.25.9's compiler)
      let tokens = map2 (\row tok -> map2 (\j x -> if j == t then tok else x) (iota width) row) tokens next
      in (tokens, map2 (\finished tok -> finished || tok == bos) done next, t)
  in tokens[:, 1:]

-- * Entry points
--
-- The state is opaque to the host.  Its fields are read back through
-- small getters rather than record projection, which futhark-ffi lacks.

entry new_state [p][l][n][d]
    (n_embd: i64) (n_layer: i64) (n_head: i64) (block_size: i64) (vocab: i64)
    (learning_rate: f64) (beta1: f64) (beta2: f64) (eps: f64) (num_steps: i64)
    (layout: [l]i64) (params: [p]f32) (tokens: [n]i32) (offsets: [d]i64) (lengths: [d]i32)
    : state [p][l][n][d] =
  let dims = {n_embd, n_layer, n_head, block_size, vocab}
  in assert (layout_fits dims p layout)
            {dims, adam = {learning_rate, beta1, beta2, eps, num_steps},
             layout, params, m = replicate p 0, v = replicate p 0, step = 0,
             tokens, offsets, lengths}

entry set_training [p][l][n][d] (s: state [p][l][n][d]) (params: [p]f32) (m: [p]f32) (v: [p]f32)
                                (step: i64): state [p][l][n][d] =
  with_training s params m v step

entry train [p][l][n][d] (s: state [p][l][n][d]) (k: i64): (state [p][l][n][d], [k]f32) =
  train_steps s k

entry get_params [p][l][n][d] (s: state [p][l][n][d]): [p]f32 = s.params
entry get_m [p][l][n][d] (s: state [p][l][n][d]): [p]f32 = s.m
entry get_v [p][l][n][d] (s: state [p][l][n][d]): [p]f32 = s.v
entry get_step [p][l][n][d] (s: state [p][l][n][d]): i64 = s.step

entry sample [p][l][n][d] (s: state [p][l][n][d]) (num_samples: i64) (temperature: f32)
                          (seed: i64): [num_samples][]i32 =
  sample_tokens s.dims s.layout s.params num_samples temperature seed
