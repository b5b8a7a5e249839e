-- | What the programs' entry points are made of (kernels/c.fut,
-- multicore.fut, gpu.fut, their _batch programs and tests/oracle.fut: each
-- exports exactly what its backend calls at its batch size): the model and weights the host holds, the training
-- steps and their loop, the held-out losses and the sampler's call.
--
-- model.fut is the network, train.fut one training step with its
-- hand-written backward pass and Adam, batch.fut a step over B > 1
-- documents, sample.fut the sampler.  Parameters live in one flat f32
-- buffer in engine/params.py's order; the host passes the offset of each
-- matrix (`layout`), which `new_weights` checks.  The way the backward
-- products run (model.fut's `products`) is each program's, fixed when it
-- is compiled.

import "model"
import "train"
import "sample"
import "batch"

-- | What a run reads and never changes, kept in the Futhark context: the
-- dimensions, Adam's settings, the layout (3 + 6 n_layer offsets), and the
-- corpus as N tokens of D documents, document i being
-- tokens[offsets[i] : offsets[i] + lengths[i]] = [bos] ++ name ++ [bos],
-- of which a step reads the first windows[i] + 1 (see `window`).
-- `threads`: the multicore runtime's thread count, the tasks
-- futhark-multicore splits a large product into (#tasks; the other
-- programs do not read it).
type model [l][n][d] =
  {dims: dims, adam: adam, threads: i64, batch: i64, layout: [l]i64,
   tokens: [n]i32, offsets: [d]i64, windows: [d]i64}

-- | What training changes: P parameters, their Adam moments and the step.
-- A value of its own, apart from the model, so that `train` can consume it
-- and update its buffers in place (Futhark refuses to consume fields of a
-- record whose other fields the call still reads).  The buffers are held
-- as P / C rows of C (every matrix has a multiple of C entries): the update
-- pass is a parallel map over rows written back into the rows it read,
-- which Futhark does in place only for arrays of rows, and a flat buffer
-- reshaped to rows after the training loop would be copied.  The host
-- sees the flat arrays (new_weights, get_params, get_m, get_v).
type weights [rows][c] = {params: [rows][c]f32, m: [rows][c]f32, v: [rows][c]f32, step: i64}

def finite (x: f32): bool = !(f32.isnan x || f32.isinf x)

-- | A flat buffer as (P / C) rows of C values (every matrix has a
-- multiple of C entries; new_weights checks the layout).
def as_rows [p] (c: i64) (flat: [p]f32): [p / c][c]f32 =
  unflatten (flat :> [(p / c) * c]f32)

-- | Where training step `step` reads: document step % D, its first
-- T = min(block_size, length - 1) positions, no padding.  The inputs are
-- tokens[start : start + T], the targets one further: (start, T).
-- (T comes precomputed from new_model, and the callers slice with sizes
-- bound by `let`: sizes computed by calling a function, or returned
-- existentially, made Futhark 0.25.34 fail with internal errors.)
def window [l][n][d] (s: model [l][n][d]) (step: i64): (i64, i64) =
  let doc = step % d
  in (s.offsets[doc], s.windows[doc])

-- | Loss and gradient sources of one document at params (P / C, C).
def step_sources [l][n][d][rows][c][t] (products: products) (s: model [l][n][d]) (params: [rows][c]f32)
                                          (inputs: [t]i32) (targets: [t]i32) =
  let (c3, f, nv, nl) = (3 * c, 4 * c, s.dims.vocab, s.dims.n_layer)
  let (loss, sources) = backward s.dims s.layout products (flatten params) inputs targets
  -- a copy (a few T-row arrays) that does not alias params, which the
  -- in-place update consumes
  in (loss, copy sources :> sources [t][c][c3][f][nv][nl][2 + 7 * nl])

-- | The squared norm of the step's whole gradient, in f64, computed from
-- the sources before the in-place update writes anything: a weight's
-- gradient is sum_t coef_t x_t^T, whose squared Frobenius norm is
-- sum_{t,s} (coef_t . coef_s) (x_t . x_s), two (T, T) Gram matrices.
-- Training stops where it is not a finite f32, as the NumPy reference
-- (its isfinite(dot(g, g))) does: a finite loss can come with an
-- overflowed gradient (an overflowing rmsnorm gives uniform logits).
def gram [t][n] (a: [t][n]f32): [t][t]f64 =
  map (\x -> map (\y -> f64.sum (map2 (\p q -> f64.f32 p * f64.f32 q) x y)) a) a

def gram_dot [t] (a: [t][t]f64) (b: [t][t]f64): f64 =
  f64.sum (map2 (\r s -> f64.sum (map2 (*) r s)) a b)

def gradient_norm2 [t][c][c3][f][v][l][k] (period: i64) (s: sources [t][c][c3][f][v][l][k]): f64 =
  let add = map2 (map2 (+))
  let x0 = gram s.xs[0]
  let same_token = map (\a -> map (\b -> f64.bool (a == b)) s.inputs) s.inputs  -- wte's coefficients
  let position = tabulate_2d t t (\i j -> f64.bool (i % period == j % period))   -- wpe's
  let layer i =
    let (g, b) = (s.grads[i], 2 + 7 * i)
    let relu_hid = add (add (gram s.xs[b + 3]) (gram s.xs[b + 4])) (add (gram s.xs[b + 5]) (gram s.xs[b + 6]))
    in gram_dot (gram g.dqkv) (gram s.xs[b]) + gram_dot (gram g.dxmid) (gram s.xs[b + 1])
       + gram_dot (gram g.dhid) (gram s.xs[b + 2]) + gram_dot (gram g.dxout) relu_hid
  in gram_dot same_token x0 + gram_dot position x0 + gram_dot (gram s.dlogits) (gram s.xs[1])
     + f64.sum (map layer (iota l))

-- | The largest finite f32.
def largest_f32: f64 = 3.4028234663852886e38

-- | |x|, with NaN as infinity (so that a maximum keeps it).
def magnitude (x: f32): f32 = if f32.isnan x then f32.inf else f32.abs x

def abs_max [n][m] (a: [n][m]f32): f32 =
  f32.maximum (map (\row -> f32.maximum (map magnitude row)) a)

-- | Whether the gradient's squared norm is a finite f32.  Every element is
-- at most T * max|coef| * max|x| in size, and P times its square far below
-- the f32 range is the usual case: one cheap pass over the sources, and
-- the Gram matrices only when that bound does not settle it (28% of a
-- tiny step when computed every time).
def gradient_is_finite [t][c][c3][f][v][l][k] (p: i64) (period: i64) (s: sources [t][c][c3][f][v][l][k])
                                              : bool =
  let layer_max (g: layer_grads [t][c][c3][f]) =
    f32.maximum [abs_max g.dqkv, abs_max g.dxmid, abs_max g.dhid, abs_max g.dxout]
  let coef = f32.maximum [1, abs_max s.dlogits, f32.maximum (map layer_max s.grads)]
  let bound = f64.i64 t * f64.f32 coef * f64.f32 (f32.maximum (map abs_max s.xs))
  in f64.i64 p * bound * bound <= largest_f32 || gradient_norm2 period s <= largest_f32

-- | Adam's update at `step`, or none (a diverged step, ok = false).
def adam_at (a: adam) (step: i64) (ok: bool): update =
  let sc = adam_scalars a step
  in \p g m v -> if ok then adam_update sc p g m v else (p, m, v)

-- | What one training step does to the buffers, in place: at `step`, the
-- step's loss, whether it was applied (a finite loss and gradient), and
-- the new parameters and moments.
type^ advance [rows][c] =
  i64 -> *[rows][c]f32 -> *[rows][c]f32 -> *[rows][c]f32 -> (f32, bool, *[rows][c]f32, *[rows][c]f32, *[rows][c]f32)

-- | One document per step (microgpt's step): document step % D, unpadded.
def one_document [rows][c][l][n][d] (products: products) (s: model [l][n][d]) (step: i64)
    (params: *[rows][c]f32) (m: *[rows][c]f32) (v: *[rows][c]f32)
    : (f32, bool, *[rows][c]f32, *[rows][c]f32, *[rows][c]f32) =
  let (start, t) = window s step
  let (loss, sources) = step_sources products s params (s.tokens[start:start + t] :> [t]i32)
                                     (s.tokens[start + 1:start + 1 + t] :> [t]i32)
  let ok = finite loss && gradient_is_finite (rows * c) t sources
  let (params, m, v) = update_all s.dims (adam_at s.adam step ok) t sources params m v
  in (loss, ok, params, m, v)

-- | one_document with the update pass as two parallel maps
-- (update_all_merged), for the multicore backend on several threads
-- (multicore.fut's `train`).  Its own step: a branch between the two
-- passes inside one step copied the buffers (a futhark-c s256 step took
-- 11.7 ms against 8.1).
def one_document_merged [rows][c][l][n][d] (products: products) (s: model [l][n][d]) (step: i64)
    (params: *[rows][c]f32) (m: *[rows][c]f32) (v: *[rows][c]f32)
    : (f32, bool, *[rows][c]f32, *[rows][c]f32, *[rows][c]f32) =
  let (start, t) = window s step
  let (loss, sources) = step_sources products s params (s.tokens[start:start + t] :> [t]i32)
                                     (s.tokens[start + 1:start + 1 + t] :> [t]i32)
  let ok = finite loss && gradient_is_finite (rows * c) t sources
  let (params, m, v) = update_all_merged s.dims (adam_at s.adam step ok) t sources params m v
  in (loss, ok, params, m, v)

-- | Whether the squared norm of a batch's gradient of `rows` rows, row o
-- being `gradient o`, is a finite f32 (gradient_is_finite's test, computed
-- directly in f64).
def squared_norm_is_finite [c] (rows: i64) (gradient: i64 -> [c]f32): bool =
  f64.sum (map (\o -> f64.sum (map (\x -> f64.f32 x * f64.f32 x) (gradient o))) (iota rows)) <= largest_f32

-- | B documents per step (batch.fut's batch_gradient): one gradient of the
-- batch's mean loss, held whole, then the update.
def batch_of_documents [rows][c][l][n][d] (products: products) (s: model [l][n][d]) (step: i64)
    (params: *[rows][c]f32) (m: *[rows][c]f32) (v: *[rows][c]f32)
    : (f32, bool, *[rows][c]f32, *[rows][c]f32, *[rows][c]f32) =
  let b = s.batch
  let lengths = batch_lengths s.windows b step
  let t = i64.maximum lengths
  let tokens = batch_tokens s.dims s.tokens s.offsets lengths step (t + 1)
  let (loss, grads) = batch_gradient products s.dims s.layout params tokens lengths
  let row o = #[unsafe] grads[o]
  let ok = finite loss && squared_norm_is_finite rows row
  let (params, m, v) = update_from_gradient s.dims (adam_at s.adam step ok) row params m v
  in (loss, ok, params, m, v)

-- | Group q of `parts` groups of about B / parts of step `step`'s B
-- documents (the last group padded with empty documents), padded to the
-- group's longest document: the sum of its share of the batch's mean loss
-- (1 / count per position, count: the batch's real positions) and its
-- gradient, computed as the sequential program computes a batch's.
#[inline]
def group_gradient [rows][c][l][n][d] (parts: i64) (s: model [l][n][d]) (step: i64) (params: [rows][c]f32) (q: i64)
                                      : (f32, *[rows][c]f32) =
  let b = s.batch
  let lengths = batch_lengths s.windows b step
  let count = f32.i64 (i64.sum lengths)
  let per = (b + parts - 1) / parts
  let doc j = i64.min (b - 1) (q * per + j)
  let lens = tabulate per (\j -> if q * per + j < b then #[unsafe] lengths[doc j] else 0)
  -- the group's own longest, not the batch's: padding costs as much as a
  -- document (a group at tiny to s32 1.06x faster so, docs/performance.md)
  let t = i64.maximum lens
  let tokens = batch_tokens s.dims s.tokens s.offsets lengths step (t + 1)  -- past t cut short: not read
  let toks = tabulate per (\j -> #[unsafe] tokens[doc j])
  in batch_gradient_sum #sequential true s.dims s.layout params toks lens (1 / count)

-- | batch_of_documents by futhark-multicore for small models
-- (multicore_batch.fut's train_batch_parts): the B documents in `parts`
-- groups (group_gradient), each group's gradient computed by one task,
-- then the groups' gradients summed row by row into the update.  A step
-- is then three parallel loops (the groups, the finiteness test, the
-- update) where batch_of_documents has about a hundred, each waking the
-- threads for a few microseconds' work at these sizes (docs/performance.md,
-- "A batch in parts").  A group's step runs inside a task, so it calls no
-- function of its own (batch.fut's batch_gradient_sum, in_task: what such
-- a call returned there was never freed).  It holds a gradient per group,
-- and from s256 on the products' own tasks are as fast or faster, so
-- engine/backends/futhark_backend.py uses it for small models alone
-- (batches_in_parts).
def batch_in_parts [rows][c][l][n][d] (parts: i64) (s: model [l][n][d]) (step: i64)
    (params: *[rows][c]f32) (m: *[rows][c]f32) (v: *[rows][c]f32)
    : (f32, bool, *[rows][c]f32, *[rows][c]f32, *[rows][c]f32) =
  let count = f32.i64 (i64.sum (batch_lengths s.windows s.batch step))
  let (loss_sums, grads) = unzip (#[sequential_inner] map (group_gradient parts s step params) (iota parts))
  let loss = (loop sum = 0f32 for q < parts do sum + loss_sums[q]) / count  -- in group order, every run
  -- row o of the batch's gradient (computed where it is read: by the test
  -- and by the update, rather than summed into a buffer of its own); the
  -- first two rows added directly (a copy of the first went through the
  -- runtime's general copy, row by row: 1-3% of a tiny or learn step)
  let gradient o = #[unsafe] #[sequential]
                   if parts == 1 then copy grads[0, o]
                   else loop g = map2 (+) grads[0, o] grads[1, o] for q in 2..<parts do map2 (+) g grads[q, o]
  let ok = finite loss && squared_norm_is_finite rows gradient
  let (params, m, v) = update_from_gradient s.dims (adam_at s.adam step ok) gradient params m v
  in (loss, ok, params, m, v)

-- | Runs up to k steps of `advance`; returns the new weights and the k
-- losses.  A non-finite loss (or gradient) stops the loop without applying
-- that step's update (its loss is reported, the later entries stay NaN),
-- so the weights keep the parameters from before it.  The steps update the
-- weights' buffers in place (update_all): the weights passed in are
-- consumed.
def train_steps [rows][c] (advance: advance [rows][c]) ({params, m, v, step}: *weights [rows][c]) (k: i64)
                          : (weights [rows][c], [k]f32) =
  let (params, m, v, step, losses, _) =
    loop (params: *[rows][c]f32, m: *[rows][c]f32, v: *[rows][c]f32, step, losses: *[k]f32, i) =
         (params, m, v, step, replicate k f32.nan, 0)
    while i < k do
      let (loss, ok, params, m, v) = advance step params m v
      -- a finite loss with an overflowed gradient is reported as NaN, as NumPy does
      let reported = if ok || !(finite loss) then loss else f32.nan
      in (params, m, v, if ok then step + 1 else step, losses with [i] = reported, if ok then i + 1 else k)
  in ({params, m, v, step}, losses)

-- * What the entry points return
--
-- The model and the weights are opaque to the host.  Their fields are
-- read back through small getters rather than record projection, which
-- futhark-ffi lacks.  Each program's `train` binds the weights' fields one
-- by one: a record passed whole counts as self-aliased where train_steps
-- consumes its fields.

def model_of [l][n][d]
    (n_embd: i64) (n_layer: i64) (n_head: i64) (block_size: i64) (vocab: i64)
    (learning_rate: f64) (beta1: f64) (beta2: f64) (eps: f64) (num_steps: i64)
    (warmup_steps: i64) (threads: i64) (batch: i64)
    (layout: [l]i64) (tokens: [n]i32) (offsets: [d]i64) (lengths: [d]i32)
    : model [l][n][d] =
  let dims = {n_embd, n_layer, n_head, block_size, vocab}
  in {dims, adam = {learning_rate, beta1, beta2, eps, num_steps, warmup_steps}, threads, batch, layout, tokens,
      offsets,
      windows = map (\length -> i64.min block_size (i64.i32 length - 1)) lengths}

-- | Weights for the model from host arrays, once the layout is checked to
-- fit P parameters (the other entries trust it).
def weights_of [p][l][n][d] (s: model [l][n][d]) (params: [p]f32) (m: [p]f32) (v: [p]f32) (step: i64)
                             : weights [p / s.dims.n_embd][s.dims.n_embd] =
  let c = s.dims.n_embd
  in assert (layout_fits s.dims p s.layout) {params = as_rows c params, m = as_rows c m, v = as_rows c v, step}

-- | A run's first weights: params with zero moments, at step 0.
def first_weights [p][l][n][d] (s: model [l][n][d]) (params: [p]f32)
                               : weights [p / s.dims.n_embd][s.dims.n_embd] =
  weights_of s params (replicate p 0) (replicate p 0) 0

-- | The summed cross-entropy of each of H documents padded to T + 1 tokens
-- (inputs tokens[:, :T], targets one further) over its first lengths[i]
-- positions: a forward pass only, mapped over the documents.
def doc_loss_sums [p][h][t1] (d: dims) (layout: []i64) (tokens: [h][t1]i32) (lengths: [h]i64) (params: [p]f32)
                             : [h]f32 =
  let t = t1 - 1
  let doc row length =
    let losses = position_losses d layout (row[:t] :> [t]i32) (row[1:] :> [t]i32) params
    in f32.sum (map2 (\i x -> if i < length then x else 0) (iota t) losses)
  in map2 doc tokens lengths

-- | The held-out loss's parts: for H documents padded to T + 1 tokens,
-- each document's summed cross-entropy over its first lengths[i]
-- positions (doc_loss_sums), and that count.
def held_out_losses [rows][c][l][n][d][h][t1] (s: model [l][n][d]) (w: weights [rows][c]) (tokens: [h][t1]i32)
                                     (lengths: [h]i64): ([h]f32, [h]i64) =
  (doc_loss_sums s.dims s.layout tokens lengths (flatten w.params), lengths)

-- | num_samples names (samples first .. first + num_samples - 1) after bos
-- and the prefix, of at most max_length characters: row j holds the
-- max_length - len(prefix) tokens drawn after the prefix, then bos to the end.
def sample_names [rows][c][l][n][d][np] (s: model [l][n][d]) (w: weights [rows][c]) (prefix: [np]i32) (num_samples: i64)
                              (temperature: f64) (seed: u64) (first: i64) (max_length: i64): [num_samples][]i32 =
  sample_tokens s.dims s.layout (flatten w.params) prefix num_samples temperature seed first max_length
