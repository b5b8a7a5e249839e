-- | One training step, written for speed: the forward pass keeps each
-- layer's activations, the backward pass (mirroring engine/model.py's
-- loss_and_grad) computes the gradients of the activations from the
-- step's weights, and one pass over the parameters then computes each row's
-- weight gradient and applies Adam to it, in place.  `vjp` of model.fut's
-- `loss` is the oracle the tests hold this gradient to (tests/oracle.fut's
-- `grad_vjp`).
--
-- Why this shape (measured: README "Performance"):
-- * Every weight gradient is a sum over the T (~7) positions of outer
--   products, G[o, :] = sum_t dY[t, o] * X[t, :].  It is computed one row
--   of C values at a time, in a row that stays in cache, and Adam updates
--   that row of the parameters and both moments at once, in place: the
--   gradient never exists as a P-sized buffer, and each of the three
--   buffers is read and written once per step.  From s256 up a step is
--   bound by memory traffic, and on this machine one thread updating in
--   place moves 34.6 GB/s, fresh arrays 19.5 GB/s (17.2 with two threads).
-- * Every matrix has a multiple of C entries (fc2's rows of 4C are four
--   rows of C), so the buffers are held as rows of C and one pass over
--   rows serves every matrix: a `map` over a section's rows, run in
--   parallel by the multicore backend, whose results Futhark writes into
--   the rows it read (update_rows).
-- * The gradient of an activation, dY @ W, adds rows of W in place
--   (model.fut's back_linear), W read once, contiguously.  These products
--   and the forward pass are the parallel work of the multicore backend,
--   with no atomics (vjp's accumulations into shared gradients became a
--   compare-and-swap loop per float there).

import "model"

-- * Forward

-- | The forward pass of one document, keeping what the backward pass
-- needs: {x0, r0} = rmsnorm(wte[tok] + wpe[pos]) and its scales, `acts`
-- for each layer, and x, the last layer's output.
def forward_train [p][t] (d: dims) (c: i64) (f: i64) (h: i64) (nl: i64) (layout: []i64) (flat: [p]f32)
                         (inputs: [t]i32)
                         : *{x0: [t][c]f32, r0: [t]f32, acts: [nl](layer_acts [t][c][f][h]), x: [t][c]f32} =
  let (v, b) = (d.vocab, d.block_size)
  let c3 = 3 * c
  let (wte, wpe, _) = embeddings flat layout v b c
  let (x0, r0) = embed wte wpe inputs
  let zeros n = replicate t (replicate n 0f32)
  let none: layer_acts [t][c][f][h] =
    {xn = zeros c, r1 = replicate t 0, q = zeros c, k = zeros c, v = zeros c,
     probs = replicate h (replicate t (replicate t 0)), y = zeros c,
     xn2 = zeros c, r2 = replicate t 0, hid = zeros f}
  let (x, acts) =
    loop (x, acts) = (copy x0, replicate nl none) for l < nl do
      let (x, a) = block_acts h (layer_at flat layout c c3 f l) x
      in (x, acts with [l] = a)
  in {x0, r0, acts, x}

-- | The cross-entropy of predicting targets from each position's logits,
-- and its gradient with respect to the logits, softmax - one_hot, times
-- weight(position): a row per position.  (batch.fut's batched loss too.)
def position_dlogits [t][v] (logits: [t][v]f32) (targets: [t]i32) (weight: i64 -> f32): *[t](f32, [v]f32) =
  map3 (\i row target ->
          let top = f32.maximum row
          let e = map (\l -> f32.exp (l - top)) row
          let z = f32.sum e
          let loss = f32.log z - (row[i64.i32 target] - top)
          let w = weight i
          in (loss, map2 (\j ej -> (ej / z - f32.bool (j == i64.i32 target)) * w) (iota v) e))
       (iota t) logits targets

-- | The mean loss of predicting targets from the final hidden states x,
-- and its gradient with respect to the logits, (softmax - one_hot) / T.
def loss_and_dlogits [t][v][c] (lm_head: [v][c]f32) (x: [t][c]f32) (targets: [t]i32)
                               : (f32, *[t][v]f32) =
  let inv_t = 1 / f32.i64 t
  let (losses, dlogits) = unzip (position_dlogits (linear x lm_head) targets (\_ -> inv_t))
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
def block_back [t][c][c3][f][h] (blocks: products) (w: layer [c][c3][f]) (a: layer_acts [t][c][f][h])
                                (dx: [t][c]f32): (*[t][c]f32, *layer_grads [t][c][c3][f]) =
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
  in (add_rows dxmid (map3 rmsnorm_back dxn a.xn a.r1), {dqkv, dxmid, dhid, dxout = copy dx})

-- | What the weight gradients are made of, for one document: every row of
-- C parameters has the gradient sum_t coef[t] * X[t, :] for coefficients
-- taken from the inputs, dlogits or a layer's `grads` and one of the (T, C)
-- matrices in `xs` (update_all says which).
type sources [t][c][c3][f][v][l][k] =
  {inputs: [t]i32, dlogits: [t][v]f32, grads: [l](layer_grads [t][c][c3][f]), xs: [k][t][c]f32}

-- | One document's gradient sources from its forward pass `fw` and the
-- gradient of the loss with respect to its logits, from the parameters
-- `flat` (read only: every product here reads the weights before any
-- update).
def backward_from [p][t][c][f][h][nl][v] (d: dims) (layout: []i64) (blocks: products) (flat: [p]f32)
                                         (inputs: [t]i32)
                                         (fw: {x0: [t][c]f32, r0: [t]f32, acts: [nl](layer_acts [t][c][f][h]),
                                               x: [t][c]f32})
                                         (dlogits: [t][v]f32) =
  let c3 = 3 * c
  let (x0, x, acts) = (fw.x0, fw.x, fw.acts)
  let (_, _, lm_head) = embeddings flat layout v d.block_size c
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
  in {inputs, dlogits, grads, xs}

-- | One document's loss and its gradient sources, from the parameters
-- `flat` (read only).
def backward [p][t] (d: dims) (layout: []i64) (blocks: products) (flat: [p]f32) (inputs: [t]i32)
                    (targets: [t]i32) =
  let (v, b, c) = (d.vocab, d.block_size, d.n_embd)
  let (f, h, nl) = (4 * c, d.n_head, d.n_layer)
  let fw = forward_train d c f h nl layout flat inputs
  let (_, _, lm_head) = embeddings flat layout v b c
  let (loss, dlogits) = loss_and_dlogits lm_head fw.x targets
  in (loss, backward_from d layout blocks flat inputs fw dlogits)

-- | Row o's gradient sum_t coef(o, t) * source(o)[t, :] (C): four
-- positions per pass over the row, so the row is loaded and stored a
-- quarter as often.  (Positions past T get a zero coefficient.)
-- Sequential: it runs inside update_rows' parallel map over rows.
#[inline]
def grad_row [t][c] (coef: i64 -> f32) (x: [t][c]f32): *[c]f32 =
  #[unsafe]
  let term i = if i < t then (coef i, i) else (0, 0)
  let quad q j = let ((c0, i0), (c1, i1)) = (term (4 * q), term (4 * q + 1))
                 let ((c2, i2), (c3, i3)) = (term (4 * q + 2), term (4 * q + 3))
                 in c0 * x[i0, j] + c1 * x[i1, j] + c2 * x[i2, j] + c3 * x[i3, j]
  -- the first pass makes the row (a zeroed scratch row cost a memset per row)
  let acc = #[sequential] tabulate c (quad 0)
  in loop acc for q < (t + 3) / 4 - 1 do
       loop acc for j < c do acc with [j] = acc[j] + quad (q + 1) j

-- | What a pass does to one parameter: (p, g, m, v) -> (p, m, v).
type^ update = f32 -> f32 -> f32 -> f32 -> (f32, f32, f32)

-- | Rows first .. first + n - 1 of the buffers seen as rows of C: row
-- first + o gets the gradient `gradient o` (one document's: grad_row of
-- its sources; a batch's: a row of its gradient), and `update` turns the
-- row of parameters and moments into new ones.  One
-- `map` over the rows (a parallel task per block of rows on the multicore
-- backend), whose three results are written back into the same rows of
-- the consumed buffers: Futhark places the map's results in those rows
-- (memory short-circuiting), so nothing is copied or allocated but the
-- row of gradient, and the pass reads and writes each buffer once.  The
-- rows must be a slice Futhark cannot prove whole: with the whole array
-- it replaced the buffers by the map's results, three fresh buffers every
-- step.
#[inline]
def update_rows [rows][c] (update: update) (first: i64) (n: i64) (gradient: i64 -> [c]f32)
                          (params: *[rows][c]f32) (m: *[rows][c]f32) (v: *[rows][c]f32)
                          : (*[rows][c]f32, *[rows][c]f32, *[rows][c]f32) =
  let row o =
    let r = first + o
    let g = gradient o
    let (pr, mr, vr) = #[unsafe] (params[r], m[r], v[r])
    in #[sequential] unzip3 (map4 update pr g mr vr)
  let (ps, ms, vs) = unzip3 (map row (iota n))
  in #[unsafe] (params with [first:first + n] = ps, m with [first:first + n] = ms,
                v with [first:first + n] = vs)

-- | Row o's coefficient at position i among wte's rows (o < vocab: the
-- positions holding token o) and wpe's (position o - vocab's, i % period).
def embedding_coef [t] (vocab: i64) (period: i64) (inputs: [t]i32) (o: i64) (i: i64): f32 =
  #[unsafe] if o < vocab then f32.bool (i64.i32 inputs[i] == o) else f32.bool (i % period == o - vocab)

-- | Row o's coefficient at position i among a layer's 12 C rows (wq, wk,
-- wv, wo, fc1, then fc2's rows of 4C as four rows of C): its activation
-- gradients g.
def layer_coef [t][c][c3][f] (g: layer_grads [t][c][c3][f]) (o: i64) (i: i64): f32 =
  #[unsafe] if o < 3 * c then g.dqkv[i, o]
            else if o < 4 * c then g.dxmid[i, o - 3 * c]
            else if o < 8 * c then g.dhid[i, o - 4 * c]
            else g.dxout[i, (o - 8 * c) / 4]

-- | Which of a layer's seven X matrices in the sources' xs (from 2 + 7 layer
-- on: xn, y, xn2, relu(hid)'s four C-column parts) row o's gradient reads.
def layer_source (c: i64) (o: i64): i64 =
  if o < 3 * c then 0 else if o < 4 * c then 1 else if o < 8 * c then 2 else 3 + (o - 8 * c) % 4

-- | Every row's gradient, computed just before `update` turns the row of
-- parameters and moments into new ones, in place: one pass (a parallel
-- map per section of rows) that reads and writes each buffer once.  The rows are those of
-- engine/params.py's layout: wte, wpe, lm_head, then 12 C per layer (wq,
-- wk, wv, wo, fc1, and fc2's rows of 4C as four rows of C); new_weights
-- checked the layout.  `period`: the positions of one document, T
-- (position i is wpe's row i % period).
def update_all [rows][c][t][c3][f][nv][l][k] (d: dims) (update: update) (period: i64)
                                             (s: sources [t][c][c3][f][nv][l][k])
                                             (params: *[rows][c]f32) (m: *[rows][c]f32) (v: *[rows][c]f32)
                                             : (*[rows][c]f32, *[rows][c]f32, *[rows][c]f32) =
  let (vocab, b) = (d.vocab, d.block_size)
  let (params, m, v) =
    update_rows update 0 (vocab + b) (\o -> grad_row (embedding_coef vocab period s.inputs o) s.xs[0])
                params m v
  let (params, m, v) =
    update_rows update (vocab + b) vocab (\o -> grad_row (\i -> #[unsafe] s.dlogits[i, o]) s.xs[1]) params m v
  in loop (params, m, v) for layer < l do
       let source o = #[unsafe] s.xs[2 + 7 * layer + layer_source c o]
       in update_rows update (2 * vocab + b + 12 * c * layer) (12 * c)
                      (\o -> grad_row (layer_coef s.grads[layer] o) (source o)) params m v

-- | update_all as two parallel maps, one over the embeddings and lm_head
-- and one over every layer's rows, for the multicore backend on several
-- threads (multicore.fut's `train`).  That backend wakes its
-- threads for each map, tens of microseconds on a 2-core virtual machine,
-- and each map ends waiting for its slower task: with a map per section,
-- eight at s256, a two-thread s256 step took 8-12% longer.  Sequential
-- C keeps update_all: this form made its s256 step 4-8% slower (README
-- "Performance").
def update_all_merged [rows][c][t][c3][f][nv][l][k] (d: dims) (update: update) (period: i64)
                                             (s: sources [t][c][c3][f][nv][l][k])
                                             (params: *[rows][c]f32) (m: *[rows][c]f32) (v: *[rows][c]f32)
                                             : (*[rows][c]f32, *[rows][c]f32, *[rows][c]f32) =
  let (vocab, b) = (d.vocab, d.block_size)
  let (embedding_end, head_end) = (vocab + b, 2 * vocab + b)
  -- wte, wpe, then lm_head: the dlogits
  let outer o i = if o < embedding_end then embedding_coef vocab period s.inputs o i
                  else #[unsafe] s.dlogits[i, o - embedding_end]
  let (params, m, v) =
    update_rows update 0 head_end (\o -> grad_row (outer o) (#[unsafe] s.xs[if o < embedding_end then 0 else 1]))
                params m v
  -- the layers' rows: row q is row q % 12 C of layer q / 12 C
  let coef q = layer_coef s.grads[q / (12 * c)] (q % (12 * c))
  let source q = #[unsafe] s.xs[2 + 7 * (q / (12 * c)) + layer_source c (q % (12 * c))]
  -- counted from l rather than as the rows left: a slice Futhark cannot
  -- prove whole stays an in-place update (with the whole array, the map's
  -- results went to three fresh buffers every step)
  in update_rows update head_end (12 * c * l) (\q -> grad_row (coef q) (source q)) params m v

-- | Every row's update from a batch's gradient, row o being `gradient o`
-- (a row of the gradient held whole, batch.fut's batch_gradient, or the
-- sum of the groups' rows, microgpt.fut's batch_in_parts): the two
-- sections of update_all_merged, each a parallel map.
def update_from_gradient [rows][c] (d: dims) (update: update) (gradient: i64 -> [c]f32)
                                   (params: *[rows][c]f32) (m: *[rows][c]f32) (v: *[rows][c]f32)
                                   : (*[rows][c]f32, *[rows][c]f32, *[rows][c]f32) =
  let head_end = 2 * d.vocab + d.block_size
  let (params, m, v) = update_rows update 0 head_end gradient params m v
  in update_rows update head_end (12 * c * d.n_layer) (\o -> gradient (head_end + o)) params m v

-- * Adam

-- | microgpt's Adam with a linearly decaying learning rate, after a linear
-- warm-up of warmup_steps steps (0: none, microgpt's schedule).
type adam = {learning_rate: f64, beta1: f64, beta2: f64, eps: f64, num_steps: i64, warmup_steps: i64}

-- | The learning rate at `step` as a fraction of learning_rate, as
-- engine.config.TrainConfig.lr_factor computes it:
-- min(1, (step + 1) / warmup_steps) * (1 - step / num_steps).
def lr_factor (a: adam) (step: i64): f64 =
  let decay = 1 - f64.i64 step / f64.i64 a.num_steps
  in if a.warmup_steps == 0 then decay
     else f64.min 1 (f64.i64 (step + 1) / f64.i64 a.warmup_steps) * decay

-- | Adam's per-step scalars at `step` (counted from 0), computed in f64 and
-- rounded to f32 as engine.model.adam_scales does.
type adam_scalars = {b1: f32, c1: f32, b2: f32, c2: f32, v_scale: f32, eps_scaled: f32}

def adam_scalars (a: adam) (step: i64): adam_scalars =
  let t = f64.i64 (step + 1)
  let lr_t = a.learning_rate * lr_factor a step
  let step_size = lr_t / (1 - a.beta1 ** t)
  in {b1 = f32.f64 a.beta1, c1 = f32.f64 (1 - a.beta1), b2 = f32.f64 a.beta2, c2 = f32.f64 (1 - a.beta2),
      v_scale = f32.f64 (f64.sqrt (1 / (1 - a.beta2 ** t)) / step_size),
      eps_scaled = f32.f64 (a.eps / step_size)}

-- | The update of one parameter, as engine.model.adam_update computes it:
-- m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2,
-- p -= m / (sqrt(v) v_scale + eps_scaled).
def adam_update (s: adam_scalars) (p: f32) (g: f32) (m: f32) (v: f32): (f32, f32, f32) =
  let m = m * s.b1 + g * s.c1
  let v = v * s.b2 + g * g * s.c2
  in (p - m / (f32.sqrt v * s.v_scale + s.eps_scaled), m, v)
