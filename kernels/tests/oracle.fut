-- | The tests' program (generated for the c target alone, used only by
-- tests/): `vjp` of the forward pass as the oracle of training's
-- hand-written gradient, and the GPU programs' step (#gpu products) run by
-- sequential C, so that it is held to the oracle where no GPU is.  Its
-- model and weights are its own (opaque values belong to one program):
-- the tests pass parameters and moments through the host.

import "../lib/model"
import "../lib/batch"
import "../lib/microgpt"

entry new_model [l][n][d]
    (n_embd: i64) (n_layer: i64) (n_head: i64) (block_size: i64) (vocab: i64)
    (learning_rate: f64) (beta1: f64) (beta2: f64) (eps: f64) (num_steps: i64)
    (warmup_steps: i64) (threads: i64) (batch: i64)
    (layout: [l]i64) (tokens: [n]i32) (offsets: [d]i64) (lengths: [d]i32)
    : model [l][n][d] =
  model_of n_embd n_layer n_head block_size vocab learning_rate beta1 beta2 eps num_steps warmup_steps threads batch
           layout tokens offsets lengths

entry new_weights [p][l][n][d] (s: model [l][n][d]) (params: [p]f32) (m: [p]f32) (v: [p]f32)
                               (step: i64): weights [p / s.dims.n_embd][s.dims.n_embd] =
  weights_of s params m v step

entry get_params [rows][c] (w: weights [rows][c]): [rows * c]f32 = flatten w.params
entry get_m [rows][c] (w: weights [rows][c]): [rows * c]f32 = flatten w.m

-- | The loss and gradient of training step `step` at the weights'
-- parameters, from `vjp` of model.fut's `loss` (at B > 1, of the mean of
-- doc_loss_sums over the batch's real positions): the oracle the tests
-- hold training's own gradient to (with beta1 = 0, Adam's first moment
-- after a step is exactly that step's gradient).
entry grad_vjp [rows][c][l][n][d] (s: model [l][n][d]) (w: weights [rows][c]) (step: i64)
                                  : (f32, [rows * c]f32) =
  if s.batch == 1 then
    let (start, t) = window s step
    let inputs = s.tokens[start:start + t] :> [t]i32
    let targets = s.tokens[start + 1:start + 1 + t] :> [t]i32
    in vjp2 (loss s.dims s.layout inputs targets) (flatten w.params) 1
  else
    let lengths = batch_lengths s.windows s.batch step
    let t = i64.maximum lengths
    let tokens = batch_tokens s.dims s.tokens s.offsets lengths step (t + 1)
    let mean flat = f32.sum (doc_loss_sums s.dims s.layout tokens lengths flat) / f32.i64 (i64.sum lengths)
    in vjp2 mean (flatten w.params) 1

-- | gpu.fut's `train` (B = 1) and `train_batch` (B > 1), run sequentially.
entry train_gpu [rows][c][l][n][d] (s: model [l][n][d]) ({params, m, v, step}: *weights [rows][c]) (k: i64)
                                   : (weights [rows][c], [k]f32) =
  if s.batch == 1 then train_steps (one_document #gpu s) {params, m, v, step} k
  else train_steps (batch_of_documents #gpu s) {params, m, v, step} k
