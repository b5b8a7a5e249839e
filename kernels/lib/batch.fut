-- | A training step over B documents (B > 1): which documents a step
-- reads, padded to the longest, and their gradient sources.
--
-- The B documents' forward and backward passes are a parallel `map` (the
-- parallel work of the multicore backend: one document is too little),
-- each run sequentially inside.  Their gradient sources are then laid end
-- to end as one set of B T positions, so that train.fut's update pass
-- sums every weight's gradient over all B x T positions, row by row, in
-- place, as it does over one document's T.  Padding adds nothing: its
-- dlogits are zero (masked_loss_and_dlogits), so every activation
-- gradient there is zero too.

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

-- | B documents' gradient sources as one set of B T positions, document
-- j's at j T .. j T + T - 1.
def end_to_end [b][t][c][c3][f][v][l][k] (docs: [b](sources [t][c][c3][f][v][l][k]))
    : *sources [b * t][c][c3][f][v][l][k] =
  let ends [m] 'a (parts: [b][t][m]a): *[b * t][m]a = copy (flatten parts)
  let layer i = {dqkv = ends (map (\s -> s.grads[i].dqkv) docs), dxmid = ends (map (\s -> s.grads[i].dxmid) docs),
                 dhid = ends (map (\s -> s.grads[i].dhid) docs), dxout = ends (map (\s -> s.grads[i].dxout) docs)}
  in {inputs = copy (flatten (map (.inputs) docs)), dlogits = ends (map (.dlogits) docs),
      grads = tabulate l layer, xs = tabulate k (\j -> ends (map (\s -> s.xs[j]) docs))}

-- | The batch's mean loss over its real positions, and its gradient
-- sources: document j's positions are B T positions' j T .. j T + T - 1.
-- `blocks`: the program's (model.fut's back_linear); a document's products
-- run sequentially on the CPU backends, in parallel on a GPU.
def batch_sources [rows][c][b][t1][l] (d: dims) (layout: [l]i64) (blocks: products) (params: [rows][c]f32)
                                      (tokens: [b][t1]i32) (lengths: [b]i64)
    : (f32, *sources [b * (t1 - 1)][c][3 * c][4 * c][d.vocab][d.n_layer][2 + 7 * d.n_layer]) =
  let t = t1 - 1
  let (f, h, nv, nl) = (4 * c, d.n_head, d.vocab, d.n_layer)
  let flat = flatten params
  let (_, _, lm_head) = embeddings flat layout nv d.block_size c
  let count = i64.sum lengths
  let scale = 1 / f32.i64 count
  let inner: products = match blocks case #gpu -> #gpu case _ -> #sequential
  let doc row n =
    let inputs = row[:t] :> [t]i32
    let fw = forward_train d c f h nl layout flat inputs
    let (loss, dlogits) = masked_loss_and_dlogits lm_head fw.x (row[1:] :> [t]i32) n scale
    in (loss, backward_from d layout inner flat inputs fw dlogits)
  let (sums, docs) = unzip (map2 doc tokens lengths)
  in (f32.sum sums / f32.i64 count,
      end_to_end docs :> sources [b * t][c][3 * c][4 * c][d.vocab][d.n_layer][2 + 7 * d.n_layer])
