-- | The futhark-multicore backend's program for batches of B > 1
-- documents a step on several threads (`futhark multicore --library`):
-- exactly the entry points engine/backends/futhark_backend.py calls at
-- B > 1 (its entry_points(B, "multicore"); one thread runs c_batch.fut's
-- library).  The batched step's products and transposes take their
-- multicore forms from `products` (lib/batch.fut); small models'
-- batches train in parts instead (train_batch_parts).  multicore.fut is the
-- program for one document a step (c.fut says why the two are apart).
-- Held-out losses and sampling are not in it: at B > 1 the backend runs
-- them in the program for one document a step, on its own copy of the
-- weights, so that each target compiles them once.

import "lib/model"
import "lib/microgpt"

-- | How this program runs its backward products (model.fut's `products`):
-- in a task per thread of the model's `threads`.
def products [l][n][d] (s: model [l][n][d]): products = #tasks s.threads

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
  train_steps (batch_of_documents (products s) s) {params, m, v, step} k

-- | train_batch with each step's documents in a group per thread
-- (microgpt.fut's batch_in_parts), for small models.
entry train_batch_parts [rows][c][l][n][d] (s: model [l][n][d]) ({params, m, v, step}: *weights [rows][c]) (k: i64)
                                           : (weights [rows][c], [k]f32) =
  train_steps (batch_in_parts (i64.max 1 (i64.min s.threads s.batch)) s) {params, m, v, step} k

entry get_params [rows][c] (w: weights [rows][c]): [rows * c]f32 = flatten w.params
entry get_m [rows][c] (w: weights [rows][c]): [rows * c]f32 = flatten w.m
entry get_v [rows][c] (w: weights [rows][c]): [rows * c]f32 = flatten w.v
entry get_step [rows][c] (w: weights [rows][c]): i64 = w.step
