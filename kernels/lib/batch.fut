-- | A training step over B documents (B > 1): which documents a step
-- reads, padded to the longest, and the gradient of the batch's mean
-- loss, computed over all N = B T positions of the step at once.
--
-- The step is engine/model/gpt.py's batched loss_and_grad: every linear
-- layer's forward and backward is one product over the N positions (rows
-- = positions, document j's at j T .. j T + T - 1), so a weight matrix is
-- read once per step and per product rather than once per document, and
-- the products are large enough to tile (rows_linear; the widest, as
-- axpys: axpy_product).  Each weight's gradient is a product too, dYᵀ X
-- with the N positions as its inner loop (transposed_product), and the gradient
-- is held whole, as the buffer's rows, for train.fut's update pass (at
-- B = 1 the update pass instead sums each row's gradient over the T ~ 7
-- positions as it goes).  Attention runs per document and head, reading
-- the queries, keys and values in place.  Padding adds nothing: its
-- dlogits are zero (batch_loss_and_dlogits), and it comes after each
-- document's real positions, which attend only to earlier ones, so every
-- activation gradient there is zero too.
--
-- B = 1 (microgpt's step, train.fut's one_document) shares none of these
-- functions: its products are model.fut's, shaped for T ~ 7 rows.
--
-- Every function here that takes weights or activations is #[inline] or
-- #[noinline] on purpose.  Inlined: with rows_linear, the layer and the
-- attention functions called as functions, Futhark 0.25.34 compiled a
-- step whose gradient was wrong for every layer below the last (1e-3 off
-- NumPy's and vjp's), depending on which other functions the program
-- held (model.fut's back_linear met the same bug: a weight matrix, a
-- view into the flat buffer, read from the wrong place).  Not inlined: a
-- few producers whose result a product reads (fc2's copy, the attention's
-- output and gradient), which, fused into the product, were read through
-- reshapes with an integer division per element.  (The transposes are
-- inlined and read as blocks: `transposed` says why.)  The tests hold the
-- step to vjp and NumPy at every such choice.

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

-- The product of N rows of x and O rows of w, x @ w.T, each row I values
-- (`tiled_product`): every element a dot product over I, computed by
-- tiles of the result that read a few rows of x and 2 of w, so each loaded
-- value serves several products (a plain dot product per element loads two
-- values per FMA), and whose dot products run in one loop as independent
-- chains of FMAs, to keep both of a core's FMA units busy through their
-- latency (5 cycles on Zen 2: 10 chains at 2 FMAs a cycle; the 2 x 2 tiles
-- before had 4, 0.8 FMA a cycle).  The batched programs are compiled so
-- that clang runs that loop once per vector of k, not interleaved
-- (engine/futhark/cc.py CLANG_TILE_CFLAGS): clang's own choice, 4 times,
-- keeps 4 times the sums, more than AVX2's 16 registers hold.  Rows shorter
-- than 128 end too soon to repay many sums' cross-lane additions, and
-- there a tile is 2 x 2 loops.  Rows past N or O repeat the last row and
-- are dropped.  The rows come from functions (x_row, w_row): a matrix's
-- row, a weight's row in the parameter buffer, or a row of a transpose
-- held as blocks (`transposed`), read in place.
--
-- One tiling for every product of this kind: Futhark 0.25.34 miscompiled
-- the multicore step whenever an `if` chose between two tilings at run
-- time (4 x 3 and 2 x 2 before, 4 x 2 and 5 x 2 since; docs/performance.md,
-- 2026-12-03).  The products whose output is 3 or 4 times as wide as
-- their inner dimension are of another kind, axpy_product, fixed by where
-- they are called, not chosen at run time.
-- How the result is written differs by program, fixed when it is
-- compiled (`products`).

-- | 5 x 2 tiles (10 chains), the result written by each program its own
-- way.  The sequential C program (also futhark-multicore on one thread, as
-- at `learn`) writes each tile's 10 sums straight into the result, a loop
-- updating it in place (rows padded to whole tiles, then sliced).  The
-- multicore program does the same in a task per run of ~1/32 of the
-- blocks of 5 rows, each into a flat array of its rows of exactly O
-- (flattened and unflattened, the tasks' rows are one contiguous [N][O]
-- to Futhark, and what reads them copies no more than before); a task
-- takes the weight's rows in chunks of ~64 KB, each read from L2 by all
-- its blocks rather than from L3 once per block.  The GPU program picks
-- each element out of its tile.  What was tried and measured, in
-- docs/performance.md: blocks as arrays of 5 rows, flattened (every result
-- copied twice, 8% of a `learn` step); picking on the CPU (r mod 5, 12% of
-- `learn`, and at `s128` and `s256` the multicore step 1.05x slower than
-- tasks); a task per block of 5 rows returning them as an array (`s64`
-- 1.5x slower: copied out, then read with a division per element); tasks'
-- rows padded to whole tiles (the copies into the activations' buffer
-- divided per element, 15% of an `s256` step); the sequential program
-- by the tasks' loop (`s64` 1.03x slower).
#[inline]
def tiles_5x2 [i] (p: products) (n: i64) (o: i64) (xr: i64 -> [i]f32) (wr: i64 -> [i]f32): *[n][o]f32 =
  let add2 (a0, a1) (b0, b1) = (a0 + b0, a1 + b1)
  let add4 (a0, a1, a2, a3) (b0, b1, b2, b3) = (a0 + b0, a1 + b1, a2 + b2, a3 + b3)
  let add10 (a0, a1, a2, a3, a4, a5, a6, a7, a8, a9) (b0, b1, b2, b3, b4, b5, b6, b7, b8, b9) =
    (a0 + b0, a1 + b1, a2 + b2, a3 + b3, a4 + b4, a5 + b5, a6 + b6, a7 + b7, a8 + b8, a9 + b9)
  let tile_1x2 (x0: [i]f32) (w0: [i]f32) (w1: [i]f32) =
    #[sequential] reduce_comm add2 (0, 0) (map (\k -> #[unsafe] (x0[k] * w0[k], x0[k] * w1[k])) (iota i))
  let tile_2x2 (x0: [i]f32) (x1: [i]f32) (w0: [i]f32) (w1: [i]f32) =
    let products k = #[unsafe] (x0[k] * w0[k], x0[k] * w1[k], x1[k] * w0[k], x1[k] * w1[k])
    in #[sequential] reduce_comm add4 (0, 0, 0, 0) (map products (iota i))
  let tile a b =
    let (x0, x1, x2, x3, x4) = (xr (5 * a), xr (5 * a + 1), xr (5 * a + 2), xr (5 * a + 3), xr (5 * a + 4))
    let (w0, w1) = (wr (2 * b), wr (2 * b + 1))
    in if i < 128
       then let (a0, a1, a2, a3) = tile_2x2 x0 x1 w0 w1
            let (a4, a5, a6, a7) = tile_2x2 x2 x3 w0 w1
            let (a8, a9) = tile_1x2 x4 w0 w1
            in (a0, a1, a2, a3, a4, a5, a6, a7, a8, a9)
       else let products k = #[unsafe] (x0[k] * w0[k], x0[k] * w1[k], x1[k] * w0[k], x1[k] * w1[k],
                                         x2[k] * w0[k], x2[k] * w1[k], x3[k] * w0[k], x3[k] * w1[k],
                                         x4[k] * w0[k], x4[k] * w1[k])
            in #[sequential] reduce_comm add10 (0, 0, 0, 0, 0, 0, 0, 0, 0, 0) (map products (iota i))
  let (blocks, pairs) = ((n + 4) / 5, (o + 1) / 2)
  in match p
     case #sequential ->
       let out = loop out = replicate (5 * blocks) (replicate (2 * pairs) 0f32) for a < blocks do
                   loop out for b < pairs do
                     let (a0, a1, a2, a3, a4, a5, a6, a7, a8, a9) = tile a b
                     let (r, c) = (5 * a, 2 * b)
                     in #[unsafe] out with [r, c] = a0 with [r, c + 1] = a1 with [r + 1, c] = a2
                                      with [r + 1, c + 1] = a3 with [r + 2, c] = a4 with [r + 2, c + 1] = a5
                                      with [r + 3, c] = a6 with [r + 3, c + 1] = a7 with [r + 4, c] = a8
                                      with [r + 4, c + 1] = a9
       in #[unsafe] out[:n, :o] :> [n][o]f32
     case #tasks _ ->
       -- blocks a0 .. a1 - 1 as rows of O, flat; a tile's second column
       -- past O (odd O) goes into its first, which is then written over
       let chunk = i64.max 1 (16384 / i)
       let rows a0 a1 (out: *[]f32) =
         loop out for q < (pairs + chunk - 1) / chunk do
           loop out for a in a0..<a1 do
             loop out for b in q * chunk..<i64.min pairs (q * chunk + chunk) do
               let (s0, s1, s2, s3, s4, s5, s6, s7, s8, s9) = tile a b
               let at = 5 * (a - a0) * o + 2 * b
               let at1 = if 2 * b + 1 < o then at + 1 else at
               in #[unsafe] out with [at1] = s1 with [at1 + o] = s3 with [at1 + 2 * o] = s5
                                with [at1 + 3 * o] = s7 with [at1 + 4 * o] = s9
                                with [at] = s0 with [at + o] = s2 with [at + 2 * o] = s4
                                with [at + 3 * o] = s6 with [at + 4 * o] = s8
       let per = (blocks + 31) / 32
       let tasks = (blocks + per - 1) / per
       let task k = rows (k * per) (i64.min blocks (k * per + per)) (replicate (5 * per * o) 0f32)
       let flat = flatten (map task (iota tasks)) :> [(tasks * 5 * per) * o]f32
       in #[unsafe] (unflatten flat)[:n] :> [n][o]f32
     case #gpu ->
       let tiles = map (\a -> map (tile a) (iota pairs)) (iota blocks)
       -- r / 5 as a multiply-high and a shift, c / 2 as a shift (/ and % on
       -- i64 are division calls: ~4% of a step)
       let pick r c = #[unsafe]
                      let a = i64.u64 (u64.mul_hi (u64.i64 r) 0xCCCCCCCCCCCCCCCD >> 2)
                      let (a0, a1, a2, a3, a4, a5, a6, a7, a8, a9) = tiles[a, c >> 1]
                      let q = r - 5 * a
                      let (e0, e1) = if q == 0 then (a0, a1) else if q == 1 then (a2, a3)
                                     else if q == 2 then (a4, a5) else if q == 3 then (a6, a7) else (a8, a9)
                      in if (c & 1) == 0 then e0 else e1
       in tabulate_2d n o pick

-- | x @ w.T by this program's tiles.
#[inline]
def tiled_product [i] (p: products) (n: i64) (o: i64) (x_row: i64 -> [i]f32) (w_row: i64 -> [i]f32): *[n][o]f32 =
  let xr a = x_row (i64.min (n - 1) a)
  let wr b = w_row (i64.min (o - 1) b)
  in tiles_5x2 p n o xr wr

-- | x @ w.T for x (N, I) and a weight w (O, I) stored as (out, in).
#[inline]
def rows_linear [n][i][o] (p: products) (x: [n][i]f32) (w: [o][i]f32): *[n][o]f32 =
  tiled_product p n o (\a -> #[unsafe] x[a]) (\b -> #[unsafe] w[b])

-- | Row r of a transpose held as blocks of 8 rows (`transposed`).
#[inline]
def row_of [k][n] (blocks: [k][8][n]f32) (r: i64): [n]f32 = #[unsafe] blocks[r >> 3, r & 7]

-- | x (N, M) transposed, as blocks of 8 of its M rows of N (row r is
-- blocks[r >> 3, r & 7], `row_of`; rows past M repeat the last): the
-- transposed operands of the products (a view would be read with a
-- stride in their inner loops).  Each block reads 8 adjacent columns of x
-- (a cache line's worth per row of x) and writes them into its 8 rows in
-- place; the map over blocks is the multicore backend's parallel work.
-- Inlined, and read as blocks rather than flattened to (M, N): a
-- transposing function of its own received its argument as a copy (the
-- activations and weights are views, into the layers' buffer and the
-- parameters; 8% of an `s256` step, the copy dividing per element), and
-- the rows of a flattened result were read with divisions per element.
-- (Futhark's own transposing copy, by tasks, also divided per element:
-- 13% of an s64 step.)
#[inline]
def transposed [n][m] (p: products) (x: [n][m]f32): *[(m + 7) / 8][8][n]f32 =
  let column c = #[unsafe] i64.min (m - 1) c
  let block q = #[unsafe] loop out = replicate 8 (replicate n 0f32) for b < n do
                  loop out for a < 8 do out with [a, b] = x[b, column (8 * q + a)]
  in match p
     case #tasks _ -> map block (iota ((m + 7) / 8))
     case #sequential -> #[sequential] map block (iota ((m + 7) / 8))
     case #gpu -> tabulate_3d ((m + 7) / 8) 8 n (\q a b -> #[unsafe] x[b, column (8 * q + a)])

-- | x @ wt for x (N, I) and wt (I, O) held as `transposed` blocks.
#[inline]
def rows_by_transposed [n][i][k] (p: products) (o: i64) (x: [n][i]f32) (wt: [k][8][i]f32): *[n][o]f32 =
  tiled_product p n o (\a -> #[unsafe] x[a]) (row_of wt)

-- | xt.T @ yt for two `transposed` blocks, N and O rows.
#[inline]
def transposed_product [kx][ky][i] (p: products) (n: i64) (o: i64) (xt: [kx][8][i]f32) (yt: [ky][8][i]f32): *[n][o]f32 =
  tiled_product p n o (row_of xt) (row_of yt)

-- | x @ m for x (N, K) and m (K, O), m's rows from a function (m_row), as
-- rows of axpys: each block of 4 rows of the result is added into in
-- place, 4 rows of m (scaled by the block's 4 x 4 values of x) at a time,
-- a loop along the output's O columns that clang vectorises with no
-- cross-lane sums.  Faster than the tiles' dot products where a row of
-- the result is wide and the inner dimension short (a tile's cross-lane
-- sums then cost as much as its multiply-adds): (448, 32) by (32, 96)
-- 2.3x, (448, 64) by (64, 192) 2.2x, (448, 256) by (256, 768) 1.3x
-- (`futhark bench`, one thread); slower where the result's rows are
-- narrow ((448, 128) by (128, 32) 1.7x slower; square ones within 10%
-- either way), so only the products whose output is 3 or 4 times as wide
-- as their input use it (and fc2's gradient, batch_block_back says).
-- Each element is summed in k order by one thread: the same bits every run.  The multicore tasks write flat rows,
-- as tiles_5x2's do (rows of their own, flattened, made the s128 and s256
-- steps 5% slower).
#[inline]
def axpy_product [k] (p: products) (n: i64) (o: i64) (x: [n][k]f32) (m_row: i64 -> [o]f32): *[n][o]f32 =
  let (quads, blocks) = ((k + 3) / 4, (n + 3) / 4)
  -- result rows 4 a .. 4 a + 3 (past N: repeats of the last) added into
  -- the rows of O from out[at] on (flat, as tiles_5x2's tasks write theirs)
  let block (out: *[]f32) (at: i64) (a: i64): *[]f32 =
    let row e = i64.min (n - 1) (4 * a + e)
    let (s0, s1, s2, s3) = (row 0, row 1, row 2, row 3)
    in loop out for q < quads do
         let kt e = i64.min (k - 1) (4 * q + e)
         let coef s e = if 4 * q + e < k then #[unsafe] x[s, 4 * q + e] else 0
         let (m0, m1, m2, m3) = (m_row (kt 0), m_row (kt 1), m_row (kt 2), m_row (kt 3))
         let (a0, a1, a2, a3) = (coef s0 0, coef s0 1, coef s0 2, coef s0 3)
         let (b0, b1, b2, b3) = (coef s1 0, coef s1 1, coef s1 2, coef s1 3)
         let (c0, c1, c2, c3) = (coef s2 0, coef s2 1, coef s2 2, coef s2 3)
         let (d0, d1, d2, d3) = (coef s3 0, coef s3 1, coef s3 2, coef s3 3)
         in loop out for j < o do
              let (w0, w1, w2, w3) = #[unsafe] (m0[j], m1[j], m2[j], m3[j])
              let (r0, r1, r2, r3) = (at + j, at + o + j, at + 2 * o + j, at + 3 * o + j)
              in #[unsafe] out with [r0] = out[r0] + a0 * w0 + a1 * w1 + a2 * w2 + a3 * w3
                               with [r1] = out[r1] + b0 * w0 + b1 * w1 + b2 * w2 + b3 * w3
                               with [r2] = out[r2] + c0 * w0 + c1 * w1 + c2 * w2 + c3 * w3
                               with [r3] = out[r3] + d0 * w0 + d1 * w1 + d2 * w2 + d3 * w3
  in match p
     case #sequential ->
       let out = loop out = replicate (4 * blocks * o) 0f32 for a < blocks do block out (4 * a * o) a
       in #[unsafe] (unflatten (out :> [(4 * blocks) * o]f32))[:n] :> [n][o]f32
     case #tasks _ ->
       -- a task per run of ~1/32 of the blocks, each into rows of its own
       let per = (blocks + 31) / 32
       let tasks = (blocks + per - 1) / per
       let task t = loop out = replicate (4 * per * o) 0f32 for a in t * per..<i64.min blocks (t * per + per) do
                      block out (4 * (a - t * per) * o) a
       let flat = flatten (map task (iota tasks)) :> [(tasks * 4 * per) * o]f32
       in #[unsafe] (unflatten flat)[:n] :> [n][o]f32
     case #gpu -> tabulate_2d n o (\s j -> #[unsafe] loop sum = 0f32 for e < k do sum + x[s, e] * (m_row e)[j])

-- * The step's weights

-- | Rows r .. r + o - 1 of the parameter buffer (rows of C), copied.
-- Read as rows of the buffer, not through a flat view of it: Futhark
-- indexed such a view with an integer division per element (the buffer's
-- layout is not known to be contiguous), 5% of a step.
#[inline]
def weight_rows [rows][c] (params: [rows][c]f32) (r: i64) (o: i64): *[o][c]f32 =
  copy (#[unsafe] params[r:r + o] :> [o][c]f32)

-- | Layer l's weights, copied out of the buffer (P values a step, a small
-- part of its N P multiply-adds), and transposed for the backward pass:
-- dy @ w, the gradient of rows_linear with respect to its input, is
-- rows_by_transposed of dy and w.T, whose tiles then read contiguous rows;
-- fc2's (4 times as wide as dy) is axpy_product of fc2's own C rows of 4C.
-- fc2 (C, 4C) lies in the buffer as 4C rows of C, row 4 a + q holding
-- columns q C .. q C + C - 1 of its row a.
type layer_t [kc][c][c3][f] = {wqkv: [kc][8][c3]f32, wo: [kc][8][c]f32, fc1: [kc][8][f]f32, fc2: [c][f]f32}

#[inline]
def fc2_rows [rows][c] (params: [rows][c]f32) (r: i64): *[c][4 * c]f32 =
  map (\a -> flatten (#[unsafe] params[r + 4 * a:r + 4 * a + 4] :> [4][c]f32)) (iota c)

#[noinline]
def fc2_rows_apart [rows][c] (params: [rows][c]f32) (r: i64): *[c][4 * c]f32 = fc2_rows params r

-- | fc2_rows as a function of its own, or inlined where the step runs
-- inside a task (`in_task`, batch_gradient_sum says why).
#[inline]
def fc2_rows_at [rows][c] (in_task: bool) (params: [rows][c]f32) (r: i64): *[c][4 * c]f32 =
  if in_task then fc2_rows params r else fc2_rows_apart params r

-- | Layer l's weights for the forward pass: wqkv and fc1 transposed
-- (axpy_product's m), wo and fc2 as rows (rows_linear's w).
type layer_f [kc][c][c3][f] = {wqkv: [kc][8][c3]f32, wo: [c][c]f32, fc1: [kc][8][f]f32, fc2: [c][f]f32}

#[inline]
def layer_rows [rows][c] (p: products) (in_task: bool) (params: [rows][c]f32) (layout: []i64) (c3: i64) (f: i64)
                         (l: i64): layer_f [(c + 7) / 8][c][c3][f] =
  let at j = layout[3 + 6 * l + j] / c
  in {wqkv = transposed p (#[unsafe] params[at 0:at 0 + c3] :> [c3][c]f32), wo = weight_rows params (at 3) c,
      fc1 = transposed p (#[unsafe] params[at 4:at 4 + f] :> [f][c]f32),
      fc2 = fc2_rows_at in_task params (at 5) :> [c][f]f32}

#[inline]
def layer_rows_t [rows][c] (p: products) (in_task: bool) (params: [rows][c]f32) (layout: []i64) (c3: i64) (f: i64)
                           (l: i64): layer_t [(c + 7) / 8][c][c3][f] =
  let at j = layout[3 + 6 * l + j] / c
  in {wqkv = transposed p (#[unsafe] params[at 0:at 0 + c3] :> [c3][c]f32),
      wo = transposed p (#[unsafe] params[at 3:at 3 + c] :> [c][c]f32),
      fc1 = transposed p (#[unsafe] params[at 4:at 4 + f] :> [f][c]f32),
      fc2 = fc2_rows_at in_task params (at 5) :> [c][f]f32}

-- * Per position
--
-- The row-wise steps between the products (rmsnorm, residual sums, relu
-- and its mask): a map over the positions, each row's own work
-- sequential (as parallel maps, Futhark made the inner maps parallel
-- loops per position).  The formulas are model.fut's rms_scale and
-- rmsnorm_back, with their inner sums and maps marked sequential.  (The
-- multicore program ran the positions as a sequential loop while waking
-- a worker cost ~20 us; with the workers' spin, engine/futhark/spin_wait.h,
-- the parallel maps are 1-5% faster: docs/performance.md.)

-- | Each row's rmsnorm (without weights) and its scale.
#[inline]
def normalised [n][c] (x: [n][c]f32): ([n][c]f32, [n]f32) =
  unzip (map (\r -> let row = #[unsafe] x[r]
                    let s = 1 / f32.sqrt (#[sequential] f32.sum (map (\a -> a * a) row) / f32.i64 c + 1e-5)
                    in (#[sequential] map (* s) row, s)) (iota n))

#[inline]
def added [n][c] (x: [n][c]f32) (y: [n][c]f32): *[n][c]f32 =
  map (\r -> #[sequential] map2 (+) (#[unsafe] x[r]) (#[unsafe] y[r])) (iota n)

-- | model.fut's rmsnorm_back of one row.
#[inline]
def norm_back_row [c] (dy: [c]f32) (y: [c]f32) (r: f32): [c]f32 =
  let mean_dy_y = #[sequential] f32.sum (map2 (*) dy y) / f32.i64 c
  in #[sequential] map2 (\d yv -> r * (d - yv * mean_dy_y)) dy y

-- | dx plus the gradient back through y = rmsnorm(x) (scales r) from dy.
#[inline]
def add_norm_back [n][c] (dx: [n][c]f32) (dy: [n][c]f32) (y: [n][c]f32) (r: [n]f32): *[n][c]f32 =
  map (\i -> #[unsafe] #[sequential] map2 (+) dx[i] (norm_back_row dy[i] y[i] r[i])) (iota n)

-- * Attention, per document and head
--
-- Read in place from the (N, 3C) rows of queries, keys and values
-- (position i of document j is row j T + i; head h's part of each is
-- columns h D .. h D + D - 1), and each document's sums written into
-- (T, C) rows of its own, which flattened are the (N, C) rows: heads
-- copied out into blocks of their own, or merged back, were permuting
-- copies, element by element (11% of an s64 step).  Position i attends to
-- positions i2 <= i only, so every sum below runs over those (the
-- weights past i are zero).
--
-- The weighted sums of rows run with i2, the position attended to,
-- outermost: each addition goes to another row than the one before, so
-- none waits on the last one's store.  Summed one output row at a time
-- (i2 innermost, the row's D sums in memory), every addition waited on
-- its row's previous one: at D = 8 those sums were 11% of futhark-c's
-- `learn` step, and the step in parts 1.2-1.5x slower.  Each sum still
-- adds its terms in increasing i2, as before.

-- | Document j's row i, head hh's D columns from `first` on: a view.
#[inline]
def head_row [n][m] (t: i64) (d: i64) (x: [n][m]f32) (first: i64) (j: i64) (hh: i64) (i: i64): [d]f32 =
  #[unsafe] x[j * t + i, first + hh * d:first + hh * d + d] :> [d]f32

-- | Every document's causal attention weights per head (B, H, T, T) from
-- qkv (N, 3C).
#[inline]
def attention_weights [n][c3] (b: i64) (t: i64) (h: i64) (d: i64) (scale: f32) (qkv: [n][c3]f32)
    : *[b][h][t][t]f32 =
  let c = h * d
  in tabulate_3d b h t (\j hh i ->
       let q = head_row t d qkv 0 j hh i
       -- causal_softmax ignores the scores past i
       in causal_softmax i (tabulate t (\i2 -> if i2 <= i then dot q (head_row t d qkv c j hh i2) * scale else 0)))

-- | The attention output (N, C): position i's head hh is sum_i2 p[i, i2] v[i2].
-- Inlined where the step runs inside a task (batch_gradient_sum's
-- in_task), a function of its own elsewhere (attention_output_apart:
-- fused into the next product, its reshape was read with divisions on
-- multicore).
#[inline]
def attention_output [n][c3] (b: i64) (t: i64) (h: i64) (d: i64) (qkv: [n][c3]f32)
                             (probs: [b][h][t][t]f32): *[n][h * d]f32 =
  let c = h * d
  let doc j = #[unsafe]
    loop out = replicate t (replicate c 0f32) for i2 < t do
      loop out for i in i2..<t do
        loop out for hh < h do
          let w = probs[j, hh, i, i2]
          in loop out for e < d do out with [i, hh * d + e] = out[i, hh * d + e] + w * qkv[j * t + i2, 2 * c + hh * d + e]
  in flatten (map doc (iota b)) :> [n][h * d]f32

-- | Back through the attention: the gradient of the queries, keys and
-- values (N, 3C) from the output's gradient dy (N, C).
#[inline]
def attention_back [n][c3][c] (b: i64) (t: i64) (h: i64) (d: i64) (scale: f32) (qkv: [n][c3]f32)
                              (probs: [b][h][t][t]f32) (dy: [n][c]f32): *[n][c3]f32 =
  -- datt[i, i2] = p (dp - sum_i2 p dp) scale, dp[i, i2] = dy_i . v_i2
  let datt = tabulate_3d b h t (\j hh i ->
               let p = #[unsafe] probs[j, hh, i]
               let dyi = head_row t d dy 0 j hh i
               let dp = tabulate t (\i2 -> if i2 <= i then dot dyi (head_row t d qkv (2 * c) j hh i2) else 0)
               let s = dot p dp
               in map2 (\pv dv -> pv * (dv - s) * scale) p dp)
  -- dq_i = sum_{i2 <= i} datt[i, i2] k_i2, dk_i = sum_{i2 >= i} datt[i2, i] q_i2,
  -- dv_i = sum_{i2 >= i} p[i2, i] dy_i2
  let doc j = #[unsafe]
    loop out = replicate t (replicate (3 * c) 0f32) for i2 < t do
      let r2 = j * t + i2
      let out = loop out for i in i2..<t do
                  loop out for hh < h do
                    let w = datt[j, hh, i, i2]
                    in loop out for e < d do out with [i, hh * d + e] = out[i, hh * d + e] + w * qkv[r2, c + hh * d + e]
      in loop out for i < i2 + 1 do
           loop out for hh < h do
             let (wk, wv) = (datt[j, hh, i2, i], probs[j, hh, i2, i])
             in loop out for e < d do
                  let (ek, ev) = (c + hh * d + e, 2 * c + hh * d + e)
                  in out with [i, ek] = out[i, ek] + wk * qkv[r2, hh * d + e]
                         with [i, ev] = out[i, ev] + wv * dy[r2, hh * d + e]
  in flatten (map doc (iota b)) :> [n][c3]f32

#[noinline]
def attention_output_apart [n][c3] (b: i64) (t: i64) (h: i64) (d: i64) (qkv: [n][c3]f32) (probs: [b][h][t][t]f32)
    : *[n][h * d]f32 =
  attention_output b t h d qkv probs

#[noinline]
def attention_back_apart [n][c3][c] (b: i64) (t: i64) (h: i64) (d: i64) (scale: f32) (qkv: [n][c3]f32)
                                    (probs: [b][h][t][t]f32) (dy: [n][c]f32): *[n][c3]f32 =
  attention_back b t h d scale qkv probs dy

-- * Forward

-- | What a layer computed over the N positions that its gradient needs:
-- the queries, keys and values, the attention weights per document and
-- head, and relu of fc1's output (relu(h) > 0 exactly where h > 0, its
-- gradient's mask).
type batch_acts [n][b][h][t][c][c3][f] =
  {xn: [n][c]f32, r1: [n]f32,
   qkv: [n][c3]f32,
   probs: [b][h][t][t]f32,
   y: [n][c]f32,
   xn2: [n][c]f32, r2: [n]f32,
   act: [n][f]f32}

-- | One pre-norm transformer layer over the N positions of B documents of
-- T positions, with its activations.
#[inline]
def batch_block [n][kc][c][c3][f] (p: products) (in_task: bool) (h: i64) (b: i64) (t: i64) (w: layer_f [kc][c][c3][f])
                              (x: [n][c]f32)
                              : (*[n][c]f32, batch_acts [n][b][h][t][c][c3][f]) =
  let d = c / h
  let scale = f32.f64 (1 / f64.sqrt (f64.i64 d))
  let (xn, r1) = normalised x
  let qkv = axpy_product p n c3 xn (row_of w.wqkv)  -- (N, 3C)
  let probs = attention_weights b t h d scale qkv
  let y = (if in_task then attention_output b t h d qkv probs
           else attention_output_apart b t h d qkv probs) :> [n][c]f32
  let x = added x (rows_linear p y w.wo)
  let (xn2, r2) = normalised x
  let hid = axpy_product p n f xn2 (row_of w.fc1)
  let act = map (\r -> #[sequential] map relu (#[unsafe] hid[r])) (iota n)
  let x = added x (rows_linear p act w.fc2)
  in (x, {xn, r1, qkv, probs, y, xn2, r2, act})

-- | The summed loss of the real positions (position r is real where r % T
-- < lengths[r / T]), and the gradient of the batch's mean loss (scale = 1
-- / the real positions' count) with respect to the logits: (softmax -
-- one_hot) scale at the real positions, zero at the padding.
def batch_loss_and_dlogits [n][v][c][b] (p: products) (lm_head: [v][c]f32) (x: [n][c]f32) (targets: [n]i32)
                                        (lengths: [b]i64) (t: i64) (scale: f32): (f32, *[n][v]f32) =
  let real r = #[unsafe] r % t < lengths[r / t]
  let (losses, dlogits) = unzip (position_dlogits (rows_linear p x lm_head) targets (\r -> if real r then scale else 0))
  let real_losses = map2 (\r loss -> if real r then loss else 0) (iota n) losses
  -- summed in position order on the CPUs (futhark-multicore's parallel sum
  -- split the positions as its threads took them, so its last bits changed
  -- from run to run); a GPU's sum is a tree of fixed shape
  let loss_sum = match p
                 case #gpu -> f32.sum real_losses
                 case _ -> loop sum = 0f32 for r < n do sum + #[unsafe] real_losses[r]
  in (loss_sum, dlogits)

-- * Backward

-- | Back through one layer over the N positions, from dx, the gradient
-- with respect to its output: the gradient with respect to its input,
-- and its weights' gradients as the buffer's 12 C rows (wq, wk, wv, wo,
-- fc1, fc2's rows of 4C as four rows of C), each a product dYᵀ X over the
-- N positions (transposed_product of the transposed activations: its
-- inner loop runs over the positions).  fc2's, whose rows are 4C wide,
-- is axpy_product over the positions in the sequential code (no
-- transposes: futhark-c's s64 step 3% faster, s128 in parts 6%); the
-- multicore tasks keep the tiles, where each task would read all of the
-- activations.  `w`: the layer's weights, transposed.
#[inline]
def batch_block_back [n][b][h][t][kc][c][c3][f] (p: products) (in_task: bool) (w: layer_t [kc][c][c3][f])
                                            (a: batch_acts [n][b][h][t][c][c3][f])
                                            (dx: [n][c]f32): (*[n][c]f32, *[12 * c][c]f32) =
  let d = c / h
  let scale = f32.f64 (1 / f64.sqrt (f64.i64 d))
  -- fc2's gradient (C, 4C) as the buffer's 4C rows of C
  let as_rows (g: [c][f]f32): *[f][c]f32 = tabulate_2d f c (\r e -> #[unsafe] g[r / 4, (r % 4) * c + e])
  -- x_out = x_mid + relu(xn2 @ fc1.T) @ fc2.T
  let g_fc2 = match p  -- (C, 4C)
              case #sequential -> axpy_product p c f (transpose dx) (\s -> #[unsafe] a.act[s])
              case _ -> transposed_product p c f (transposed p dx) (transposed p a.act)
  let dact = axpy_product p n f dx (\k -> #[unsafe] w.fc2[k])
  let dhid = map (\r -> #[unsafe] #[sequential] map2 (\g av -> if av > 0 then g else 0) dact[r] a.act[r]) (iota n)
  let g_fc1 = transposed_product p f c (transposed p dhid) (transposed p a.xn2)  -- (4C, C)
  let dxn2 = rows_by_transposed p c dhid w.fc1
  let dxmid = add_norm_back dx dxn2 a.xn2 a.r2
  -- x_mid = x_in + attn(xn) @ wo.T
  let g_wo = transposed_product p c c (transposed p dxmid) (transposed p a.y)  -- (C, C)
  let dy = rows_by_transposed p c dxmid w.wo
  let dqkv = if in_task then attention_back b t h d scale a.qkv a.probs dy
             else attention_back_apart b t h d scale a.qkv a.probs dy
  let g_qkv = transposed_product p c3 c (transposed p dqkv) (transposed p a.xn)  -- (3C, C)
  let dxn = rows_by_transposed p c dqkv w.wqkv
  let grads = (g_qkv ++ g_wo ++ g_fc1 ++ as_rows g_fc2) :> [12 * c][c]f32
  in (add_norm_back dxmid dxn a.xn a.r1, grads)

-- | The batch's mean loss over its real positions, and its gradient as
-- the parameter buffer's rows (engine/params.py's layout, rows of C): a
-- forward pass over the N = B T positions of the step (document j's at
-- j T .. j T + T - 1), then a backward pass that computes every weight's
-- gradient as products over those positions.  batch_gradient_sum takes
-- the loss's scale (1 / the real positions' count) and returns the sum of
-- the scaled losses, so that groups of a batch's documents can each take
-- their share (microgpt.fut's batch_in_parts); batch_gradient is the whole
-- batch's.
--
-- in_task: the step runs inside a task of the multicore program (a group
-- of batch_in_parts).  There Futhark 0.25.34 never frees what a function
-- of its own returns (a step at learn in parts leaked 250 KB, at s64 1.2
-- MB), so every function is inlined; elsewhere the few producers above
-- are functions of their own (the header says why).  Inlined too: called
-- from more than one place, a function this large can stay one, its
-- buffers allocated and zeroed anew each call.
#[inline]
def batch_gradient_sum [rows][c][b][t1][l] (p: products) (in_task: bool) (dm: dims) (layout: [l]i64) (params: [rows][c]f32)
                                           (tokens: [b][t1]i32) (lengths: [b]i64) (scale: f32)
                                           : (f32, *[rows][c]f32) =
  let t = t1 - 1
  let n = b * t
  let (c3, f, nv, nl, h) = (3 * c, 4 * c, dm.vocab, dm.n_layer, dm.n_head)
  let matrix_rows j o = weight_rows params (layout[j] / c) o
  let (wte, wpe, lm_head) = (matrix_rows 0 nv, matrix_rows 1 dm.block_size, matrix_rows 2 nv)
  let inputs = flatten (map (\row -> row[:t] :> [t]i32) tokens) :> [n]i32
  let targets = flatten (map (\row -> row[1:] :> [t]i32) tokens) :> [n]i32
  -- forward
  let e = map2 (\tok r -> #[unsafe] map2 (+) wte[i64.i32 tok] wpe[r % t]) inputs (iota n)
  let (x0, r0) = normalised e
  -- the activations' buffer starts as zeros: Futhark has no uninitialised
  -- arrays, and each layer's entry is then written in place
  let zeros m = replicate n (replicate m 0f32)
  let none: batch_acts [n][b][h][t][c][c3][f] =
    {xn = zeros c, r1 = replicate n 0, qkv = zeros c3,
     probs = replicate b (replicate h (replicate t (replicate t 0))), y = zeros c,
     xn2 = zeros c, r2 = replicate n 0, act = zeros f}
  let (x, acts) =
    loop (x, acts) = (copy x0, replicate nl none) for j < nl do
      let (x, a) = batch_block p in_task h b t (layer_rows p in_task params layout c3 f j) x
      in (x, acts with [j] = (a :> batch_acts [n][b][h][t][c][c3][f]))
  let (loss_sum, dlogits) = batch_loss_and_dlogits p lm_head x targets lengths t scale
  -- backward: the gradient rows of each layer, top down, then lm_head,
  -- wpe and wte
  let head_end = 2 * nv + dm.block_size
  let grads = replicate rows (replicate c 0f32)
  let (dx, grads) =
    loop (dx, grads) = (rows_by_transposed p c dlogits (transposed p lm_head), grads) for i < nl do
      let j = nl - 1 - i
      let (dx, g) = batch_block_back p in_task (layer_rows_t p in_task params layout c3 f j) acts[j] dx
      let first = head_end + 12 * c * j
      in (dx, grads with [first:first + 12 * c] = g)
  let dx0 = map (\i -> #[unsafe] norm_back_row dx[i] x0[i] r0[i]) (iota n)
  let g_head = transposed_product p nv c (transposed p dlogits) (transposed p x)  -- (V, C)
  -- wte: token v's row the sum of dx0 over the positions holding v, in
  -- position order (as one document's np.add.at); wpe: position i's row the sum
  -- over the documents of their position i (none past T).  A parallel
  -- reduce_by_index adds in whatever order the threads (or a GPU's atomics)
  -- meet the rows: two futhark-multicore runs of one batch differed after 3
  -- steps.  So in parallel each token's row (on a GPU: each value) is
  -- summed by one thread, and only the sequential program keeps
  -- reduce_by_index, which goes in position order.
  let token_rows v = #[unsafe] loop acc = replicate c 0f32 for i < n do
                       if inputs[i] != i32.i64 v then acc
                       else loop acc for e < c do acc with [e] = acc[e] + dx0[i, e]
  let g_wte = match p
              case #sequential -> reduce_by_index (replicate nv (replicate c 0)) (map2 (+)) (replicate c 0)
                                                  (map i64.i32 inputs) dx0
              case #tasks _ -> tabulate nv token_rows
              case #gpu -> tabulate_2d nv c (\v e -> #[unsafe] loop sum = 0f32 for i < n do
                                                      if inputs[i] == i32.i64 v then sum + dx0[i, e] else sum)
  let per_doc = unflatten (dx0 :> [b * t][c]f32)
  let g_wpe = tabulate dm.block_size (\i -> if i < t
                                             then #[unsafe] loop s = replicate c 0 for j < b do map2 (+) s per_doc[j, i]
                                             else replicate c 0)
  let grads = grads with [0:nv] = g_wte
  let grads = grads with [nv:nv + dm.block_size] = g_wpe
  let grads = grads with [nv + dm.block_size:head_end] = g_head
  in (loss_sum, grads)

def batch_gradient [rows][c][b][t1][l] (p: products) (dm: dims) (layout: [l]i64) (params: [rows][c]f32)
                                       (tokens: [b][t1]i32) (lengths: [b]i64): (f32, *[rows][c]f32) =
  let count = f32.i64 (i64.sum lengths)
  let (loss_sum, grads) = batch_gradient_sum p false dm layout params tokens lengths (1 / count)
  in (loss_sum / count, grads)
