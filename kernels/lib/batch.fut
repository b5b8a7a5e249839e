-- | A training step over B documents (B > 1): which documents a step
-- reads, padded to the longest, and their gradient sources, computed over
-- all N = B T positions of the step at once.
--
-- The step is engine/model/gpt.py's batched loss_and_grad: every linear
-- layer's forward and backward is one product over the N positions (rows
-- = positions, document j's at j T .. j T + T - 1), so a weight matrix is
-- read once per step and per product rather than once per document, and
-- the products are large enough to tile (rows_linear).  Attention runs per
-- document.  The activations are N rows from the start, so they are the
-- gradient sources of train.fut's update pass as they are: it sums every
-- weight row's gradient over the N positions, row by row, in place, as it
-- does over one document's T, with no copy of the sources.  Padding adds
-- nothing: its dlogits are zero (batch_loss_and_dlogits), and it comes
-- after each document's real positions, which attend only to earlier
-- ones, so every activation gradient there is zero too.
--
-- B = 1 (microgpt's step, train.fut's one_document) shares none of these
-- functions: its products are model.fut's, shaped for T ~ 7 rows.
--
-- Every function here that takes weights or activations is #[inline]:
-- with rows_linear, the layer and the attention functions called as
-- functions, Futhark 0.25.34 compiled a step whose gradient was wrong for
-- every layer below the last (1e-3 off NumPy's and vjp's), depending on
-- which other functions the program held (model.fut's back_linear met the
-- same bug: a weight matrix, a view into the flat buffer, read from the
-- wrong place).

import "model"
import "train"

-- | The predicted positions of the documents of training step `step` at
-- batch size b: document (step b + j) mod D for j < b, as
-- engine.batches.DataSplit.step_documents picks them.
def batch_lengths [d] (windows: [d]i64) (b: i64) (step: i64): [b]i64 =
  tabulate b (\j -> #[unsafe] windows[(step * b + j) % d])

-- | Step `step`'s documents padded with bos to t1 = T + 1 tokens (T: the
-- longest of `lengths`), as DataSplit.documents_batch pads them: the
-- inputs are tokens[:, :T], the targets one further.
def batch_tokens [n][d][b] (dims: dims) (tokens: [n]i32) (offsets: [d]i64) (lengths: [b]i64) (step: i64)
                           (t1: i64): [b][t1]i32 =
  let bos = i32.i64 (dims.vocab - 1)
  in tabulate_2d b t1 (\j i -> let doc = (step * b + j) % d
                               in if i <= lengths[j] then #[unsafe] tokens[offsets[doc] + i] else bos)

-- * Products over the step's positions

-- | x @ w.T for x (N, I) and a weight w (O, I) stored as (out, in): each
-- 4 x 4 tile of the result is 16 dot products over I computed together,
-- four rows of x against four rows of w, so each loaded value serves four
-- products (clang makes the loop over I 16 vector FMAs on 8 loads).  A
-- dot product per element loads two values per FMA: 2.8 ms for
-- (256, 256) by (1024, 256) on one thread of this machine, 1.9 tiled.
-- Rows past N or O repeat the last row and are dropped.  The map over
-- tiles of rows is the multicore backend's parallel work.
#[inline]
def rows_linear [n][i][o] (x: [n][i]f32) (w: [o][i]f32): *[n][o]f32 =
  let xr a = #[unsafe] x[i64.min (n - 1) a]
  let wr b = #[unsafe] w[i64.min (o - 1) b]
  let add (a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15)
          (b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15) =
    (a0 + b0, a1 + b1, a2 + b2, a3 + b3, a4 + b4, a5 + b5, a6 + b6, a7 + b7,
     a8 + b8, a9 + b9, a10 + b10, a11 + b11, a12 + b12, a13 + b13, a14 + b14, a15 + b15)
  let zero = (0f32, 0f32, 0f32, 0f32, 0f32, 0f32, 0f32, 0f32, 0f32, 0f32, 0f32, 0f32, 0f32, 0f32, 0f32, 0f32)
  let tile a b =
    let (x0, x1, x2, x3) = (xr (4 * a), xr (4 * a + 1), xr (4 * a + 2), xr (4 * a + 3))
    let (w0, w1, w2, w3) = (wr (4 * b), wr (4 * b + 1), wr (4 * b + 2), wr (4 * b + 3))
    let products k = #[unsafe]
                     let (p0, p1, p2, p3) = (x0[k], x1[k], x2[k], x3[k])
                     let (q0, q1, q2, q3) = (w0[k], w1[k], w2[k], w3[k])
                     in (p0 * q0, p0 * q1, p0 * q2, p0 * q3, p1 * q0, p1 * q1, p1 * q2, p1 * q3,
                         p2 * q0, p2 * q1, p2 * q2, p2 * q3, p3 * q0, p3 * q1, p3 * q2, p3 * q3)
    in #[sequential] reduce_comm add zero (map products (iota i))
  let tiles = map (\a -> map (tile a) (iota ((o + 3) / 4))) (iota ((n + 3) / 4))
  let pick r c = #[unsafe]
                 let (a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15) = tiles[r / 4, c / 4]
                 let row4 (e0, e1, e2, e3) = let k = c % 4
                                             in if k == 0 then e0 else if k == 1 then e1 else if k == 2 then e2 else e3
                 let k = r % 4
                 in if k == 0 then row4 (a0, a1, a2, a3) else if k == 1 then row4 (a4, a5, a6, a7)
                    else if k == 2 then row4 (a8, a9, a10, a11) else row4 (a12, a13, a14, a15)
  in tabulate_2d n o pick

-- | A layer's weights transposed, (in, out) and row-major: dy @ w, the
-- gradient of rows_linear with respect to its input, is rows_linear of dy
-- and w.T, whose tiles then read contiguous rows.  (O I values copied per
-- step, a small part of the N O I multiply-adds.)
type layer_t [c][c3][f] = {wqkv: [c][c3]f32, wo: [c][c]f32, fc1: [c][f]f32, fc2: [f][c]f32}

-- | Every layer's weights transposed, made once per step before the
-- backward pass (in parallel on the multicore backend).
#[inline]
def transposed_layers [p] (flat: [p]f32) (layout: []i64) (c: i64) (c3: i64) (f: i64) (nl: i64)
    : [nl](layer_t [c][c3][f]) =
  let t [r][k] (w: [r][k]f32): *[k][r]f32 = tabulate_2d k r (\a b -> #[unsafe] w[b, a])
  in map (\l -> let w = layer_at flat layout c c3 f l
                in {wqkv = t w.wqkv, wo = t w.wo, fc1 = t w.fc1, fc2 = t w.fc2}) (iota nl)

-- | Document j's rows of an (N, M) array of positions, N = B T.
def per_doc [n][m] 'a (b: i64) (t: i64) (x: [n][m]a): [b][t][m]a =
  unflatten (x :> [b * t][m]a)

-- | The (N, M) rows of B documents' (T, M) arrays.
def rows_of [b][t][m] 'a (n: i64) (x: [b][t][m]a): [n][m]a =
  flatten x :> [n][m]a

def scale_rows [n][c] (x: [n][c]f32) (r: [n]f32): *[n][c]f32 =
  map2 (\row s -> map (* s) row) x r

-- * Forward

-- | What a layer computed over the N positions that its gradient needs
-- (model.fut's layer_acts, with each document's attention weights).
type batch_acts [n][b][t][c][f][h] =
  {xn: [n][c]f32, r1: [n]f32,
   q: [n][c]f32, k: [n][c]f32, v: [n][c]f32,
   probs: [b][h][t][t]f32,
   y: [n][c]f32,
   xn2: [n][c]f32, r2: [n]f32,
   hid: [n][f]f32}

-- | One document's causal attention from its (T, C) queries, keys and
-- values: the weights per head and the output (T, C), as block_acts
-- computes them.
#[inline]
def attend_doc [t][c] (n_head: i64) (q: [t][c]f32) (k: [t][c]f32) (v: [t][c]f32)
                      : (*[n_head][t][t]f32, *[t][c]f32) =
  let d = c / n_head
  let scale = f32.f64 (1 / f64.sqrt (f64.i64 d))
  let attend h =
    let (qh, kh, vh) = (head d q h, head d k h, head d v h)
    let probs = map2 (\i qi -> causal_softmax i (map (\kj -> dot qi kj * scale) kh)) (iota t) qh
    in (probs, tabulate_2d t d (\i j -> f32.sum (map2 (\pr vr -> pr * vr[j]) probs[i] vh)))
  let (probs, heads) = unzip (map attend (iota n_head))
  in (probs, merge_heads c heads)

-- | One pre-norm transformer layer over the N positions of B documents of
-- T positions, with its activations.
#[inline]
def batch_block [n][c][c3][f] (n_head: i64) (b: i64) (t: i64) (w: layer [c][c3][f]) (x: [n][c]f32)
                              : (*[n][c]f32, batch_acts [n][b][t][c][f][n_head]) =
  let r1 = map rms_scale x
  let xn = scale_rows x r1
  let qkv = rows_linear xn w.wqkv  -- (N, 3C)
  let part j = map (\row -> #[unsafe] (row[j * c:j * c + c] :> [c]f32)) qkv
  let (q, k, v) = (part 0, part 1, part 2)
  let (probs, ys) = unzip (map3 (attend_doc n_head) (per_doc b t q) (per_doc b t k) (per_doc b t v))
  let y = rows_of n ys
  let x = add_rows x (rows_linear y w.wo)
  let r2 = map rms_scale x
  let xn2 = scale_rows x r2
  let hid = rows_linear xn2 w.fc1
  let x = add_rows x (rows_linear (map (map relu) hid) w.fc2)
  in (x, {xn, r1, q, k, v, probs, y, xn2, r2, hid})

-- | The forward pass over the N = B T positions of `inputs` (position r
-- is document r / T's position r % T), keeping what the backward pass
-- needs.
def batch_forward [p][n] (d: dims) (c: i64) (f: i64) (b: i64) (t: i64) (layout: []i64) (flat: [p]f32)
                         (inputs: [n]i32) =
  let (h, nl) = (d.n_head, d.n_layer)
  let c3 = 3 * c
  let (wte, wpe, _) = embeddings flat layout d.vocab d.block_size c
  let e = map2 (\tok r -> #[unsafe] map2 (+) wte[i64.i32 tok] wpe[r % t]) inputs (iota n)
  let r0 = map rms_scale e
  let x0 = scale_rows e r0
  let zeros m = replicate n (replicate m 0f32)
  let none: batch_acts [n][b][t][c][f][h] =
    {xn = zeros c, r1 = replicate n 0, q = zeros c, k = zeros c, v = zeros c,
     probs = replicate b (replicate h (replicate t (replicate t 0))), y = zeros c,
     xn2 = zeros c, r2 = replicate n 0, hid = zeros f}
  let (x, acts) =
    loop (x, acts) = (copy x0, replicate nl none) for l < nl do
      let (x, a) = batch_block h b t (layer_at flat layout c c3 f l) x
      in (x, acts with [l] = a)
  in {x0, r0, acts, x}

-- | The summed loss of the real positions (position r is real where r % T
-- < lengths[r / T]), and the gradient of the batch's mean loss (scale = 1
-- / the real positions' count) with respect to the logits: (softmax -
-- one_hot) scale at the real positions, zero at the padding.
def batch_loss_and_dlogits [n][v][c][b] (lm_head: [v][c]f32) (x: [n][c]f32) (targets: [n]i32)
                                        (lengths: [b]i64) (t: i64) (scale: f32): (f32, *[n][v]f32) =
  let real r = #[unsafe] r % t < lengths[r / t]
  let position r logits target =
    let top = f32.maximum logits
    let e = map (\l -> f32.exp (l - top)) logits
    let z = f32.sum e
    let loss = f32.log z - (#[unsafe] logits[i64.i32 target] - top)
    let w = if real r then scale else 0
    in (if real r then loss else 0, map2 (\j ej -> (ej / z - f32.bool (j == i64.i32 target)) * w) (iota v) e)
  let (losses, dlogits) = unzip (map3 position (iota n) (rows_linear x lm_head) targets)
  in (f32.sum losses, dlogits)

-- * Backward

-- | One document's attention backward from its (T, C) queries, keys,
-- values, weights and output gradient dy: dq, dk, dv (T, C) each, as
-- block_back computes them.
#[inline]
def attend_doc_back [t][c][h] (q: [t][c]f32) (k: [t][c]f32) (v: [t][c]f32) (probs: [h][t][t]f32)
                              (dy: [t][c]f32): (*[t][c]f32, *[t][c]f32, *[t][c]f32) =
  let d = c / h
  let scale = f32.f64 (1 / f64.sqrt (f64.i64 d))
  let head_back hh =
    let (qh, kh, vh, dyh, p) = (head d q hh, head d k hh, head d v hh, head d dy hh, probs[hh])
    let dp = linear dyh vh  -- (T, T): dp[i, j] = dy_i . v_j
    let datt = map2 (\pr dpr -> let s = dot pr dpr
                                in map2 (\pv dv -> pv * (dv - s) * scale) pr dpr) p dp
    in (matmul datt kh, matmul (transpose datt) qh, matmul (transpose p) dyh)
  let (dqs, dks, dvs) = unzip3 (map head_back (iota h))
  in (merge_heads c dqs, merge_heads c dks, merge_heads c dvs)

-- | Back through one layer over the N positions: the gradient with
-- respect to its input, and the activation gradients of its weights;
-- `w`: the layer's weights transposed.
#[inline]
def batch_block_back [n][b][t][c][c3][f][h] (w: layer_t [c][c3][f]) (a: batch_acts [n][b][t][c][f][h])
                                            (dx: [n][c]f32): (*[n][c]f32, *[n][c3]f32, *[n][c]f32, *[n][f]f32) =
  -- x_out = x_mid + relu(xn2 @ fc1.T) @ fc2.T
  let dact = rows_linear dx w.fc2
  let dhid = map2 (map2 (\g hv -> if hv > 0 then g else 0)) dact a.hid
  let dxn2 = rows_linear dhid w.fc1
  let dxmid = add_rows dx (map3 rmsnorm_back dxn2 a.xn2 a.r2)
  -- x_mid = x_in + attn(xn) @ wo.T
  let dy = rows_linear dxmid w.wo
  let (dqs, dks, dvs) = unzip3 (map5 attend_doc_back (per_doc b t a.q) (per_doc b t a.k) (per_doc b t a.v)
                                     a.probs (per_doc b t dy))
  let (dq, dk, dv) = (rows_of n dqs, rows_of n dks, rows_of n dvs)
  let dqkv = map3 (\x y z -> (x ++ y ++ z) :> [c3]f32) dq dk dv
  let dxn = rows_linear dqkv w.wqkv
  in (add_rows dxmid (map3 rmsnorm_back dxn a.xn a.r1), dqkv, dxmid, dhid)

-- | The batch's mean loss over its real positions, and its gradient
-- sources: its N = B T positions, document j's at j T .. j T + T - 1, as
-- the forward and backward passes computed them.
def batch_sources [rows][c][b][t1][l] (d: dims) (layout: [l]i64) (_blocks: products) (params: [rows][c]f32)
                                      (tokens: [b][t1]i32) (lengths: [b]i64)
    : (f32, *sources [b * (t1 - 1)][c][3 * c][4 * c][d.vocab][d.n_layer][2 + 7 * d.n_layer]) =
  let t = t1 - 1
  let n = b * t
  let (c3, f, nv, nl) = (3 * c, 4 * c, d.vocab, d.n_layer)
  -- a copy, P values (a small part of a step's N P multiply-adds), so that
  -- nothing here is a view of the buffers the update pass overwrites
  let flat = copy (flatten params)
  let (_, _, lm_head) = embeddings flat layout nv d.block_size c
  let inputs = flatten (map (\row -> row[:t] :> [t]i32) tokens) :> [n]i32
  let targets = flatten (map (\row -> row[1:] :> [t]i32) tokens) :> [n]i32
  let count = i64.sum lengths
  let fw = batch_forward d c f b t layout flat inputs
  let (loss_sum, dlogits) = batch_loss_and_dlogits lm_head fw.x targets lengths t (1 / f32.i64 count)
  let zeros m = replicate n (replicate m 0f32)
  let wt = transposed_layers flat layout c c3 f nl
  -- each layer's activation gradients in arrays of their own, the input
  -- gradient (fc2's) stored before the layer's call
  let (dx, dqkvs, dxmids, dhids, dxouts) =
    loop (dx, dqkvs, dxmids, dhids, dxouts) =
         (rows_linear dlogits (copy (transpose lm_head)), replicate nl (zeros c3), replicate nl (zeros c),
          replicate nl (zeros f), replicate nl (zeros c))
    for i < nl do
      let j = nl - 1 - i
      let dxouts = dxouts with [j] = dx
      let (dx, dqkv, dxmid, dhid) = batch_block_back wt[j] fw.acts[j] dx
      in (dx, dqkvs with [j] = dqkv, dxmids with [j] = dxmid, dhids with [j] = dhid, dxouts)
  let grads = map4 (\dqkv dxmid dhid dxout -> {dqkv, dxmid, dhid, dxout}) dqkvs dxmids dhids dxouts
  let dx0 = map3 rmsnorm_back dx fw.x0 fw.r0
  -- xs as backward_from lays them out: dx0 (wte, wpe), x (lm_head), then
  -- per layer xn, y, xn2 and the four C-column parts of relu(hid)
  let xs = replicate (2 + 7 * nl) (zeros c)
  let xs = xs with [0] = dx0
  let xs = xs with [1] = fw.x
  let xs = loop xs for j < nl do
             let a = fw.acts[j]
             let xs = xs with [2 + 7 * j] = a.xn
             let xs = xs with [3 + 7 * j] = a.y
             let xs = xs with [4 + 7 * j] = a.xn2
             in loop xs for part < 4 do
                  xs with [5 + 7 * j + part] =
                    map (\row -> map relu (#[unsafe] row[part * c:part * c + c] :> [c]f32)) a.hid
  in (loss_sum / f32.i64 count,
      {inputs, dlogits, grads, xs} :> sources [b * t][c][3 * c][4 * c][d.vocab][d.n_layer][2 + 7 * d.n_layer])
