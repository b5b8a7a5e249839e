-- | The futhark-c backend's program for one document a step (`futhark c
-- --library`): exactly the entry points engine/backends/futhark_backend.py
-- calls at B = 1 (its entry_points(1)), with the backward products run
-- sequentially.  The same library runs futhark-multicore on one thread.
-- c_batch.fut is the program for batches; multicore.fut, gpu.fut and
-- their _batch programs are the same for their targets; kernels/lib/
-- holds what they are made of.
--
-- B = 1 and batches are two programs, not two entry points of one, because
-- Futhark 0.25.34 compiles one entry point's memory differently depending
-- on the program's other entry points: its last-use analysis keeps one
-- table of aliases for the whole program, and names of a function it read
-- before stand in for another's.  In one program, an edit of the batched
-- step changed the B = 1 step's code (2 x 2 tiles there made B = 1 steps
-- 35-40% slower; kernels/README.md "Two programs per target").

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

-- | k steps of one document each (B = 1: microgpt's step, no padding or
-- mask).  Not the batched step behind a branch on the batch size: in one
-- entry point, sequential C ran B = 1 steps 13-26% slower (tiny to s128).
entry train [rows][c][l][n][d] (s: model [l][n][d]) ({params, m, v, step}: *weights [rows][c]) (k: i64)
                               : (weights [rows][c], [k]f32) =
  train_steps (one_document products s) {params, m, v, step} k

entry get_params [rows][c] (w: weights [rows][c]): [rows * c]f32 = flatten w.params
entry get_m [rows][c] (w: weights [rows][c]): [rows * c]f32 = flatten w.m
entry get_v [rows][c] (w: weights [rows][c]): [rows * c]f32 = flatten w.v
entry get_step [rows][c] (w: weights [rows][c]): i64 = w.step

entry doc_losses [rows][c][l][n][d][h][t1] (s: model [l][n][d]) (w: weights [rows][c]) (tokens: [h][t1]i32)
                                           (lengths: [h]i64): ([h]f32, [h]i64) =
  held_out_losses s w tokens lengths

entry sample [rows][c][l][n][d][np] (s: model [l][n][d]) (w: weights [rows][c]) (prefix: [np]i32)
                                    (num_samples: i64) (temperature: f64) (seed: u64) (first: i64)
                                    (max_length: i64): [num_samples][]i32 =
  sample_names s w prefix num_samples temperature seed first max_length
