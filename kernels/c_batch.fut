-- | The futhark-c backend's program for batches of B > 1 documents a step
-- (`futhark c --library`): exactly the entry points
-- engine/backends/futhark_backend.py calls at B > 1 (its entry_points(B)).
-- The same library runs futhark-multicore on one thread.  c.fut is the
-- program for one document a step (and says why the two are apart).
-- Held-out losses and sampling are not in it: at B > 1 the backend runs
-- them in the program for one document a step, on its own copy of the
-- weights, so that each target compiles them once.

import "lib/model"
import "lib/microgpt"

-- | How this program runs its backward products (model.fut's `products`).
def products: products = #sequential

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

entry initial_weights [p][l][n][d] (s: model [l][n][d]) (params: [p]f32)
                                   : weights [p / s.dims.n_embd][s.dims.n_embd] =
  first_weights s params

-- | k steps of the model's batch size B > 1 documents each.
entry train_batch [rows][c][l][n][d] (s: model [l][n][d]) ({params, m, v, step}: *weights [rows][c]) (k: i64)
                                     : (weights [rows][c], [k]f32) =
  train_steps (batch_of_documents products s) {params, m, v, step} k

entry get_params [rows][c] (w: weights [rows][c]): [rows * c]f32 = flatten w.params
entry get_m [rows][c] (w: weights [rows][c]): [rows * c]f32 = flatten w.m
entry get_v [rows][c] (w: weights [rows][c]): [rows * c]f32 = flatten w.v
entry get_step [rows][c] (w: weights [rows][c]): i64 = w.step
