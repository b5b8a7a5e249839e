-- | One training step, written for speed: the forward pass keeps each
-- layer's activations, the backward pass (mirroring engine/model.py's
-- loss_and_grad) computes the gradients of the activations, and a single
-- pass over the parameters computes each weight row's gradient and applies
-- Adam to it.  `vjp` of model.fut's `loss` is the oracle the tests hold
-- this gradient to (kernels/microgpt.fut's `grad_vjp` and `grad_fast`).
--
-- Why this shape (measured against `vjp`, see README "Performance"):
-- * Every weight gradient is a sum over the T (~7) positions of outer
--   products, G[o, :] = sum_t dY[t, o] * X[t, :].  It is computed one row
--   of C values at a time, T in-place multiply-adds over a row that stays
--   in cache, and Adam is applied to that row at once: the gradient never
--   exists as a P-sized buffer, and the parameters and both moments are
--   read and written once per step.  Every matrix of the flat buffer has a
--   multiple of C entries, so the whole buffer is one map over P / C rows:
--   a parallel loop for the multicore backend with no atomics (vjp's
--   accumulations into shared gradients became a compare-and-swap loop per
--   float there).
-- * The gradient of an activation, dY @ W, adds up rows of W in place
--   (model.fut's back_linear): W is read once, contiguously.

import "model"

-- * Forward

-- | The forward pass of one document, keeping what the backward pass
-- needs: {x0, r0} = rmsnorm(wte[tok] + wpe[pos]) and its scales, `acts`
-- for each layer, and x, the last layer's output.
def forward_train [p][t] (d: dims) (layout: []i64) (flat: [p]f32) (inputs: [t]i32) =
  let (v, b, c) = (d.vocab, d.block_size, d.n_embd)
  let (c3, f, h) = (3 * c, 4 * c, d.n_head)
  let (wte, wpe, _) = embeddings flat layout v b c
  let (x0, r0) = embed wte wpe 0 inputs
  let zeros n = replicate t (replicate n 0f32)
  let none: layer_acts [t][c][f][h] =
    {xn = zeros c, r1 = replicate t 0, q = zeros c, k = zeros c, v = zeros c,
     probs = replicate h (replicate t (replicate t 0)), y = zeros c,
     xn2 = zeros c, r2 = replicate t 0, hid = zeros f}
  let (x, acts) =
    loop (x, acts) = (x0, replicate d.n_layer none) for l < d.n_layer do
      let (x, a) = block_acts h (layer_at flat layout c c3 f l) x
      in (x, acts with [l] = a)
  in {x0, r0, acts, x}

-- | The loss of predicting targets from the final hidden states x, and its
-- gradient with respect to the logits, (softmax - one_hot) / T.
def loss_and_dlogits [t][v][c] (lm_head: [v][c]f32) (x: [t][c]f32) (targets: [t]i32)
                               : (f32, [t][v]f32) =
  let inv_t = 1 / f32.i64 t
  let rows = map2 (\logits target ->
                     let top = f32.maximum logits
                     let e = map (\l -> f32.exp (l - top)) logits
                     let z = f32.sum e
                     let loss = f32.log z - (logits[i64.i32 target] - top)
                     in (loss, map2 (\j ej -> (ej / z - f32.bool (j == i64.i32 target)) * inv_t)
                                    (iota v) e))
                  (linear x lm_head) targets
  let (losses, dlogits) = unzip rows
  in (f32.sum losses * inv_t, dlogits)

-- * Backward

-- | The gradients of a layer's activations that its weight gradients need:
-- each weight's gradient is dY.T @ X for one of these dY.
type layer_grads [t][c][c3][f] =
  {dqkv: [t][c3]f32,   -- wq, wk, wv (X = xn)
   dxmid: [t][c]f32,   -- wo (X = y)
   dhid: [t][f]f32,    -- fc1 (X = xn2)
   dxout: [t][c]f32}   -- fc2 (X = relu(hid))

-- | Back through one layer: the gradient with respect to its input, and
-- the activation gradients of its weights.  `blocks`: see back_linear.
def block_back [t][c][c3][f][h] (blocks: i64) (w: layer [c][c3][f]) (a: layer_acts [t][c][f][h])
                                (dx: [t][c]f32): ([t][c]f32, layer_grads [t][c][c3][f]) =
  let d = c / h
  let scale = f32.f64 (1 / f64.sqrt (f64.i64 d))
  -- x_out = x_mid + relu(xn2 @ fc1.T) @ fc2.T
  let dact = back_linear blocks dx w.fc2
  let dhid = map2 (map2 (\g hv -> if hv > 0 then g else 0)) dact a.hid
  let dxn2 = back_linear blocks dhid w.fc1
  let dxmid = add_rows dx (map3 rmsnorm_back dxn2 a.xn2 a.r2)
  -- x_mid = x_in + attn(xn) @ wo.T
  let dy = back_linear blocks dxmid w.wo
  let head_back hh =
    let (qh, kh, vh, dyh, p) = (head d a.q hh, head d a.k hh, head d a.v hh, head d dy hh, a.probs[hh])
    let dp = linear dyh vh  -- (T, T): dp[i, j] = dy_i . v_j
    let datt = map2 (\pr dpr -> let s = dot pr dpr
                                in map2 (\pv dv -> pv * (dv - s) * scale) pr dpr) p dp
    in (matmul datt kh, matmul (transpose datt) qh, matmul (transpose p) dyh)
  let (dqs, dks, dvs) = unzip3 (map head_back (iota h))
  let (dq, dk, dv) = (merge_heads c dqs, merge_heads c dks, merge_heads c dvs)
  let dqkv = map3 (\a b e -> (a ++ b ++ e) :> [c3]f32) dq dk dv
  let dxn = back_linear blocks dqkv w.wqkv
  in (add_rows dxmid (map3 rmsnorm_back dxn a.xn a.r1), {dqkv, dxmid, dhid, dxout = dx})

-- | What the weight gradients are made of, for one document: every row of
-- C parameters has the gradient sum_t coef[t] * X[t, :] for a coefficient
-- vector (row_coef) and one of the (T, C) matrices in `xs` (row_source).
type sources [t][c][c3][f][v][l][k] =
  {inputs: [t]i32, dlogits: [t][v]f32, grads: [l](layer_grads [t][c][c3][f]), xs: [k][t][c]f32}

-- | The loss of one document and its gradient sources.
def backward [p][t] (d: dims) (layout: []i64) (blocks: i64) (flat: [p]f32) (inputs: [t]i32)
                    (targets: [t]i32) =
  let (v, b, c) = (d.vocab, d.block_size, d.n_embd)
  let (c3, f, h, nl) = (3 * c, 4 * c, d.n_head, d.n_layer)
  let fw = forward_train d layout flat inputs
  let (x0, x) = (fw.x0 :> [t][c]f32, fw.x :> [t][c]f32)
  let acts = fw.acts :> [nl](layer_acts [t][c][f][h])
  let (_, _, lm_head) = embeddings flat layout v b c
  let (loss, dlogits) = loss_and_dlogits lm_head x targets
  let zeros n = replicate t (replicate n 0f32)
  let none: layer_grads [t][c][c3][f] = {dqkv = zeros c3, dxmid = zeros c, dhid = zeros f, dxout = zeros c}
  let (dx, grads) =
    loop (dx, grads) = (back_linear blocks dlogits lm_head, replicate nl none)
    for i < nl do
      let l = nl - 1 - i
      let (dx, g) = block_back blocks (layer_at flat layout c c3 f l) acts[l] dx
      in (dx, grads with [l] = g)
  let dx0 = map3 rmsnorm_back dx x0 fw.r0
  -- xs: dx0 (wte, wpe), x (lm_head), then per layer xn, y, xn2 and the
  -- four C-column parts of relu(hid) (fc2's rows are F = 4C long).
  -- xs: dx0 (wte, wpe), x (lm_head), then per layer xn, y, xn2 and the
  -- four C-column parts of relu(hid) (fc2's rows are F = 4C long),
  -- written into one array (a concatenation would be read through a
  -- branch per element, which keeps the row loops from vectorising).
  let xs = replicate (2 + 7 * nl) (replicate t (replicate c 0f32))
  let xs = xs with [0] = dx0
  let xs = xs with [1] = x
  let xs = loop xs for l < nl do
             let a = acts[l]
             let xs = xs with [2 + 7 * l] = a.xn
             let xs = xs with [3 + 7 * l] = a.y
             let xs = xs with [4 + 7 * l] = a.xn2
             in loop xs for part < 4 do
                  xs with [5 + 7 * l + part] =
                    map (\row -> map relu (#[unsafe] row[part * c:part * c + c] :> [c]f32)) a.hid
  in (loss, {inputs, dlogits, grads, xs})

-- | Coefficient i of row r's gradient: row r of the flat buffer viewed as
-- rows of C values (wte, wpe, lm_head, then 12 C rows per layer: wq, wk,
-- wv, wo, fc1, and fc2's rows as four rows of C each).  A scalar per
-- (row, position), so no row allocates a vector.
def row_coef [t][c][c3][f][v][l][k] (d: dims) (s: sources [t][c][c3][f][v][l][k]) (r: i64) (i: i64): f32 =
  let (vocab, b) = (d.vocab, d.block_size)
  let top = 2 * vocab + b
  in #[unsafe]
     if r < vocab then f32.bool (i64.i32 s.inputs[i] == r)
     else if r < vocab + b then f32.bool (i == r - vocab)
     else if r < top then s.dlogits[i, r - vocab - b]
     else let l = (r - top) / (12 * c)
          let o = (r - top) % (12 * c)
          let g = s.grads[l]
          in if o < 3 * c then g.dqkv[i, o]
             else if o < 4 * c then g.dxmid[i, o - 3 * c]
             else if o < 8 * c then g.dhid[i, o - 4 * c]
             else g.dxout[i, (o - 8 * c) / 4]

-- | Which matrix of `xs` row r's gradient multiplies (see row_coef).
def row_source (d: dims) (r: i64): i64 =
  let (vocab, b, c) = (d.vocab, d.block_size, d.n_embd)
  let top = 2 * vocab + b
  in if r < vocab + b then 0
     else if r < top then 1
     else let l = (r - top) / (12 * c)
          let o = (r - top) % (12 * c)
          in 2 + 7 * l + (if o < 3 * c then 0 else if o < 4 * c then 1 else if o < 8 * c then 2
                          else 3 + (o - 8 * c) % 4)

-- | sum_t coef(t) * x[t, :], as T in-place multiply-adds over one row.
#[inline]
def grad_row [t][c] (coef: i64 -> f32) (x: [t][c]f32): [c]f32 =
  #[unsafe]
  let c0 = coef 0
  in loop acc = map (* c0) x[0] for i < t - 1 do
       let (w, xr) = (coef (i + 1), x[i + 1])
       in loop acc for j < c do acc with [j] = acc[j] + w * xr[j]

-- | The gradient of every parameter, as (P / C) rows of C.
def gradient_rows [t][c][c3][f][v][l][k] (d: dims) (rows: i64) (s: sources [t][c][c3][f][v][l][k])
                                         : [rows][c]f32 =
  map (\r -> grad_row (row_coef d s r) (#[unsafe] s.xs[row_source d r])) (iota rows)

-- * Adam

-- | microgpt's Adam with a linearly decaying learning rate.
type adam = {learning_rate: f64, beta1: f64, beta2: f64, eps: f64, num_steps: i64}

-- | The update of one parameter at `step` (counted from 0), as
-- engine.model.adam_update computes it: m = b1 m + (1 - b1) g,
-- v = b2 v + (1 - b2) g^2, p -= m / (sqrt(v) v_scale + eps_scaled), with
-- the scalars computed in f64 and rounded to f32.
def adam_update (a: adam) (step: i64): f32 -> f32 -> f32 -> f32 -> (f32, f32, f32) =
  let t = f64.i64 (step + 1)
  let lr_t = a.learning_rate * (1 - f64.i64 step / f64.i64 a.num_steps)
  let step_size = lr_t / (1 - a.beta1 ** t)
  let v_scale = f32.f64 (f64.sqrt (1 / (1 - a.beta2 ** t)) / step_size)
  let eps_scaled = f32.f64 (a.eps / step_size)
  let (b1, c1) = (f32.f64 a.beta1, f32.f64 (1 - a.beta1))
  let (b2, c2) = (f32.f64 a.beta2, f32.f64 (1 - a.beta2))
  in \p g m v ->
       let m = m * b1 + g * c1
       let v = v * b2 + g * g * c2
       in (p - m / (f32.sqrt v * v_scale + eps_scaled), m, v)

-- | One Adam step over the (P / C, C) rows, each row's gradient computed
-- just before its update; with apply = false (a diverged step), the
-- parameters and moments come back unchanged.  (Chosen per element rather
-- than by an `if` around the arrays, which made Futhark copy all three.)
def adam_rows [rows][c][t][c3][f][nv][l][k] (d: dims) (a: adam) (step: i64) (apply: bool)
                                            (s: sources [t][c][c3][f][nv][l][k])
                                            (params: [rows][c]f32) (m: [rows][c]f32) (v: [rows][c]f32)
                                            : ([rows][c]f32, [rows][c]f32, [rows][c]f32) =
  let update = adam_update a step
  let keep p g m v = if apply then update p g m v else (p, m, v)
  in unzip3 (map4 (\r pr mr vr ->
                     let g = grad_row (row_coef d s r) (#[unsafe] s.xs[row_source d r])
                     in unzip3 (map4 keep pr g mr vr))
                  (iota rows) params m v)
