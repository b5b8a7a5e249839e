-- | microgpt's network: the parameter layout, the building blocks and one
-- transformer layer, shared by training (train.fut), the `vjp`
-- oracle (kernels/tests/oracle.fut) and sampling (sample.fut).
--
-- The same model as engine/model.py (the NumPy reference), in f32:
--
--     x = rmsnorm(wte[tok] + wpe[pos])
--     per layer:  x += attn(rmsnorm x) @ wo.T        (causal, 1/sqrt(head_dim))
--                 x += relu(rmsnorm x @ fc1.T) @ fc2.T
--     logits = x @ lm_head.T                        (no final norm)
--
-- Shapes are written (T, C) etc.: T positions, C = n_embd, H heads of
-- D = C/H columns, F = 4C hidden units, V tokens, B = block_size.
-- No size is a compile-time constant: one compiled library serves every
-- size.  (Size expressions in types need Futhark 0.25.)  Only the
-- products' strategy (`products`) is fixed per program: kernels/c.fut,
-- multicore.fut, gpu.fut and their _batch programs each pass their own.

-- * Building blocks

def dot [n] (xs: [n]f32) (ys: [n]f32): f32 =
  f32.sum (map2 (*) xs ys)

-- | How a program runs its backward products (back_linear), chosen when
-- it is compiled (each program in kernels/ passes its own): sequential C
-- adds the rows in one loop, the multicore backend splits a product into
-- n parallel tasks (its thread count) from `parallel_work` multiply-adds
-- up (below that, sequentially: waking the scheduler's threads costs tens
-- of microseconds, and at s128, where a product is about 100,000
-- multiply-adds, parallel tasks made the step 20% slower), and a GPU runs
-- a thread per position and column.  A constructor the program fixes, so
-- Futhark compiles only that strategy's code into it.
type products = #sequential | #tasks i64 | #gpu

def parallel_work: i64 = 1 << 20

-- | x @ w.T for x (T, I) and a weight w (O, I) stored as (out, in).
--
-- The map runs over the weight's rows outermost, so each row of w is read
-- once and used for all T positions (T is a name's length, ~7), and every
-- dot product runs over two contiguous rows.  The result (O, T) is turned
-- back by indexing rather than `transpose`, which `vjp` in Futhark 0.25.9
-- failed on.  (Loops for small products, which the multicore backend
-- would not make tasks of, made sequential C 15-30% slower from s64 up.)
def linear [t][i][o] (x: [t][i]f32) (w: [o][i]f32): *[t][o]f32 =
  let y = map (\wr -> map (\xr -> dot xr wr) x) w  -- (O, T)
  in tabulate_2d t o (\a b -> y[b, a])

-- | a @ b for small matrices (attention's (T, T) by (T, D)).
def matmul [n][k][m] (a: [n][k]f32) (b: [k][m]f32): *[n][m]f32 =
  tabulate_2d n m (\i j -> f32.sum (map2 (\x br -> x * #[unsafe] br[j]) a[i] b))

-- | dy @ w for dy (T, O) and w (O, I): the gradient of `linear` with
-- respect to its input, as sums of rows of w.
--
-- Sequentially, the rows of w are added into the (T, I) sums in place,
-- four rows of w per pass over the sums (rows past O get a zero
-- coefficient): w is read once, contiguously, and the sums stay in cache.
-- A sum over each column of w instead would read it with a stride of I.
-- #tasks n splits w's rows into n parts, one task each adding its rows
-- into sums of its own, which are then added: w is still read once and
-- contiguously; #gpu runs a thread per position and column.
-- Inlined: called as a function, it read a weight matrix of the flat
-- buffer from the buffer's start (wrong gradients with Futhark 0.25.34).
#[inline]
def back_linear [t][o][i] (products: products) (dy: [t][o]f32) (w: [o][i]f32): *[t][i]f32 =
  let quads = (o + 3) / 4
  -- rows 4q .. 4q + 3 of w added with position s's coefficients, at column j
  let quad s q j = #[unsafe]
                   let term r = if r < o then (dy[s, r], r) else (0, 0)
                   let ((d0, r0), (d1, r1)) = (term (4 * q), term (4 * q + 1))
                   let ((d2, r2), (d3, r3)) = (term (4 * q + 2), term (4 * q + 3))
                   in d0 * w[r0, j] + d1 * w[r1, j] + d2 * w[r2, j] + d3 * w[r3, j]
  let sequential_sum () =
    #[unsafe]
    loop acc = replicate t (replicate i 0f32) for q < quads do
      loop acc for s < t do
        loop acc for j < i do acc with [s, j] = acc[s, j] + quad s q j
  in match products
     case #sequential -> sequential_sum ()
     case #tasks blocks ->
       if t * o * i < parallel_work then sequential_sum ()
       else
         -- one task per block of w's rows, each adding its rows into (T, I)
         -- sums of its own as the sequential code does (its part of w read
         -- once, contiguously), then the blocks' sums added: at gpt2-small on
         -- two threads the backward pass took 20.6-20.8 ms this way against
         -- 26.7 with a task per block of columns, which read half of each row
         let per = (quads + blocks - 1) / blocks
         let parts = map (\b -> let q0 = b * per
                                let n = i64.max 0 (i64.min quads (q0 + per) - q0)
                                in #[unsafe]
                                   loop acc = replicate t (replicate i 0f32) for qq < n do
                                     loop acc for s < t do
                                       loop acc for j < i do acc with [s, j] = acc[s, j] + quad s (q0 + qq) j)
                         (iota blocks)
         in tabulate_2d t i (\s j -> #[unsafe] loop sum = parts[0, s, j] for b < blocks - 1 do sum + parts[b + 1, s, j])
     case #gpu ->
       -- one thread per position and column (indexed: `unflatten parts`
       -- made the sequential C build 20-30% slower at tiny and s32)
       let parts = map (\p -> let (s, j) = (p / i, p % i)
                              in #[unsafe] loop acc = 0f32 for q < quads do acc + quad s q j)
                       (iota (t * i))
       in tabulate_2d t i (\s j -> #[unsafe] parts[s * i + j])

def relu (x: f32): f32 = f32.max x 0

-- | 1 / sqrt(mean(x^2) + 1e-5): rmsnorm's scale of one row.
def rms_scale [c] (x: [c]f32): f32 =
  1 / f32.sqrt (f32.sum (map (\a -> a * a) x) / f32.i64 c + 1e-5)

-- | x / sqrt(mean(x^2) + 1e-5), without weights.
def rmsnorm [c] (x: [c]f32): [c]f32 =
  let r = rms_scale x
  in map (* r) x

-- | The gradient of y = rmsnorm(x) = x * r with respect to x, given dy, y and r.
def rmsnorm_back [c] (dy: [c]f32) (y: [c]f32) (r: f32): [c]f32 =
  let mean_dy_y = dot dy y / f32.i64 c
  in map2 (\d yv -> r * (d - yv * mean_dy_y)) dy y

def add_rows [t][c] (x: [t][c]f32) (y: [t][c]f32): *[t][c]f32 =
  map2 (map2 (+)) x y

-- * The parameter layout

-- | Sizes of a network; the vocabulary includes the bos token (the last id).
type dims = {n_embd: i64, n_layer: i64, n_head: i64, block_size: i64, vocab: i64}

-- | Rows and columns of matrix j of the layout: wte, wpe, lm_head, then per
-- layer wq, wk, wv, wo, fc1, fc2 (engine/params.py's order).
def matrix_shape (d: dims) (j: i64): (i64, i64) =
  let (c, f) = (d.n_embd, 4 * d.n_embd)
  in if j == 0 || j == 2 then (d.vocab, c)
     else if j == 1 then (d.block_size, c)
     else let k = (j - 3) % 6
          in if k == 4 then (f, c) else if k == 5 then (c, f) else (c, c)

-- | Whether a layout (3 + 6 n_layer offsets) puts the matrices back to back
-- in that order from 0 and fills exactly P parameters.  Training relies on
-- it: it walks the flat buffer as rows of C values (every matrix has a
-- multiple of C entries) and reads each matrix unchecked.
def layout_fits [l] (d: dims) (p: i64) (layout: [l]i64): bool =
  let sizes = map (\j -> let (rows, cols) = matrix_shape d j in rows * cols) (iota l)
  let starts = map2 (-) (scan (+) 0 sizes) sizes
  in l == 3 + 6 * d.n_layer && d.n_embd % d.n_head == 0
     && and (map2 (==) layout starts)
     && (l == 0 || starts[l - 1] + sizes[l - 1] == p)

-- | The (rows, cols) matrix stored row-major at `offset` of the flat buffer:
-- a reshaped slice, so a view rather than a copy.  Unchecked: `new_weights`
-- asserts that the layout fits.  (A map over row slices, as `vjp` once
-- preferred, made Futhark copy every weight row on every step.)
#[inline]
def matrix [p] (flat: [p]f32) (offset: i64) (rows: i64) (cols: i64): [rows][cols]f32 =
  unflatten (#[unsafe] flat[offset:offset + rows * cols] :> [rows * cols]f32)

-- | One transformer layer's weights: wqkv (3C, C) is wq, wk and wv, which
-- lie back to back in the flat buffer; F = 4C.
type layer [c][c3][f] = {wqkv: [c3][c]f32, wo: [c][c]f32, fc1: [f][c]f32, fc2: [c][f]f32}

-- | Layer l's weights, read from the flat buffer.
#[inline]
def layer_at [p] (flat: [p]f32) (layout: []i64) (c: i64) (c3: i64) (f: i64) (l: i64): layer [c][c3][f] =
  let at j = layout[3 + 6 * l + j]
  in {wqkv = matrix flat (at 0) c3 c, wo = matrix flat (at 3) c c,
      fc1 = matrix flat (at 4) f c, fc2 = matrix flat (at 5) c f}

-- | The embedding and output matrices: wte (V, C), wpe (B, C), lm_head (V, C).
#[inline]
def embeddings [p] (flat: [p]f32) (layout: []i64) (v: i64) (b: i64) (c: i64)
                   : ([v][c]f32, [b][c]f32, [v][c]f32) =
  (matrix flat layout[0] v c, matrix flat layout[1] b c, matrix flat layout[2] v c)

-- * One layer

-- | Softmax of row i of the attention scores over positions j <= i.
def causal_softmax [t] (i: i64) (scores: [t]f32): [t]f32 =
  let masked = map2 (\j s -> if j <= i then s else -f32.inf) (iota t) scores
  let top = f32.maximum masked
  let e = map (\s -> f32.exp (s - top)) masked
  let z = f32.sum e
  in map (/ z) e

-- | Column block h of x (T, C): head h's (T, D) part.
def head [t][c] (d: i64) (x: [t][c]f32) (h: i64): [t][d]f32 =
  map (\row -> #[unsafe] (row[h * d:h * d + d] :> [d]f32)) x

-- | Heads (H, T, D) back to (T, C).
def merge_heads [h][t][d] (c: i64) (heads: [h][t][d]f32): *[t][c]f32 =
  tabulate_2d t c (\i j -> #[unsafe] heads[j / d, i, j % d])

-- | Everything a layer computed that its gradient needs.
type layer_acts [t][c][f][h] =
  {xn: [t][c]f32, r1: [t]f32,                     -- rmsnorm of the input and its scales
   q: [t][c]f32, k: [t][c]f32, v: [t][c]f32,
   probs: [h][t][t]f32,                           -- attention weights per head
   y: [t][c]f32,                                  -- attention output, before wo
   xn2: [t][c]f32, r2: [t]f32,                    -- rmsnorm before the MLP
   hid: [t][f]f32}                                -- fc1's output, before relu

-- | relu(rmsnorm(x) @ fc1.T) @ fc2.T: the MLP's contribution, with its
-- normalised input, scales and fc1 output.
def mlp [t][c][f] (fc1: [f][c]f32) (fc2: [c][f]f32) (x: [t][c]f32)
                  : (*[t][c]f32, *[t][c]f32, *[t]f32, *[t][f]f32) =
  let r2 = map rms_scale x
  let xn2 = map2 (\row r -> map (* r) row) x r2
  let hid = linear xn2 fc1
  in (linear (map (map relu) hid) fc2, xn2, r2, hid)

-- | One pre-norm transformer layer (T, C) -> (T, C), with its activations.
def block_acts [t][c][c3][f] (n_head: i64) (w: layer [c][c3][f]) (x: [t][c]f32)
                             : (*[t][c]f32, *layer_acts [t][c][f][n_head]) =
  let d = c / n_head
  let scale = f32.f64 (1 / f64.sqrt (f64.i64 d))
  let r1 = map rms_scale x
  let xn = map2 (\row r -> map (* r) row) x r1
  let qkv = linear xn w.wqkv  -- (T, 3C)
  let part k = map (\row -> #[unsafe] (row[k * c:k * c + c] :> [c]f32)) qkv
  let (q, k, v) = (part 0, part 1, part 2)
  let attend h =
    let (qh, kh) = (head d q h, head d k h)
    let probs = map2 (\i qi -> causal_softmax i (map (\kj -> dot qi kj * scale) kh)) (iota t) qh
    let vh = head d v h
    -- probs @ vh, written out: calling `matmul` (or `linear` with a
    -- transpose) here makes Futhark 0.25.34 fail with an internal error
    in (probs, tabulate_2d t d (\i j -> f32.sum (map2 (\pr vr -> pr * vr[j]) probs[i] vh)))
  let (probs, heads) = unzip (map attend (iota n_head))
  let y = merge_heads c heads
  let x = add_rows x (linear y w.wo)
  let (out, xn2, r2, hid) = mlp w.fc1 w.fc2 x
  in (add_rows x out, {xn, r1, q, k, v, probs, y, xn2, r2, hid})

-- | The first hidden states rmsnorm(wte[tok] + wpe[pos]) of a document's
-- tokens, with their rmsnorm scales.
def embed [v][b][c][t] (wte: [v][c]f32) (wpe: [b][c]f32) (tokens: [t]i32): (*[t][c]f32, *[t]f32) =
  let e = map2 (\tok pos -> map2 (+) wte[i64.i32 tok] wpe[pos]) tokens (iota t)
  let r0 = map rms_scale e
  in (map2 (\row r -> map (* r) row) e r0, r0)

-- | -log softmax(logits)[target], computed stably.
def cross_entropy [v] (logits: [v]f32) (target: i32): f32 =
  let top = f32.maximum logits
  let z = map (\l -> l - top) logits
  in f32.log (f32.sum (map f32.exp z)) - z[i64.i32 target]

-- | The cross-entropy of predicting targets[i] after inputs[0..i], for
-- each position i, with the layers run by `block_acts` (its activations
-- unused).  Position i depends on positions 0..i only, so a document
-- padded at its end has the same losses at its real positions.
def position_losses [p][t] (d: dims) (layout: []i64) (inputs: [t]i32) (targets: [t]i32) (flat: [p]f32): [t]f32 =
  let (v, b, c) = (d.vocab, d.block_size, d.n_embd)
  let (c3, f) = (3 * c, 4 * c)
  let (wte, wpe, lm_head) = embeddings flat layout v b c
  let (x0, _) = embed wte wpe inputs
  let x = loop x = x0 for l < d.n_layer do
            (block_acts d.n_head (layer_at flat layout c c3 f l) x).0
  in map2 cross_entropy (linear x lm_head) targets

-- | Mean cross-entropy over the T positions: what `vjp` differentiates for
-- the gradient oracle.
def loss [p][t] (d: dims) (layout: []i64) (inputs: [t]i32) (targets: [t]i32) (flat: [p]f32): f32 =
  f32.sum (position_losses d layout inputs targets flat) / f32.i64 t
